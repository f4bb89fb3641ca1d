"""Metadata replication (issue 17): topics, groups, offsets and delay/checker progress ride the
replicated CommitLog. In process: a master store and a follower store, each with its real
managers and MetadataLog, joined by a real ReplicationMaster/ReplicationFollower on loopback.
With real processes: a group created, a topic created and offsets committed (one explicitly, one
carried by a pull) through the master only survive a SIGKILL of the master ~1 s later."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tidemq.bodies import SubscriptionGroupConfig
from tidemq.broker.delay import parse_delay_levels
from tidemq.broker.groups import SubscriptionGroupManager
from tidemq.broker.ha.metadata import (
    METADATA_QUEUE,
    METADATA_TOPIC,
    Change,
    OffsetEntry,
    OffsetsCommitted,
    TopicSet,
    decode,
)
from tidemq.broker.ha.metaapply import REWIND_STEP
from tidemq.broker.ha.metalog import Managers, MetadataLog, MetadataLogConfig
from tidemq.broker.ha.replication import EpochStart, ReplicationFollower, ReplicationMaster
from tidemq.broker.creation import ImplicitCreation
from tidemq.broker.messaging.admin import AdminService
from tidemq.broker.messaging.context import Caller
from tidemq.broker.messaging.offsets import OffsetCommit, OffsetService
from tidemq.broker.offsets import ConsumerOffsetManager
from tidemq.broker.quota import CreationLimits, CreationQuota
from tidemq.broker.schedule import ScheduleMessageService
from tidemq.broker.store.jsonfile import write_json_atomic
from tidemq.broker.store.store import MessageStore, PutRequest
from tidemq.broker.topics import TopicConfig, TopicConfigManager
from tidemq.broker.transaction.half import EndType
from tidemq.broker.transaction.service import TransactionConfig, TransactionService
from tidemq.errors import BrokerError, StoreError
from tidemq.message import SysFlag, decode_record
from tidemq.client import ClientConfig
from tidemq.client.pull import build_pull_request
from tidemq.client.route import MessageQueue
from tidemq.client.send import SendStatus
from tidemq.client.sync import SyncProducer
from tidemq.message import Message
from tidemq.remoting import RemotingCommand, RequestCode
from tidemq.remoting.codes import ResponseCode
from tests.broker.ha.conftest import wait_for
from tests.broker.ha.test_replication import CFG, assert_same, commitlog, queues, started, until
from tests.cli.clirun import broker_request, json_body, tidemq
from tests.broker.store.util import T0, Clock, open_store, req

HOST = ("127.0.0.1", 10911)
QUOTA = CreationQuota(CreationLimits())
FAST = MetadataLogConfig(batch_interval=0.02, persist_interval=0.05)


@dataclass
class Replica:
    """One replica's store, managers and MetadataLog; ``master`` says whether it may record."""

    root: Path
    store: MessageStore
    topics: TopicConfigManager
    groups: SubscriptionGroupManager
    offsets: ConsumerOffsetManager
    schedule: ScheduleMessageService
    transactions: TransactionService
    log: MetadataLog
    master: bool = False

    async def persist_topics(self) -> None:
        await asyncio.to_thread(self.topics.persist)

    async def persist_groups(self) -> None:
        await asyncio.to_thread(self.groups.persist)

    async def persist_offsets(self) -> None:
        await asyncio.to_thread(ConsumerOffsetManager.write, self.offsets.path, self.offsets.snapshot())


async def replica(root: Path, store: MessageStore | None = None,
                  replicated: Callable[[int], asyncio.Future[int] | None] = lambda end: None,
                  refusal: Callable[[], tuple[int, str] | None] = lambda: None) -> Replica:
    store = store or await started(root / "store")
    cfg = root / "config"
    cfg.mkdir(parents=True, exist_ok=True)
    topics, groups = TopicConfigManager(cfg / "topics.json"), SubscriptionGroupManager(cfg / "groups.json")
    offsets = ConsumerOffsetManager(cfg / "offsets.json")
    box: list[Replica] = []
    schedule = ScheduleMessageService(store, parse_delay_levels("1s 5s"), cfg / "delay.json", HOST,
                                      clock=lambda: T0, may_write=lambda: box[0].master)
    transactions = TransactionService(store, TransactionConfig(), HOST, cfg / "tx.json")
    for m in (topics, groups, offsets, schedule, transactions):
        m.load()
    r = Replica(root, store, topics, groups, offsets, schedule, transactions, None)  # type: ignore[arg-type]
    box.append(r)
    r.log = MetadataLog(store, Managers(topics, groups, offsets, schedule, transactions, lambda: None,
                                        r.persist_topics, r.persist_groups, r.persist_offsets),
                        cfg / "metadataApplied.json", store_host=HOST, clock=lambda: T0,
                        may_record=lambda: r.master, refusal=refusal, replicated=replicated, config=FAST)
    r.log.attach()
    r.log.load()
    await r.log.start()
    return r


