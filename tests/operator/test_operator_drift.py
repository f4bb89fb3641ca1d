"""The real operator keeps a managed Cluster's objects in their declared state (issue 18, items 2,
3 and 5): ``tidemq operator`` in a subprocess against kmock's emulator, adapted as in
test_operator_integration (its emulator, operator and object helpers are reused), which serves
server-side apply with field managers (tests.support.ssa).

The tests play kubectl (deleting objects, scaling, annotating, as another field manager) and the
StatefulSet controller (``mark_ready``: the pods of the current generation ready and available).
"""

from __future__ import annotations

import pytest

kubernetes = pytest.importorskip("kubernetes")
pytest.importorskip("kmock")
pytest.importorskip("kopf")

from tests.operator.test_operator_integration import (  # noqa: E402
    GROUP, NS, PLURALS, VERSION, Operator, build_emulator, condition, create, get, mark_ready, mount_master_key,
)
from tests.support.kube import ThreadedEmulator  # noqa: E402
from tidemq.operator import apply, crds, workloads  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")


@pytest.fixture(scope="module")
def emulator():
    emu = ThreadedEmulator(build_emulator, name="kmock-drift").start()
    yield emu
    emu.stop()


@pytest.fixture(scope="module")
def operator(emulator, kube, tmp_path_factory):
    op = Operator(tmp_path_factory.mktemp("operator-drift"), emulator.url).start()
    op.master_key = mount_master_key(kube, op)
    yield op
    op.stop()


def _apis(kube):
    _, api = kube
    return (kubernetes.client.AppsV1Api(api), kubernetes.client.CoreV1Api(api),
            kubernetes.client.PolicyV1Api(api), api)


def _sts(kube, name: str) -> dict:
    apps, *_, api = _apis(kube)
    return api.sanitize_for_serialization(apps.read_namespaced_stateful_set(name, NS))


def _settled(kube, cluster: str, names: list[str], check=lambda: True):
    """Play the StatefulSet controller for ``names`` until the Cluster is Ready and ``check``."""
    apps = _apis(kube)[0]

    def attempt():
        for n in names:
            mark_ready(apps, n)
        return condition(get(kube, "Cluster", cluster), "Ready").get("status") == "True" and check()
    return attempt


def _change(kube, name: str, merge: dict) -> None:
    """A merge patch of the Cluster spec (``None`` removes a field), checked against the CRD first."""
    api, _ = kube
    old = get(kube, "Cluster", name)
    new = {**old, "spec": crds_merge(old["spec"], merge)}
    new["metadata"] = {**old["metadata"], "generation": old["metadata"].get("generation", 1) + 1}
    _, errors = crds.admit(new, old)
    assert errors == [], errors
    api.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURALS["Cluster"], name,
                                       {"metadata": {"generation": new["metadata"]["generation"]}, "spec": merge})


def crds_merge(base: dict, patch: dict) -> dict:
    out = dict(base)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = crds_merge(out[k], v)
        else:
            out[k] = v
    return out


def _broker(sts: dict) -> dict:
    return sts["spec"]["template"]["spec"]["containers"][0]


def test_fields_removed_from_a_cluster_leave_its_statefulsets(kube, operator):
    """Item 2: with create-or-merge-patch, the ACL and TLS volumes and mounts, the CPU limit and the
    scrape annotations stayed on the StatefulSets after the Cluster dropped them."""
    apps = _apis(kube)[0]
    create(kube, "Cluster", "lean", {
        "nameServers": {"replicas": 1}, "metrics": {"enabled": True},
        "tls": {"mode": "enforcing", "secretName": "lean-tls"},
        "brokers": {"groups": 1, "acl": {"secretName": "lean-acl"},
                    "resources": {"limits": {"cpu": "2", "memory": "2Gi"}}}})
    sts = ["lean-namesrv", "lean-broker-0"]
    operator.wait("Ready", _settled(kube, "lean", sts))
    before = _sts(kube, "lean-broker-0")
    assert {"acl", "tls"} <= {v["name"] for v in before["spec"]["template"]["spec"]["volumes"]}
    assert _broker(before)["resources"]["limits"]["cpu"] == "2"
    # kubectl annotate: another field manager's annotation on the same object
    apps.patch_namespaced_stateful_set("lean-broker-0", NS, {"metadata": {"annotations": {"example.com/team": "a"}}},
                                       field_manager="kubectl-annotate")

    _change(kube, "lean", {"metrics": {"enabled": False}, "tls": None,
                           "brokers": {"acl": None, "resources": {"limits": {"cpu": None}}}})

    def lean() -> bool:
        broker = _sts(kube, "lean-broker-0")
        return "acl" not in {v["name"] for v in broker["spec"]["template"]["spec"]["volumes"]}
    operator.wait("the rollout without ACL, TLS, CPU limit and metrics", _settled(kube, "lean", sts, lean))
    for name in sts:
        live = _sts(kube, name)
        pod = live["spec"]["template"]
        assert {v["name"] for v in pod["spec"]["volumes"]} & {"acl", "tls"} == set(), name
        assert {m["name"] for m in pod["spec"]["containers"][0]["volumeMounts"]} & {"acl", "tls"} == set(), name
        assert not any(k.startswith("prometheus.io/") for k in (pod["metadata"].get("annotations") or {})), name
        assert "--tls-mode" not in pod["spec"]["containers"][0]["args"], name
    broker = _sts(kube, "lean-broker-0")
    assert "--acl-file" not in _broker(broker)["args"]  # (the name servers keep the Cluster key's)
    assert _broker(broker)["resources"] == {"limits": {"memory": "2Gi"}}
    assert broker["metadata"]["annotations"]["example.com/team"] == "a"  # another manager's field stays
    assert {f["manager"] for f in broker["metadata"]["managedFields"]} >= {apply.FIELD_MANAGER, "kubectl-annotate"}


