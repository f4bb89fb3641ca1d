"""tidemq.operator.apply: server-side apply of a Cluster's objects (issue 18, item 2), through the
operator's own client code against kmock's emulator with field management (tests.support.ssa).

With create-or-merge-patch, a field dropped from the desired object stayed on the live one: a
Cluster that no longer uses ACL, TLS, a CPU limit or metrics kept their volumes, mounts, limit and
scrape annotations (and pods could not start once the ACL Secret was deleted). With SSA the fields
the operator stops sending go, and fields other managers set stay.
"""

from __future__ import annotations

import copy
import json

import pytest

kubernetes = pytest.importorskip("kubernetes")
pytest.importorskip("kmock")

from tests.support import ssa  # noqa: E402
from tests.support.kube import ThreadedEmulator, status_emulator  # noqa: E402
from tidemq.operator import apply  # noqa: E402
from tidemq.operator import workloads as w  # noqa: E402

NS = "mq"
UID = "5b0c7f4e-3a8d-4e0a-9c51-6d2e8f1a7b30"
pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")


@pytest.fixture
def api(monkeypatch):
    """An ApiClient on an emulator; the client's default configuration points there too, as
    apply.apply_objects builds its client from it (as in a pod)."""
    def build():
        emu = status_emulator()()
        emu.resources.load_bundled()
        return emu

    emu = ThreadedEmulator(build, name="kmock-apply").start()
    cfg = kubernetes.client.Configuration()
    cfg.host = emu.url
    monkeypatch.setattr(kubernetes.client.Configuration, "_default", cfg)
    yield kubernetes.client.ApiClient(cfg)
    emu.stop()


def _cluster(**spec) -> dict:
    return {"apiVersion": "tidemq.io/v1alpha1", "kind": "Cluster",
            "metadata": {"name": "demo", "namespace": NS, "uid": UID},
            "spec": {"brokers": {"groups": 1}, **spec}}


FULL = {"brokers": {"groups": 1, "acl": {"secretName": "demo-acl"},
                    "resources": {"limits": {"cpu": "2", "memory": "2Gi"}}},
        "tls": {"mode": "enforcing", "secretName": "demo-tls"},
        "metrics": {"enabled": True}}
PLAIN = {"brokers": {"groups": 1, "resources": {"limits": {"memory": "2Gi"}}},
         "metrics": {"enabled": False}}


def _sts(api, name: str = "demo-broker-0") -> dict:
    apps = kubernetes.client.AppsV1Api(api)
    return api.sanitize_for_serialization(apps.read_namespaced_stateful_set(name, NS))


def _broker(sts: dict) -> dict:
    return sts["spec"]["template"]["spec"]["containers"][0]


def test_fields_dropped_from_the_cluster_leave_the_statefulset(api):
    apply.apply_objects(w.desired_objects(_cluster(**FULL)), NS)
    before = _sts(api)
    assert {"acl", "tls"} <= {v["name"] for v in before["spec"]["template"]["spec"]["volumes"]}
    assert _broker(before)["resources"]["limits"]["cpu"] == "2"
    assert "prometheus.io/scrape" in before["spec"]["template"]["metadata"]["annotations"]

    apply.apply_objects(w.desired_objects(_cluster(**PLAIN)), NS)
    after = _sts(api)
    pod = after["spec"]["template"]
    assert {v["name"] for v in pod["spec"]["volumes"]} == {"config", "tmp"}
    assert {m["name"] for m in _broker(after)["volumeMounts"]} == {"data", "config", "tmp"}
    assert _broker(after)["resources"] == {"limits": {"memory": "2Gi"}}
    assert not any(k.startswith("prometheus.io/") for k in pod["metadata"]["annotations"])
    assert not any(a in _broker(after)["args"] for a in ("--acl-file", "--tls-mode"))
    # what the operator now sends is exactly what it owns
    owned = ssa.managers_of(after)[apply.FIELD_MANAGER]
    assert owned[0] == "Apply"
    assert ssa.field_paths(next(o for o in w.desired_objects(_cluster(**PLAIN))
                                if o["metadata"]["name"] == "demo-broker-0")) == owned[1]