@contextlib.asynccontextmanager
async def pair(tmp_path: Path) -> AsyncIterator[tuple[Replica, Replica]]:
    m, f = await replica(tmp_path / "m"), await replica(tmp_path / "f")
    m.master = True
    try:
        yield m, f
    finally:
        for r in (m, f):
            await r.log.stop()
            await r.store.shutdown()


@contextlib.asynccontextmanager
async def replicating(m: Replica, f: Replica) -> AsyncIterator[ReplicationMaster]:
    rm = ReplicationMaster(m.store, CFG, 1, (EpochStart(1, 0),))
    port = await rm.start("127.0.0.1", 0)
    rf = ReplicationFollower(f.store, CFG, 1, 1, ("127.0.0.1", port))
    rf.start()
    try:
        yield rm
    finally:
        await rf.close()
        await rm.close()


def meta_end(r: Replica) -> int:
    return r.store.max_offset(METADATA_TOPIC, METADATA_QUEUE)


def changes(r: Replica, start: int = 0) -> list[Change]:
    """The changes of the metadata queue from ``start`` (the batching loop may add progress records
    between a test's own changes)."""
    res = r.store.get_messages(METADATA_TOPIC, METADATA_QUEUE, start, 1000, None)
    return [decode(decode_record(raw).body) for raw in res.records]


async def caught_up(m: Replica, f: Replica) -> None:
    await until(lambda: f.log.applier.applied == meta_end(m) > 0 and
                f.store.commitlog_max_offset == m.store.commitlog_max_offset)


def deliver_one_delayed(m: Replica) -> None:
    """A level-1 delayed message stored, then delivered by the master's level walker (its
    progress moves from 0 to 1)."""
    put = m.schedule.prepare_put(req("Real", 0, b"later", props={"DELAY": "1"}))
    assert m.store.put(put).ok
    m.schedule.level_timers[0].run_due(int((T0 + 3600) * 1000))
    assert m.schedule.level_timers[0].offset == 1


async def test_changes_on_the_master_appear_on_the_follower_and_survive_its_restart(tmp_path: Path) -> None:
    async with pair(tmp_path) as (m, f):
        tc = TopicConfig("Orders", 4, 4, 6)
        group = SubscriptionGroupConfig("billing", retry_max_times=3)
        async with replicating(m, f):
            m.topics.put(tc)
            m.topics.put(TopicConfig("Gone", 1, 1, 6))
            m.groups.put(group)
            m.groups.put(SubscriptionGroupConfig("gone-group"))
            for q in range(4):
                m.offsets.commit("billing", "Orders", q, 10 + q)
            m.offsets.commit("billing", "Orders", 2, 42)  # the latest per queue is what counts
            deliver_one_delayed(m)
            m.transactions.advance(0)  # the checker's progress, recorded in the next batch too
            assert m.store.put(req("Gone", 0, b"x")).ok
            await caught_up(m, f)
            await until(lambda: f.offsets.query("billing", "Orders", 3) == 13)
            assert f.topics.get("Orders") == tc and f.groups.get("billing") == group
            assert [f.offsets.query("billing", "Orders", q) for q in range(4)] == [10, 11, 42, 13]
            assert f.schedule.level_timers[0].offset == 1  # the follower never delivered: the master's progress
            assert f.store.max_offset("Gone", 0) == 1

            m.topics.delete("Gone")  # as the admin service does: the topic, its queues, its offsets
            m.store.delete_topic("Gone")
            m.groups.delete("gone-group")
            m.offsets.drop(None, "billing")
            m.offsets.commit("billing", "Orders", 1, 7)
            await caught_up(m, f)
            await until(lambda: f.offsets.query("billing", "Orders", 1) == 7)
            assert f.topics.get("Gone") is None and f.store.queue_ids("Gone") == []
            assert f.groups.get("gone-group") is None
            assert f.offsets.offsets("billing", "Orders") == {1: 7}
        assert f.log.recorded == 0  # a follower appends nothing of its own
        assert f.log.applier.applied_count > 0 and f.log.applier.applied == meta_end(f) == meta_end(m)
        assert_same(m.store, f.store)
        await f.log.stop()  # persists what the records touched, then the applied position
        follower_root, follower_store = f.root, f.store

    # A restart reads the managers' own files (the applied position says nothing is left to do).
    store = await started(follower_root / "store")
    again = await replica(follower_root, store)
    try:
        assert again.topics.get("Orders") == tc and again.topics.get("Gone") is None
        assert again.groups.get("billing") == group and again.offsets.offsets("billing", "Orders") == {1: 7}
        assert again.schedule.level_timers[0].offset == 1
        assert again.log.applier.applied == meta_end(again) and again.log.applier.applied_count == 0
    finally:
        await again.log.stop()
        await store.shutdown()
    assert follower_store is not store


