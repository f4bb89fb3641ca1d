"""Put / get behaviour of MessageStore: record layout, rollover, batches, the 6.4 status table,
tag filtering, time and key lookups."""

from __future__ import annotations

import asyncio
import logging
import struct

import pytest

from tidemq.message import BLANK_MAGIC, SysFlag, decode_offset_msg_id, decode_record, java_hash, tags_code

from tidemq.broker.store import consume_queue
from tidemq.broker.store.store import GetStatus, PutRequest, PutStatus

from tests.broker.store.util import SEGMENT, Clock, config, open_store, read_queue, req

A6 = bytes.fromhex(  # the hex dump of PROTOCOL-REFERENCE A.6
    "00 00 00 89 da a3 20 a7 36 10 a6 86 00 00 00 00"
    "00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00"
    "00 00 00 00 00 00 00 00 00 00 01 8b cf e5 68 00"
    "7f 00 00 01 00 00 c3 50 00 00 01 8b cf e5 68 7b"
    "7f 00 00 01 00 00 2a 9f 00 00 00 00 00 00 00 00"
    "00 00 00 00 00 00 00 05 68 65 6c 6c 6f 09 54 6f"
    "70 69 63 54 65 73 74 00 20 54 41 47 53 01 54 61"
    "67 41 02 43 4c 55 53 54 45 52 01 44 65 66 61 75"
    "6c 74 43 6c 75 73 74 65 72"
)


def test_first_record_matches_the_reference_layout(tmp_path):
    """PROTOCOL-REFERENCE A.6: the 137-byte record, byte for byte, and its offset message id."""
    store = open_store(config(tmp_path), clock=Clock(1700000000123 / 1000))
    r = store.put(PutRequest(
        "TopicTest", 0, b"hello", {"TAGS": "TagA", "CLUSTER": "DefaultCluster"},
        born_timestamp=1700000000000, born_host=("127.0.0.1", 50000), store_host=("127.0.0.1", 10911),
    ))
    assert r.status is PutStatus.PUT_OK
    assert (r.physical_offset, r.queue_offset, r.count, r.end_offset) == (0, 0, 1, 137)
    assert r.msg_ids == ["7F00000100002A9F0000000000000000"]
    got = store.get_messages("TopicTest", 0, 0, 32, None)
    assert got.records == [A6]
    assert store.read_record(0) == A6
    store.close_abruptly()


def test_put_get_round_trip_keeps_every_field(tmp_path):
    clock = Clock()
    store = open_store(config(tmp_path), clock=clock)
    r = store.put(PutRequest(
        "Orders", 3, b"\x00body\xff", {"TAGS": "TagB", "KEYS": "k1 k2", "UNIQ_KEY": "U1", "x": "y"},
        flag=7, sys_flag=SysFlag.COMPRESSED, born_timestamp=123, born_host=("10.0.0.2", 4000),
        store_host=("10.0.0.9", 10911), reconsume_times=2, prepared_transaction_offset=99,
    ))
    m = read_queue(store, "Orders", 3)[0]
    assert (m.topic, m.body, m.queue_id, m.queue_offset, m.flag, m.sys_flag) == (
        "Orders", b"\x00body\xff", 3, 0, 7, SysFlag.COMPRESSED)
    assert m.properties == {"TAGS": "TagB", "KEYS": "k1 k2", "UNIQ_KEY": "U1", "x": "y"}
    assert (m.born_timestamp, m.born_host, m.store_host) == (123, "10.0.0.2:4000", "10.0.0.9:10911")
    assert (m.reconsume_times, m.prepared_transaction_offset) == (2, 99)
    assert m.store_timestamp == int(clock.now * 1000)
    assert m.commit_log_offset == r.physical_offset and m.offset_msg_id == r.msg_ids[0]
    assert decode_offset_msg_id(r.msg_ids[0]) == ("10.0.0.9:10911", r.physical_offset)
    store.close_abruptly()