def test_fields_other_managers_set_survive_an_apply(api):
    apps = kubernetes.client.AppsV1Api(api)
    apply.apply_objects(w.desired_objects(_cluster(**FULL)), NS)
    # kubectl annotate (a merge patch: another manager), and the controller's status
    apps.patch_namespaced_stateful_set("demo-broker-0", NS, {"metadata": {"annotations": {"example.com/owner": "team-a"}}},
                                       field_manager="kubectl-annotate")
    apps.patch_namespaced_stateful_set_status("demo-broker-0", NS, {"status": {"replicas": 1, "readyReplicas": 1}})
    apply.apply_objects(w.desired_objects(_cluster(**PLAIN)), NS)
    after = _sts(api)
    assert after["metadata"]["annotations"]["example.com/owner"] == "team-a"
    assert after["status"]["readyReplicas"] == 1
    assert ssa.managers_of(after)["kubectl-annotate"][1] == {("metadata", "annotations", "example.com/owner")}


def test_a_field_another_manager_changed_is_taken_back(api):
    """kubectl scale: the replicas field moves to another manager; the operator's forced apply
    takes it back (without force the API server refuses the apply with a conflict)."""
    apps = kubernetes.client.AppsV1Api(api)
    desired = w.desired_objects(_cluster(**PLAIN))
    apply.apply_objects(desired, NS)
    apps.patch_namespaced_stateful_set("demo-broker-0", NS, {"spec": {"replicas": 0}}, field_manager="kubectl")
    sts = copy.deepcopy(next(o for o in desired if o["metadata"]["name"] == "demo-broker-0"))
    with pytest.raises(kubernetes.client.ApiException) as info:
        apps.patch_namespaced_stateful_set("demo-broker-0", NS, sts, field_manager=apply.FIELD_MANAGER,
                                           _content_type=apply.APPLY_CONTENT_TYPE)
    assert info.value.status == 409 and "spec.replicas" in str(info.value.body)
    apply.apply_objects(desired, NS)
    assert _sts(api)["spec"]["replicas"] == 1


def test_an_unchanged_apply_changes_nothing(api):
    desired = w.desired_objects(_cluster(**FULL))
    assert apply.apply_objects(desired, NS)[-1] == "StatefulSet/demo-broker-0"
    first = _sts(api)
    apply.apply_objects(desired, NS)
    again = _sts(api)
    assert again == first and again["metadata"]["generation"] == 1


