"""tidemq.operator.workloads: Cluster spec -> StatefulSets, Services, ConfigMaps, PDBs.

Every generated object is validated offline against Kubernetes 1.30's schemas
(kubernetes-validate, strict: unknown fields refused); the broker's generated command line and
config file are parsed by the real `tidemq broker` CLI."""

from __future__ import annotations

import copy
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tidemq.cli.config import load_config_file
from tidemq.cli.servers import broker_cmd
from tidemq.errors import ConfigError
from tidemq.operator import crds
from tidemq.operator import workloads as w

ROOT = Path(__file__).resolve().parents[2]
UID = "8d4c2a8e-0d1f-4c55-9f0e-2b7f3a1c9d10"


def _cluster(**spec) -> dict:
    base = yaml.safe_load((ROOT / "crds" / "examples" / "cluster.yaml").read_text())
    base["metadata"].update(namespace="mq", uid=UID)
    base["spec"].update(spec)
    return base


def _by(objs, kind, name=None):
    out = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    return out if name is None else out[0]


def _container(sts):
    [c] = sts["spec"]["template"]["spec"]["containers"]
    return c


def _arg(container, flag):
    args = container["args"]
    return args[args.index(flag) + 1]


@pytest.fixture(scope="module")
def objs():
    return w.desired_objects(_cluster())


def test_the_expected_objects_in_apply_order(objs):
    got = [(o["kind"], o["metadata"]["name"]) for o in objs]
    expected = [
        ("Service", "demo-namesrv-headless"), ("Service", "demo-namesrv"),
        ("PodDisruptionBudget", "demo-namesrv"), ("StatefulSet", "demo-namesrv"),
        ("PodDisruptionBudget", "demo-broker"),  # lone brokers: one budget over all of them
    ]
    for g in (0, 1):
        expected += [
            ("ConfigMap", f"demo-broker-{g}-config"), ("Service", f"demo-broker-{g}-headless"),
            ("StatefulSet", f"demo-broker-{g}"),
        ]
    assert got == expected


def test_every_object_validates_against_kubernetes_1_30(objs):
    for o in objs:
        kubernetes_validate.validate(o, "1.30", strict=True)


def test_a_broken_object_would_be_caught(objs):
    sts = copy.deepcopy(_by(objs, "StatefulSet", "demo-broker-0"))
    sts["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, "1.30", strict=True)


def test_owner_references_labels_and_namespace(objs):
    for o in objs:
        md = o["metadata"]
        assert md["namespace"] == "mq"
        assert md["ownerReferences"] == [{
            "apiVersion": "tidemq.io/v1alpha1", "kind": "Cluster", "name": "demo", "uid": UID,
            "controller": True, "blockOwnerDeletion": True}]
        assert md["labels"]["app.kubernetes.io/name"] == "tidemq"
        assert md["labels"]["app.kubernetes.io/instance"] == "demo"
        assert md["labels"]["app.kubernetes.io/managed-by"] == "tidemq-operator"
        assert md["labels"]["app.kubernetes.io/component"] in ("namesrv", "broker")


def test_selectors_match_pods_and_are_distinct_per_group(objs):
    selectors = set()
    for sts in _by(objs, "StatefulSet"):
        sel = sts["spec"]["selector"]["matchLabels"]
        assert sel.items() <= sts["spec"]["template"]["metadata"]["labels"].items()
        selectors.add(tuple(sorted(sel.items())))
        svc = _by(objs, "Service", sts["spec"]["serviceName"])
        assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
        assert svc["spec"]["selector"] == sel
    assert len(selectors) == 3  # name servers and each broker group select only their own pods


def test_name_server_statefulset(objs):
    sts = _by(objs, "StatefulSet", "demo-namesrv")
    assert sts["spec"]["replicas"] == 2
    c = _container(sts)
    assert c["command"] == ["tidemq", "namesrv"]
    assert _arg(c, "--listen") == "0.0.0.0:9876" and _arg(c, "--metrics-listen") == "0.0.0.0:9877"
    assert c["resources"] == {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}}
    client = _by(objs, "Service", "demo-namesrv")
    assert client["spec"]["type"] == "ClusterIP" and client["spec"]["ports"][0]["port"] == 9876