def test_rollover_writes_a_blank_filler_and_no_record_spans_segments(tmp_path):
    store = open_store(config(tmp_path))
    results = [store.put(req(body=bytes([i % 251]) * 3000)) for i in range(70)]
    assert all(r.ok for r in results)
    assert store.stats()["segments"] >= 4
    for r in results:
        assert r.physical_offset // SEGMENT == (r.end_offset - 1) // SEGMENT
    # The record after a rollover starts a segment; the bytes after the previous one are a filler.
    rolled = [(a, b) for a, b in zip(results, results[1:]) if b.physical_offset != a.end_offset]
    assert rolled
    for a, b in rolled:
        assert b.physical_offset % SEGMENT == 0
        seg = (tmp_path / "commitlog" / f"{a.end_offset // SEGMENT * SEGMENT:020d}").read_bytes()
        pos = a.end_offset % SEGMENT
        assert struct.unpack_from(">iI", seg, pos) == (SEGMENT - pos, BLANK_MAGIC)
    msgs = read_queue(store, "T", 0)
    assert [m.body for m in msgs] == [bytes([i % 251]) * 3000 for i in range(70)]
    assert [m.queue_offset for m in msgs] == list(range(70))
    store.close_abruptly()


def test_batch_gets_consecutive_offsets_in_one_segment(tmp_path):
    store = open_store(config(tmp_path))
    for _ in range(20):
        store.put(req(body=b"a" * 3000))  # leaves the first segment nearly full
    batch = [req(body=bytes([65 + i]) * 3000, keys=f"b{i}") for i in range(5)]
    r = store.put_batch(batch)
    assert r.status is PutStatus.PUT_OK
    assert (r.queue_offset, r.count, len(r.msg_ids)) == (20, 5, 5)
    assert r.physical_offset // SEGMENT == (r.end_offset - 1) // SEGMENT
    msgs = read_queue(store, "T", 0, 20)
    assert [m.queue_offset for m in msgs] == [20, 21, 22, 23, 24]
    assert [m.body[:1] for m in msgs] == [b"A", b"B", b"C", b"D", b"E"]
    assert [m.offset_msg_id for m in msgs] == r.msg_ids
    assert len({m.store_timestamp for m in msgs}) == 1
    assert msgs[-1].commit_log_offset + msgs[-1].store_size == r.end_offset
    store.close_abruptly()


def test_batch_is_all_or_nothing(tmp_path):
    store = open_store(config(tmp_path, max_message_size=1000))
    store.put(req())
    before = (store.commitlog_max_offset, store.max_offset("T", 0))
    bad = [req(), req(), req(body=b"x" * 1001)]
    r = store.put_batch(bad)
    assert r.status is PutStatus.MESSAGE_ILLEGAL and "message 2" in r.remark
    assert store.put_batch([req(), req(topic="Other")]).status is PutStatus.MESSAGE_ILLEGAL
    assert store.put_batch([req(body=b"y" * 900) for _ in range(80)]).status is PutStatus.MESSAGE_ILLEGAL
    half = req(sys_flag=SysFlag.TRANSACTION_PREPARED)
    assert store.put_batch([req(), half]).status is PutStatus.MESSAGE_ILLEGAL
    assert store.put_batch([]).status is PutStatus.MESSAGE_ILLEGAL
    assert (store.commitlog_max_offset, store.max_offset("T", 0)) == before
    assert len(read_queue(store, "T", 0)) == 1
    store.close_abruptly()


def test_invalid_requests_are_refused_and_the_store_keeps_working(tmp_path):
    store = open_store(config(tmp_path, max_message_size=100))
    assert store.put(req(body=b"x" * 101)).status is PutStatus.MESSAGE_ILLEGAL
    assert store.put(req(props={"big": "v" * 40000})).status is PutStatus.PROPERTIES_SIZE_EXCEEDED
    for topic in ("", "../etc", "a/b", "x" * 128):
        assert store.put(req(topic=topic)).status is PutStatus.MESSAGE_ILLEGAL
    assert store.put(req(queue_id=2**31)).status is PutStatus.MESSAGE_ILLEGAL
    assert store.put(req(flag=2**40)).status is PutStatus.MESSAGE_ILLEGAL
    assert store.commitlog_max_offset == 0
    r = store.put(req())
    assert r.ok and r.physical_offset == 0
    assert [m.body for m in read_queue(store, "T", 0)] == [b"hello"]
    store.close_abruptly()


