"""Offset maps of the Spark source: checkpoint JSON, resolving, data loss, rate limits, plans.

Pure functions; the invariants of the module docstring are checked with hypothesis.
"""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.spark.offsets import (
    QueueKey,
    QueueRange,
    Slice,
    data_loss,
    data_loss_message,
    from_json,
    limit_rows,
    past_end,
    past_end_message,
    plan,
    resolve,
    to_json,
)
from tidemq.spark.options import EARLIEST, LATEST, SparkOptionError

A0, A1 = QueueKey("orders", "broker-a", 0), QueueKey("orders", "broker-a", 1)
A10 = QueueKey("orders", "broker-a", 10)
B2 = QueueKey("orders", "broker-b", 2)
P0 = QueueKey("payments", "broker-a", 0)

_keys = st.builds(QueueKey, st.sampled_from(["orders", "payments", "a-b_c"]),
                  st.sampled_from(["broker-a", "broker-b"]), st.integers(0, 20))


# --- checkpoint JSON -------------------------------------------------------------------------


def test_to_json_nests_topic_broker_queue():
    assert to_json({A0: 5, B2: 7, P0: 0}) == {
        "orders": {"broker-a": {"0": 5}, "broker-b": {"2": 7}}, "payments": {"broker-a": {"0": 0}}}


def test_to_json_orders_queue_ids_numerically_whatever_the_insertion_order():
    text = json.dumps(to_json({A10: 1, P0: 3, A1: 2, A0: 0}))
    assert text == '{"orders": {"broker-a": {"0": 0, "1": 2, "10": 1}}, "payments": {"broker-a": {"0": 3}}}'


@settings(max_examples=100, deadline=None)
@given(offsets=st.dictionaries(_keys, st.integers(0, 2**63 - 1), max_size=12), seed=st.integers())
def test_json_round_trips_and_equal_maps_serialise_identically(offsets, seed):
    items = list(offsets.items())
    random.Random(seed).shuffle(items)
    shuffled = dict(items)
    text = json.dumps(to_json(offsets))
    assert json.dumps(to_json(shuffled)) == text
    assert from_json(text) == offsets
    assert from_json(to_json(offsets)) == offsets
    assert from_json(text.encode()) == offsets


@pytest.mark.parametrize("bad", ["[1, 2]", "5", [1], None])
def test_from_json_refuses_non_objects(bad):
    with pytest.raises(SparkOptionError):
        from_json(bad)


# --- resolve ---------------------------------------------------------------------------------

RANGES = {A0: QueueRange(3, 10), A1: QueueRange(0, 0), B2: QueueRange(100, 250)}


def test_resolve_earliest_and_latest():
    assert resolve("earliest", RANGES, "startingOffsets", "earliest") == {A0: 3, A1: 0, B2: 100}
    assert resolve("latest", RANGES, "endingOffsets", "latest") == {A0: 10, A1: 0, B2: 250}


def test_resolve_json_with_markers_and_explicit_offsets():
    spec = {"orders": {"broker-a": {0: EARLIEST, 1: LATEST}, "broker-b": {2: 123}}}
    assert resolve(spec, RANGES, "startingOffsets", "earliest") == {A0: 3, A1: 0, B2: 123}
    spec = {"orders": {"broker-a": {0: LATEST}, "broker-b": {2: EARLIEST}}}
    assert resolve(spec, RANGES, "startingOffsets", "earliest") == {A0: 10, A1: 0, B2: 100}


@pytest.mark.parametrize("missing, expected", [("earliest", {A0: 3, A1: 0, B2: 7}),
                                               ("latest", {A0: 10, A1: 0, B2: 7})])
def test_resolve_gives_unnamed_queues_the_missing_default(missing, expected):
    spec = {"orders": {"broker-b": {2: 7}}}
    assert resolve(spec, RANGES, "startingOffsets", missing) == expected


