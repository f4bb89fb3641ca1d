"""Pure operator logic: Topic/ConsumerGroup spec mapping, drain detection, the shrink state
machine, conditions and metrics."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.errors import ConfigError
from tidemq.operator.groups import GroupSpec, group_spec
from tidemq.operator.handlers import set_condition
from tidemq.operator.metrics import OperatorMetrics
from tidemq.operator.topics import (
    ROUTE_GRACE,
    Action,
    BrokerQueues,
    InvalidSpec,
    QuietPeriod,
    Step,
    TopicSpec,
    format_since,
    hold_for_routes,
    perm_name,
    plan,
    readiness,
    since_from_status,
    topic_spec,
    undrained_queues,
)

REF = {"clusterRef": {"name": "c1"}}


def spec(read: int = 8, write: int = 8, perm: int = 6) -> TopicSpec:
    return TopicSpec("c1", "T", read, write, perm, False, "NORMAL")


# spec mapping -----------------------------------------------------------------------------------
def test_defaults_follow_metadata_name_and_rocketmq_defaults():
    s = topic_spec("orders", REF)
    assert s == TopicSpec("c1", "orders", 8, 8, 6, False, "NORMAL")


def test_topic_name_overrides_metadata_name_and_allows_rocketmq_characters():
    s = topic_spec("orders-k8s", {**REF, "topicName": "Orders_V2%x|y"})
    assert s.topic_name == "Orders_V2%x|y"


@pytest.mark.parametrize("perm,value", [("R", 4), ("W", 2), ("RW", 6)])
def test_perm_names(perm, value):
    s = topic_spec("t", {**REF, "perm": perm})
    assert s.perm == value and perm_name(value) == perm


def test_fifo_implies_order_and_explicit_order_is_kept():
    assert topic_spec("t", {**REF, "messageType": "FIFO"}).order is True
    assert topic_spec("t", {**REF, "order": True}).order is True
    assert topic_spec("t", {**REF, "messageType": "DELAY"}).order is False


def test_explicit_counts():
    s = topic_spec("t", {**REF, "readQueueNums": 3, "writeQueueNums": 2})
    assert (s.read_queues, s.write_queues) == (3, 2)


@pytest.mark.parametrize("bad,fragment", [
    ({"writeQueueNums": 0}, "writeQueueNums"),
    ({"readQueueNums": 1025}, "readQueueNums"),
    ({"writeQueueNums": "8"}, "writeQueueNums"),
    ({"writeQueueNums": True}, "writeQueueNums"),
    ({"perm": "X"}, "perm"),
    ({"messageType": "STREAM"}, "messageType"),
    ({"order": "yes"}, "order"),
    ({"order": True, "messageType": "DELAY"}, "order"),
    ({"topicName": "a b"}, "' '"),
    ({"topicName": "x" * 128}, "longer"),
])
def test_invalid_topic_specs_name_the_field(bad, fragment):
    with pytest.raises(InvalidSpec, match=fragment.replace("|", r"\|")):
        topic_spec("t", {**REF, **bad})


def test_cluster_ref_is_required():
    with pytest.raises(InvalidSpec, match="clusterRef"):
        topic_spec("t", {})
    with pytest.raises(InvalidSpec, match="clusterRef"):
        group_spec("g", {"clusterRef": {}})


def test_group_defaults_match_rocketmq():
    g = group_spec("billing", REF)
    assert g == GroupSpec("c1", "billing", True, True, 16, 1, True)
    assert g.admin_kwargs() == {"consume_enable": True, "consume_broadcast_enable": True,
                                "retry_max_times": 16, "retry_queue_nums": 1,
                                "consume_from_min_enable": True}


def test_group_fields_map():
    g = group_spec("k8s-name", {**REF, "groupName": "CID_billing", "consumeEnable": False,
                                "consumeBroadcastEnable": False, "retryMaxTimes": 3,
                                "retryQueueNums": 2, "consumeFromMinEnable": False})
    assert g == GroupSpec("c1", "CID_billing", False, False, 3, 2, False)


@pytest.mark.parametrize("bad", [{"retryMaxTimes": "3"}, {"retryQueueNums": -1},
                                 {"consumeEnable": "no"}, {"groupName": "a/b"}])
def test_invalid_group_specs(bad):
    with pytest.raises(InvalidSpec):
        group_spec("g", {**REF, **bad})


# drain detection --------------------------------------------------------------------------------
def test_empty_queues_are_drained_even_without_groups():
    assert undrained_queues(range(2, 4), {2: 0, 3: 5}, {2: 0, 3: 5}, {}) == ()


def test_retained_messages_without_any_group_are_undrained():
    assert undrained_queues(range(2, 4), {}, {2: 3, 3: 0}, {}) == (2,)


def test_every_group_must_reach_the_max_offset():
    committed = {"a": {2: 3, 3: 7}, "b": {2: 3, 3: 6}}
    assert undrained_queues(range(2, 4), {}, {2: 3, 3: 7}, committed) == (3,)
    committed["b"][3] = 7
    assert undrained_queues(range(2, 4), {}, {2: 3, 3: 7}, committed) == ()


def test_a_group_missing_a_queue_has_not_consumed_it():
    assert undrained_queues(range(1, 2), {}, {1: 4}, {"a": {0: 9}}) == (1,)


# the shrink state machine ----------------------------------------------------------------------
def test_absent_topic_is_created_with_desired_counts():
    step = plan(spec(4, 4), None)
    assert (step.action, step.read, step.write, step.perm) == (Action.APPLY, 4, 4, 6)
    assert step.writes and not step.is_draining


def test_matching_topic_is_ready():
    step = plan(spec(8, 8), BrokerQueues(8, 8, 6))
    assert step.action is Action.READY and not step.writes


def test_growing_is_immediate():
    step = plan(spec(16, 12), BrokerQueues(8, 8, 6))
    assert (step.action, step.read, step.write) == (Action.APPLY, 16, 12)


def test_perm_change_without_shrink_applies():
    step = plan(spec(8, 8, 4), BrokerQueues(8, 8, 6))
    assert (step.action, step.perm) == (Action.APPLY, 4)


def test_order_change_applies():
    desired = TopicSpec("c1", "T", 8, 8, 6, True, "FIFO")
    assert plan(desired, BrokerQueues(8, 8, 6, False, "FIFO")).action is Action.APPLY
    assert plan(desired, BrokerQueues(8, 8, 6, True, "FIFO")).action is Action.READY


def test_shrinking_write_only_is_immediate():
    step = plan(spec(8, 4), BrokerQueues(8, 8, 6))
    assert (step.action, step.read, step.write) == (Action.APPLY, 8, 4)


def test_shrink_lowers_write_first_and_keeps_read():
    step = plan(spec(2, 2), BrokerQueues(8, 8, 6))
    assert (step.action, step.read, step.write) == (Action.SHRINK_WRITE, 8, 2)
    assert step.is_draining and step.writes
    assert step.draining == tuple(range(2, 8))


def test_shrink_write_goes_no_higher_than_the_new_read_count():
    step = plan(spec(2, 6), BrokerQueues(8, 8, 6))
    assert (step.action, step.read, step.write) == (Action.SHRINK_WRITE, 8, 2)


def test_waits_while_queues_hold_unconsumed_messages():
    step = plan(spec(2, 2), BrokerQueues(8, 2, 6), undrained=(5, 7))
    assert (step.action, step.draining) == (Action.WAIT_DRAIN, (5, 7))
    assert step.is_draining and not step.writes


def test_drained_queues_let_read_drop():
    step = plan(spec(2, 2), BrokerQueues(8, 2, 6), undrained=())
    assert (step.action, step.read, step.write) == (Action.SHRINK_READ, 2, 2)
    assert step.writes and not step.is_draining


def test_final_write_above_read_is_applied_after_draining():
    step = plan(spec(2, 6), BrokerQueues(8, 2, 6), undrained=())
    assert (step.action, step.read, step.write) == (Action.SHRINK_READ, 2, 6)


def test_perm_change_during_shrink_goes_with_the_write_step():
    step = plan(spec(2, 2, 4), BrokerQueues(8, 2, 6), undrained=(3,))
    assert (step.action, step.perm, step.read) == (Action.SHRINK_WRITE, 4, 8)


# the quiet period before read queues drop (issue 18) ----------------------------------------------
def drive(desired: TopicSpec, have: BrokerQueues, quiet: QuietPeriod, undrained: tuple[int, ...] = ()) -> Step:
    """plan() then hold_for_routes(), as one broker's pass does."""
    return hold_for_routes(plan(desired, have, undrained), "broker-a", have, quiet)