def test_get_status_table(tmp_path):
    """Every row of PROTOCOL-REFERENCE 6.4's table: status and nextBeginOffset."""
    store = open_store(config(tmp_path))
    r = store.get_messages("Nope", 0, 5, 32, None)
    assert (r.status, r.next_begin_offset, r.min_offset, r.max_offset) == (
        GetStatus.NO_MESSAGE_IN_QUEUE, 0, 0, 0)
    for i in range(10):
        store.put(req(tags="TagA" if i % 2 else "TagB"))
    r = store.get_messages("T", 0, 10, 32, None)
    assert (r.status, r.next_begin_offset, r.max_offset) == (GetStatus.OFFSET_OVERFLOW_ONE, 10, 10)
    r = store.get_messages("T", 0, 15, 32, None)
    assert (r.status, r.next_begin_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, 10)
    r = store.get_messages("T", 0, 2, 3, None)
    assert (r.status, r.next_begin_offset, r.message_count) == (GetStatus.FOUND, 5, 3)
    assert r.total_bytes == sum(len(x) for x in r.records)
    r = store.get_messages("T", 0, 0, 32, frozenset({java_hash("TagC")}))
    assert (r.status, r.next_begin_offset, r.records) == (GetStatus.NO_MATCHED_MESSAGE, 10, [])
    store.close_abruptly()


def test_offset_too_small_and_message_was_removing(tmp_path):
    store = open_store(config(tmp_path))
    for _ in range(10):
        store.put(req(body=b"z" * 3000))  # queue 0 lives in the first segment only
    for _ in range(50):
        store.put(req(queue_id=1, body=b"z" * 3000))
    cq = store._cq("T", 0)
    # Units pointing into a segment that is gone (deleted, min offset not corrected yet):
    store._commitlog.detach_head(1)
    r = store.get_messages("T", 0, 0, 4, None)
    assert (r.status, r.next_begin_offset, r.records) == (GetStatus.MESSAGE_WAS_REMOVING, 10, [])
    cq.detach_below(store.commitlog_min_offset)
    assert cq.min_offset == cq.max_offset == 10
    r = store.get_messages("T", 0, 3, 4, None)
    assert (r.status, r.next_begin_offset, r.min_offset) == (GetStatus.OFFSET_TOO_SMALL, 10, 10)
    r = store.get_messages("T", 0, 10, 4, None)
    assert r.status is GetStatus.OFFSET_OVERFLOW_ONE
    store.close_abruptly()


def test_message_was_removing_then_found_in_one_pull(tmp_path):
    store = open_store(config(tmp_path))
    for _ in range(30):
        store.put(req(body=b"z" * 3000))
    store._commitlog.detach_head(1)
    r = store.get_messages("T", 0, 0, 32, None)
    assert r.status is GetStatus.FOUND
    first = decode_record(r.records[0])
    assert first.commit_log_offset == SEGMENT and r.next_begin_offset == first.queue_offset + r.message_count
    store.close_abruptly()


def test_offset_found_null_when_the_queue_file_is_missing(tmp_path):
    store = open_store(config(tmp_path))
    for _ in range(150):
        store.put(req())
    cq = store._cq("T", 0)
    assert len(cq.files) == 3
    cq.files.pop(1), cq._starts.pop(1)  # the file holding offsets 64..127 is gone
    r = store.get_messages("T", 0, 70, 32, None)
    assert (r.status, r.next_begin_offset) == (GetStatus.OFFSET_FOUND_NULL, 128)
    store.close_abruptly()


def test_tag_filtering_counts_scanned_units(tmp_path):
    store = open_store(config(tmp_path))
    for i in range(40):
        store.put(req(tags=("TagA", "TagB", "TagC")[i % 3], body=str(i).encode()))
    want = frozenset({java_hash("TagA"), java_hash("TagC")})
    r = store.get_messages("T", 0, 0, 5, want)
    bodies = [decode_record(x).body for x in r.records]
    assert bodies == [b"0", b"2", b"3", b"5", b"6"]
    assert r.next_begin_offset == 7
    assert all(decode_record(x).tags in ("TagA", "TagC") for x in r.records)
    r = store.get_messages("T", 0, 0, 100, frozenset({java_hash("TagB")}))
    assert r.message_count == 13 and r.next_begin_offset == 40
    store.close_abruptly()


def test_scan_is_bounded_and_a_large_message_is_always_returned(tmp_path):
    store = open_store(config(tmp_path, consume_queue_units_per_file=3000, commitlog_segment_size=1 << 20))
    for i in range(1000):
        store.put(req(tags="TagA"))
    r = store.get_messages("T", 0, 0, 32, frozenset({1}))
    assert (r.status, r.next_begin_offset) == (GetStatus.NO_MATCHED_MESSAGE, 800)
    store.put(req(body=b"B" * 50_000))
    r = store.get_messages("T", 0, 1000, 32, None, max_bytes=1024)
    assert r.message_count == 1 and len(r.records[0]) > 50_000
    r = store.get_messages("T", 0, 0, 32, None, max_bytes=500)
    assert r.message_count == len(r.records) and r.total_bytes <= 500
    assert r.next_begin_offset == r.message_count
    store.close_abruptly()