def test_resolve_refuses_queues_that_are_not_part_of_the_read():
    spec = {"orders": {"broker-a": {0: 1, 9: 4}}, "ghost": {"broker-a": {0: 0}}}
    with pytest.raises(SparkOptionError) as info:
        resolve(spec, RANGES, "startingOffsets", "earliest")
    msg = str(info.value)
    assert "option startingOffsets" in msg
    assert "ghost/broker-a/0, orders/broker-a/9" in msg
    assert "orders/broker-a/0" in msg  # the queues that do exist are shown


# --- data loss -------------------------------------------------------------------------------


def test_data_loss_lists_queues_whose_start_retention_removed():
    start = {A0: 2, A1: 0, B2: 100, P0: 5}  # P0 unknown to ranges: not reported
    assert data_loss(start, RANGES) == {A0: 3}
    assert data_loss({A0: 3, B2: 250}, RANGES) == {}


def test_data_loss_message_names_queues_and_the_option():
    lost = {QueueKey("t", "b", i): 10 for i in range(7)}
    msg = data_loss_message(lost, {k: 1 for k in lost})
    assert "t/b/0 wanted 1 but the oldest left is 10" in msg
    assert "(and 2 more queues)" in msg
    assert "failOnDataLoss" in msg


# --- limit_rows ------------------------------------------------------------------------------


def test_limit_rows_shares_in_proportion_to_backlog():
    start = {A0: 0, A1: 100, B2: 50}
    latest = {A0: 300, A1: 200, B2: 50}  # backlogs 300, 100, 0
    assert limit_rows(start, latest, 40) == {A0: 30, A1: 110, B2: 50}


def test_limit_rows_admits_everything_under_the_limit():
    assert limit_rows({A0: 1}, {A0: 5, A1: 3}, 100) == {A0: 5, A1: 3}


def test_limit_rows_remainder_goes_to_largest_fractions():
    # three equal backlogs, limit 2: two queues get one each, in key order on ties
    got = limit_rows({A0: 0, A1: 0, B2: 0}, {A0: 10, A1: 10, B2: 10}, 2)
    assert got == {A0: 1, A1: 1, B2: 0}


