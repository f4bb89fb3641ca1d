"""tidemq.operator.budgets: a Cluster's PodDisruptionBudgets become exactly the desired ones, against
kmock's Kubernetes emulator through the kubernetes client (the operator's own client code)."""

from __future__ import annotations

import copy

import pytest

kubernetes = pytest.importorskip("kubernetes")
pytest.importorskip("kmock")

from tests.support.kube import ThreadedEmulator, status_emulator  # noqa: E402
from tidemq.operator import budgets  # noqa: E402
from tidemq.operator import workloads as w  # noqa: E402

NS = "mq"
UID = "8d4c2a8e-0d1f-4c55-9f0e-2b7f3a1c9d10"
pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")


@pytest.fixture
def policy(monkeypatch):
    """A PolicyV1Api on an emulator; the kubernetes client's default configuration points there
    too, as budgets.reconcile builds its client from it (as in a pod)."""
    def build():
        emu = status_emulator()()
        emu.resources.load_bundled()
        return emu

    emu = ThreadedEmulator(build, name="kmock-budgets").start()
    cfg = kubernetes.client.Configuration()
    cfg.host = emu.url
    monkeypatch.setattr(kubernetes.client.Configuration, "_default", cfg)
    yield kubernetes.client.PolicyV1Api(kubernetes.client.ApiClient(cfg))
    emu.stop()


def _cluster(**brokers) -> dict:
    return {"apiVersion": "tidemq.io/v1alpha1", "kind": "Cluster",
            "metadata": {"name": "demo", "namespace": NS, "uid": UID},
            "spec": {"brokers": {"groups": 2, **brokers}}}


def _names(policy) -> set[str]:
    return {p.metadata.name for p in policy.list_namespaced_pod_disruption_budget(NS).items}


def _legacy_group_budget(group: int, uid: str = UID, instance: str = "demo") -> dict:
    """A budget per lone broker group, as operators before issue 18 made them."""
    pdb = copy.deepcopy(next(o for o in w.desired_objects(_cluster(replicas=3))
                             if o["kind"] == "PodDisruptionBudget" and o["metadata"]["name"] == f"demo-broker-{group}"))
    pdb["spec"]["maxUnavailable"] = 1
    pdb["metadata"]["ownerReferences"][0]["uid"] = uid
    pdb["metadata"]["labels"]["app.kubernetes.io/instance"] = instance
    pdb["metadata"]["annotations"][w.SPEC_HASH_ANNOTATION] = "old"
    return pdb


def test_budgets_of_an_older_operator_give_way_to_one_over_every_lone_broker(policy):
    for g in (0, 1):
        policy.create_namespaced_pod_disruption_budget(NS, _legacy_group_budget(g))
    # another Cluster's and a hand-made budget in the namespace stay
    policy.create_namespaced_pod_disruption_budget(NS, _legacy_group_budget(0, uid="someone-else") | {
        "metadata": {**_legacy_group_budget(0, uid="someone-else")["metadata"], "name": "other-broker-0"}})
    policy.create_namespaced_pod_disruption_budget(NS, {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "mine", "namespace": NS},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "mine"}}}})
    desired = w.desired_objects(_cluster())
    done = budgets.reconcile(desired, NS, "demo", UID)
    assert done == ["PodDisruptionBudget/demo-namesrv", "PodDisruptionBudget/demo-broker",
                    "deleted PodDisruptionBudget/demo-broker-0", "deleted PodDisruptionBudget/demo-broker-1"]
    assert _names(policy) == {"demo-namesrv", "demo-broker", "other-broker-0", "mine"}
    cluster_wide = policy.read_namespaced_pod_disruption_budget("demo-broker", NS)
    assert cluster_wide.spec.max_unavailable == 1
    assert cluster_wide.spec.selector.match_labels == {
        "app.kubernetes.io/name": "tidemq", "app.kubernetes.io/instance": "demo", "app.kubernetes.io/component": "broker"}
    assert budgets.reconcile(desired, NS, "demo", UID) == []  # in place: nothing written


def test_replicas_one_to_three_swaps_the_cluster_wide_budget_for_one_per_group(policy):
    budgets.reconcile(w.desired_objects(_cluster()), NS, "demo", UID)
    assert _names(policy) == {"demo-namesrv", "demo-broker"}
    done = budgets.reconcile(w.desired_objects(_cluster(replicas=3, minInSync=1)), NS, "demo", UID)
    assert done == ["PodDisruptionBudget/demo-broker-0", "PodDisruptionBudget/demo-broker-1",
                    "deleted PodDisruptionBudget/demo-broker"]
    assert _names(policy) == {"demo-namesrv", "demo-broker-0", "demo-broker-1"}
    assert policy.read_namespaced_pod_disruption_budget("demo-broker-1", NS).spec.max_unavailable == 2
    # minInSync 1 -> 2 changes the budget (patched, not recreated)
    done = budgets.reconcile(w.desired_objects(_cluster(replicas=3, minInSync=2)), NS, "demo", UID)
    assert done == ["PodDisruptionBudget/demo-broker-0", "PodDisruptionBudget/demo-broker-1"]
    assert policy.read_namespaced_pod_disruption_budget("demo-broker-0", NS).spec.max_unavailable == 1


def test_a_deleted_budget_is_recreated(policy):
    desired = w.desired_objects(_cluster())
    budgets.reconcile(desired, NS, "demo", UID)
    policy.delete_namespaced_pod_disruption_budget("demo-broker", NS)
    assert budgets.reconcile(desired, NS, "demo", UID) == ["PodDisruptionBudget/demo-broker"]
    assert "demo-broker" in _names(policy)


def test_the_decision_alone():
    desired = w.desired_objects(_cluster())
    live = [o for o in desired if o["kind"] == "PodDisruptionBudget"]
    assert budgets.budget_changes(desired, live, "demo", UID) == budgets.BudgetChanges((), ())
    stale = _legacy_group_budget(1)
    unlabelled = copy.deepcopy(stale)
    unlabelled["metadata"]["labels"].pop("app.kubernetes.io/managed-by")
    unlabelled["metadata"]["name"] = "demo-broker-9"
    changes = budgets.budget_changes(desired, [*live, stale, unlabelled], "demo", UID)
    assert changes.delete == ("demo-broker-1",)  # never one the operator did not make
    assert budgets.budget_changes(desired, [*live, stale], "demo", UID, keep={"demo-broker-1"}).delete == ()