async def test_a_followers_deletion_mark_is_at_the_deletion_not_at_the_end_of_its_frame(tmp_path: Path) -> None:
    """A topic deleted and re-created in one replication frame: the follower marks the deletion
    at its record, so a replay of its CommitLog keeps the second incarnation's record (marked at
    the frame's end, the replay dropped it)."""
    async with pair(tmp_path) as (m, f):
        m.topics.put(TopicConfig("Again", 1, 1, 6))
        assert m.store.put(req("Again", 0, b"first life")).ok
        m.topics.delete("Again")
        m.store.delete_topic("Again")
        m.topics.put(TopicConfig("Again", 1, 1, 6))
        assert m.store.put(req("Again", 0, b"second life")).ok
        f.store.append_replicated(0, commitlog(m.store))  # one frame: dispatched, applied
        assert f.topics.get("Again") is not None and f.store.max_offset("Again", 0) == 1
        cfg = f.store.config
    shutil.rmtree(cfg.consume_queue_dir)
    again = open_store(cfg, clock=Clock())
    try:
        res = again.get_messages("Again", 0, 0, 8, None)
        assert [decode_record(raw).body for raw in res.records] == [b"second life"]
    finally:
        again.close_abruptly()


async def test_the_first_master_of_an_empty_log_writes_what_its_broker_held_before(tmp_path: Path) -> None:
    """A broker that ran before ``--coordination`` (topics, groups, offsets in its files, none in
    the log) becomes the group's first master: the log starts with all of it (but the broker's
    own topics), so its followers, and whoever takes over, have them. Once only."""
    async with pair(tmp_path) as (m, f):
        m.master = False  # held before the log existed: put straight into the tables, unrecorded
        m.topics.ensure_system_topics("c", "broker-a", False, 4)
        m.topics.topics["Orders"] = TopicConfig("Orders", 2, 2, 6)
        m.groups.groups["billing"] = SubscriptionGroupConfig("billing", retry_max_times=5)
        m.offsets.table["Orders@billing"] = {0: 7, 1: 9}
        assert meta_end(m) == 0
        m.master = True
        async with replicating(m, f):
            await until(lambda: meta_end(m) > 0)
            await caught_up(m, f)
            await until(lambda: f.offsets.query("billing", "Orders", 1) == 9)
        assert f.topics.get("Orders") == TopicConfig("Orders", 2, 2, 6)
        assert f.groups.get("billing") == SubscriptionGroupConfig("billing", retry_max_times=5)
        assert f.offsets.offsets("billing", "Orders") == {0: 7, 1: 9}
        assert f.topics.get("broker-a") is None  # each broker makes its own
        recorded = [type(c).__name__ for c in changes(m)]
        assert recorded[:3] == ["TopicSet", "GroupSet", "OffsetsCommitted"]
        m.master = False
        await asyncio.sleep(FAST.batch_interval * 3)
        m.master = True
        await asyncio.sleep(FAST.batch_interval * 3)
        assert [type(c).__name__ for c in changes(m)].count("TopicSet") == 1