@st.composite
def _start_latest(draw, big: bool = False):
    keys = draw(st.lists(_keys, min_size=1, max_size=10, unique=True))
    hi = 2**62 if big else 10_000
    start, latest = {}, {}
    for k in keys:
        s = draw(st.integers(0, hi))
        backlog = draw(st.integers(0, hi // 4) | st.just(0))
        latest[k] = s + backlog
        if draw(st.booleans()) or s:  # a queue missing from start starts at 0
            start[k] = s
    return start, latest


def _check_limit(start, latest, limit):
    end = limit_rows(start, latest, limit)
    assert set(end) == set(latest)
    backlog = {k: latest[k] - start.get(k, 0) for k in latest}
    admitted = {k: end[k] - start.get(k, 0) for k in latest}
    assert sum(admitted.values()) == min(limit, sum(backlog.values()))
    for k in latest:
        assert start.get(k, 0) <= end[k] <= latest[k], k
        if backlog[k] == 0:
            assert admitted[k] == 0
        if sum(backlog.values()) > limit:  # proportional: within one message of the exact share
            total = sum(backlog.values())  # |admitted - limit * backlog / total| < 1, exactly
            assert abs(admitted[k] * total - limit * backlog[k]) < total, (k, admitted[k])


@settings(max_examples=200, deadline=None)
@given(sl=_start_latest(), limit=st.integers(1, 20_000))
def test_limit_rows_invariants(sl, limit):
    _check_limit(*sl, limit)


@settings(max_examples=100, deadline=None)
@given(sl=_start_latest(big=True), data=st.data())
def test_limit_rows_invariants_with_huge_offsets(sl, data):
    start, latest = sl
    backlog = sum(latest[k] - start.get(k, 0) for k in latest)
    limit = data.draw(st.integers(1, max(1, backlog)), label="limit")  # mostly below the backlog
    _check_limit(start, latest, limit)


def test_limit_rows_is_exact_where_float_shares_round_up():
    # with float shares (limit * backlog / total) these totals came out wrong
    latest = {A0: 2**61 + 1, A1: 2**61 - 1, B2: 12345}
    for limit in (2**60 * 3, 2**61 + 7, 2**55 + 3):
        _check_limit({}, latest, limit)


# --- plan ------------------------------------------------------------------------------------


def test_plan_one_slice_per_queue_without_limits():
    got = plan({A0: 5, B2: 0}, {A0: 9, B2: 3, A1: 0})
    assert got == [Slice("orders", "broker-a", 0, 5, 9), Slice("orders", "broker-b", 2, 0, 3)]
    assert got[0].key == A0


def test_plan_is_empty_when_start_equals_end():
    assert plan({A0: 4, A1: 7}, {A0: 4, A1: 7}, min_partitions=8, max_records=1) == []


def test_plan_splits_by_max_records():
    got = plan({A0: 0}, {A0: 10}, max_records=4)
    assert [(s.start, s.end) for s in got] == [(0, 4), (4, 7), (7, 10)]


def test_plan_splits_biggest_queues_for_min_partitions():
    got = plan({A0: 0, A1: 0}, {A0: 90, A1: 10}, min_partitions=4)
    assert sum(s.key == A0 for s in got) >= 3
    assert len(got) >= 4


@st.composite
def _start_end(draw):
    keys = draw(st.lists(_keys, min_size=0, max_size=8, unique=True))
    start, end = {}, {}
    for k in keys:
        s = draw(st.integers(0, 10**6))
        end[k] = s + draw(st.integers(0, 2000) | st.just(0))
        if draw(st.booleans()) or s:
            start[k] = s
    return start, end


@settings(max_examples=200, deadline=None)
@given(se=_start_end(), min_parts=st.none() | st.integers(1, 64),
       max_records=st.none() | st.integers(1, 5000))
def test_plan_covers_every_range_exactly_once(se, min_parts, max_records):
    start, end = se
    slices = plan(start, end, min_partitions=min_parts, max_records=max_records)
    by_queue: dict[QueueKey, list[Slice]] = {}
    for s in slices:
        assert s.start < s.end, s  # never an empty slice
        if max_records:
            assert s.end - s.start <= max_records
        by_queue.setdefault(s.key, []).append(s)
    for k, e in end.items():
        got = sorted(by_queue.pop(k, []), key=lambda s: s.start)
        b = start.get(k, 0)
        if e <= b:
            assert got == []
            continue
        # disjoint, contiguous, covering [b, e)
        assert got[0].start == b and got[-1].end == e
        assert all(x.end == y.start for x, y in zip(got, got[1:]))
    assert by_queue == {}  # no slice of a queue not in end
    total = sum(max(0, e - start.get(k, 0)) for k, e in end.items())
    if min_parts and total >= min_parts:
        assert len(slices) >= min_parts
    if total == 0:
        assert slices == []


def test_past_end_names_each_queue_with_its_end_and_the_way_to_read_to_the_end():
    ranges = {A0: QueueRange(0, 31), A1: QueueRange(5, 5)}
    assert past_end({A0: 31, A1: 5}, ranges) == {}
    past = past_end({A0: 1000, A1: 6}, ranges)
    assert past == {A0: 1000, A1: 6}
    text = past_end_message(past, ranges, "endingOffsets")
    assert text.startswith("endingOffsets asks for offset 1000 of orders/broker-a/0, which ends at "
                           "31; offset 6 of orders/broker-a/1, which ends at 5")
    assert 'endingOffsets "latest"' in text
    assert 'startingOffsets "earliest"' in past_end_message(past, ranges, "startingOffsets")
    many = {QueueKey("t", "b", q): 9 for q in range(7)}
    text = past_end_message(many, {k: QueueRange(0, 1) for k in many}, "endingOffsets")
    assert "(and 2 more queues)" in text and "t/b/5" not in text
