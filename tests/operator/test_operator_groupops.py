"""The pure parts of tidemq.operator.groupops: pods as the API serves them, what status.groups and
the ReplicasInSync condition say of a pass. (The I/O is covered by test_operator_integration.py,
against the API emulator and real replicas.)"""

from __future__ import annotations

from tidemq.operator import groupops
from tidemq.operator.grouproll import Action, GroupHealth, Health, RollStep


def pod(name: str, index: str | None, revision: str = "r1", ready: bool = True, ip: str = "10.0.0.7",
        deleting: bool = False) -> dict:
    labels = {"controller-revision-hash": revision}
    if index is not None:
        labels["apps.kubernetes.io/pod-index"] = index
    md = {"name": name, "labels": labels}
    if deleting:
        md["deletionTimestamp"] = "2026-11-26T04:00:00Z"
    return {"metadata": md, "status": {"podIP": ip, "conditions": [
        {"type": "Ready", "status": "True" if ready else "False"}]}}


def test_pods_are_read_by_ordinal_readiness_and_revision():
    assert groupops.parse_pod(pod("demo-broker-0-2", "2")) == groupops.Pod(2, True, "r1", "10.0.0.7")
    assert groupops.parse_pod(pod("demo-broker-0-1", None)).ordinal == 1  # before 1.28: the name's suffix
    assert groupops.parse_pod(pod("demo-broker-0-1", "1", deleting=True)).ready is False  # going away
    assert groupops.parse_pod(pod("stray", None)) is None
    views = groupops.pod_views([groupops.Pod(0, True, "r2", ""), groupops.Pod(1, False, "r1", "")], "r2")
    assert (views[0].updated, views[1].updated, views[1].ready) == (True, False, False)
    assert not any(v.updated for v in groupops.pod_views([groupops.Pod(0, True, "", "")], None).values())


def test_status_and_condition_of_a_pass():
    ok = GroupHealth("demo-broker-0", Health.IN_SYNC, 0, 4, (0, 1, 2), 2, "sync")
    electing = GroupHealth("demo-broker-1", Health.NO_MASTER, message="no replica is master")
    below = GroupHealth("demo-broker-2", Health.BELOW_MIN_IN_SYNC, 1, 2, (1,), 2, "sync")
    waiting = RollStep(Action.WAIT, "CatchingUp", "replica 2 is back but not in sync yet")
    repl = groupops.ClusterReplication([groupops.GroupReport(ok.name, ok, RollStep(Action.IDLE)),
                                        groupops.GroupReport(electing.name, electing, waiting),
                                        groupops.GroupReport(below.name, below, waiting, error="x failed")])
    groups, summary = repl.status()
    assert summary == "1/3 groups in sync"
    assert "message" not in groups[0]
    assert groups[1]["message"] == "no replica is master; replica 2 is back but not in sync yet"
    assert groups[2]["message"] == "x failed"  # the failed step says more than the plan
    ctype, ok_, reason, message = repl.condition()
    assert (ctype, ok_, reason) == ("ReplicasInSync", False, "NoMaster")  # the worst group names it
    assert "demo-broker-2: BelowMinInSync" in message
    assert repl.masters == {"demo-broker-0": 0, "demo-broker-1": None, "demo-broker-2": 1}
    assert repl.blocked == []
    fine = groupops.ClusterReplication([groupops.GroupReport(ok.name, ok, RollStep(Action.IDLE))])
    assert fine.condition() == ("ReplicasInSync", True, "InSync", "1/1 groups in sync")