async def test_a_replica_without_its_files_rebuilds_them_from_the_log(tmp_path: Path) -> None:
    async with pair(tmp_path) as (m, f):
        async with replicating(m, f):
            m.topics.put(TopicConfig("Orders", 2, 2, 6))
            m.groups.put(SubscriptionGroupConfig("billing"))
            m.offsets.commit("billing", "Orders", 1, 99)
            await caught_up(m, f)
            await until(lambda: f.offsets.query("billing", "Orders", 1) == 99)
        await f.log.stop()
        follower_root = f.root
    for name in ("topics.json", "groups.json", "offsets.json", "metadataApplied.json"):
        write_json_atomic(follower_root / "config" / name, {})  # as if never written
    store = await started(follower_root / "store")
    again = await replica(follower_root, store)
    try:  # every change is a value to set: applying the whole log again gives the same state
        assert again.topics.get("Orders") == TopicConfig("Orders", 2, 2, 6)
        assert again.groups.get("billing") == SubscriptionGroupConfig("billing")
        assert again.offsets.query("billing", "Orders", 1) == 99
        assert again.log.applier.applied == meta_end(again) and again.log.recorded == 0
    finally:
        await again.log.stop()
        await store.shutdown()


async def test_a_cut_log_is_applied_again_from_the_new_masters_records(tmp_path: Path) -> None:
    """An old master's unreplicated record is cut when it follows the new master, whose records
    reuse those queue offsets: the applier starts again at the cut and takes the new ones."""
    async with pair(tmp_path) as (a, b):
        async with replicating(a, b):
            a.topics.put(TopicConfig("Shared", 1, 1, 6))
            await caught_up(a, b)
        a.groups.put(SubscriptionGroupConfig("lost", retry_max_times=1))  # A's alone: never replicated
        common = b.store.commitlog_max_offset
        a.master, b.master = False, True
        b.groups.put(SubscriptionGroupConfig("kept", retry_max_times=2))
        b.offsets.commit("kept", "Shared", 0, 5)
        rm = ReplicationMaster(b.store, CFG, 2, (EpochStart(1, 0), EpochStart(2, common)))
        port = await rm.start("127.0.0.1", 0)
        rf = ReplicationFollower(a.store, CFG, 0, 1, ("127.0.0.1", port), truncate=a.log.truncate)
        rf.start()
        try:
            await caught_up(b, a)
            await until(lambda: a.offsets.query("kept", "Shared", 0) == 5)
        finally:
            await rf.close()
            await rm.close()
        assert a.groups.get("kept") == SubscriptionGroupConfig("kept", retry_max_times=2)
        assert a.groups.get("lost") is None  # A's alone, cut with its record
        assert a.log.applier.applied == meta_end(a) == meta_end(b)
        assert_same(b.store, a.store)


