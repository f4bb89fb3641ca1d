"""tidemq.operator.grouproll: a replicated group's health from its replicas' runtime info, and the
pure plan of its rolling restart (followers first, the master after a switchover, never below
minInSync). A model of the StatefulSet controller and the group drives the planner to the end."""

from __future__ import annotations

import pytest

from tidemq.operator.grouproll import (
    Action,
    GroupHealth,
    Health,
    PodView,
    group_health,
    plan_roll,
    plan_scale_down,
    replica_view,
    summary,
)


def info(rid: int, role: str = "follower", epoch: int = 3, master: int | None = 0, in_sync: str = "0,1,2",
         lag: str = "", min_in_sync: int = 2) -> dict[str, str]:
    return {"haRole": role, "haReplicaId": str(rid), "haEpoch": str(epoch),
            "haMaster": "" if master is None else str(master), "haInSync": in_sync,
            "haMinInSync": str(min_in_sync), "haReplication": "sync", "haHighWater": "4096",
            "haLogEnd": "4096", "haFollowerLag": lag, "haFailovers": "1", "haLastFailoverSeconds": "2.5",
            "haSwitchovers": "0", "brokerVersionDesc": "V4_9_4"}


# -- health --------------------------------------------------------------------------------------

def test_replica_view_parses_the_ha_keys_and_ignores_plain_brokers():
    v = replica_view(info(0, "master", lag="1:0,2:4096"))
    assert v is not None
    assert (v.replica_id, v.role, v.epoch, v.master, v.in_sync) == (0, "master", 3, 0, (0, 1, 2))
    assert v.follower_lag == ((1, 0), (2, 4096)) and v.last_failover_seconds == 2.5
    assert replica_view({"brokerVersionDesc": "V4_9_4"}) is None
    none = replica_view({**info(1, "none", master=None), "haLastFailoverSeconds": ""})
    assert none is not None and none.master is None and none.last_failover_seconds is None


@pytest.mark.parametrize("key, value", [("haEpoch", "x"), ("haInSync", "0;1"), ("haFollowerLag", "1=2"),
                                        ("haLastFailoverSeconds", "soon")])
def test_replica_view_names_the_bad_key(key, value):
    with pytest.raises(ValueError, match=key):
        replica_view({**info(0, "master"), key: value})


def test_health_comes_from_the_master_of_the_highest_epoch():
    views = {0: replica_view(info(0, "master", epoch=2, in_sync="0,1,2")),  # stale, lease lapsed
             1: replica_view(info(1, "master", epoch=3, master=1, in_sync="1,2", lag="2:128")),
             2: None}
    h = group_health("demo-broker-0", 3, views, {2: "connection refused"})
    assert (h.health, h.master, h.epoch, h.in_sync, h.lag) == (Health.UNDER_REPLICATED, 1, 3, (1, 2), ((2, 128),))
    assert "replica 2: connection refused" in h.message
    status = h.status()
    assert status == {"name": "demo-broker-0", "health": "UnderReplicated", "master": 1, "epoch": 3,
                      "inSync": [1, 2], "minInSync": 2, "replication": "sync",
                      "lagBytes": [{"replica": 2, "bytes": 128}], "failovers": 1, "lastFailoverSeconds": 2.5,
                      "message": "replica 2: connection refused"}


def test_health_states():
    master = replica_view(info(0, "master"))
    assert group_health("g", 3, {0: master}).health is Health.IN_SYNC
    alone = replica_view(info(0, "master", in_sync="0"))
    assert group_health("g", 3, {0: alone}).health is Health.BELOW_MIN_IN_SYNC
    electing = group_health("g", 3, {1: replica_view(info(1, "none", master=None))})
    assert electing.health is Health.NO_MASTER and electing.status()["health"] == "NoMaster"
    assert "master" not in electing.status()
    unknown = group_health("g", 3, {0: None, 1: None}, {0: "timed out"})
    assert unknown.health is Health.UNKNOWN and "timed out" in unknown.message
    groups = [group_health("a", 3, {0: master}), electing]
    assert summary(groups) == "1/2 groups in sync"


# -- rolling: single steps ---------------------------------------------------------------------------

def pods(updated: set[int] = frozenset(), not_ready: set[int] = frozenset(), n: int = 3) -> dict[int, PodView]:
    return {o: PodView(o, o not in not_ready, o in updated) for o in range(n)}