def test_offset_by_time_and_store_times(tmp_path):
    clock = Clock(1000.0)
    store = open_store(config(tmp_path), clock=clock)
    assert store.offset_by_time("T", 0, 5) == 0
    for t in (1000, 2000, 2000, 3000, 4000):
        clock.now = t
        store.put(req())
    assert store.offset_by_time("T", 0, 2_000_000) == 1  # the first of equal times
    assert store.offset_by_time("T", 0, 3_000_000) == 3
    assert store.offset_by_time("T", 0, 3_400_000) == 3  # nearer neighbour: left
    assert store.offset_by_time("T", 0, 3_600_000) == 4  # nearer neighbour: right
    assert store.offset_by_time("T", 0, 3_500_000) == 3  # tie: the earlier
    assert store.offset_by_time("T", 0, 1) == 0
    assert store.offset_by_time("T", 0, 9_000_000) == 4
    assert store.earliest_store_time("T", 0) == 1_000_000
    assert store.store_time_at("T", 0, 3) == 3_000_000
    assert store.store_time_at("T", 0, 5) == 0 and store.earliest_store_time("X", 0) == 0
    store.close_abruptly()


def test_query_by_key_and_uniq_key(tmp_path):
    clock = Clock(1000.0)
    store = open_store(config(tmp_path), clock=clock)
    for i in range(300):  # several index files (400 entries each), hash collisions (97 slots)
        clock.now = 1000.0 + i
        store.put(req(keys=f"order-{i % 50} all", uniq=f"U{i}", body=str(i).encode()))
    store.put(req(topic="Other", keys="order-1", uniq="U1"))
    got = [decode_record(x) for x in store.query_by_key("T", "order-1", 32, 0, 2**62)]
    assert [m.body for m in got] == [b"251", b"201", b"151", b"101", b"51", b"1"]  # newest first
    assert all(m.topic == "T" for m in got)
    assert [decode_record(x).body for x in store.query_by_key("T", "U7", 32, 0, 2**62)] == [b"7"]
    assert len(store.query_by_key("T", "all", 10, 0, 2**62)) == 10
    window = store.query_by_key("T", "order-1", 32, 1_100_000, 1_210_000)
    assert [decode_record(x).body for x in window] == [b"201", b"151", b"101"]
    assert store.query_by_key("T", "missing", 32, 0, 2**62) == []
    assert store.stats()["index_files"] >= 2
    store.close_abruptly()


def test_half_messages_are_stored_but_not_queued(tmp_path):
    store = open_store(config(tmp_path))
    heard = []
    store.add_dispatch_listener(lambda *a: heard.append(a))
    prepared = store.put(req(sys_flag=SysFlag.TRANSACTION_PREPARED, uniq="H1"))
    rolled = store.put(req(sys_flag=SysFlag.TRANSACTION_ROLLBACK, uniq="H2"))
    assert prepared.ok and prepared.queue_offset == 0 and store.max_offset("T", 0) == 0
    assert decode_record(store.read_record(prepared.physical_offset)).queue_offset == 0
    assert len(store.query_by_key("T", "H1", 5, 0, 2**62)) == 1  # prepared: indexed
    assert store.query_by_key("T", "H2", 5, 0, 2**62) == []  # rollback: not indexed
    committed = store.put(req(sys_flag=SysFlag.TRANSACTION_COMMIT, tags="TagA"))
    assert committed.queue_offset == 0 and store.max_offset("T", 0) == 1
    assert heard == [("T", 0, 0, java_hash("TagA"))]
    assert rolled.ok
    store.close_abruptly()


