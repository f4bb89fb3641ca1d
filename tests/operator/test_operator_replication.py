"""Replicated broker groups in the operator's objects (issue 17, tidemq.operator.replication):
spec.brokers.replicas 2-5 turns each pod of a group's StatefulSet into a replica with the Lease
RBAC, the HA port, a partition the operator lowers, and a PDB that follows minInSync; replicas 1
keeps the lone broker's objects exactly."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.charts.test_chart import helm_python, kubeconfig, render  # noqa: F401 (fixtures)
from tests.operator.test_operator_security import check_pod
from tidemq.cli.servers import broker_cmd
from tidemq.errors import ConfigError
from tidemq.operator import crds, replication, workloads as w

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")
UID = "8d4c2a8e-0d1f-4c55-9f0e-2b7f3a1c9d10"


def _cluster(**brokers) -> dict:
    base = yaml.safe_load((ROOT / "crds" / "examples" / "cluster.yaml").read_text())
    base["metadata"].update(namespace="mq", uid=UID)
    base["spec"]["brokers"].update(brokers)
    return base


def _by(objs, kind, name):
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


def _container(sts):
    [c] = sts["spec"]["template"]["spec"]["containers"]
    return c


def _arg(container, flag):
    args = container["args"]
    return args[args.index(flag) + 1]


@pytest.fixture(scope="module")
def objs():
    return w.desired_objects(_cluster(replicas=3))


def test_lone_broker_groups_stay_as_they_were():
    objs = w.desired_objects(_cluster(replicas=1, replication="sync", leaseSeconds=10))
    assert not {"ServiceAccount", "Role", "RoleBinding"} & {o["kind"] for o in objs}
    sts = _by(objs, "StatefulSet", "demo-broker-0")
    c = _container(sts)
    assert "--coordination" not in c["args"] and "--replica-id" not in c["args"]
    assert [p["name"] for p in c["ports"]] == ["remoting", "metrics"]
    assert sts["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in sts["spec"]["template"]["spec"]
    assert sts["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}
    assert _by(objs, "PodDisruptionBudget", "demo-broker")["spec"]["maxUnavailable"] == 1  # issue 18: one over all lone brokers


def test_replicated_objects_validate_and_rbac_comes_before_the_brokers(objs):
    for o in objs:
        kubernetes_validate.validate(o, "1.30", strict=True)
    kinds = [(o["kind"], o["metadata"]["name"]) for o in objs]
    rbac = [("ServiceAccount", "demo-broker"), ("Role", "demo-broker-leases"), ("RoleBinding", "demo-broker-leases")]
    assert kinds[4:7] == rbac  # after the name servers, before the first broker group's stage
    role = _by(objs, "Role", "demo-broker-leases")
    assert role["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                              "verbs": ["get", "list", "watch", "create", "patch"]}]
    binding = _by(objs, "RoleBinding", "demo-broker-leases")
    assert binding["roleRef"]["name"] == "demo-broker-leases"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "demo-broker", "namespace": "mq"}]
    for name in ("demo-broker", "demo-broker-leases"):
        assert _by(objs, "RoleBinding" if name.endswith("leases") else "ServiceAccount", name)[
            "metadata"]["ownerReferences"][0]["uid"] == UID


def test_each_pod_is_a_replica_with_its_ordinal_and_the_group_settings(objs):
    for g in (0, 1):
        sts = _by(objs, "StatefulSet", f"demo-broker-{g}")
        c = _container(sts)
        assert _arg(c, "--coordination") == "kubernetes"
        assert _arg(c, "--replica-id") == "$(REPLICA_ID)"
        assert (_arg(c, "--min-in-sync"), _arg(c, "--replication"), _arg(c, "--lease-seconds")) == ("2", "sync", "10")
        env = {e["name"]: e for e in c["env"]}
        assert env["REPLICA_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['apps.kubernetes.io/pod-index']"
        assert {"name": "ha", "containerPort": 10912, "protocol": "TCP"} in c["ports"]
        svc = _by(objs, "Service", f"demo-broker-{g}-headless")
        assert {"name": "ha", "port": 10912, "targetPort": "ha", "protocol": "TCP"} in svc["spec"]["ports"]
        pod = sts["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == "demo-broker"
        check_pod(f"replicated {sts['metadata']['name']}", pod, needs_api=True)
        assert pod["automountServiceAccountToken"] is True  # the Lease store's credentials
        # the controller replaces no pod on its own: tidemq.operator.grouproll lowers the partition
        assert sts["spec"]["updateStrategy"]["rollingUpdate"]["partition"] == 3
        assert sts["spec"]["replicas"] == 3
        assert _by(objs, "PodDisruptionBudget", f"demo-broker-{g}")["spec"]["maxUnavailable"] == 1


def test_the_replica_command_line_is_accepted_by_the_cli(objs, tmp_path):
    sts = _by(objs, "StatefulSet", "demo-broker-1")
    conf = tmp_path / "broker.conf"
    conf.write_text(_by(objs, "ConfigMap", "demo-broker-1-config")["data"]["broker.conf"])
    pod_env = {"POD_NAME": "demo-broker-1-2", "POD_NAMESPACE": "mq", "REPLICA_ID": "2"}
    args = []
    for a in _container(sts)["args"]:  # what the kubelet does with $(VAR)
        for k, v in pod_env.items():
            a = a.replace(f"$({k})", v)
        args.append(str(conf) if a == "/etc/tidemq/broker.conf" else a)
    p = broker_cmd.make_context("broker", args).params
    assert (p["coordination"], p["replica_id"], p["min_in_sync"], p["replication"], p["lease_seconds"]) == (
        "kubernetes", 2, 2, "sync", 10)
    assert p["ha_listen"] is None  # the default, listen port + 1, advertised under the pod's DNS name
    assert p["advertise"] == "demo-broker-1-2.demo-broker-1-headless.mq.svc:10911"


@pytest.mark.parametrize("brokers, budget, min_in_sync", [
    ({"replicas": 2}, 0, 2),                    # min(2, replicas) = 2: no voluntary eviction
    ({"replicas": 3, "minInSync": 1}, 2, 1),
    ({"replicas": 5}, 3, 2),
    ({"replicas": 3, "minInSync": 3}, 0, 3),    # replicas == minInSync: a drain waits (documented)
])
def test_the_disruption_budget_follows_min_in_sync(brokers, budget, min_in_sync):
    objs = w.desired_objects(_cluster(**brokers))
    assert _by(objs, "PodDisruptionBudget", "demo-broker-0")["spec"]["maxUnavailable"] == budget
    assert _arg(_container(_by(objs, "StatefulSet", "demo-broker-0")), "--min-in-sync") == str(min_in_sync)


def test_async_replication_and_the_lease_reach_the_broker():
    c = _container(_by(w.desired_objects(_cluster(replicas=2, replication="async", leaseSeconds=4)),
                       "StatefulSet", "demo-broker-0"))
    assert (_arg(c, "--replication"), _arg(c, "--lease-seconds")) == ("async", "4")


@pytest.mark.parametrize("brokers, message", [
    ({"replicas": 2, "minInSync": 3}, "between 1 and spec.brokers.replicas"),
    ({"replicas": 7}, "1 to 5 replicas"),
    ({"replicas": 3, "replication": "quorum"}, "use sync or async"),
])
def test_settings_the_crd_would_refuse_are_config_errors(brokers, message):
    """An API server without CEL (or the emulator) lets them through: the operator says what to fix."""
    with pytest.raises(ConfigError, match=message):
        w.desired_objects(_cluster(**brokers))


def test_broker_ids_follow_the_reported_master():
    c = _cluster(replicas=3, groups=2)
    ids = {(b["name"], b["address"].split(".")[0]): b["brokerId"]
           for b in w.broker_addresses(c, {"demo-broker-0": 1, "demo-broker-1": None})}
    assert ids == {("demo-broker-0", "demo-broker-0-0"): 1, ("demo-broker-0", "demo-broker-0-1"): 0,
                   ("demo-broker-0", "demo-broker-0-2"): 3,
                   ("demo-broker-1", "demo-broker-1-0"): 1, ("demo-broker-1", "demo-broker-1-1"): 2,
                   ("demo-broker-1", "demo-broker-1-2"): 3}
    lone = w.broker_addresses(_cluster(replicas=1))
    assert [b["brokerId"] for b in lone] == [0, 0]  # one per group, the ordinal
    assert w.broker_pod_address(c, 1, 2) == "demo-broker-1-2.demo-broker-1-headless.mq.svc:10911"


def test_replication_spec_defaults():
    assert replication.replication_spec({}) == replication.ReplicationSpec(1, 1, "sync", 10)
    assert replication.replication_spec({"replicas": 4}).min_in_sync == 2
    assert replication.replication_spec({"replicas": 4, "minInSync": 4}).max_unavailable == 0


# -- the chart --------------------------------------------------------------------------------------

def test_chart_renders_a_replicated_cluster_and_opens_the_ha_port_to_its_brokers(request):
    """Helm renders cluster.brokers.{replicas,minInSync,replication,leaseSeconds} into a Cluster the
    CRD admits; its broker pods' NetworkPolicy opens exactly their container ports, the HA port
    only to the cluster's own broker pods."""
    helm, kubecfg = request.getfixturevalue("helm_python"), request.getfixturevalue("kubeconfig")
    objs = render(helm, kubecfg, "repl", {
        "cluster": {"name": "repl", "brokers": {"replicas": 3, "minInSync": 2, "replication": "async", "leaseSeconds": 6}},
        "networkPolicy": {"enabled": True}})
    cluster = next(o for o in objs if o["kind"] == "Cluster")
    brokers = cluster["spec"]["brokers"]
    assert (brokers["replicas"], brokers["minInSync"], brokers["replication"], brokers["leaseSeconds"]) == (3, 2, "async", 6)
    admitted, errors = crds.admit(cluster)
    assert errors == []
    sts = next(o for o in w.desired_objects({**admitted, "metadata": {**admitted["metadata"], "uid": UID}})
               if o["kind"] == "StatefulSet" and o["metadata"]["name"].endswith("broker-0"))
    ports = {p["containerPort"] for p in _container(sts)["ports"]}
    policy = next(o for o in objs if o["kind"] == "NetworkPolicy" and o["metadata"]["name"].endswith("-broker"))
    assert {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]} == ports
    [ha_rule] = [r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == brokers["port"] + 1]
    assert ha_rule["from"] == [{"podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "tidemq", "app.kubernetes.io/instance": cluster["metadata"]["name"],
        "app.kubernetes.io/component": "broker"}}}]
    assert brokers["port"] + 1 in ports