def health(master: int | None = 0, in_sync: tuple[int, ...] = (0, 1, 2), min_in_sync: int = 2,
           lag: tuple[tuple[int, int], ...] = ()) -> GroupHealth:
    if master is None:
        return GroupHealth("g", Health.NO_MASTER, message="no replica is master")
    return GroupHealth("g", Health.IN_SYNC, master, 3, in_sync, min_in_sync, "sync", lag)


def test_followers_go_first_from_the_highest_ordinal():
    step = plan_roll(3, 3, pods(), health(master=0))
    assert (step.action, step.partition) == (Action.PARTITION, 2)


def test_the_master_hands_over_before_its_restart_preferring_an_updated_replica():
    step = plan_roll(3, 1, pods(updated={1, 2}), health(master=0, lag=((1, 512), (2, 0))))
    assert (step.action, step.switch_from, step.to) == (Action.SWITCHOVER, 0, 2)  # updated, least lag
    first = plan_roll(3, 3, pods(), health(master=1))  # before the first restart
    assert (first.action, first.switch_from, first.to) == (Action.SWITCHOVER, 1, 0)  # 0 rolls last
    unready = plan_roll(3, 3, pods(not_ready={0}), health(master=2))  # 0 cannot take it: at its turn
    assert (unready.action, unready.switch_from, unready.to) == (Action.SWITCHOVER, 2, 1)
    after = plan_roll(3, 3, pods(), health(master=0))
    assert (after.action, after.partition) == (Action.PARTITION, 2)


def test_waits_while_a_replaced_pod_restarts_or_catches_up():
    restarting = plan_roll(3, 2, pods(updated={2}, not_ready={2}), health())
    assert (restarting.action, restarting.reason) == (Action.WAIT, "RestartingReplica")
    old_pod = plan_roll(3, 2, pods(), health())  # the controller has not replaced it yet
    assert old_pod.action is Action.WAIT
    behind = plan_roll(3, 2, pods(updated={2}), health(in_sync=(0, 1)))
    assert (behind.action, behind.reason) == (Action.WAIT, "CatchingUp")
    assert "replica 2" in behind.message


def test_never_below_min_in_sync():
    # replica 1 is out of sync: restarting in-sync replica 2 would leave {0} < 2
    step = plan_roll(3, 3, pods(), health(in_sync=(0, 2)))
    assert (step.action, step.reason) == (Action.BLOCKED, "BelowMinInSync")
    assert "would leave 1 replica(s) in sync (0)" in step.message and "tidemq.io/roll-below-min-in-sync" in step.message
    # a replica already out of sync may be restarted: it takes nothing away
    assert plan_roll(3, 3, pods(), health(in_sync=(0, 1))).partition == 2
    # replicas == minInSync: blocked unless the Cluster accepts refused writes
    assert plan_roll(2, 2, pods(n=2), health(in_sync=(0, 1), min_in_sync=2)).action is Action.BLOCKED
    forced = plan_roll(2, 2, pods(n=2), health(in_sync=(0, 1), min_in_sync=2), allow_below_min=True)
    assert (forced.action, forced.partition) == (Action.PARTITION, 1)


def test_no_master_restarts_only_a_pod_that_is_not_ready():
    assert plan_roll(3, 3, pods(), health(master=None)).action is Action.WAIT
    step = plan_roll(3, 3, pods(not_ready={2}), health(master=None))
    assert (step.action, step.partition) == (Action.PARTITION, 2)


def test_no_switchover_target_is_blocked():
    step = plan_roll(3, 1, pods(updated={1, 2}, not_ready=set()), health(master=0, in_sync=(0,), min_in_sync=1))
    assert (step.action, step.reason) == (Action.WAIT, "CatchingUp")  # 1 and 2 must rejoin first
    # replica 1 is in sync but not ready (the master's view lags its pod): nobody to hand over to
    lone = plan_roll(3, 3, pods(not_ready={0, 1}), health(master=2, in_sync=(1, 2), min_in_sync=1))
    assert (lone.action, lone.reason) == (Action.BLOCKED, "NoSwitchoverTarget")
    only = plan_roll(3, 3, pods(not_ready={0, 1}), health(master=2, in_sync=(2,), min_in_sync=1))
    assert (only.action, only.reason) == (Action.BLOCKED, "BelowMinInSync")