def test_read_drops_only_a_grace_after_writes_were_steered_away():
    desired = spec(2, 2)
    step = drive(desired, BrokerQueues(8, 8, 6), QuietPeriod(1000.0, 35.0))
    assert (step.action, step.write, step.quiet_since) == (Action.SHRINK_WRITE, 2, 1000.0)
    since = {"broker-a": step.quiet_since}
    have = BrokerQueues(8, 2, 6)
    # Drained at once, but a producer whose route is up to 30 s old may still send to queues 2-7.
    for now in (1000.5, 1010.0, 1034.9):
        step = drive(desired, have, QuietPeriod(now, 35.0, since))
        assert (step.action, step.read, step.write) == (Action.WAIT_QUIET, 8, 2), now
        assert (step.quiet_since, step.quiet_until) == (1000.0, 1035.0)
        assert step.is_draining and not step.writes
    step = drive(desired, have, QuietPeriod(1035.0, 35.0, since))
    assert (step.action, step.read, step.write) == (Action.SHRINK_READ, 2, 2)


def test_a_queue_found_undrained_after_the_grace_still_holds_read():
    """The consumption check that lets read drop is the one made after the grace: messages a
    stale producer wrote during the period keep the queue until consumed."""
    desired, have, since = spec(2, 2), BrokerQueues(8, 2, 6), {"broker-a": 1000.0}
    assert drive(desired, have, QuietPeriod(1020.0, 35.0, since)).action is Action.WAIT_QUIET
    step = drive(desired, have, QuietPeriod(1040.0, 35.0, since), undrained=(6,))
    assert (step.action, step.draining, step.quiet_since) == (Action.WAIT_DRAIN, (6,), 1000.0)
    assert drive(desired, have, QuietPeriod(1070.0, 35.0, since)).action is Action.SHRINK_READ


