"""CommitLog replication between two real MessageStores on loopback (no broker process): catch-up
to a byte-identical log and the same consume queues, truncation of a diverged follower, resuming
after a restart, a connection dropped mid-frame and a corrupt frame leaving nothing behind, one
ack for the frames of one read, and a moved high-water mark reaching an idle follower; the
connection scenarios again on uvloop, the broker's loop (its transports are not asyncio's)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
import socket
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from pathlib import Path

import pytest
import uvloop

from tidemq.errors import StoreError
from tidemq.message import decode_record, decode_record_header

from tidemq.broker.ha import protocol
from tidemq.broker.ha.protocol import Ack, Data, Handshake, Heartbeat, Refusal, Welcome
from tidemq.broker.ha.replication import (
    EpochStart,
    ReplicationConfig,
    ReplicationError,
    ReplicationFollower,
    ReplicationMaster,
    truncation_point,
)
from tidemq.broker.store import deletions
from tidemq.broker.store import store as store_module
from tidemq.broker.store.replay import TIMER_TOPIC
from tidemq.broker.store.store import MessageStore
from tests.broker.store.util import Clock, config, open_store, req

CFG = ReplicationConfig("c", "broker-a", frame_bytes=4096, max_unacked_bytes=16384, heartbeat_interval=0.1,
                        timeout=3.0, poll_interval=0.01, retry_interval=0.05)
_Follower = ReplicationFollower


@pytest.fixture(autouse=True, params=[True, False], ids=["acks-flushed", "acks-appended"])
def ack_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Every test twice: followers that ack what they flushed (a SYNC_FLUSH broker's: a task
    appends, flushes, acks) and what they appended (ASYNC_FLUSH: appended and acked in the
    connection's callback), unless the test names its mode."""
    flushed: bool = request.param

    def follower(*args: object, **kwargs: object) -> ReplicationFollower:
        kwargs.setdefault("ack_flushed", flushed)
        return _Follower(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setitem(globals(), "ReplicationFollower", follower)
    return flushed


async def started(root: Path) -> MessageStore:
    store = open_store(config(root), clock=Clock())
    await store.start()
    return store


@contextlib.asynccontextmanager
async def stores(tmp_path: Path) -> AsyncIterator[tuple[MessageStore, MessageStore]]:
    master, follower = await started(tmp_path / "m"), await started(tmp_path / "f")
    try:
        yield master, follower
    finally:
        await master.shutdown()
        await follower.shutdown()


def put(store: MessageStore, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        body = bytes([i % 251]) * (100 + (i * 37) % 700)  # sizes vary: segments roll over with fillers
        r = store.put(req(f"T{i % 3}", i % 2, body, tags=f"t{i % 4}", keys=f"k{i}", uniq=f"u{i}"))
        assert r.status.name == "PUT_OK"


def commitlog(store: MessageStore) -> bytes:
    data = b"".join(p.read_bytes() for p in sorted(store.config.commitlog_dir.iterdir()))
    return data[store.commitlog_min_offset : store.commitlog_max_offset]


def queues(store: MessageStore) -> dict[tuple[str, int], list[tuple[int, int, int] | None]]:
    out = {}
    for topic in store.topics():
        for qid in store.queue_ids(topic):
            cq = store._cq(topic, qid)
            assert cq is not None
            out[topic, qid] = [cq.unit(q) for q in range(cq.min_offset, cq.max_offset)]
    return out


async def until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.01)


def assert_same(master: MessageStore, follower: MessageStore) -> None:
    assert follower.commitlog_max_offset == master.commitlog_max_offset
    assert commitlog(follower) == commitlog(master)
    assert queues(follower) == queues(master)


@contextlib.asynccontextmanager
async def replicating(master: MessageStore, follower: MessageStore, epoch: int = 1,
                      history: tuple[EpochStart, ...] = (EpochStart(1, 0),),
                      follower_epoch: int = 1) -> AsyncIterator[tuple[ReplicationMaster, ReplicationFollower]]:
    m = ReplicationMaster(master, CFG, epoch, history)
    port = await m.start("127.0.0.1", 0)
    f = ReplicationFollower(follower, CFG, 1, follower_epoch, ("127.0.0.1", port))
    f.start()
    try:
        yield m, f
    finally:
        await f.close()
        await m.close()


def test_truncation_point_is_the_start_of_the_first_epoch_after_the_followers() -> None:
    history = (EpochStart(1, 0), EpochStart(2, 500), EpochStart(3, 900))
    assert truncation_point(history, 1, 700, 1200) == 500  # holds a tail epoch 2's master never had
    assert truncation_point(history, 1, 400, 1200) is None  # behind: nothing to cut
    assert truncation_point(history, 2, 1000, 1200) == 900
    assert truncation_point(history, 3, 1000, 1200) is None
    assert truncation_point(history, 3, 1300, 1200) == 1200  # never past the master's end


async def test_follower_catches_up_to_a_byte_identical_log_and_the_same_queues(tmp_path: Path) -> None:
    async with stores(tmp_path) as (master, follower):
        put(master, 300)  # ~125 KiB: rolls over two 64 KiB segments
        async with replicating(master, follower) as (m, _f):
            await until(lambda: m.acked_offset(1) == master.commitlog_max_offset)
            put(master, 100, 300)  # live, while streaming
            m.wake()
            await until(lambda: m.acked_offset(1) == master.commitlog_max_offset)
            assert m.followers()[1].sent == master.commitlog_max_offset
        assert_same(master, follower)
        assert len(follower.query_by_key("T1", "k7", 5, 0, 1 << 62)) == 1  # the index was built too


async def test_a_diverged_follower_truncates_to_the_new_epoch_and_then_matches(tmp_path: Path) -> None:
    async with stores(tmp_path) as (master, follower):
        put(master, 120)
        async with replicating(master, follower) as (m, _f):
            await until(lambda: m.acked_offset(1) == master.commitlog_max_offset)
        common = master.commitlog_max_offset
        put(follower, 40, 1000)  # written by the follower as an old master, never replicated
        put(master, 80, 120)  # epoch 2 began at ``common``
        assert follower.commitlog_max_offset > common
        history = (EpochStart(1, 0), EpochStart(2, common))
        async with replicating(master, follower, epoch=2, history=history) as (m, f):
            await until(lambda: m.acked_offset(1) == master.commitlog_max_offset)
            assert f.epoch == 2
        assert_same(master, follower)
        cfg, log, units = follower.config, commitlog(master), queues(master)
    # The truncation is durable: a load finds the master's log, not the cut tail.
    reopened = open_store(cfg, clock=Clock())
    try:
        assert commitlog(reopened) == log
        assert queues(reopened) == units
    finally:
        await reopened.shutdown()


async def test_a_restarted_follower_resumes_from_its_end(tmp_path: Path) -> None:
    master = await started(tmp_path / "m")
    follower = await started(tmp_path / "f")
    try:
        put(master, 400)
        async with replicating(master, follower):
            await until(lambda: follower.commitlog_max_offset > 0)
        stopped_at = follower.commitlog_max_offset
        await follower.shutdown()
        put(master, 50, 400)
        follower = await started(tmp_path / "f")
        assert follower.commitlog_max_offset == stopped_at
        async with replicating(master, follower) as (m, _f):
            await until(lambda: m.acked_offset(1) == master.commitlog_max_offset)
        assert_same(master, follower)
    finally:
        await master.shutdown()
        await follower.shutdown()


@contextlib.asynccontextmanager
async def fake_master(send: Callable[[asyncio.StreamWriter], None],
                      closed: asyncio.Event) -> AsyncIterator[int]:
    """A master that answers any handshake with a welcome at offset 0, then writes ``send``'s bytes;
    ``closed`` is set when the follower closes its end."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        kind, length = protocol.decode_head(await reader.readexactly(protocol.FRAME_HEAD.size))
        assert isinstance(protocol.decode_body(kind, await reader.readexactly(length)), Handshake)
        writer.write(protocol.encode(Welcome(1, -1, 0)))
        send(writer)
        await writer.drain()
        with contextlib.suppress(ConnectionError):
            while await reader.read(1 << 16):
                pass
        closed.set()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def test_a_connection_dropped_mid_frame_leaves_no_partial_record(tmp_path: Path) -> None:
    async with stores(tmp_path) as (master, follower):
        put(master, 10)
        at, records = master.read_commitlog(0, 1 << 20)
        frame = protocol.encode(Data(1, at, records))

        def half(writer: asyncio.StreamWriter) -> None:
            writer.write(frame[: len(frame) // 2])
            writer.write_eof()

        closed = asyncio.Event()
        async with fake_master(half, closed) as port:
            f = ReplicationFollower(follower, CFG, 1, 1, ("127.0.0.1", port))
            with pytest.raises(asyncio.IncompleteReadError):
                await f.run_session()
        assert follower.commitlog_max_offset == 0
        assert follower.read_record(0) is None

        async with fake_master(lambda w: w.write(frame), asyncio.Event()) as port:
            f = ReplicationFollower(follower, CFG, 1, 1, ("127.0.0.1", port))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    await f.run_session()
        assert commitlog(follower) == commitlog(master)


async def test_a_corrupt_data_frame_is_refused_and_the_connection_closed(tmp_path: Path) -> None:
    async with stores(tmp_path) as (master, follower):
        put(master, 10)
        at, records = master.read_commitlog(0, 1 << 20)
        bad = bytearray(records)
        bad[decode_record_header(records).body_start + 3] ^= 0x01  # as a master's damaged disk would
        closed = asyncio.Event()
        async with fake_master(lambda w: w.write(protocol.encode(Data(1, at, bytes(bad)))), closed) as port:
            f = ReplicationFollower(follower, CFG, 1, 1, ("127.0.0.1", port))
            with pytest.raises(StoreError, match="refused"):
                await f.run_session()
            async with asyncio.timeout(5):
                await closed.wait()
        assert follower.commitlog_max_offset == 0
        assert follower.read_record(0) is None
        assert queues(follower) == {}


async def test_a_data_frame_damaged_in_transit_fails_its_crc(tmp_path: Path) -> None:
    async with stores(tmp_path) as (master, follower):
        put(master, 3)
        at, records = master.read_commitlog(0, 1 << 20)
        raw = bytearray(protocol.encode(Data(1, at, records)))
        raw[protocol.FRAME_HEAD.size + protocol.DATA.size + 8] ^= 0x01  # a header byte no BODYCRC covers
        closed = asyncio.Event()
        async with fake_master(lambda w: w.write(bytes(raw)), closed) as port:
            f = ReplicationFollower(follower, CFG, 1, 1, ("127.0.0.1", port))
            with pytest.raises(protocol.ReplicationCodecError, match="CRC"):
                await f.run_session()
            async with asyncio.timeout(5):
                await closed.wait()
        assert follower.commitlog_max_offset == 0


async def test_appending_refuses_a_gap_and_an_overlap(tmp_path: Path) -> None:
    async with stores(tmp_path) as (master, follower):
        put(master, 3)
        _, records = master.read_commitlog(0, 1 << 20)
        size = len(records)
        with pytest.raises(StoreError, match="gap or an overlap"):
            follower.append_replicated(100, records)
        assert follower.append_replicated(0, records) == size
        with pytest.raises(StoreError, match="gap or an overlap"):
            follower.append_replicated(0, records)
        assert commitlog(follower) == commitlog(master)


async def test_the_master_refuses_another_group_and_a_newer_epoch(tmp_path: Path) -> None:
    async with stores(tmp_path) as (master, follower):
        m = ReplicationMaster(master, CFG, 2, (EpochStart(2, 0),))
        port = await m.start("127.0.0.1", 0)
        try:
            other = ReplicationConfig("c", "broker-b", timeout=3.0)
            with pytest.raises(ReplicationError, match="check --cluster and --broker-name"):
                await ReplicationFollower(follower, other, 1, 1, ("127.0.0.1", port)).run_session()
            with pytest.raises(ReplicationError, match="this master is stale"):
                await ReplicationFollower(follower, CFG, 1, 3, ("127.0.0.1", port)).run_session()
        finally:
            await m.close()
        assert isinstance(protocol.decode(protocol.encode(Refusal("x"))), Refusal)


async def test_a_truncation_across_segments_survives_a_crash(tmp_path: Path) -> None:
    store = await started(tmp_path / "f")
    put(store, 60)
    cut = store.commitlog_max_offset
    units = queues(store)
    put(store, 400, 60)  # three more segments, and a pre-created next one
    assert store.commitlog_max_offset > 3 * store.config.commitlog_segment_size
    await store.truncate(cut)
    assert store.commitlog_max_offset == cut
    assert queues(store) == units
    store.close_abruptly()
    reopened = open_store(store.config, clock=Clock())
    try:
        assert reopened.commitlog_max_offset == cut
        assert queues(reopened) == units
        assert sorted(p.name for p in reopened.config.commitlog_dir.iterdir()) == [f"{0:020d}"]
        await reopened.start()
        put(reopened, 200, 1000)  # and the log grows on from the cut, across segments again
    finally:
        await reopened.shutdown()


async def test_a_topic_deleted_in_a_cut_tail_keeps_the_new_masters_records_in_a_rebuild(tmp_path: Path) -> None:
    """A deletion in the cut tail is marked at the old log's end; the new master's records for a
    topic of the same name land below that mark after the cut, and replay must not skip them."""
    store = await started(tmp_path / "f")
    put(store, 5)
    cut = store.commitlog_max_offset
    for i in range(6):
        assert store.put(req("Gone", 0, b"old %d" % i)).ok
    store.delete_topic("Gone")
    await store.truncate(cut)
    for i in range(2):  # as the new master's, streamed in: the same bytes a put writes
        assert store.put(req("Gone", 0, b"new %d" % i)).ok
    assert store.max_offset("Gone", 0) == 2
    await store.shutdown()
    shutil.rmtree(store.config.consume_queue_dir)  # rebuilt from the CommitLog by replay
    reopened = open_store(store.config, clock=Clock())
    try:
        assert reopened.max_offset("Gone", 0) == 2
    finally:
        reopened.close_abruptly()


async def test_timer_units_carry_their_delivery_time_on_a_follower_and_after_a_replay(tmp_path: Path) -> None:
    """A delivery-timestamp message's unit carries its delivery time on the master (its put); a
    follower's replicated dispatch, what its listeners (its timer) hear, and a replay at load
    must give the same, or a promoted follower delivers it at once."""
    due = 1_700_000_060_000
    async with stores(tmp_path) as (master, follower):
        timed = req(TIMER_TOPIC, 0, b"later", props={"TIMER_OUT_MS": str(due), "REAL_TOPIC": "Real", "REAL_QID": "0"},
                    tags="TagT")
        timed.tags_code = due
        assert master.put(timed).ok
        heard: list[tuple[str, int, int, int]] = []
        follower.add_dispatch_listener(lambda *unit: heard.append(unit))
        follower.append_replicated(0, commitlog(master))
        assert heard == [(TIMER_TOPIC, 0, 0, due)]
        assert queues(follower) == queues(master)
        assert queues(master)[TIMER_TOPIC, 0][0][2] == due
        units = queues(master)
    shutil.rmtree(follower.config.consume_queue_dir)  # replayed from the CommitLog at load
    reopened = open_store(follower.config, clock=Clock())
    try:
        assert queues(reopened) == units
    finally:
        reopened.close_abruptly()


def bodies(store: MessageStore, topic: str, queue_id: int) -> list[bytes]:
    res = store.get_messages(topic, queue_id, 0, 64, None)
    return [decode_record(raw).body for raw in res.records]


async def test_a_topic_whose_deletion_is_cut_gets_its_queues_back_and_an_earlier_deletion_holds(
        tmp_path: Path) -> None:
    """The second of two deletions of one topic is cut: the topic's queues come back with what
    it held between the two (the first incarnation's records stay skipped), also after a load."""
    store = await started(tmp_path / "f")
    for i in range(3):
        assert store.put(req("Twice", 0, b"first life %d" % i)).ok
    store.delete_topic("Twice")
    for i in range(2):
        assert store.put(req("Twice", i, b"second life %d" % i)).ok
    put(store, 4)
    cut = store.commitlog_max_offset
    put(store, 1, 4)  # the tail: a record (a master writes its deletion's first), the deletion, more
    store.delete_topic("Twice")
    put(store, 5, 5)
    await store.truncate(cut, undeleted=["Twice"])
    assert (bodies(store, "Twice", 0), bodies(store, "Twice", 1)) == ([b"second life 0"], [b"second life 1"])
    assert not store.config.pending_cut_path.exists()
    await store.shutdown()
    shutil.rmtree(store.config.consume_queue_dir)  # and a replay from the CommitLog agrees
    reopened = open_store(store.config, clock=Clock())
    try:
        assert (bodies(reopened, "Twice", 0), bodies(reopened, "Twice", 1)) == ([b"second life 0"], [b"second life 1"])
    finally:
        reopened.close_abruptly()


async def deleted_in_a_tail(root: Path) -> tuple[MessageStore, int, dict]:
    """A store whose tail (past the returned cut) deletes topic Back and writes a new Back, whose
    queue offsets start at 0 again; and the queues as they were at the cut."""
    store = await started(root)
    for i in range(5):
        assert store.put(req("Back", i % 2, b"kept %d" % i)).ok
    put(store, 6)
    cut = store.commitlog_max_offset
    units = queues(store)
    put(store, 1, 6)  # a master writes its deletion's record first
    store.delete_topic("Back")
    for i in range(2):
        assert store.put(req("Back", 0, b"tail life %d" % i)).ok
    put(store, 3, 7)
    return store, cut, units


def assert_back(store: MessageStore, units: dict) -> None:
    assert queues(store) == units
    assert bodies(store, "Back", 0) == [b"kept 0", b"kept 2", b"kept 4"] and bodies(store, "Back", 1) == [b"kept 1", b"kept 3"]
    assert not store.config.pending_cut_path.exists()
    assert all(m <= store.commitlog_max_offset for ms in deletions.load(store.config.deleted_topics_path).values()
               for m in ms)


def crash_in(monkeypatch: pytest.MonkeyPatch, target: object, name: str) -> None:
    def crash(*_args: object, **_kw: object) -> None:
        raise OSError(f"killed in {name}")

    def crash_walking(*_args: object, **_kw: object) -> Iterator[tuple[int, object]]:
        raise OSError(f"killed in {name}")
        yield  # a generator, as the real walk

    monkeypatch.setattr(target, name, crash_walking if name == "walk_records" else crash)


@pytest.mark.parametrize("where", ["walk", "marks"])
async def test_a_cut_a_crash_interrupts_after_the_cut_is_finished_at_the_next_load(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """Killed in the rebuild's walk, or before the marks past the cut were moved: the load moves
    them and rebuilds the undeleted topic's queues (the tail's new incarnation is gone with the
    cut, the first one's records come back once, without a clash of queue offsets)."""
    store, cut, units = await deleted_in_a_tail(tmp_path / "f")
    crash_in(monkeypatch, store_module, "walk_records") if where == "walk" else crash_in(monkeypatch, deletions, "save")
    with pytest.raises(OSError, match="killed"):
        await store.truncate(cut, undeleted=["Back"])
    assert store.commitlog_max_offset == cut and store.config.pending_cut_path.exists()
    store.close_abruptly()
    monkeypatch.undo()
    reopened = open_store(store.config, clock=Clock())
    try:
        assert_back(reopened, units)
    finally:
        reopened.close_abruptly()


@pytest.mark.parametrize("where", ["walk", "marks"])
async def test_a_made_cut_is_finished_at_the_next_load_though_the_log_grew_since(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """The record says the cut was made: a log that grew past it since (other topics' writes)
    does not make it stale."""
    store, cut, units = await deleted_in_a_tail(tmp_path / "f")
    crash_in(monkeypatch, store_module, "walk_records") if where == "walk" else crash_in(monkeypatch, deletions, "save")
    with pytest.raises(OSError, match="killed"):
        await store.truncate(cut, undeleted=["Back"])
    monkeypatch.undo()
    put(store, 3, 30)
    units = {**queues(store), **{k: v for k, v in units.items() if k[0] == "Back"}}
    store.close_abruptly()
    reopened = open_store(store.config, clock=Clock())
    try:
        assert reopened.commitlog_max_offset > cut
        assert_back(reopened, units)
    finally:
        reopened.close_abruptly()


async def test_a_cut_a_crash_came_before_is_made_again_and_a_failed_rebuild_is_finished_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed before the cut: the load leaves the marks and queues as they were (consistent with
    the uncut log) and the next truncate cuts; a rebuild that fails is finished by the next
    truncate before anything else (the handshake is retried)."""
    store, cut, units = await deleted_in_a_tail(tmp_path / "f")
    crash_in(monkeypatch, store_module, "truncate_commitlog")
    with pytest.raises(OSError, match="killed"):
        await store.truncate(cut, undeleted=["Back"])
    store.close_abruptly()
    monkeypatch.undo()
    reopened = open_store(store.config, clock=Clock())
    try:
        assert reopened.commitlog_max_offset > cut and not reopened.config.pending_cut_path.exists()
        assert bodies(reopened, "Back", 0) == [b"tail life 0", b"tail life 1"]  # the tail's incarnation
        await reopened.start()
        crash_in(monkeypatch, store_module, "walk_records")
        with pytest.raises(OSError, match="killed"):
            await reopened.truncate(cut, undeleted=["Back"])
        monkeypatch.undo()
        await reopened.truncate(cut)  # the retried handshake: same cut point, nothing else to undo
        assert_back(reopened, units)
    finally:
        await reopened.shutdown()


async def test_the_next_session_finishes_a_cut_whose_rebuild_failed(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Its log already ends at the cut, so the master asks for no truncation: the follower still
    finishes the pending rebuild before it streams."""
    async with stores(tmp_path) as (master, follower):
        for i in range(5):
            assert master.put(req("Back", i % 2, b"kept %d" % i)).ok
        follower.append_replicated(0, commitlog(master))
        cut = follower.commitlog_max_offset
        units = queues(follower)
        put(follower, 1, 6)  # the follower's own tail, as an old master's: a record, the deletion
        follower.delete_topic("Back")
        crash_in(monkeypatch, store_module, "walk_records")
        with pytest.raises(OSError, match="killed"):
            await follower.truncate(cut, undeleted=["Back"])
        monkeypatch.undo()
        rm = ReplicationMaster(master, CFG, 1, (EpochStart(1, 0),))
        port = await rm.start("127.0.0.1", 0)
        rf = ReplicationFollower(follower, CFG, 1, 1, ("127.0.0.1", port))
        rf.start()
        try:
            await until(lambda: not follower.config.pending_cut_path.exists())
            assert master.put(req("Back", 0, b"new")).ok  # and streaming goes on
            await until(lambda: follower.max_offset("Back", 0) == 4)
        finally:
            await rf.close()
            await rm.close()
        assert {k: v for k, v in queues(follower).items() if v} == queues(master) != units
        assert bodies(follower, "Back", 0) == [b"kept 0", b"kept 2", b"kept 4", b"new"]


def test_deletion_marks_read_an_older_file_keep_a_history_and_refuse_junk(tmp_path: Path) -> None:
    path = tmp_path / "deletedTopics.json"
    path.write_text('{"Old": 120}')  # one mark per topic, as written before histories
    marks = deletions.load(path)
    assert marks == {"Old": [120]}
    for at in range(200, 200 + deletions.MAX_KEPT + 2):
        marks = deletions.deleted(marks, "Old", at)
    assert len(marks["Old"]) == deletions.MAX_KEPT and deletions.latest(marks) == {"Old": 209}
    assert deletions.cut({"A": [5, 50], "B": [60]}, 40, ["A"]) == {"A": [5], "B": [40]}
    for junk in ('{"A": "x"}', '{"A": [true]}', '{"A": []}', '[1]', '{"A": -1}'):
        path.write_text(junk)
        with pytest.raises(StoreError, match="deletedTopics.json"):
            deletions.load(path)


async def test_two_followers_of_one_master_both_match_it(tmp_path: Path) -> None:
    async with stores(tmp_path) as (master, follower):
        other = await started(tmp_path / "f2")
        try:
            put(master, 200)
            m = ReplicationMaster(master, CFG, 1, (EpochStart(1, 0),))
            port = await m.start("127.0.0.1", 0)
            followers = [ReplicationFollower(s, CFG, r, 1, ("127.0.0.1", port)) for r, s in ((1, follower), (2, other))]
            for f in followers:
                f.start()
            try:
                for n in (0, 120, 60):  # caught up, then live writes while both stream
                    put(master, n, 1000 + n)
                    m.wake()
                    await until(lambda: m.acked_offset(1) == m.acked_offset(2) == master.commitlog_max_offset)
            finally:
                for f in followers:
                    await f.close()
                await m.close()
            assert_same(master, follower)
            assert_same(master, other)
        finally:
            await other.shutdown()


async def test_a_follower_acks_the_frames_of_one_read_once_and_only_news(tmp_path: Path) -> None:
    """Three data frames written at once get one ack, for all three; a heartbeat with nothing new
    gets none (its keepalive is not due); the next frame gets its own."""
    async with stores(tmp_path) as (master, follower):
        ends = []
        for i in range(4):
            put(master, 1, i)
            ends.append(master.commitlog_max_offset)
        _, records = master.read_commitlog(0, 1 << 20)
        starts = [0, *ends[:3]]
        frames = [Data(1, lo, records[lo:hi]) for lo, hi in zip(starts[:3], ends[:3])]
        last = Data(1, ends[2], records[ends[2] : ends[3]])
        cuts = [ends[2], ends[3]]
        acks: list[int] = []
        step = asyncio.Event()
        got_ack = asyncio.Event()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            kind, length = protocol.decode_head(await reader.readexactly(protocol.FRAME_HEAD.size))
            assert isinstance(protocol.decode_body(kind, await reader.readexactly(length)), Handshake)
            writer.write(protocol.encode(Welcome(1, -1, 0)) + b"".join(protocol.encode(f) for f in frames))
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                while True:
                    kind, length = protocol.decode_head(await reader.readexactly(protocol.FRAME_HEAD.size))
                    ack = protocol.decode_body(kind, await reader.readexactly(length))
                    assert isinstance(ack, Ack)
                    acks.append(ack.offset)
                    got_ack.set()
                    await step.wait()
                    step.clear()
                    if len(acks) == 1:
                        writer.write(protocol.encode(Heartbeat(1, cuts[1])))
                        await asyncio.sleep(0.2)  # an ack for it would be read by now
                        writer.write(protocol.encode(last))

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        quiet = ReplicationConfig("c", "broker-a", heartbeat_interval=10.0, timeout=3.0)  # keepalive: 5 s
        f = ReplicationFollower(follower, quiet, 1, 1, ("127.0.0.1", server.sockets[0].getsockname()[1]),
                                ack_flushed=False)
        f.start()
        try:
            for _ in range(2):
                async with asyncio.timeout(5):
                    await got_ack.wait()
                got_ack.clear()
                step.set()
            await asyncio.sleep(0.1)
        finally:
            await f.close()
            server.close()
            await server.wait_closed()
        assert acks == cuts  # never past what it held, nothing for the heartbeat
        assert commitlog(follower) == commitlog(master)


async def test_a_moved_high_water_mark_reaches_an_idle_follower_before_its_heartbeat(tmp_path: Path) -> None:
    async with stores(tmp_path) as (master, follower):
        put(master, 5)
        mark = [-1]
        slow = ReplicationConfig("c", "broker-a", heartbeat_interval=30.0, timeout=3.0, poll_interval=0.01)
        m = ReplicationMaster(master, slow, 1, (EpochStart(1, 0),), high_water=lambda: mark[0])
        port = await m.start("127.0.0.1", 0)
        f = ReplicationFollower(follower, slow, 1, 1, ("127.0.0.1", port), ack_flushed=False)
        f.start()
        try:
            await until(lambda: m.acked_offset(1) == master.commitlog_max_offset)
            mark[0] = master.commitlog_max_offset  # acknowledged now, as the others' acks would make it
            await until(lambda: f.high_water == mark[0], timeout=5.0)  # not at the 30 s idle heartbeat
        finally:
            await f.close()
            await m.close()


async def test_a_parked_stream_gets_a_put_before_the_master_dispatches_it(tmp_path: Path) -> None:
    """A caught-up follower's frame is written within the put (the store's on_commit), before the
    put's dispatch, with no task step between: the followers' work overlaps the master's. Small
    puts made while a frame is in flight go together at the end of the loop step."""
    async with stores(tmp_path) as (master, follower):
        put(master, 3)
        async with replicating(master, follower) as (m, _f):
            await until(lambda: m.acked_offset(1) == master.commitlog_max_offset)
            await asyncio.sleep(0.05)  # the stream parks for news
            master.on_commit = m.wake
            seen: list[int] = []
            master.add_dispatch_listener(lambda *_: seen.append(m.followers()[1].sent))
            for i in range(3, 6):  # the follower has everything acked: each put goes at once
                put(master, 1, i)  # no await between the put and the check
                assert seen[-1] == master.commitlog_max_offset
                await until(lambda: m.acked_offset(1) == master.commitlog_max_offset)
            # Small puts while a frame is in flight wait for the end of the loop step: one frame.
            put(master, 1, 6)
            first = master.commitlog_max_offset
            put(master, 2, 7)
            assert seen[-1] == first < master.commitlog_max_offset
            await asyncio.sleep(0)
            assert m.followers()[1].sent == master.commitlog_max_offset
            await until(lambda: m.acked_offset(1) == master.commitlog_max_offset)
        assert_same(master, follower)


async def test_a_follower_acks_what_it_appended_before_it_dispatches(tmp_path: Path) -> None:
    """The ack for a read's frames is written before their dispatch (consume queue, index,
    listeners), in the same step: the master's wait does not include this replica's dispatch."""
    async with stores(tmp_path) as (master, follower):
        put(master, 3)
        m = ReplicationMaster(master, CFG, 1, (EpochStart(1, 0),))
        port = await m.start("127.0.0.1", 0)
        f = ReplicationFollower(follower, CFG, 1, 1, ("127.0.0.1", port), ack_flushed=False)
        acked_at_dispatch: list[tuple[int, int]] = []
        follower.add_dispatch_listener(lambda *_: acked_at_dispatch.append((f.acked, follower.commitlog_max_offset)))
        f.start()
        try:
            await until(lambda: m.acked_offset(1) == master.commitlog_max_offset)
            put(master, 40, 3)
            m.wake()
            await until(lambda: m.acked_offset(1) == master.commitlog_max_offset)
        finally:
            await f.close()
            await m.close()
        assert acked_at_dispatch and all(acked == end for acked, end in acked_at_dispatch)
        assert_same(master, follower)


async def test_a_truncation_dispatches_appended_frames_before_it_cuts(tmp_path: Path) -> None:
    async with stores(tmp_path) as (master, follower):
        reference = await started(tmp_path / "r")
        try:
            put(master, 60)
            frames = []
            at = 0
            while at < master.commitlog_max_offset:
                at, data = master.read_commitlog(at, 3000)
                frames.append((at, bytes(data)))
                at += len(data)
            cut = frames[len(frames) // 2][0]
            for at, data in frames:
                follower.append_replicated(at, data, dispatch=False)
                if at < cut:
                    reference.append_replicated(at, data)
            await follower.truncate(cut)
            assert follower.commitlog_max_offset == cut
            assert queues(follower) == queues(reference) != {}
        finally:
            await reference.shutdown()


async def _raw_follower(port: int, replica: int = 1, log_end: int = 0
                       ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, Welcome]:
    """A hand-driven follower: handshake sent, the master's Welcome read."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(protocol.encode(Handshake("c", "broker-a", replica, 1, log_end)))
    head = await reader.readexactly(protocol.FRAME_HEAD.size)
    kind, length = protocol.decode_head(head)
    welcome = protocol.decode_body(kind, await reader.readexactly(length))
    assert isinstance(welcome, Welcome)
    return reader, writer, welcome


async def _closed_by_peer(reader: asyncio.StreamReader, timeout: float) -> None:
    """Read (and drop) whatever comes until the master closes the connection."""
    async with asyncio.timeout(timeout):
        while await reader.read(65536):
            pass


async def test_acks_are_handled_as_they_arrive_with_no_task_step(tmp_path: Path) -> None:
    """The master reads acks in the connection's callback: the acknowledgement gate (on_change)
    hears of an ack outside any task, in the loop step that received it, so the sends it
    completes are answered in that step."""
    async with stores(tmp_path) as (master, follower):
        put(master, 5)
        tasks: list[asyncio.Task | None] = []
        m = ReplicationMaster(master, CFG, 1, (EpochStart(1, 0),), on_change=lambda: tasks.append(asyncio.current_task()))
        port = await m.start("127.0.0.1", 0)
        f = ReplicationFollower(follower, CFG, 1, 1, ("127.0.0.1", port))
        f.start()
        try:
            await until(lambda: m.acked_offset(1) == master.commitlog_max_offset)
            put(master, 3, 5)
            m.wake()
            await until(lambda: m.acked_offset(1) == master.commitlog_max_offset)
        finally:
            await f.close()
            await m.close()
        assert len(tasks) >= 2
        assert tasks[:-1] == [None] * (len(tasks) - 1)  # the last: the session's end, in its task
        assert_same(master, follower)


async def test_a_follower_acking_what_it_was_never_sent_is_dropped(tmp_path: Path) -> None:
    async with stores(tmp_path) as (master, _follower):
        put(master, 2)
        m = ReplicationMaster(master, CFG, 1, (EpochStart(1, 0),))
        port = await m.start("127.0.0.1", 0)
        try:
            reader, writer, _ = await _raw_follower(port)
            await until(lambda: 1 in m.followers())
            writer.write(protocol.encode(Ack(master.commitlog_max_offset + 1000)))
            await _closed_by_peer(reader, 5.0)
            await until(lambda: 1 not in m.followers())
            writer.close()
        finally:
            await m.close()


async def test_a_silent_follower_is_dropped_after_the_heartbeat_interval_and_timeout(tmp_path: Path) -> None:
    """A follower that never acks (not even the heartbeats) is dropped once silent past the
    heartbeat interval plus the timeout; one that keeps acking stays."""
    cfg = dataclasses.replace(CFG, heartbeat_interval=0.1, timeout=0.4)
    async with stores(tmp_path) as (master, follower):
        put(master, 2)
        m = ReplicationMaster(master, cfg, 1, (EpochStart(1, 0),))
        port = await m.start("127.0.0.1", 0)
        f = ReplicationFollower(follower, cfg, 2, 1, ("127.0.0.1", port))
        f.start()
        try:
            loop = asyncio.get_running_loop()
            reader, writer, _ = await _raw_follower(port)
            t0 = loop.time()
            await _closed_by_peer(reader, 5.0)
            # silent past 0.1 + 0.4 s, counted from the welcome (just before t0)
            assert 0.45 <= loop.time() - t0 < 3.0
            assert 1 not in m.followers() and 2 in m.followers()  # the acking one stays
            writer.close()
        finally:
            await f.close()
            await m.close()


async def test_an_acks_appended_follower_appends_in_the_connections_callback(tmp_path: Path, ack_mode: bool) -> None:
    """A follower acking what it appended takes each read's frames in the connection's callback
    (no task wakes up per read); one acking what it flushed does it in its task (it awaits the
    flush)."""
    async with stores(tmp_path) as (master, follower):
        tasks: list[asyncio.Task | None] = []
        follower.add_dispatch_listener(lambda *_: tasks.append(asyncio.current_task()))
        put(master, 4)
        async with replicating(master, follower) as (m, _f):
            await until(lambda: m.acked_offset(1) == master.commitlog_max_offset)
            tasks.clear()  # (the frames that came with the handshake were taken in the task)
            put(master, 3, 4)
            m.wake()
            await until(lambda: m.acked_offset(1) == master.commitlog_max_offset)
        assert len(tasks) == 3
        assert all(t is None for t in tasks) if not ack_mode else all(t is not None for t in tasks)
        assert_same(master, follower)


async def test_a_follower_ends_a_session_whose_master_went_silent(tmp_path: Path) -> None:
    """A master that welcomes and then sends nothing (no data, no heartbeat) is given up after
    the heartbeat interval plus the timeout: the session raises, the follower reconnects."""
    cfg = dataclasses.replace(CFG, heartbeat_interval=0.1, timeout=0.4)
    follower = await started(tmp_path / "f")
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        kind, length = protocol.decode_head(await reader.readexactly(protocol.FRAME_HEAD.size))
        assert isinstance(protocol.decode_body(kind, await reader.readexactly(length)), Handshake)
        writer.write(protocol.encode(Welcome(1, -1, 0, (EpochStart(1, 0),))))
        held.append(writer)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    try:
        loop = asyncio.get_running_loop()
        f = ReplicationFollower(follower, cfg, 1, 1, ("127.0.0.1", server.sockets[0].getsockname()[1]))
        t0 = loop.time()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(5.0):
                await f.run_session()
        assert 0.5 <= loop.time() - t0 < 3.0
    finally:
        for w in held:
            w.close()
        server.close()
        await server.wait_closed()
        await follower.shutdown()


@pytest.mark.parametrize("scenario", [
    test_follower_catches_up_to_a_byte_identical_log_and_the_same_queues,
    test_a_connection_dropped_mid_frame_leaves_no_partial_record,
    test_a_data_frame_damaged_in_transit_fails_its_crc,
    test_a_follower_acks_the_frames_of_one_read_once_and_only_news,
    test_two_followers_of_one_master_both_match_it,
    test_a_parked_stream_gets_a_put_before_the_master_dispatches_it,
    test_a_follower_acks_what_it_appended_before_it_dispatches,
    test_acks_are_handled_as_they_arrive_with_no_task_step,
    test_a_follower_ends_a_session_whose_master_went_silent,
], ids=lambda f: f.__name__.removeprefix("test_"))
def test_on_uvloop(scenario: Callable[[Path], Coroutine[None, None, None]], tmp_path: Path) -> None:
    uvloop.run(scenario(tmp_path))


async def test_a_follower_reports_its_welcoming_masters_address_refusing_at_once(tmp_path: Path) -> None:
    """The proof a deposition needs (ha/election.py, Elector.depose): the address that welcomed
    this follower at an epoch refuses connections. Told once the session breaks, by the immediate
    retry (the retry interval here is 30 s); an address that never welcomed it proves nothing."""
    slow = dataclasses.replace(CFG, retry_interval=30.0)
    async with stores(tmp_path) as (master, follower):
        put(master, 10)
        m = ReplicationMaster(master, CFG, 3, (EpochStart(3, 0),))
        port = await m.start("127.0.0.1", 0)
        refused: list[int] = []
        f = ReplicationFollower(follower, slow, 1, 3, ("127.0.0.1", port), on_refused=refused.append)
        f.start()
        try:
            await until(lambda: m.acked_offset(1) == master.commitlog_max_offset)
            assert refused == [] and f.welcomed == 3
            await m.close()  # its listener closes with it (its process ending does the same)
            await until(lambda: refused == [3], timeout=3.0)
        finally:
            await f.close()
        never: list[int] = []
        g = ReplicationFollower(follower, dataclasses.replace(CFG, retry_interval=0.05), 2, 3,
                                ("127.0.0.1", port), on_refused=never.append)
        g.start()
        try:
            await asyncio.sleep(0.5)  # refused ~10 times
            assert never == [] and g.welcomed is None
        finally:
            await g.close()


async def test_a_follower_reports_refusal_only_when_every_address_of_its_masters_name_refuses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A master's HA name with two addresses (a dual-stack pod's; Python 3.11 raises a bare
    OSError for a name whose addresses all fail): the follower connects through the address that
    accepts, and reports its master gone only once both addresses refuse."""
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here ({exc}): the name needs two addresses")
    real = socket.getaddrinfo

    def dual(host, port, *args, **kwargs):  # the resolver alone is stood in for: sockets are real
        if host != "dual.tidemq.test":
            return real(host, port, *args, **kwargs)
        return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", port, 0, 0)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    monkeypatch.setattr(socket, "getaddrinfo", dual)
    slow = dataclasses.replace(CFG, retry_interval=30.0)
    async with stores(tmp_path) as (master, follower):
        put(master, 10)
        m = ReplicationMaster(master, CFG, 3, (EpochStart(3, 0),))
        port = await m.start("127.0.0.1", 0)  # ::1 refuses this port
        refused: list[int] = []
        f = ReplicationFollower(follower, slow, 1, 3, ("dual.tidemq.test", port), on_refused=refused.append)
        f.start()
        try:
            await until(lambda: m.acked_offset(1) == master.commitlog_max_offset)
            assert refused == [] and f.welcomed == 3
            await m.close()
            await until(lambda: refused == [3], timeout=3.0)
        finally:
            await f.close()