def test_objects_deleted_or_scaled_by_hand_are_put_back(kube, operator):
    """Item 3: a Service, ConfigMap or budget deleted by hand was never recreated, after
    ``kubectl scale sts --replicas=0`` the Cluster stayed Ready=True, and a template edited by
    hand stayed so."""
    apps, core, policy, _ = _apis(kube)
    create(kube, "Cluster", "drift", {"nameServers": {"replicas": 1}, "brokers": {"groups": 1}})
    sts = ["drift-namesrv", "drift-broker-0"]
    operator.wait("Ready", _settled(kube, "drift", sts))
    service, config = workloads.broker_headless_name("drift", 0), workloads.broker_config_name("drift", 0)
    budget = workloads.brokers_budget_name("drift")
    core.delete_namespaced_service(service, NS)
    core.delete_namespaced_config_map(config, NS)
    policy.delete_namespaced_pod_disruption_budget(budget, NS)
    operator.wait("the Service, ConfigMap and budget recreated",
                  lambda: core.read_namespaced_service(service, NS) and core.read_namespaced_config_map(config, NS)
                  and policy.read_namespaced_pod_disruption_budget(budget, NS))
    assert workloads.CONFIG_FILE in core.read_namespaced_config_map(config, NS).data

    # kubectl scale sts drift-broker-0 --replicas=0, and the controller removes the pod
    apps.patch_namespaced_stateful_set("drift-broker-0", NS, {"spec": {"replicas": 0}}, field_manager="kubectl")
    apps.patch_namespaced_stateful_set_status("drift-broker-0", NS, {"status": {
        "replicas": 0, "readyReplicas": 0, "availableReplicas": 0, "updatedReplicas": 0}})
    cond = operator.wait("replicas put back, not Ready meanwhile",
                         lambda: _sts(kube, "drift-broker-0")["spec"]["replicas"] == 1
                         and (c := condition(get(kube, "Cluster", "drift"), "Ready")).get("status") == "False" and c)
    assert cond["reason"] in ("ReplicasRestored", "WaitingForPods")
    assert get(kube, "Cluster", "drift")["status"]["readyBrokers"] == 0
    events = core.list_namespaced_event(NS).items
    assert any(e.reason == "ReplicasRestored" and e.involved_object.name == "drift" and e.type == "Warning"
               for e in events)
    operator.wait("Ready once the pod is back", _settled(kube, "drift", sts))

    # kubectl set image: the template goes back (the controller rolls the pod twice)
    containers = _sts(kube, "drift-broker-0")["spec"]["template"]["spec"]["containers"]
    image = containers[0]["image"]
    apps.patch_namespaced_stateful_set("drift-broker-0", NS, {"spec": {"template": {"spec": {"containers": [
        {**containers[0], "image": "example.com/other:1"}]}}}}, field_manager="kubectl-set")
    assert _broker(_sts(kube, "drift-broker-0"))["image"] == "example.com/other:1"
    operator.wait("the template put back", _settled(kube, "drift", sts,
                                                    lambda: _broker(_sts(kube, "drift-broker-0"))["image"] == image))


def test_a_storage_change_does_not_hold_back_an_image_change(kube, operator):
    """Item 5: a storage size change with an image change blocked every group, the image never
    rolled. Now the image rolls (name servers, then the group) with the claim templates as they
    are, and the storage change is reported: a Warning Event and Ready=False (ImmutableFieldChange)."""
    create(kube, "Cluster", "grow", {"image": "tidemq:1", "nameServers": {"replicas": 1},
                                     "brokers": {"groups": 1, "storage": {"size": "10Gi"}}})
    sts = ["grow-namesrv", "grow-broker-0"]
    operator.wait("Ready", _settled(kube, "grow", sts))
    _change(kube, "grow", {"image": "tidemq:2", "brokers": {"storage": {"size": "20Gi"}}})
    apps = _apis(kube)[0]

    def rolled() -> bool:
        for n in sts:
            mark_ready(apps, n)
        return _broker(_sts(kube, "grow-broker-0"))["image"] == "tidemq:2"
    operator.wait("the image rolled to the broker group", rolled)
    broker = _sts(kube, "grow-broker-0")
    assert broker["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "10Gi"
    cond = operator.wait("ImmutableFieldChange", lambda: (c := condition(get(kube, "Cluster", "grow"), "Ready"))
                         .get("reason") == "ImmutableFieldChange" and c)
    assert cond["status"] == "False" and "volumeClaimTemplates" in cond["message"]
    events = _apis(kube)[1].list_namespaced_event(NS).items
    assert any(e.reason == "ImmutableFieldChange" and e.involved_object.name == "grow" and e.type == "Warning"
               and "the rest of the change is applied" in e.message for e in events)