def test_dispatch_listener_and_given_tags_code(tmp_path):
    store = open_store(config(tmp_path))
    heard = []
    store.add_dispatch_listener(lambda *a: heard.append(a))
    store.add_dispatch_listener(lambda *a: 1 / 0)  # a failing listener does not fail the put
    sched = req(topic="SCHEDULE_TOPIC_XXXX", queue_id=2, tags_code=1_700_000_010_000, tags="TagA")
    assert store.put(sched).ok
    store.put_batch([req(queue_id=1), req(queue_id=1)])
    # A batch is heard once per tags code, with the highest offset stored under it.
    store.put_batch([req(queue_id=1, tags="TagA"), req(queue_id=1, tags="TagB"), req(queue_id=1, tags="TagA")])
    a, b = tags_code("TagA"), tags_code("TagB")
    assert heard == [("SCHEDULE_TOPIC_XXXX", 2, 0, 1_700_000_010_000), ("T", 1, 1, 0), ("T", 1, 4, a), ("T", 1, 3, b)]
    r = store.get_messages("SCHEDULE_TOPIC_XXXX", 2, 0, 1, frozenset({1_700_000_010_000}))
    assert r.status is GetStatus.FOUND
    assert store.queue_ids("T") == [1] and store.queue_ids("none") == []
    store.close_abruptly()


@pytest.mark.timeout(20, func_only=True)
async def test_delete_topic_drops_its_queues(tmp_path, caplog):
    store = open_store(config(tmp_path))
    await store.start()
    for q in range(3):
        store.put(req(topic="Gone", queue_id=q))
    store.put(req(topic="Kept"))
    store.delete_topic("Gone")
    assert store.queue_ids("Gone") == [] and store.max_offset("Gone", 0) == 0
    assert store.get_messages("Gone", 0, 0, 32, None).status is GetStatus.NO_MESSAGE_IN_QUEUE
    with caplog.at_level(logging.WARNING):
        await store.flush()  # the new queue directories went aside with the topic: none to fsync
    assert "cannot open directory" not in caplog.text
    await store.shutdown()
    assert not (tmp_path / "consumequeue" / "Gone").exists()
    again = open_store(config(tmp_path))
    assert again.queue_ids("Gone") == [] and again.max_offset("Kept", 0) == 1
    again.close_abruptly()


def test_stats_count_puts(tmp_path):
    store = open_store(config(tmp_path))
    store.put(req())
    store.put_batch([req(), req()])
    st = store.stats()
    assert (st["messages_put"], st["batches_put"], st["queues"]) == (3, 1, 1)
    assert st["bytes_put"] == store.commitlog_max_offset
    store.close_abruptly()


@pytest.mark.parametrize("host", ["::1", "2001:db8::5"])
def test_ipv6_store_host_is_encoded_with_its_flag(tmp_path, host):
    store = open_store(config(tmp_path))
    r = store.put(req(store_host=(host, 10911)))
    m = decode_record(store.read_record(r.physical_offset))
    assert m.sys_flag & SysFlag.STOREHOST_V6 and m.store_host.endswith(":10911")
    assert len(r.msg_ids[0]) == 56
    store.close_abruptly()


@pytest.mark.parametrize("warm", [False, True])
@pytest.mark.timeout(20, func_only=True)
async def test_next_segment_is_created_off_the_loop(tmp_path, warm):
    store = open_store(config(tmp_path, warm_segments=warm))  # warm: pre-faulted (MAP_POPULATE)
    await store.start()
    cl = store._commitlog
    for i in range(80):
        # Give the worker the time it needs (not a fixed slice a loaded machine may not honour):
        # a put must then never find the next segment missing or still unstarted.
        pending = cl._pending
        if pending is not None:
            await asyncio.wait_for(asyncio.wrap_future(pending), 10)
        assert store.put(req(body=bytes([i]) * 3000)).ok
        await asyncio.sleep(0.002)
    st = store.stats()
    assert st["segments"] >= 4 and st["segments_created_on_loop"] == 0
    got = [m.body for m in read_queue(store, "T", 0)]
    assert got == [bytes([i]) * 3000 for i in range(80)]
    await store.shutdown()


def test_a_file_that_cannot_be_created_refuses_the_put_and_writes_nothing(tmp_path, monkeypatch):
    store = open_store(config(tmp_path))
    assert store.put(req(topic="A")).ok
    end = store.commitlog_max_offset

    def fail(*a, **kw):
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(consume_queue.LazyMappedFile, "create", fail)
    r = store.put(req(topic="B"))
    assert r.status is PutStatus.SERVICE_NOT_AVAILABLE and "Too many open files" in r.remark
    assert store.commitlog_max_offset == end and store.max_offset("B", 0) == 0
    monkeypatch.undo()
    assert store.put(req(topic="B")).queue_offset == 0
    store.close_abruptly()