def test_without_a_record_the_period_starts_at_the_first_pass_that_sees_writes_away():
    """Writes lowered by an earlier operator (or a status lost): no record, so the period starts
    now; a recorded start in the future (another replica's clock) counts as now."""
    desired, have = spec(2, 2), BrokerQueues(8, 2, 6)
    step = drive(desired, have, QuietPeriod(500.0, 35.0))
    assert (step.action, step.quiet_since, step.quiet_until) == (Action.WAIT_QUIET, 500.0, 535.0)
    step = drive(desired, have, QuietPeriod(500.0, 35.0, {"broker-a": 9000.0}))
    assert (step.action, step.quiet_since) == (Action.WAIT_QUIET, 500.0)
    assert drive(desired, have, QuietPeriod(500.0, 35.0, {"broker-b": 0.0})).action is Action.WAIT_QUIET


def test_steps_outside_a_shrink_are_not_held():
    quiet = QuietPeriod(100.0, 35.0, {"broker-a": 99.0})
    assert drive(spec(8, 8), BrokerQueues(8, 8, 6), quiet).action is Action.READY
    assert drive(spec(16, 16), BrokerQueues(8, 8, 6), quiet).action is Action.APPLY
    assert hold_for_routes(plan(spec(4, 4), None), "broker-a", None, quiet).action is Action.APPLY
    assert drive(spec(2, 2), BrokerQueues(8, 2, 6), QuietPeriod(100.0, 0.0)).action is Action.SHRINK_READ


def test_a_quiet_wait_is_draining_for_the_topics_status():
    step = drive(spec(2, 2), BrokerQueues(8, 2, 6), QuietPeriod(0.0, 35.0))
    assert readiness({"broker-a": step})[:2] == (False, "Draining")


def test_the_period_start_survives_the_status_round_trip_rounded_up():
    rows = [{"name": "broker-a", "drainingSince": format_since(1_700_000_000.2)},
            {"name": "broker-b", "drainingSince": "yesterday"}, {"name": "broker-c"}, "junk",
            {"drainingSince": format_since(5.0)}]
    assert rows[0]["drainingSince"] == "2023-11-14T22:13:21Z"
    assert since_from_status(rows) == {"broker-a": 1_700_000_001.0}
    assert since_from_status(None) == {} and since_from_status({"broker-a": 1}) == {}