@pytest.mark.parametrize("crash_before_cut", [False, True])
async def test_an_old_master_undoes_the_metadata_changes_of_the_tail_it_cuts(tmp_path: Path,
                                                                             crash_before_cut: bool) -> None:
    """An old master's changes the group never acknowledged (made alone, after its followers had
    left) are cut from its log when it follows the new master, and undone in its managers: each
    key they named gets what the kept log gives it, or goes when no kept record names it. Its
    files say the same after a restart. The undo is written before the cut; with the cut failing
    (a crash between the two), a restart applies the tail again and the next handshake undoes
    it again."""
    shared, group = TopicConfig("Shared", 1, 1, 6), SubscriptionGroupConfig("billing", retry_max_times=1)
    doomed = TopicConfig("Doomed", 2, 2, 6)
    async with pair(tmp_path) as (a, b):
        a.topics.topics["Old"] = TopicConfig("Old", 1, 1, 6)  # from before --coordination: the baseline has it
        async with replicating(a, b):
            a.topics.put(shared)
            a.groups.put(group)
            a.offsets.commit("billing", "Shared", 0, 3)
            a.offsets.commit("audit", "Shared", 0, 8)
            await caught_up(a, b)
            await until(lambda: b.offsets.query("audit", "Shared", 0) == 8)
            assert b.topics.get("Old") == TopicConfig("Old", 1, 1, 6)
            for r in (a, b):  # a topic no record names (made after the baseline), with a message before the cut
                r.topics.topics["Side"] = TopicConfig("Side", 1, 1, 6)
            assert a.store.put(req("Side", 0, b"before")).ok
            a.topics.put(doomed)
            for i in range(3):
                assert a.store.put(req("Doomed", i % 2, b"acknowledged %d" % i)).ok
            timed = a.schedule.prepare_put(req("Real", 0, b"at a time", props={"TIMER_DELIVER_MS": str(int(T0 * 1000) + 5000)}))
            assert a.store.put(timed).ok  # acknowledged; delivered only in A's tail below
            await caught_up(a, b)
        common = b.store.commitlog_max_offset
        doomed_queues = queues(b.store)["Doomed", 0], queues(b.store)["Doomed", 1]
        # A alone (its followers gone, it still thinks it is master): nothing of this is acknowledged.
        a.topics.put(TopicConfig("Shared", 4, 4, 6))
        a.topics.put(TopicConfig("Ghost", 2, 2, 6))
        a.topics.put(TopicConfig("Old", 2, 2, 6))
        a.topics.put(TopicConfig("Side", 2, 2, 6))
        assert a.store.put(req("Ghost", 0, b"never acknowledged")).ok
        a.groups.put(SubscriptionGroupConfig("billing", retry_max_times=9))
        a.groups.put(SubscriptionGroupConfig("lost"))
        a.offsets.commit("billing", "Shared", 0, 40)
        a.offsets.commit("lost", "Shared", 0, 2)
        a.offsets.drop(None, "audit")
        a.topics.delete("Doomed")  # as the admin service does: the topic, then its queues
        a.store.delete_topic("Doomed")
        deliver_one_delayed(a)
        a.schedule.timer.run_due(int((T0 + 3600) * 1000))  # A alone delivers the timer message
        assert a.schedule.timer.progress == 1
        later = a.schedule.prepare_put(req("Real", 0, b"alone", props={"TIMER_DELIVER_MS": str(int(T0 * 1000) + 7_200_000)}))
        assert a.store.put(later).ok  # and stores another one, never acknowledged
        await until(lambda: any(isinstance(c, OffsetsCommitted) for c in changes(a, meta_end(b))) and
                    a.log.applier.applied == meta_end(a) > meta_end(b) + 5)
        await until(lambda: a.schedule.level_timers[0].offset == 1)

        a.master, b.master = False, True
        b.groups.put(SubscriptionGroupConfig("kept", retry_max_times=2))
        rm = ReplicationMaster(b.store, CFG, 2, (EpochStart(1, 0), EpochStart(2, common)))
        port = await rm.start("127.0.0.1", 0)
        if crash_before_cut:
            tried: list[int] = []

            async def cut_fails(at: int, undeleted: object = ()) -> None:
                tried.append(at)
                raise OSError("the disk went away")

            a.store.truncate = cut_fails  # type: ignore[method-assign]
            rf = ReplicationFollower(a.store, CFG, 0, 1, ("127.0.0.1", port), truncate=a.log.truncate)
            rf.start()
            await until(lambda: tried != [])
            await rf.close()
            assert a.groups.get("lost") is not None  # not cut: the tail's changes are in effect again
            assert a.log.applier.applied == meta_end(a)
            await a.log.stop()
            await a.store.shutdown()
            restarted = await replica(a.root)
            assert restarted.groups.get("lost") is not None  # the uncut tail is applied again at start
            assert restarted.log.applier.applied == meta_end(restarted) > meta_end(b)
            vars(a).update(vars(restarted))  # the pair stops this one
            a.master = False
        cut_store = a.store.truncate
        loaded: list[int] = []

        async def truncate_while_the_timer_loads(at: int, undeleted: object = ()) -> None:
            a.schedule.timer.refill()  # what A's timer loop may do during the cut's awaits
            loaded.append(len(a.schedule.timer))
            await cut_store(at, undeleted=undeleted)

        a.store.truncate = truncate_while_the_timer_loads  # type: ignore[method-assign]
        rf = ReplicationFollower(a.store, CFG, 0, 1, ("127.0.0.1", port), truncate=a.log.truncate)
        rf.start()
        try:
            await caught_up(b, a)
            await until(lambda: a.groups.get("kept") is not None)
        finally:
            await rf.close()
            await rm.close()
        assert commitlog(a.store) == commitlog(b.store)  # the cut leaves A's delayed message's queues empty
        assert {k: v for k, v in queues(a.store).items() if v} == queues(b.store)
        for r in (a, b):
            assert r.topics.get("Shared") == shared and r.topics.get("Ghost") is None
            assert r.groups.get("billing") == group and r.groups.get("lost") is None
            assert r.offsets.query("billing", "Shared", 0) == 3 and r.offsets.query("lost", "Shared", 0) is None
            assert r.offsets.query("audit", "Shared", 0) == 8
            assert r.schedule.level_timers[0].offset == 0
        assert a.store.queue_ids("Ghost") == []
        assert a.schedule.timer.progress == 0  # its delivery went with the tail: to be delivered again
        assert loaded == [2] and len(a.schedule.timer) == 0  # what it loaded of the cut tail is forgotten
        # Deleted in the cut tail: set again, and its queues (gone with the deletion) rebuilt.
        assert a.topics.get("Doomed") == doomed
        assert (queues(a.store)["Doomed", 0], queues(a.store)["Doomed", 1]) == doomed_queues
        assert not a.store.config.pending_cut_path.exists()
        assert a.topics.get("Old") == TopicConfig("Old", 1, 1, 6)  # the baseline's value
        # No kept record gives Side's earlier value, but it held a message before the cut: kept.
        assert a.topics.get("Side") == TopicConfig("Side", 2, 2, 6) and a.store.max_offset("Side", 0) == 1
        assert a.log.applier.applied == meta_end(a) == meta_end(b)
        await a.log.stop()
        root = a.root

    store = await started(root / "store")
    again = await replica(root, store)
    try:  # its own files: the undone values, and nothing left to apply
        assert again.topics.get("Shared") == shared and again.topics.get("Ghost") is None
        assert again.groups.get("billing") == group and again.groups.get("lost") is None
        assert again.offsets.query("billing", "Shared", 0) == 3 and again.offsets.query("audit", "Shared", 0) == 8
        assert again.offsets.query("lost", "Shared", 0) is None
        assert again.topics.get("Doomed") == doomed and store.max_offset("Doomed", 0) == 2
        assert again.schedule.timer.progress == 0
        assert [decode_record(raw).body for raw in store.get_messages("Doomed", 1, 0, 8, None).records] == [b"acknowledged 1"]
        assert again.log.applier.applied == meta_end(again) and again.log.applier.applied_count == 0
    finally:
        await again.log.stop()
        await store.shutdown()