def test_an_object_of_an_unknown_api_is_refused_with_a_sentence(api):
    with pytest.raises(Exception, match="applies only"):
        apply.apply_objects([{"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "x"}}], NS)


def test_fields_an_older_operator_set_go_after_the_upgrade(api):
    """The operator before server-side apply created its objects with a plain POST: the API
    server recorded their fields under the client's Update manager (OpenAPI-Generator), and an
    apply never removes fields another manager owns. The first apply takes them over."""
    apps = kubernetes.client.AppsV1Api(api)
    old = next(o for o in w.desired_objects(_cluster(**FULL)) if o["metadata"]["name"] == "demo-broker-0")
    legacy = {"manager": "OpenAPI-Generator", "operation": "Update", "apiVersion": "apps/v1",
              "fieldsType": "FieldsV1", "fieldsV1": ssa.encode(ssa.field_paths(old))}
    controller = {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "apps/v1",
                  "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:replicas": {}}}, "subresource": "status"}
    apps.create_namespaced_stateful_set(NS, {**old, "metadata": {**old["metadata"], "managedFields": [legacy, controller]},
                                             "status": {"replicas": 1}})

    apply.apply_objects(w.desired_objects(_cluster(**PLAIN)), NS)
    after = _sts(api)
    assert {v["name"] for v in after["spec"]["template"]["spec"]["volumes"]} == {"config", "tmp"}
    assert _broker(after)["resources"] == {"limits": {"memory": "2Gi"}}
    assert not any(k.startswith("prometheus.io/") for k in after["spec"]["template"]["metadata"]["annotations"])
    managers = {f["manager"]: f for f in after["metadata"]["managedFields"]}
    assert set(managers) == {apply.FIELD_MANAGER, "kube-controller-manager"}  # the status writer's stays
    assert after["status"]["replicas"] == 1


def test_adopting_legacy_fields_is_pure_and_needs_an_apply_entry():
    ours = {"manager": apply.FIELD_MANAGER, "operation": "Apply", "fieldsV1": {"f:spec": {"f:replicas": {}}}}
    legacy = {"manager": "OpenAPI-Generator", "operation": "Update", "fieldsV1": {"f:spec": {"f:x": {}}}}
    status = {"manager": "OpenAPI-Generator", "operation": "Update", "subresource": "status", "fieldsV1": {"f:status": {}}}
    assert apply.adopt_legacy_fields([legacy]) is None  # not applied yet: nothing to move into
    assert apply.adopt_legacy_fields([ours, status]) is None  # status writes are not the operator's fields
    assert apply.adopt_legacy_fields([ours, legacy, status]) == [
        {**ours, "fieldsV1": {"f:spec": {"f:replicas": {}, "f:x": {}}}}, status]


def test_refresh_applies_only_what_is_gone_or_differs(api):
    """Drift repair (issue 18, item 3): each pass compares the objects in step with the spec with
    the live ones and applies only those deleted or changed by hand (SSA would make the others
    no-ops, but each would still be a request per object per pass)."""
    core, apps = kubernetes.client.CoreV1Api(api), kubernetes.client.AppsV1Api(api)
    desired = [o for o in w.desired_objects(_cluster(**PLAIN)) if o["kind"] != "PodDisruptionBudget"]  # budgets.py's
    apply.apply_objects(desired, NS)

    def live_sts() -> dict:  # as the pass reads them: raw JSON
        return {o["metadata"]["name"]: json.loads(apps.read_namespaced_stateful_set(
            o["metadata"]["name"], NS, _preload_content=False).data) for o in desired if o["kind"] == "StatefulSet"}

    # what the API server adds (defaults, status, other managers' fields) is no drift
    apps.patch_namespaced_stateful_set_status("demo-broker-0", NS, {"status": {"replicas": 1}})
    core.patch_namespaced_service("demo-broker-0-headless", NS, {"metadata": {"annotations": {"example.com/x": "y"}}})
    assert apply.refresh(desired, NS, live_sts()) == []
    core.delete_namespaced_service("demo-broker-0-headless", NS)
    core.patch_namespaced_config_map("demo-broker-0-config", NS, {"data": {w.CONFIG_FILE: "edited by hand"}})
    apps.patch_namespaced_stateful_set("demo-broker-0", NS, {"spec": {"template": {"metadata": {"annotations": {
        w.CONFIG_HASH_ANNOTATION: "edited"}}}}})
    assert sorted(apply.refresh(desired, NS, live_sts())) == [
        "ConfigMap/demo-broker-0-config", "Service/demo-broker-0-headless", "StatefulSet/demo-broker-0"]
    assert core.read_namespaced_config_map("demo-broker-0-config", NS).data[w.CONFIG_FILE] != "edited by hand"
    assert apply.refresh(desired, NS, live_sts()) == []


def test_covers_is_a_subset_match_with_lists_item_by_item():
    assert apply.covers({"a": 1, "b": {"c": 2, "d": 3}}, {"b": {"c": 2}})
    assert not apply.covers({"b": {"c": 2}}, {"b": {"c": 3}})
    assert apply.covers([{"name": "x", "extra": 1}], [{"name": "x"}])
    assert not apply.covers([{"name": "x"}, {"name": "y"}], [{"name": "x"}])  # an item added by hand
    assert not apply.covers({}, {"a": {}})