def test_chart_default_cluster_has_lone_brokers(request):
    helm, kubecfg = request.getfixturevalue("helm_python"), request.getfixturevalue("kubeconfig")
    objs = render(helm, kubecfg, "lone", {"cluster": {"name": "lone"}, "networkPolicy": {"enabled": True}})
    cluster = next(o for o in objs if o["kind"] == "Cluster")
    assert cluster["spec"]["brokers"]["replicas"] == 1 and "minInSync" not in cluster["spec"]["brokers"]
    policy = next(o for o in objs if o["kind"] == "NetworkPolicy" and o["metadata"]["name"].endswith("-broker"))
    assert len(policy["spec"]["ingress"]) == 2  # remoting and metrics only


def test_the_replicated_example_is_admitted_and_renders_valid_objects():
    example = yaml.safe_load((ROOT / "crds" / "examples" / "cluster-replicated.yaml").read_text())
    admitted, errors = crds.admit(example)
    assert errors == []
    objs = w.desired_objects({**admitted, "metadata": {**admitted["metadata"], "namespace": "mq", "uid": UID}})
    for o in objs:
        kubernetes_validate.validate(o, "1.30", strict=True)
    assert sum(o["kind"] == "StatefulSet" and "--coordination" in _container(o)["args"] for o in objs) == 2
