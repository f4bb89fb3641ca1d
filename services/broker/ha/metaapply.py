"""Applying metadata records (issue 17): the follower's half of metadata replication.

Records of ``rmq_sys_TIDEMQ_METADATA`` (codec: :mod:`tidemq.broker.ha.metadata`) reach a follower
through replication; the store's dispatcher tells :meth:`MetadataApplier.on_dispatch` of each,
which applies it to the managers (topics, groups, offsets, delay and checker progress) without
appending anything. At start the records past the applied position are applied the same way
(:meth:`apply_until` with ``replay``). The recording half is :mod:`tidemq.broker.ha.metalog`.

Invariants:
- ``applied`` is the next metadata queue offset to apply; records are applied in queue order,
  each once per pass, and every change is a value to set, so a pass that starts earlier than
  needed ends in the same state.
- A replicated record below ``applied`` means the log was cut (a follower truncated to a new
  master's history, which reuses those queue offsets): applying restarts there.
- While ``applying``, the managers' change reports are the log's own changes, not new ones: the
  recorder ignores them. While ``appending``, the record being dispatched is this replica's own
  and already in effect.
- ``touched`` names the managers' files the applied (or recorded) records changed since the
  applied position was last written (:data:`PERSISTS`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tidemq.broker.ha import metarewind
from tidemq.broker.ha.metadata import (
    METADATA_QUEUE,
    METADATA_TOPIC,
    Change,
    DelayProgress,
    GroupDeleted,
    GroupSet,
    MetadataCodecError,
    OffsetsCommitted,
    OffsetsDropped,
    TopicDeleted,
    TopicSet,
    TransactionProgress,
    decode,
)
from tidemq.broker.store.results import GetStatus
from tidemq.broker.topics import is_system_topic
from tidemq.errors import CodecError
from tidemq.message import decode_record

if TYPE_CHECKING:
    from tidemq.broker.groups import SubscriptionGroupManager
    from tidemq.broker.offsets import ConsumerOffsetManager
    from tidemq.broker.schedule import ScheduleMessageService
    from tidemq.broker.store.store import MessageStore
    from tidemq.broker.topics import TopicConfigManager
    from tidemq.broker.transaction.service import TransactionService

log = logging.getLogger(__name__)

APPLY_BATCH = 64  # records read from the metadata queue at a time
MAX_READ_BYTES = 1 << 22  # per read: a few records of the codec's largest size
REWIND_STEP = 1024  # kept records read per loop step while undoing a cut tail

# Which of the managers' files a change touches.
PERSISTS: dict[type, str] = {
    TopicSet: "topics", TopicDeleted: "topics", GroupSet: "groups", GroupDeleted: "groups",
    OffsetsCommitted: "offsets", OffsetsDropped: "offsets", DelayProgress: "delay",
    TransactionProgress: "transactions",
}


@dataclass(frozen=True, slots=True)
class Managers:
    """The metadata a failover must keep, and how each is persisted (the broker's own writers)."""

    topics: TopicConfigManager
    groups: SubscriptionGroupManager
    offsets: ConsumerOffsetManager
    schedule: ScheduleMessageService
    transactions: TransactionService
    topics_changed: Callable[[], object]  # persist topics.json soon and re-register
    persist_topics: Callable[[], Awaitable[None]]
    persist_groups: Callable[[], Awaitable[None]]
    persist_offsets: Callable[[], Awaitable[None]]


class MetadataApplier:
    def __init__(self, store: MessageStore, managers: Managers) -> None:
        self.store = store
        self.m = managers
        self.applied = 0
        self.applied_count = 0  # records applied from the log
        self.touched: set[str] = set()
        self.applying = False
        self.appending = False

    def on_dispatch(self, topic: str, queue_id: int, queue_offset: int, tags_code: int) -> None:
        """Store dispatch listener: a replicated metadata record arrived; apply up to it."""
        if topic != METADATA_TOPIC or self.appending:
            return
        if queue_offset < self.applied:
            log.warning("metadata queue offset %d arrived again (applied up to %d): the log was cut to "
                        "follow a new master; applying from there", queue_offset, self.applied)
            self.applied = queue_offset
        self.apply_until(queue_offset + 1)

    def apply_until(self, end: int, replay: bool = False) -> int:
        """Apply the records of the metadata queue from ``applied`` up to ``end``; the count.
        ``replay``: at start, over a store that recovered its own topic deletions."""
        n = 0
        for queue_offset, phys, change in self._records(self.applied, end, "applying"):
            if change is not None:
                self._apply(change, replay, phys)
                n += 1
            self.applied = queue_offset + 1
        self.applied_count += n
        return n

    def _records(self, start: int, end: int, doing: str) -> Iterator[tuple[int, int, Change | None]]:
        """(queue offset, CommitLog offset, change) of the metadata queue's records in [start,
        end), oldest first; None for a record that does not decode (logged). Offsets retention
        removed are skipped (logged)."""
        at = start
        while at < end:
            res = self.store.get_messages(METADATA_TOPIC, METADATA_QUEUE, at, min(APPLY_BATCH, end - at), None,
                                          MAX_READ_BYTES, everything=True)  # ahead of the mark too
            if not res.records:
                if res.status is GetStatus.OFFSET_TOO_SMALL and res.next_begin_offset > at:
                    # Retention removed records before they were read (a replica down for days).
                    log.warning("metadata queue offsets %d..%d are gone; continuing at %d", at,
                                res.next_begin_offset - 1, res.next_begin_offset)
                    at = res.next_begin_offset
                    continue
                return
            for raw in res.records:
                try:
                    msg = decode_record(raw)
                except CodecError as exc:
                    log.warning("metadata record at queue offset %d not read: %s", at, exc)
                    yield at, -1, None
                    at += 1
                    continue
                if msg.queue_offset != at:
                    log.warning("metadata record at queue offset %d found while %s %d", msg.queue_offset, doing, at)
                try:
                    change: Change | None = decode(msg.body)
                except CodecError as exc:
                    level = logging.ERROR if isinstance(exc, MetadataCodecError) else logging.WARNING
                    log.log(level, "metadata record at queue offset %d not applied: %s", msg.queue_offset, exc)
                    change = None
                yield msg.queue_offset, msg.commit_log_offset, change
                at = msg.queue_offset + 1

    # ---------------------------------------------------------------------------- a cut tail
    async def cut_changes(self, at: int) -> tuple[int, list[Change]]:
        """The metadata records at CommitLog offset ``at`` or past it, what a truncation at ``at``
        is about to cut: the queue offset of the first (the queue's end when none) and their
        changes, oldest first. Read before the cut, a batch per loop step."""
        store = self.store
        low = store.min_offset(METADATA_TOPIC, METADATA_QUEUE)
        end = first = store.max_offset(METADATA_TOPIC, METADATA_QUEUE)
        found: list[Change] = []
        while end > low:  # back from the end, a batch at a time, to the first record before ``at``
            start = max(low, end - APPLY_BATCH)
            batch = list(self._records(start, end, "reading the cut tail at"))
            for queue_offset, phys, change in reversed(batch):
                if 0 <= phys < at:
                    found.reverse()
                    return first, found
                first = queue_offset
                if change is not None:
                    found.append(change)
            if not batch:
                break
            end = start
            await asyncio.sleep(0)
        found.reverse()
        return first, found

    async def rewind(self, first: int, cut: list[Change], at: int) -> metarewind.Plan:
        """Before a truncation at CommitLog offset ``at`` cuts the records from metadata queue
        offset ``first`` on (their changes: ``cut``): set what they touched back to what the
        records before ``first`` give it (:mod:`tidemq.broker.ha.metarewind`); applying continues
        at ``first``. Done again after a crash: until the cut, a restart applies the tail again and
        the handshake cuts it again. The kept records are read a batch per loop step (a long log
        must not stall the loop)."""
        store, m = self.store, self.m
        low = store.min_offset(METADATA_TOPIC, METADATA_QUEUE)
        self.applied = min(self.applied, first)
        if not cut:
            return metarewind.Plan()
        planner = metarewind.Planner(cut)
        for n, (_, _, change) in enumerate(self._records(low, first, "reading the kept log at"), 1):
            if change is not None:
                planner.feed(change)
            if n % REWIND_STEP == 0:
                await asyncio.sleep(0)
        # Whole only if retention removed nothing, before the read or during it.
        complete = low == 0 and store.min_offset(METADATA_TOPIC, METADATA_QUEUE) == 0
        plan = planner.result(complete, delay_levels=[t.level for t in m.schedule.level_timers])
        self.applying = True
        try:
            self._carry_out(plan, at)
        finally:
            self.applying = False
        log.warning("metadata: %d change(s) of the cut tail undone (%d topic(s), %d group(s), %d offset(s)%s%s)",
                    len(cut), len(plan.topics), len(plan.groups), len(plan.offsets),
                    ", delay progress" if plan.delay else "", ", checker progress" if plan.transactions else "")
        if plan.restored_topics:
            log.warning("metadata: topic(s) %s were deleted in the cut tail and are set again; their consume "
                        "queues are rebuilt from the commitlog once the log is cut", ", ".join(plan.restored_topics))
        if plan.unknown:
            log.warning("metadata: kept as they are (no kept record gives their earlier value: the metadata "
                        "queue's oldest records are gone, or they never were in it): %s",
                        "; ".join(plan.unknown))
        return plan

    def _carry_out(self, plan: metarewind.Plan, at: int) -> None:
        m = self.m
        topics_changed = False
        for name, tc in plan.topics.items():
            if tc is not None:
                topics_changed |= m.topics.put(tc)
            elif m.topics.get(name) is None:
                continue
            elif is_system_topic(name) or name in m.topics.ensured or self._stored_before(name, at):
                # Not made by the log (a broker's own topics, or one from before replication):
                # no kept record names it, yet it was there before the cut.
                plan.unknown.append(f"topic {name} (it was there before the cut)")
            else:
                self.store.delete_topic(name)  # first: a failure leaves the topic for the retry
                m.topics.delete(name)
                topics_changed = True
        for name, g in plan.groups.items():
            if g is not None:
                m.groups.put(g)
            else:
                m.groups.delete(name)
        for (group, topic, queue_id), offset in plan.offsets.items():
            if offset is None:
                m.offsets.remove(group, topic, queue_id)
            else:
                m.offsets.commit(group, topic, queue_id, offset, record=False)
        if plan.delay is not None:  # the levels and the delivery timer go back
            m.schedule.rewind_progress(plan.delay.levels, plan.delay.timer)
        if plan.transactions is not None:
            m.transactions.apply_progress(plan.transactions.half, plan.transactions.op)
        if topics_changed:
            m.topics_changed()
        self.touched |= {kind for kind, hit in (("topics", plan.topics), ("groups", plan.groups),
                                                ("offsets", plan.offsets), ("delay", plan.delay),
                                                ("transactions", plan.transactions)) if hit}

    def _stored_before(self, topic: str, at: int) -> bool:
        """Whether a queue of ``topic`` holds a message stored before CommitLog offset ``at``."""
        store = self.store
        for queue_id in store.queue_ids(topic):
            res = store.get_messages(topic, queue_id, store.min_offset(topic, queue_id), 1, None, everything=True)
            if res.records and decode_record(res.records[0]).commit_log_offset < at:
                return True
        return False

    def _apply(self, change: Change, replay: bool, phys: int = -1) -> None:
        """Apply one record's change; ``phys`` is the record's CommitLog offset (-1: unknown)."""
        m = self.m
        self.applying = True
        try:
            if isinstance(change, TopicSet):
                if m.topics.put(change.config):
                    m.topics_changed()
            elif isinstance(change, TopicDeleted):
                if m.topics.delete(change.name):
                    if not replay:  # at start the store recovered its own (durable) deletion
                        # Marked at its record, not at the end of the frame it came in: the
                        # topic's records after it (re-created in the same frame) are kept by a
                        # replay, and a cut keeps or removes the mark with the record.
                        self.store.delete_topic(change.name, at=phys + 1 if phys >= 0 else None)
                    m.topics_changed()
            elif isinstance(change, GroupSet):
                m.groups.put(change.config)
            elif isinstance(change, GroupDeleted):
                m.groups.delete(change.name)
            elif isinstance(change, OffsetsCommitted):
                for e in change.entries:
                    m.offsets.commit(e.group, e.topic, e.queue_id, e.offset, record=False)
            elif isinstance(change, OffsetsDropped):
                m.offsets.drop(change.topic, change.group, record=False)
            elif isinstance(change, DelayProgress):
                m.schedule.apply_progress(change.levels, change.timer)
            else:
                m.transactions.apply_progress(change.half, change.op)
        finally:
            self.applying = False
        self.touched.add(PERSISTS[type(change)])