async def test_a_cut_that_cannot_be_undone_and_written_is_not_made(tmp_path: Path) -> None:
    """No cut where no record starts, nothing changed; and when the undone managers cannot be
    written, the log keeps its tail and its changes stay in effect (the handshake is retried)."""
    r = await replica(tmp_path / "r")
    r.master = True
    try:
        r.groups.put(SubscriptionGroupConfig("kept"))
        at = r.store.commitlog_max_offset
        r.groups.put(SubscriptionGroupConfig("tail"))
        end = r.store.commitlog_max_offset
        r.master = False
        with pytest.raises(StoreError, match="no record starts there"):
            await r.log.truncate(at + 1)
        assert r.groups.get("tail") is not None

        def disk_full() -> None:
            raise OSError(28, "No space left on device")

        r.groups.persist = disk_full  # type: ignore[method-assign]
        with pytest.raises(StoreError, match="could not be written; the log is not cut"):
            await r.log.truncate(at)
        assert r.store.commitlog_max_offset == end and r.groups.get("tail") is not None
        assert r.log.applier.applied == meta_end(r)
    finally:
        await r.log.stop()
        await r.store.shutdown()


async def test_undoing_a_cut_tail_reads_a_long_kept_log_a_batch_per_loop_step(tmp_path: Path) -> None:
    """The kept log is read to find each named key's last value: thousands of records must not
    hold the event loop in one step."""
    r = await replica(tmp_path / "r")
    r.master = True
    try:
        for i in range(2 * REWIND_STEP + 10):
            r.groups.put(SubscriptionGroupConfig(f"g{i}"))
        r.groups.put(SubscriptionGroupConfig("x", retry_max_times=4))  # as if this record were cut
        r.master = False
        steps = 0

        async def ticker() -> None:
            nonlocal steps
            while True:
                steps += 1
                await asyncio.sleep(0)

        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        first = meta_end(r) - 1
        plan = await r.log.applier.rewind(first, changes(r, first), r.store.commitlog_max_offset)
        tick.cancel()
        assert steps >= 3  # the loop ran while the kept records were read
        assert plan.groups == {"x": None} and r.groups.get("x") is None and r.groups.get("g7") is not None
        assert r.log.applier.applied == first
    finally:
        await r.log.stop()
        await r.store.shutdown()