def test_pods_already_on_the_new_revision_are_released_without_a_restart():
    assert plan_roll(3, 3, pods(updated={0, 1, 2}), health()).partition == 0
    assert plan_roll(3, 0, pods(updated={0, 1, 2}), health()).action is Action.IDLE
    assert plan_roll(3, 3, pods(updated={2}), health()).partition == 2  # scaled up on the new one
    missing = plan_roll(3, 3, {0: PodView(0, True, False)}, health())
    assert (missing.action, missing.reason) == (Action.WAIT, "WaitingForPods")


def test_scale_down_moves_the_master_onto_a_kept_replica_first():
    step = plan_scale_down(2, pods(), health(master=2))
    assert (step.action, step.switch_from, step.to) == (Action.SWITCHOVER, 2, 0)
    assert plan_scale_down(2, pods(), health(master=1)).action is Action.IDLE
    short = plan_scale_down(2, pods(), health(master=0, in_sync=(0, 2)))
    assert (short.action, short.reason) == (Action.BLOCKED, "BelowMinInSync")
    assert plan_scale_down(2, pods(), health(master=None)).action is Action.WAIT


# -- rolling: the whole way, against a model -----------------------------------------------------------

class Group:
    """The StatefulSet controller and the replicas, as far as the planner sees them: lowering the
    partition replaces the pod at that ordinal (it leaves the in-sync set, and when it was master
    the group fails over); the pod comes back on the new revision and rejoins after a pass."""

    def __init__(self, replicas: int, master: int, min_in_sync: int) -> None:
        self.replicas, self.master, self.min = replicas, master, min_in_sync
        self.partition = replicas
        self.updated: set[int] = set()
        self.in_sync = set(range(replicas))
        self.down: set[int] = set()
        self.restarted: list[int] = []
        self.switchovers: list[tuple[int, int]] = []
        self.lowest_in_sync = replicas
        self.failovers = 0

    def pods(self) -> dict[int, PodView]:
        return {o: PodView(o, o not in self.down, o in self.updated) for o in range(self.replicas)}

    def health(self) -> GroupHealth:
        return GroupHealth("g", Health.IN_SYNC, self.master, 1, tuple(sorted(self.in_sync)), self.min, "sync")

    def tick(self) -> None:
        for o in list(self.down):  # a replaced pod is back and catches up within a pass
            self.down.discard(o)
            self.in_sync.add(o)

    def apply(self, step) -> None:
        if step.action is Action.SWITCHOVER:
            assert step.switch_from == self.master and step.to in self.in_sync
            self.switchovers.append((step.switch_from, step.to))
            self.master = step.to
        elif step.action is Action.PARTITION:
            self.partition = step.partition
            for o in range(step.partition, self.replicas):
                if o not in self.updated:
                    self.updated.add(o)
                    self.restarted.append(o)
                    self.down.add(o)
                    self.in_sync.discard(o)
                    if o == self.master:
                        self.failovers += 1
        self.lowest_in_sync = min(self.lowest_in_sync, len(self.in_sync))


@pytest.mark.parametrize("replicas, master, min_in_sync", [(3, 0, 2), (3, 2, 2), (3, 1, 1), (5, 3, 2), (2, 1, 1)])
def test_a_whole_roll_restarts_followers_first_and_the_master_last_after_a_switchover(replicas, master, min_in_sync):
    g = Group(replicas, master, min_in_sync)
    for _ in range(50):
        step = plan_roll(g.replicas, g.partition, g.pods(), g.health())
        assert step.action is not Action.BLOCKED, step
        if step.action is Action.IDLE:
            break
        g.apply(step)
        g.tick()
    else:
        pytest.fail("the roll did not finish in 50 passes")
    assert g.updated == set(range(replicas)) and g.partition == 0
    assert sorted(g.restarted) == list(range(replicas))  # each pod exactly once
    assert g.failovers == 0  # the master never restarted while master
    assert g.lowest_in_sync >= min_in_sync
    assert g.restarted[-1] == g.switchovers[-1][0] == 0  # the last restart: the replica that handed over
    assert len(g.switchovers) == (1 if master == 0 else 2)