def test_name_server_address_lists_every_pod():
    addr = w.name_server_address(_cluster())
    assert addr == ("demo-namesrv-0.demo-namesrv-headless.mq.svc:9876;"
                    "demo-namesrv-1.demo-namesrv-headless.mq.svc:9876")
    assert w.name_server_address(_cluster(nameServers={"replicas": 3, "port": 9000})).count(":9000") == 3


def test_broker_statefulset(objs):
    sts = _by(objs, "StatefulSet", "demo-broker-1")
    spec = sts["spec"]
    assert spec["replicas"] == 1 and spec["serviceName"] == "demo-broker-1-headless"
    assert spec["podManagementPolicy"] == "OrderedReady"
    assert spec["updateStrategy"]["type"] == "RollingUpdate"
    [pvc] = spec["volumeClaimTemplates"]
    assert pvc["metadata"]["name"] == "data"
    assert pvc["spec"]["resources"]["requests"]["storage"] == "20Gi"
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"] and "storageClassName" not in pvc["spec"]
    c = _container(sts)
    assert c["command"] == ["tidemq", "broker"]
    assert _arg(c, "--advertise") == "$(POD_NAME).demo-broker-1-headless.$(POD_NAMESPACE).svc:10911"
    assert _arg(c, "--namesrv") == w.name_server_address(_cluster())
    assert _arg(c, "--listen") == "0.0.0.0:10911"
    assert {m["name"]: m["mountPath"] for m in c["volumeMounts"]} == {"data": "/var/lib/tidemq", "config": "/etc/tidemq",
                                                                  "tmp": "/tmp"}
    assert _arg(c, "--store").startswith("/var/lib/tidemq/")
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"] if "fieldRef" in e["valueFrom"]}
    assert env["POD_NAME"] == "metadata.name" and env["POD_NAMESPACE"] == "metadata.namespace"
    pod = spec["template"]["spec"]
    assert pod["volumes"] == [{"name": "config", "configMap": {"name": "demo-broker-1-config"}},
                              {"name": "tmp", "emptyDir": {}}]


def test_probes_use_the_health_endpoints(objs):
    for sts in _by(objs, "StatefulSet"):
        c = _container(sts)
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert _arg(c, "--metrics-listen") == f"0.0.0.0:{ports['metrics']}"
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics", "scheme": "HTTP"}
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
        assert c["startupProbe"]["failureThreshold"] * c["startupProbe"]["periodSeconds"] >= 300
    assert ports["metrics"] == 9878  # brokers: spec.metrics.port


def test_graceful_stop_and_anti_affinity(objs):
    for sts in _by(objs, "StatefulSet"):
        pod = sts["spec"]["template"]["spec"]
        c = pod["containers"][0]
        sleep = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
        assert c["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
        assert pod["terminationGracePeriodSeconds"] >= sleep + 20  # time left to flush and unregister
        anti = pod["affinity"]["podAntiAffinity"]
        assert "requiredDuringSchedulingIgnoredDuringExecution" not in anti  # preferred by default
        [term] = anti["preferredDuringSchedulingIgnoredDuringExecution"]
        component = sts["metadata"]["labels"]["app.kubernetes.io/component"]
        assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
        selector = {"app.kubernetes.io/name": "tidemq", "app.kubernetes.io/instance": "demo",
                    "app.kubernetes.io/component": component}
        assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == selector
        # by default spread over zones, as a preference (nodes without the zone label change nothing)
        assert pod["topologySpreadConstraints"] == [{
            "maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": selector}}]


# -- disruption budgets and placement (issue 18, item 11) ----------------------------------------

