"""Delayed delivery: delay-level tables, the put-time conversion, the level walkers and the
delivery-timestamp timer (driven by an injected clock, no sleeping), progress persistence, and
real broker processes keeping delay promises across restarts and kill -9."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest

from tidemq.broker.delay import (
    DEFAULT_DELAY_LEVELS,
    TIMER_OUT_MS,
    TIMER_TOPIC,
    parse_delay_levels,
    restore_put,
    schedule_put,
)
from tidemq.broker.schedule import ScheduleMessageService
from tidemq.broker.store.replay import DEFAULT_DELAY_LEVELS_MS, SCHEDULE_TOPIC
from tidemq.broker.store.store import PutRequest
from tidemq.errors import BrokerError, ConfigError
from tidemq.message import MessageExt, decode_record, decode_records, tags_code
from tidemq.remoting import RemotingClient, ResponseCode
from tests.broker.store.util import T0, Clock, config, open_store
from tests.broker.test_broker_protocol import pull_cmd, send_cmd

HOST = ("127.0.0.1", 10911)
T0_MS = int(T0 * 1000)


# ---------------------------------------------------------------------------------- levels
def test_default_table_is_rocketmqs_18_levels_and_matches_the_store_default():
    levels = parse_delay_levels(DEFAULT_DELAY_LEVELS)
    assert levels.delays_ms == DEFAULT_DELAY_LEVELS_MS
    assert levels.max_level == 18 and levels.delay_ms(2) == 5000 and levels.delay_ms(18) == 7_200_000


def test_table_units_and_clamping():
    levels = parse_delay_levels("250ms 1s 2m 1h 1d")
    assert levels.delays_ms == (250, 1000, 120_000, 3_600_000, 86_400_000)
    assert levels.level_of("3") == 3
    assert levels.level_of("99") == 5  # clamps to the highest level
    assert levels.level_of("0") == 0 and levels.level_of("-2") == 0 and levels.level_of("x") == 0
    assert levels.level_of(None) == 0


@pytest.mark.parametrize("text", ["", "1s 5x", "0s", "1s -1s", "s", "1s " * 65])
def test_bad_tables_are_refused_with_a_sentence(text):
    with pytest.raises(ConfigError) as e:
        parse_delay_levels(text)
    assert "delay level" in str(e.value)


def test_store_hook_recomputes_the_tags_code_the_put_used():
    levels = parse_delay_levels("1s 3s 7s")
    req = schedule_put(PutRequest("T", 2, b"b", {"DELAY": "2"}), levels, T0_MS)
    assert req.tags_code == T0_MS + 3000
    assert levels.tags_code(req.queue_id, T0_MS, req.properties) == req.tags_code
    assert levels.tags_code(2, T0_MS, {}) == T0_MS + 7000  # no DELAY: the queue says level 3


# ---------------------------------------------------------------------------------- conversion
LEVELS = parse_delay_levels(DEFAULT_DELAY_LEVELS)


def test_delay_level_put_goes_to_the_schedule_queue_of_its_level():
    req = PutRequest("Orders", 3, b"x", {"DELAY": "2", "TAGS": "A", "UNIQ_KEY": "U1"})
    out = schedule_put(req, LEVELS, T0_MS)
    assert (out.topic, out.queue_id, out.tags_code) == (SCHEDULE_TOPIC, 1, T0_MS + 5000)
    assert out.properties["REAL_TOPIC"] == "Orders" and out.properties["REAL_QID"] == "3"
    assert out.properties["DELAY"] == "2" and out.properties["UNIQ_KEY"] == "U1"


def test_delay_above_the_table_clamps_and_non_positive_means_no_delay():
    out = schedule_put(PutRequest("T", 0, b"x", {"DELAY": "40"}), LEVELS, T0_MS)
    assert out.queue_id == 17 and out.properties["DELAY"] == "18"
    assert out.tags_code == T0_MS + 7_200_000
    for v in ("0", "-3"):
        same = schedule_put(PutRequest("T", 0, b"x", {"DELAY": v}), LEVELS, T0_MS)
        assert same.topic == "T" and same.tags_code is None


@pytest.mark.parametrize("props,due", [
    ({"TIMER_DELIVER_MS": str(T0_MS + 2000)}, T0_MS + 2000),
    ({"__STARTDELIVERTIME": str(T0_MS + 9000)}, T0_MS + 9000),
    ({"TIMER_DELAY_SEC": "4"}, T0_MS + 4000),
    ({"TIMER_DELAY_MS": "1500"}, T0_MS + 1500),
])
def test_delivery_time_put_goes_to_the_timer_topic(props, due):
    out = schedule_put(PutRequest("T", 1, b"x", dict(props, DELAY="3")), LEVELS, T0_MS)
    assert (out.topic, out.queue_id, out.tags_code) == (TIMER_TOPIC, 0, due)
    assert out.properties[TIMER_OUT_MS] == str(due)
    assert out.properties["REAL_TOPIC"] == "T" and out.properties["REAL_QID"] == "1"
    assert not set(props) & set(out.properties) and "DELAY" not in out.properties


def test_a_delivery_time_in_the_past_is_a_normal_message():
    out = schedule_put(PutRequest("T", 1, b"x", {"TIMER_DELIVER_MS": str(T0_MS - 1)}), LEVELS, T0_MS)
    assert out.topic == "T" and "TIMER_DELIVER_MS" not in out.properties and out.tags_code is None


@pytest.mark.parametrize("props", [{"TIMER_DELIVER_MS": "soon"}, {"TIMER_DELAY_SEC": str(4 * 86400)}])
def test_bad_or_too_distant_delivery_times_are_illegal(props):
    with pytest.raises(BrokerError) as e:
        schedule_put(PutRequest("T", 1, b"x", props), LEVELS, T0_MS)
    assert e.value.code == ResponseCode.MESSAGE_ILLEGAL and e.value.remark


def test_half_messages_are_not_scheduled():
    req = PutRequest("T", 0, b"x", {"DELAY": "2"}, sys_flag=0x4)
    assert schedule_put(req, LEVELS, T0_MS).topic == "T"


# ---------------------------------------------------------------------------------- walking
def make(tmp_path, table="1s 5s 10s", **kw):
    clock = Clock()
    store = open_store(config(tmp_path / "store"), clock=clock, schedule_tags_code=parse_delay_levels(table).tags_code)
    svc = ScheduleMessageService(store, parse_delay_levels(table), tmp_path / "config" / "delayOffset.json",
                                 HOST, clock, **kw)
    return clock, store, svc


def put(svc, store, topic="Real", qid=0, body=b"payload", props=None, **kw):
    req = PutRequest(topic, qid, body, dict(props or {}), born_timestamp=T0_MS - 5, born_host=("10.0.0.7", 4567),
                     store_host=HOST, **kw)
    r = store.put(svc.prepare_put(req))
    assert r.ok
    return r


def real(store, topic="Real", qid=0, codes=None):
    res = store.get_messages(topic, qid, 0, 100, codes)
    return [decode_record(r) for r in res.records]


def test_level_entry_is_delivered_when_due_and_not_a_millisecond_before(tmp_path):
    clock, store, svc = make(tmp_path)
    put(svc, store, qid=2, props={"DELAY": "2", "TAGS": "TagA", "KEYS": "k1", "UNIQ_KEY": "U-1", "user": "v"},
        flag=7, reconsume_times=2)
    lvl = svc.level_timers[1]
    assert lvl.run_due(T0_MS + 4999) == T0_MS + 5000
    assert real(store, qid=2) == []
    clock.now = T0 + 5.0
    assert lvl.run_due(T0_MS + 5000) is None
    [m] = real(store, qid=2, codes=frozenset({tags_code("TagA")}))  # tags code rebuilt from TAGS
    assert m.body == b"payload" and m.flag == 7 and m.reconsume_times == 2
    assert m.born_timestamp == T0_MS - 5 and m.born_host == "10.0.0.7:4567"
    assert m.properties["UNIQ_KEY"] == "U-1" and m.properties["user"] == "v" and m.properties["KEYS"] == "k1"
    assert m.properties["REAL_TOPIC"] == "Real" and m.properties["REAL_QID"] == "2"
    assert "DELAY" not in m.properties and "WAIT" not in m.properties
    assert lvl.offset == 1 and svc.delivered == 1
    assert store.query_by_key("Real", "k1", 10, 0, 2**62)  # indexed under the real topic


def test_a_replica_that_may_not_write_delivers_nothing_until_it_may(tmp_path):
    """A follower's log is its master's copy (tidemq.broker.ha): a due entry waits, then goes
    once this replica may write (became master)."""
    allowed = False
    clock, store, svc = make(tmp_path, may_write=lambda: allowed)
    put(svc, store, props={"DELAY": "1"})
    lvl = svc.level_timers[0]
    clock.now = T0 + 1.0
    assert lvl.run_due(T0_MS + 1000) is not None  # retried later
    assert real(store) == [] and lvl.offset == 0
    allowed = True
    assert lvl.run_due(T0_MS + 2000) is None
    assert [m.body for m in real(store)] == [b"payload"] and lvl.offset == 1


def test_a_level_delivers_in_order_and_stops_at_the_first_entry_not_due(tmp_path):
    clock, store, svc = make(tmp_path)
    for i in range(5):
        clock.now = T0 + i * 0.1
        put(svc, store, body=b"m%d" % i, props={"DELAY": "1"})
    lvl = svc.level_timers[0]
    assert lvl.run_due(T0_MS + 1250) == T0_MS + 1300
    assert [m.body for m in real(store)] == [b"m0", b"m1", b"m2"] and lvl.offset == 3
    assert lvl.run_due(T0_MS + 10_000) is None
    assert [m.body for m in real(store)] == [b"m0", b"m1", b"m2", b"m3", b"m4"]


def test_levels_are_independent(tmp_path):
    clock, store, svc = make(tmp_path)
    put(svc, store, body=b"slow", props={"DELAY": "3"})
    put(svc, store, body=b"fast", props={"DELAY": "1"})
    assert svc.level_timers[2].run_due(T0_MS + 1000) == T0_MS + 10_000
    assert svc.level_timers[0].run_due(T0_MS + 1000) is None
    assert [m.body for m in real(store)] == [b"fast"]


def test_a_refused_delivery_keeps_the_entry_for_a_retry(tmp_path):
    clock, store, svc = make(tmp_path)
    put(svc, store, props={"DELAY": "1"})
    lvl = svc.level_timers[0]
    calls = []
    lvl.deliver = lambda rec: calls.append(rec) and False  # the store said "not now"
    assert lvl.run_due(T0_MS + 1000) == T0_MS + 2000 and lvl.offset == 0
    lvl.deliver = svc._deliver
    assert lvl.run_due(T0_MS + 2000) is None and lvl.offset == 1 and len(real(store)) == 1


def test_an_entry_without_a_real_topic_is_skipped_not_stuck(tmp_path):
    clock, store, svc = make(tmp_path)
    store.put(PutRequest(SCHEDULE_TOPIC, 0, b"orphan", {"DELAY": "1"}, store_host=HOST))
    put(svc, store, body=b"good", props={"DELAY": "1"})
    assert svc.level_timers[0].run_due(T0_MS + 1000) is None
    assert [m.body for m in real(store)] == [b"good"] and svc.skipped == 1


def test_budget_bounds_one_step(tmp_path):
    clock, store, svc = make(tmp_path)
    for i in range(10):
        put(svc, store, body=b"%d" % i, props={"DELAY": "1"})
    lvl = svc.level_timers[0]
    assert lvl.run_due(T0_MS + 1000, budget=4) == T0_MS + 1000  # more is due: run again at once
    assert len(real(store)) == 4
    assert lvl.run_due(T0_MS + 1000) is None and len(real(store)) == 10


# ---------------------------------------------------------------------------------- timer
def test_timer_delivers_in_due_order_whatever_the_arrival_order(tmp_path):
    clock, store, svc = make(tmp_path)
    svc._wakes = [asyncio.Event() for _ in range(4)]  # as if started: dispatch feeds the heap
    store.add_dispatch_listener(svc.on_dispatch)
    for body, due in ((b"c", 3000), (b"a", 1000), (b"b", 2000)):
        put(svc, store, body=body, props={"TIMER_DELIVER_MS": str(T0_MS + due)})
    t = svc.timer
    assert len(t) == 3 and t.progress == 0
    assert t.run_due(T0_MS + 2000) == T0_MS + 3000
    assert [m.body for m in real(store)] == [b"a", b"b"]
    assert t.progress == 0  # offset 0 ("c") is still pending
    assert t.run_due(T0_MS + 3000) is None and t.progress == 3
    [m] = [m for m in real(store) if m.body == b"c"]
    assert m.properties[TIMER_OUT_MS] == str(T0_MS + 3000) and "TIMER_DELIVER_MS" not in m.properties


def test_timer_rebuilds_its_heap_from_the_queue_after_a_restart(tmp_path):
    clock, store, svc = make(tmp_path)
    for body, due in ((b"late", 5000), (b"early", 1000), (b"mid", 2000)):
        put(svc, store, body=body, props={"TIMER_DELAY_MS": str(due)})
    svc.timer.refill()
    assert svc.timer.run_due(T0_MS + 1000) == T0_MS + 2000
    assert svc.snapshot()["timerOffset"] == 0  # "late" at offset 0 holds the progress
    # a new service over the same store, from the persisted progress: nothing lost
    svc2 = ScheduleMessageService(store, svc.levels, tmp_path / "x.json", HOST, clock)
    svc2.timer.scanned = svc.timer.progress
    assert svc2.timer.run_due(T0_MS + 1500) == T0_MS + 2000
    assert svc2.timer.run_due(T0_MS + 5000) is None
    assert sorted(m.body for m in real(store)) == [b"early", b"early", b"late", b"mid"]  # one duplicate


def test_a_follower_takes_the_masters_progress_and_never_delivers_below_it(tmp_path):
    """Replicated progress (tidemq.broker.ha.metalog): levels and the timer move to the master's
    offsets; the timer forgets what it had loaded below them, so a promoted follower resumes there."""
    clock, store, svc = make(tmp_path, may_write=lambda: False)
    for i in range(4):
        put(svc, store, body=b"%d" % i, props={"TIMER_DELAY_MS": str(1000 + i)})
    put(svc, store, props={"DELAY": "2"})
    t = svc.timer
    t.refill()
    assert len(t) == 4 and t.progress == 0
    svc.apply_progress(((2, 1), (9, 5)), 3)  # level 9 is not in this table: ignored, as at load
    assert svc.level_timers[1].offset == 1 and len(t) == 1 and t.progress == 3
    assert svc.progress() == (((1, 0), (2, 1), (3, 0)), 3)
    svc.apply_progress((), 9)  # past what is loaded and stored: nothing is loaded again
    assert len(t) == 0 and t.progress == 9 and not t.refill()


async def test_after_a_cut_the_timer_loads_its_queue_again_and_forgets_deliveries_past_it(tmp_path):
    """A replica's CommitLog cut (tidemq.broker.ha.metalog): what the timer loaded of the cut tail
    is forgotten, and a SYNC_FLUSH persist no longer waits for a delivery the cut removed."""
    clock, store, svc = make(tmp_path)
    await store.start()
    try:
        put(svc, store, body=b"kept", props={"TIMER_DELAY_MS": "1000"})
        cut = store.commitlog_max_offset
        put(svc, store, body=b"cut", props={"TIMER_DELAY_MS": "2000"})
        svc.timer.refill()
        svc.timer.run_due(T0_MS + 1000)  # "kept" delivered: its copy lands past the cut
        assert len(svc.timer) == 1 and svc._delivered_end > cut
        await store.truncate(cut)
        svc.after_cut()
        assert len(svc.timer) == 0 and svc.timer.scanned == svc.timer.progress == 1
        assert svc._delivered_end <= cut and not svc.timer.refill()
    finally:
        await store.shutdown()


def test_timer_capacity_bounds_memory_and_still_delivers_everything(tmp_path):
    clock, store, svc = make(tmp_path, timer_capacity=2)
    for i in range(7):
        put(svc, store, body=b"%d" % i, props={"TIMER_DELAY_MS": str(1000 + 10 * i)})
    t = svc.timer
    t.refill()
    assert len(t) == 2
    nxt = T0_MS
    while nxt is not None:
        nxt = t.run_due(T0_MS + 60_000)
        assert len(t) <= 2
    assert sorted(m.body for m in real(store)) == [b"%d" % i for i in range(7)] and t.progress == 7


# ---------------------------------------------------------------------------------- persistence
async def test_progress_is_persisted_with_string_keys_and_resumed(tmp_path):
    clock, store, svc = make(tmp_path)
    for i in range(3):
        put(svc, store, body=b"%d" % i, props={"DELAY": "1"})
    put(svc, store, body=b"t", props={"TIMER_DELAY_MS": "100"})
    svc.timer.refill()
    svc.level_timers[0].run_due(T0_MS + 1000, budget=2)
    svc.timer.run_due(T0_MS + 1000)
    await svc.persist()
    data = json.loads(svc.path.read_text())
    assert data == {"offsetTable": {"1": 2, "2": 0, "3": 0}, "timerOffset": 1}
    svc2 = ScheduleMessageService(store, svc.levels, svc.path, HOST, clock)
    svc2.load()
    assert [t.offset for t in svc2.level_timers] == [2, 0, 0] and svc2.timer.progress == 1
    svc2.level_timers[0].run_due(T0_MS + 1000)
    assert sorted(m.body for m in real(store)) == [b"0", b"1", b"2", b"t"]  # resumed, nothing twice


def test_rocketmqs_own_delay_offset_file_is_read(tmp_path):
    clock, store, svc = make(tmp_path)
    svc.path.parent.mkdir(parents=True, exist_ok=True)
    svc.path.write_text('{"offsetTable":{1:4,3:9,77:1}}')  # fastjson int keys; level 77 unknown
    svc.load()
    assert [t.offset for t in svc.level_timers] == [4, 0, 9]


def test_offsets_past_the_queue_end_are_pulled_back(tmp_path):
    clock, store, svc = make(tmp_path)
    put(svc, store, props={"DELAY": "1"})
    svc.level_timers[0].offset = 50  # e.g. the queue lost its tail in a crash
    assert svc.level_timers[0].run_due(T0_MS + 1000) is None and svc.level_timers[0].offset == 1


def test_restore_refuses_records_that_would_loop_back():
    m = MessageExt(SCHEDULE_TOPIC, b"x", 0, 0, 0, 0, 0, 0, 0, "1.2.3.4:5", 0, "1.2.3.4:5", 0, 0,
                   {"REAL_TOPIC": SCHEDULE_TOPIC, "REAL_QID": "0"}, 0, "")
    with pytest.raises(ValueError):
        restore_put(m, HOST)


# ---------------------------------------------------------------------------------- driven by asyncio
async def test_running_service_wakes_on_arrival_and_delivers_on_time(tmp_path):
    store = open_store(config(tmp_path / "s"))
    levels = parse_delay_levels("300ms 150ms")
    svc = ScheduleMessageService(store, levels, tmp_path / "d.json", HOST, persist_interval=0.05)
    store.add_dispatch_listener(svc.on_dispatch)
    await store.start()
    await svc.start()
    try:
        await asyncio.sleep(0.05)  # both loops idle now
        t0 = time.time()
        put(svc, store, body=b"L1", props={"DELAY": "1"})
        put(svc, store, body=b"L2", props={"DELAY": "2"})
        put(svc, store, body=b"T", props={"TIMER_DELAY_MS": "200"})
        seen = {}
        while len(seen) < 3 and time.time() - t0 < 10:
            for m in real(store):
                seen.setdefault(m.body, time.time() - t0)
            await asyncio.sleep(0.005)
        assert set(seen) == {b"L1", b"L2", b"T"}
        for body, due in ((b"L1", 0.3), (b"L2", 0.15), (b"T", 0.2)):
            assert due - 0.002 <= seen[body] <= due + 1.0, (body, seen[body])  # late only by load
        await asyncio.sleep(0.15)
        assert json.loads(svc.path.read_text())["offsetTable"] == {"1": 1, "2": 1}
    finally:
        await svc.stop()
        await store.shutdown()


# ---------------------------------------------------------------------------------- real processes
async def _pull_first_arrival(c: RemotingClient, addr: str, topic: str, qid: int, deadline: float,
                              offset: int = 0):
    """Long-poll one queue until a message arrives; returns (messages, arrival time), ([], now) at the
    deadline. Not tests/support/waiting.wait_until: the broker holds each pull until the message
    arrives (no sleep between checks to blur the arrival time), the offset follows the broker's
    nextBeginOffset, and the caller asserts on what arrived with its own message."""
    while time.time() < deadline:
        r = await c.invoke(addr, pull_cmd(topic, qid, offset, suspend_ms=500), 5)
        if r.code == ResponseCode.SUCCESS:
            return decode_records(r.body_bytes()), time.time()
        offset = int(r.ext_fields.get("nextBeginOffset", offset))
    return [], time.time()


def _send(c, addr, topic, body, props, qid=0):
    return c.invoke(addr, send_cmd(topic, body, qid, props), 5)


async def test_delay_level_2_waits_5_seconds_across_a_clean_restart_and_a_kill(cluster_factory):
    """Default table; message A waits through a clean restart, B through a kill -9."""
    cl = cluster_factory()
    topic = f"delay_{uuid.uuid4().hex[:6]}"
    cl.create_topic(topic, queues=2)

    async def send(body, qid):
        c = RemotingClient()
        try:
            t = time.time()
            r = await _send(c, cl.broker_addr, topic, body, {"DELAY": "2", "TAGS": "X", "UNIQ_KEY": body.decode()}, qid)
            assert r.code == ResponseCode.SUCCESS, r.remark
            assert r.ext_fields["queueId"] == str(qid)
            return t
        finally:
            await c.close()

    async def receive(qid, t_sent):
        c = RemotingClient()
        try:
            return await _pull_first_arrival(c, cl.broker_addr, topic, qid, t_sent + 30.0)
        finally:
            await c.close()

    t_a = await send(b"A", 0)
    cl.restart_broker()
    t_b = await send(b"B", 1)
    await asyncio.sleep(0.3)
    cl.restart_broker(kill=True)
    for qid, t_sent, body in ((0, t_a, b"A"), (1, t_b, b"B")):
        msgs, at = await receive(qid, t_sent)
        assert [m.body for m in msgs] == [body], f"{body!r} not delivered within 30 s"
        m = msgs[0]
        assert m.store_timestamp / 1000 - t_sent >= 4.998, "delivered before its delay"  # stored when delivered
        assert at - t_sent <= 15.0  # due at 5 s; two broker restarts on a loaded runner may delay it
        assert m.properties["UNIQ_KEY"] == body.decode() and m.properties["REAL_TOPIC"] == topic
        assert "DELAY" not in m.properties and m.queue_id == qid
    assert "Traceback" not in cl.broker.log()


async def test_delivery_timestamp_is_honoured_and_survives_a_kill(cluster_factory):
    cl = cluster_factory()
    topic = f"timer_{uuid.uuid4().hex[:6]}"
    cl.create_topic(topic, queues=1)

    async def send(props, body):
        c = RemotingClient()
        try:
            r = await _send(c, cl.broker_addr, topic, body, props)
            assert r.code == ResponseCode.SUCCESS, r.remark
        finally:
            await c.close()

    async def receive(offset, deadline):
        c = RemotingClient()
        try:
            return await _pull_first_arrival(c, cl.broker_addr, topic, 0, deadline, offset)
        finally:
            await c.close()

    t0 = time.time()
    await send({"TIMER_DELIVER_MS": str(int(t0 * 1000) + 2000)}, b"abs")
    msgs, at = await receive(0, t0 + 15)
    assert [m.body for m in msgs] == [b"abs"] and 1.998 <= msgs[0].store_timestamp / 1000 - t0 and at - t0 <= 10

    t1 = time.time()
    await send({"TIMER_DELAY_SEC": "3"}, b"rel")
    cl.restart_broker(kill=True)
    offset, rel = 1, []
    while not rel and time.time() < t1 + 20:
        msgs, at = await receive(offset, t1 + 20)
        assert {m.body for m in msgs} <= {b"abs", b"rel"}  # "abs" again is a duplicate after the kill: allowed
        rel = [m for m in msgs if m.body == b"rel"]
        offset += len(msgs)
    assert rel, "the delivery-time message was lost in the kill"
    assert 2.998 <= rel[0].store_timestamp / 1000 - t1 and at - t1 <= 15  # the kill -9 restart comes first


def test_queues_left_by_a_longer_table_are_still_delivered(tmp_path):
    clock, store, svc = make(tmp_path, table="1s 2s 3s 4s")
    put(svc, store, body=b"lvl4", props={"DELAY": "4"})
    svc2 = ScheduleMessageService(store, parse_delay_levels("1s 2s"), tmp_path / "d2.json", HOST, clock)
    svc2.load()
    assert len(svc2.level_timers) == 4 and svc2.level_timers[3].delay_ms == 2000  # the longest delay
    assert svc2.level_timers[3].run_due(T0_MS + 2000) is None
    assert [m.body for m in real(store)] == [b"lvl4"]