async def test_a_promoted_follower_rebuilds_the_transaction_book_before_it_checks(tmp_path: Path) -> None:
    """A transaction the master committed is resolved in the book of the follower that takes
    over, so an answer to a later check cannot commit it twice."""
    async with pair(tmp_path) as (m, f):
        async with replicating(m, f):
            half = m.transactions.prepare(PutRequest("T", 0, b"tx", {"TRAN_MSG": "true", "PGROUP": "pg",
                                                                     "UNIQ_KEY": "U1"},
                                                     sys_flag=int(SysFlag.TRANSACTION_PREPARED), store_host=HOST))
            assert half.ok
            assert m.transactions.end("pg", half.queue_offset, half.physical_offset, EndType.COMMIT) is not None
            await until(lambda: f.store.commitlog_max_offset == m.store.commitlog_max_offset)
        assert half.queue_offset not in f.transactions.book  # a follower does not keep the book
        m.master, f.master = False, True
        await until(lambda: half.queue_offset in f.transactions.book)
        assert f.transactions.end("pg", half.queue_offset, half.physical_offset, EndType.COMMIT) is None
        assert f.store.max_offset("T", 0) == 1  # committed once


def _admin(r: Replica, metadata: MetadataLog) -> AdminService:
    return AdminService(topics=r.topics, groups=r.groups, offsets=r.offsets, store=r.store,
                        quota=QUOTA, reserved_names=("C", "b"), persist_topics=r.persist_topics,
                        topics_changed=lambda persist=True: None, persist_groups=r.persist_groups,
                        metadata=metadata)


async def test_admin_changes_wait_for_the_groups_rule_and_answer_its_code(tmp_path: Path) -> None:
    answers: list[asyncio.Future[int]] = []
    waited: list[int] = []

    def replicated(end: int) -> asyncio.Future[int]:
        waited.append(end)
        fut = asyncio.get_running_loop().create_future()
        answers.append(fut)
        return fut

    refusal: list[tuple[int, str]] = []
    r = await replica(tmp_path / "m", replicated=replicated, refusal=lambda: refusal[0] if refusal else None)
    r.master = True
    try:
        admin = _admin(r, r.log)
        done = asyncio.ensure_future(admin.update_topic(TopicConfig("Orders", 4, 4, 6)))
        await until(lambda: len(answers) == 1)
        assert TopicSet(TopicConfig("Orders", 4, 4, 6)) in changes(r)
        assert len(waited) == 1 and waited[0] > 0  # the log end the change reached
        assert not done.done()  # not answered before the group's rule holds the change
        answers[0].set_result(int(ResponseCode.SUCCESS))
        await done

        done = asyncio.ensure_future(admin.update_group(SubscriptionGroupConfig("billing")))  # type: ignore[arg-type]
        await until(lambda: len(answers) == 2)
        answers[1].set_result(int(ResponseCode.FLUSH_SLAVE_TIMEOUT))
        with pytest.raises(BrokerError) as err:
            await done
        assert err.value.code == ResponseCode.FLUSH_SLAVE_TIMEOUT and "in-sync replicas" in err.value.remark

        offsets = OffsetService(offsets=r.offsets, store=r.store, topics=r.topics,
                                creation=_creation(r), metadata=r.log)
        caller = Caller("127.0.0.1:1234")
        pending = offsets.commit(caller, OffsetCommit("billing", "Orders", 3, 77))
        assert pending is not None
        waiter = asyncio.ensure_future(pending)
        await until(lambda: len(answers) == 3)
        # The commit was appended before the answer waited, not left to a later batch.
        assert OffsetsCommitted((OffsetEntry("billing", "Orders", 3, 77),)) in changes(r)
        answers[2].set_result(int(ResponseCode.SLAVE_NOT_AVAILABLE))
        with pytest.raises(BrokerError) as err:
            await waiter
        assert err.value.code == ResponseCode.SLAVE_NOT_AVAILABLE

        refusal.append((int(ResponseCode.SERVICE_NOT_AVAILABLE), "replica 1 is not the master"))
        with pytest.raises(BrokerError, match="not the master") as err:
            admin.update_topic(TopicConfig("Other", 1, 1, 6))
        assert err.value.code == ResponseCode.SERVICE_NOT_AVAILABLE
        before = meta_end(r)
        assert r.topics.get("Other") is None and meta_end(r) == before  # refused before anything changed
        with pytest.raises(BrokerError):
            offsets.commit(caller, OffsetCommit("billing", "Orders", 3, 78))
        assert r.offsets.query("billing", "Orders", 3) == 77
    finally:
        await r.log.stop()
        await r.store.shutdown()