def _budgets_of(objs, pod_labels):
    return [p["metadata"]["name"] for p in _by(objs, "PodDisruptionBudget")
            if p["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()]


@pytest.mark.parametrize("brokers", [{"groups": 3}, {"groups": 3, "replicas": 3}, {"groups": 2, "replicas": 2}])
def test_every_pod_has_exactly_one_disruption_budget(brokers):
    """The eviction API refuses a pod that two budgets select, so a drain could not move it."""
    objs = w.desired_objects(_cluster(brokers=brokers))
    for sts in _by(objs, "StatefulSet"):
        labels = sts["spec"]["template"]["metadata"]["labels"]
        assert len(_budgets_of(objs, labels)) == 1, (sts["metadata"]["name"], _budgets_of(objs, labels))


def test_lone_brokers_share_one_budget_so_a_drain_evicts_one_at_a_time():
    objs = w.desired_objects(_cluster(brokers={"groups": 3}))
    brokers = [s for s in _by(objs, "StatefulSet") if s["metadata"]["name"].startswith("demo-broker-")]
    assert len(brokers) == 3
    for sts in brokers:
        assert _budgets_of(objs, sts["spec"]["template"]["metadata"]["labels"]) == ["demo-broker"]
    pdb = _by(objs, "PodDisruptionBudget", "demo-broker")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["metadata"]["ownerReferences"][0]["uid"] == UID
    assert [p["metadata"]["name"] for p in _by(objs, "PodDisruptionBudget")] == ["demo-namesrv", "demo-broker"]


def test_replicated_groups_keep_a_budget_each_and_no_cluster_wide_one():
    objs = w.desired_objects(_cluster(brokers={"groups": 2, "replicas": 3}))
    names = [p["metadata"]["name"] for p in _by(objs, "PodDisruptionBudget")]
    assert names == ["demo-namesrv", "demo-broker-0", "demo-broker-1"]
    for g in (0, 1):
        pdb = _by(objs, "PodDisruptionBudget", f"demo-broker-{g}")
        assert pdb["spec"]["maxUnavailable"] == 1  # replicas 3 - minInSync 2
        assert pdb["spec"]["selector"]["matchLabels"][w.BROKER_GROUP_LABEL] == str(g)


def test_required_anti_affinity_keeps_replicas_of_a_group_on_different_nodes():
    objs = w.desired_objects(_cluster(brokers={"groups": 2, "replicas": 3},
                                      placement={"antiAffinity": "required", "topologySpread": []}))
    for g in (0, 1):
        pod = _by(objs, "StatefulSet", f"demo-broker-{g}")["spec"]["template"]["spec"]
        anti = pod["affinity"]["podAntiAffinity"]
        [term] = anti["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        assert term["labelSelector"]["matchLabels"] == w.broker_selector("demo", g)  # its own group only
        # different groups only prefer to be apart: 2 groups x 3 replicas fit on 3 nodes
        [weak] = anti["preferredDuringSchedulingIgnoredDuringExecution"]
        assert weak["weight"] < 100 and w.BROKER_GROUP_LABEL not in weak["podAffinityTerm"]["labelSelector"]["matchLabels"]
        assert "topologySpreadConstraints" not in pod  # [] turns spreading off
    ns = _by(objs, "StatefulSet", "demo-namesrv")["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert list(ns) == ["requiredDuringSchedulingIgnoredDuringExecution"]
    for o in objs:
        kubernetes_validate.validate(o, "1.30", strict=True)


def test_lone_brokers_keep_apart_from_every_broker_and_spread_as_configured():
    spread = [{"topologyKey": "topology.kubernetes.io/zone", "maxSkew": 2, "whenUnsatisfiable": "DoNotSchedule"},
              {"topologyKey": "kubernetes.io/hostname"}]
    objs = w.desired_objects(_cluster(brokers={"groups": 2}, placement={
        "antiAffinity": "required", "antiAffinityTopologyKey": "topology.kubernetes.io/zone", "topologySpread": spread}))
    pod = _by(objs, "StatefulSet", "demo-broker-1")["spec"]["template"]["spec"]
    [term] = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    all_brokers = {"app.kubernetes.io/name": "tidemq", "app.kubernetes.io/instance": "demo",
                   "app.kubernetes.io/component": "broker"}
    assert term == {"labelSelector": {"matchLabels": all_brokers}, "topologyKey": "topology.kubernetes.io/zone"}
    assert "preferredDuringSchedulingIgnoredDuringExecution" not in pod["affinity"]["podAntiAffinity"]
    assert [(t["topologyKey"], t["maxSkew"], t["whenUnsatisfiable"]) for t in pod["topologySpreadConstraints"]] == [
        ("topology.kubernetes.io/zone", 2, "DoNotSchedule"), ("kubernetes.io/hostname", 1, "ScheduleAnyway")]
    assert all(t["labelSelector"]["matchLabels"] == all_brokers for t in pod["topologySpreadConstraints"])
    for o in objs:
        kubernetes_validate.validate(o, "1.30", strict=True)


def test_a_placement_change_rolls_the_pods(objs):
    changed = w.desired_objects(_cluster(placement={"antiAffinity": "required"}))
    for name in ("demo-namesrv", "demo-broker-0"):
        assert w.spec_hash(_by(changed, "StatefulSet", name)) != w.spec_hash(_by(objs, "StatefulSet", name))


def _admit(**spec):
    c = _cluster(**spec)
    del c["metadata"]["uid"]
    return crds.admit(c)


@pytest.mark.parametrize("placement, where", [
    ({"antiAffinity": "sometimes"}, "antiAffinity"),
    ({"antiAffinityTopologyKey": ""}, "antiAffinityTopologyKey"),
    ({"topologySpread": [{"maxSkew": 1}]}, "topologyKey"),
    ({"topologySpread": [{"topologyKey": "zone", "maxSkew": 0}]}, "maxSkew"),
    ({"topologySpread": [{"topologyKey": "zone", "whenUnsatisfiable": "Never"}]}, "whenUnsatisfiable"),
    ({"topologySpread": {"topologyKey": "zone"}}, "topologySpread"),
])
def test_the_crd_refuses_bad_placement(placement, where):
    _obj, problems = _admit(placement=placement)
    assert problems and any(where in p for p in problems), problems


def test_the_crd_defaults_placement():
    obj, problems = _admit(placement={"topologySpread": [{"topologyKey": "kubernetes.io/hostname"}]})
    assert problems == []
    assert obj["spec"]["placement"] == {
        "antiAffinity": "preferred", "antiAffinityTopologyKey": "kubernetes.io/hostname",
        "topologySpread": [{"topologyKey": "kubernetes.io/hostname", "maxSkew": 1, "whenUnsatisfiable": "ScheduleAnyway"}]}
    assert _admit()[1] == []


def test_prometheus_annotations_follow_spec_metrics(objs):
    pod_md = _by(objs, "StatefulSet", "demo-broker-0")["spec"]["template"]["metadata"]
    assert pod_md["annotations"]["prometheus.io/scrape"] == "true"
    assert pod_md["annotations"]["prometheus.io/port"] == "9878"
    off = w.desired_objects(_cluster(metrics={"enabled": False}))
    for sts in _by(off, "StatefulSet"):
        ann = sts["spec"]["template"]["metadata"]["annotations"]
        assert "prometheus.io/scrape" not in ann
        assert _container(sts)["readinessProbe"]["httpGet"]["path"] == "/readyz"  # probes stay


def test_broker_config_file_is_read_by_the_cli(objs, tmp_path):
    cm = _by(objs, "ConfigMap", "demo-broker-0-config")
    conf = tmp_path / "broker.conf"
    conf.write_text(cm["data"]["broker.conf"])
    cfg = load_config_file(str(conf))
    assert cfg["cluster"] == "demo" and cfg["broker_name"] == "demo-broker-0"
    assert cfg["flush"] == "sync" and cfg["segment_size"] == "1073741824" and cfg["retention_hours"] == "48"
    assert cfg["delay_levels"].startswith("1s 5s")  # extra settings pass through (messageDelayLevel)


def test_connection_limits_in_spec_brokers_config_reach_the_broker(tmp_path):
    """RocketMQ's keys and our option names both work in spec.brokers.config (the chart's
    cluster.brokers.config): the broker command the operator renders reads them from broker.conf."""
    c = _cluster()
    c["spec"]["brokers"]["config"] = {"serverChannelMaxIdleTimeSeconds": "60", "waitTimeMillsInSendQueue": "200",
                                      "max-connections": "2048", "max-buffered-bytes": "67108864"}
    conf = tmp_path / "broker.conf"
    conf.write_text(w.broker_config_text(c, 0))
    ctx = broker_cmd.make_context("broker", ["--config", str(conf)])
    p = ctx.params
    assert (p["idle_timeout"], p["busy_wait_ms"], p["max_connections"], p["max_buffered_bytes"]) == (
        60.0, 200, 2048, 64 << 20)


def test_broker_command_line_is_accepted_by_the_cli(objs, tmp_path):
    sts = _by(objs, "StatefulSet", "demo-broker-0")
    cm = _by(objs, "ConfigMap", "demo-broker-0-config")
    conf = tmp_path / "broker.conf"
    conf.write_text(cm["data"]["broker.conf"])
    pod_env = {"POD_NAME": "demo-broker-0-0", "POD_NAMESPACE": "mq"}
    args = []
    for a in _container(sts)["args"]:  # what the kubelet does with $(VAR)
        for k, v in pod_env.items():
            a = a.replace(f"$({k})", v)
        args.append(str(conf) if a == "/etc/tidemq/broker.conf" else a)
    ctx = broker_cmd.make_context("broker", args)
    p = ctx.params
    assert p["advertise"] == "demo-broker-0-0.demo-broker-0-headless.mq.svc:10911"
    assert p["cluster"] == "demo" and p["broker_name"] == "demo-broker-0"
    assert p["flush"] == "sync" and p["segment_size"] == 1 << 30 and p["retention_hours"] == 48.0
    assert p["namesrv"].split(";")[1] == "demo-namesrv-1.demo-namesrv-headless.mq.svc:9876"
    assert p["metrics_listen"] == "0.0.0.0:9878"
    assert p["delay_levels"].startswith("1s 5s")


def test_flush_mode_storage_class_and_groups():
    objs = w.desired_objects(_cluster(brokers={
        "groups": 3, "flushMode": "async", "retentionHours": 0.5,
        "storage": {"size": "5Gi", "storageClassName": "fast"}}))
    stss = [o["metadata"]["name"] for o in _by(objs, "StatefulSet")]
    assert stss == ["demo-namesrv", "demo-broker-0", "demo-broker-1", "demo-broker-2"]
    [pvc] = _by(objs, "StatefulSet", "demo-broker-2")["spec"]["volumeClaimTemplates"]
    assert pvc["spec"]["storageClassName"] == "fast" and pvc["spec"]["resources"]["requests"]["storage"] == "5Gi"
    conf = _by(objs, "ConfigMap", "demo-broker-2-config")["data"]["broker.conf"]
    assert "flushDiskType=ASYNC_FLUSH" in conf.splitlines() and "fileReservedTime=0.5" in conf.splitlines()
    for o in objs:
        kubernetes_validate.validate(o, "1.30", strict=True)


def test_minimal_spec_gets_the_crd_defaults():
    objs = w.desired_objects({"kind": "Cluster", "metadata": {"name": "tiny", "uid": UID}, "spec": {"brokers": {}}})
    assert _by(objs, "StatefulSet", "tiny-namesrv")["spec"]["replicas"] == 2
    b = _by(objs, "StatefulSet", "tiny-broker-0")
    assert b["metadata"]["namespace"] == "default"
    assert b["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "10Gi"
    assert "flushDiskType=SYNC_FLUSH" in _by(objs, "ConfigMap", "tiny-broker-0-config")["data"]["broker.conf"]
    assert len(objs) == 8


def test_external_cluster_yields_nothing():
    ext = {"apiVersion": "tidemq.io/v1alpha1", "kind": "Cluster",
           "metadata": {"name": "legacy", "namespace": "mq", "uid": UID},
           "spec": {"external": {"nameServers": ["ns-a:9876", "ns-b:9876"]}}}
    assert w.desired_objects(ext) == []
    assert w.name_server_address(ext) == "ns-a:9876;ns-b:9876"
    with pytest.raises(ConfigError):
        w.broker_config_text(ext, 0)


def test_missing_uid_or_name_is_a_config_error():
    c = _cluster()
    del c["metadata"]["uid"]
    with pytest.raises(ConfigError, match="uid"):
        w.desired_objects(c)
    with pytest.raises(ConfigError):
        w.desired_objects({"metadata": {}, "spec": {"brokers": {}}})
    with pytest.raises(ConfigError):
        w.desired_objects({"kind": "Topic", "metadata": {"name": "x", "uid": UID}, "spec": {}})
    for bad in ("1abc", "a.b", "x" * 41):
        with pytest.raises(ConfigError, match="DNS label"):
            w.desired_objects({"metadata": {"name": bad, "uid": UID}, "spec": {"brokers": {}}})


@pytest.mark.parametrize("config", [{"9lives": "x"}, {"a\nbrokerName": "x"}, {"a=b": "c"}, {"k": "v\nbrokerName=evil"}])
def test_config_that_cannot_be_a_broker_conf_line_is_a_config_error(config):
    with pytest.raises(ConfigError, match="broker.conf"):
        w.desired_objects(_cluster(brokers={"config": config}))


def test_spec_hash_is_stable_and_detects_changes(objs):
    again = w.desired_objects(_cluster())
    assert again == objs  # deterministic
    for o in objs:
        assert o["metadata"]["annotations"][w.SPEC_HASH_ANNOTATION] == w.spec_hash(o)
        live = copy.deepcopy(o)
        live["status"] = {"readyReplicas": 1}
        assert w.spec_hash(live) == w.spec_hash(o)  # status and the stamp itself do not count
    hashes = {o["metadata"]["name"] + o["kind"]: w.spec_hash(o) for o in objs}
    changed = w.desired_objects(_cluster(image="ghcr.io/tidemq/tidemq:0.2.0"))
    new = {o["metadata"]["name"] + o["kind"]: w.spec_hash(o) for o in changed}
    assert new["demo-broker-0StatefulSet"] != hashes["demo-broker-0StatefulSet"]
    assert new["demo-namesrvStatefulSet"] != hashes["demo-namesrvStatefulSet"]
    assert new["demo-broker-0-configConfigMap"] == hashes["demo-broker-0-configConfigMap"]


def test_config_change_rolls_the_broker_pods(objs):
    before = _by(objs, "StatefulSet", "demo-broker-0")
    c = _cluster()
    c["spec"]["brokers"]["config"] = {"autoCreateTopicEnable": "true"}
    after_objs = w.desired_objects(c)
    after = _by(after_objs, "StatefulSet", "demo-broker-0")
    key = w.CONFIG_HASH_ANNOTATION
    assert after["spec"]["template"]["metadata"]["annotations"][key] != before["spec"]["template"]["metadata"]["annotations"][key]
    assert "autoCreateTopicEnable=true" in _by(after_objs, "ConfigMap", "demo-broker-0-config")["data"]["broker.conf"]
    assert w.spec_hash(_by(after_objs, "StatefulSet", "demo-namesrv")) == w.spec_hash(_by(objs, "StatefulSet", "demo-namesrv"))


def test_input_is_not_mutated():
    c = _cluster()
    before = copy.deepcopy(c)
    w.desired_objects(c)
    w.name_server_address(c)
    assert c == before


def test_immutable_statefulset_changes_are_reported(objs):
    live = copy.deepcopy(_by(objs, "StatefulSet", "demo-broker-0"))
    live["spec"]["volumeClaimTemplates"][0]["spec"]["volumeMode"] = "Filesystem"  # server defaults
    live["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"] = "standard"
    live["status"] = {"replicas": 1}
    assert w.immutable_changes(live, _by(objs, "StatefulSet", "demo-broker-0")) == []
    bigger = w.desired_objects(_cluster(brokers={"groups": 2, "storage": {"size": "50Gi"}}))
    assert w.immutable_changes(live, _by(bigger, "StatefulSet", "demo-broker-0")) == ["spec.volumeClaimTemplates"]
    other_class = w.desired_objects(_cluster(brokers={"groups": 2, "storage": {"size": "20Gi", "storageClassName": "fast"}}))
    assert w.immutable_changes(live, _by(other_class, "StatefulSet", "demo-broker-0")) == ["spec.volumeClaimTemplates"]
    new_image = w.desired_objects(_cluster(image="ghcr.io/tidemq/tidemq:9"))
    assert w.immutable_changes(live, _by(new_image, "StatefulSet", "demo-broker-0")) == []
    assert w.immutable_changes(live, _by(objs, "ConfigMap", "demo-broker-0-config")) == []