def test_a_negative_grace_is_refused():
    with pytest.raises(ConfigError, match="grace"):
        QuietPeriod(0.0, -1.0)


REFRESH = 30.0  # a client's route refresh (ClientConfig.route_refresh_interval, RocketMQ's default)


@given(st.lists(st.floats(min_value=0.5, max_value=20.0), min_size=1, max_size=30),
       st.sets(st.integers(0, 29)))
def test_read_never_drops_while_a_stale_route_may_still_write(gaps, restarts):
    """Passes at random intervals, an operator that loses its record at random passes (a
    restart, a new leader): read queues drop only once every producer re-read the route after
    writes were steered away, and from a check made after that."""
    desired, have = spec(2, 2), BrokerQueues(8, 8, 6)
    now, since, lowered = 0.0, {}, None
    for i, gap in enumerate(gaps):
        now += gap
        step = drive(desired, have, QuietPeriod(now, ROUTE_GRACE, {} if i in restarts else since))
        if step.action is Action.SHRINK_WRITE:
            lowered = now
        if step.action is Action.SHRINK_READ:
            assert lowered is not None and now - lowered >= ROUTE_GRACE > REFRESH
        if step.writes:
            have = BrokerQueues(step.read, step.write, step.perm)
        since = {"broker-a": step.quiet_since} if step.is_draining and step.quiet_since is not None else {}
    if now - (lowered or 0.0) < ROUTE_GRACE:
        assert have.read == 8


counts = st.integers(min_value=1, max_value=32)


@given(counts, counts, counts, counts, st.sets(st.integers(0, 31)))
def test_state_machine_never_drops_an_undrained_queue_and_converges(r0, w0, rd, wd, busy):
    """Drive plan() like the operator does: read never falls below an undrained queue, and
    once the queues are consumed the broker reaches the desired counts in a few steps."""
    desired = spec(rd, wd)
    have = BrokerQueues(r0, w0, 6)
    for _ in range(4):
        undrained = tuple(q for q in range(desired.read_queues, have.read) if q in busy)
        step = plan(desired, have, undrained)
        if step.writes:
            assert all(q < step.read for q in undrained), (have, step)
            if step.read < have.read:
                assert have.write <= min(wd, rd)  # writes were steered away first
            have = BrokerQueues(step.read, step.write, step.perm)
        if step.action is Action.WAIT_DRAIN:
            busy = set()  # the consumer catches up
    assert plan(desired, have).action is Action.READY


# conditions and metrics -------------------------------------------------------------------------
def test_set_condition_keeps_transition_time_unless_status_changes():
    c1 = set_condition([], "Ready", False, "Draining", "m", now="t1")
    c2 = set_condition(c1, "Ready", False, "Draining", "m2", now="t2")
    assert c2 == [{"type": "Ready", "status": "False", "reason": "Draining", "message": "m2",
                   "lastTransitionTime": "t1"}]
    c3 = set_condition(c2, "Ready", True, "Reconciled", now="t3")
    assert c3[0]["status"] == "True" and c3[0]["lastTransitionTime"] == "t3"
    c4 = set_condition(c3, "Draining", False, "None", now="t4")
    assert [c["type"] for c in c4] == ["Draining", "Ready"]


def test_metrics_count_results_duration_and_managed():
    now = [0.0]
    m = OperatorMetrics(clock=lambda: now[0])
    with m.timed("Topic"):
        now[0] = 0.3
    m.result("Topic", "ok")
    m.result("Topic", "invalid", "InvalidSpec")
    m.track("Topic", "u1")
    m.track("Topic", "u2")
    m.track("Topic", "u1", present=False)
    get = m.registry.get_sample_value
    assert get("tidemq_operator_reconciles_total", {"kind": "Topic", "result": "ok"}) == 1
    assert get("tidemq_operator_errors_total", {"kind": "Topic", "reason": "InvalidSpec"}) == 1
    assert get("tidemq_operator_reconcile_seconds_sum", {"kind": "Topic"}) == pytest.approx(0.3)
    assert get("tidemq_operator_managed", {"kind": "Topic"}) == 1