async def test_explicit_commits_of_one_loop_round_share_one_record(tmp_path: Path) -> None:
    r = await replica(tmp_path / "m")
    r.master = True
    try:
        r.topics.put(TopicConfig("Orders", 4, 4, 6))
        offsets = OffsetService(offsets=r.offsets, store=r.store, topics=r.topics, creation=_creation(r),
                                metadata=r.log)
        before = meta_end(r)
        commits = [offsets.commit(Caller("127.0.0.1:1"), OffsetCommit("billing", "Orders", q, 5 + q))
                   for q in range(4)]  # a RocketMQ client persists every queue at once
        await asyncio.gather(*[c for c in commits if c is not None])
        batches = [c for c in changes(r, before) if isinstance(c, OffsetsCommitted)]
        assert [{(e.queue_id, e.offset) for e in c.entries} for c in batches] == [
            {(0, 5), (1, 6), (2, 7), (3, 8)}]
    finally:
        await r.log.stop()
        await r.store.shutdown()


def _creation(r: Replica) -> ImplicitCreation:
    return ImplicitCreation(r.topics, r.groups, QUOTA, lambda: True, lambda: None)


# ---------------------------------------------------------------------------------------------
# Real processes: name server, etcd, three replicas.

def _request(addr: str, code: RequestCode, fields: dict[str, object] | None = None) -> RemotingCommand:
    return asyncio.run(broker_request(addr, code, fields))


def test_a_topic_group_and_offset_made_on_the_master_survive_its_sigkill(replica_group) -> None:
    # minInSync 2: a change is acknowledged only once a follower holds it too, so the first
    # change waits (is refused, and retried) until a follower has caught up.
    group = replica_group("meta-broker", 3, 3.0, "--min-in-sync", "2")
    master = group.master()
    ns = group.namesrv
    create = ("admin", "updateTopic", "-n", ns, "-b", master, "-t", "MetaTopic", "-r", "3", "-w", "2")
    wait_for("the topic created through the master", lambda: tidemq(*create).rc == 0, 20, 0.5)
    tidemq("admin", "updateSubGroup", "-n", ns, "-b", master, "-g", "meta-group", "-r", "5").ok()
    resp = _request(master, RequestCode.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": "meta-group", "topic": "MetaTopic", "queueId": 1, "commitOffset": 37})
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    # A commit carried by a pull is not waited for: it rides the next 0.25 s batch.
    pull = build_pull_request("meta-group", MessageQueue("MetaTopic", group.name, 0), 0, 1, "*", commit_offset=11)
    assert asyncio.run(broker_request(master, pull.code, pull.ext_fields)).code in (
        ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_OFFSET_MOVED, ResponseCode.SUCCESS)

    time.sleep(1.0)
    group.replicas[master][0].kill()
    killed = time.monotonic()
    new = group.master(group.lease + 5, other_than=master)
    print(f"metadata failover: {new} is master {time.monotonic() - killed:.2f} s after SIGKILL of {master}")

    topics = json_body(_request(new, RequestCode.GET_ALL_TOPIC_CONFIG))["topicConfigTable"]
    assert (topics["MetaTopic"]["readQueueNums"], topics["MetaTopic"]["writeQueueNums"]) == (3, 2)
    groups = json_body(_request(new, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG))["subscriptionGroupTable"]
    assert groups["meta-group"]["retryMaxTimes"] == 5  # the admin's setting, not an implicit default
    resp = _request(new, RequestCode.QUERY_CONSUMER_OFFSET,
                    {"consumerGroup": "meta-group", "topic": "MetaTopic", "queueId": 1})
    assert resp.code == ResponseCode.SUCCESS and int(resp.ext_fields["offset"]) == 37
    resp = _request(new, RequestCode.QUERY_CONSUMER_OFFSET,
                    {"consumerGroup": "meta-group", "topic": "MetaTopic", "queueId": 0})
    assert resp.code == ResponseCode.SUCCESS and int(resp.ext_fields["offset"]) == 11
    with SyncProducer("meta-pg", ns, ClientConfig(request_timeout=5.0)) as producer:
        assert producer.send(Message("MetaTopic", b"after failover")).status is SendStatus.SEND_OK
