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

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

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
        while self.applied < end:
            res = self.store.get_messages(METADATA_TOPIC, METADATA_QUEUE, self.applied,
                                          min(APPLY_BATCH, end - self.applied), None, MAX_READ_BYTES,
                                          everything=True)  # applied as replicated, ahead of the mark
            if not res.records:
                if res.status is GetStatus.OFFSET_TOO_SMALL and res.next_begin_offset > self.applied:
                    # Retention removed records before they were applied (a replica down for days).
                    log.warning("metadata queue offsets %d..%d are gone; continuing at %d", self.applied,
                                res.next_begin_offset - 1, res.next_begin_offset)
                    self.applied = res.next_begin_offset
                    continue
                break
            for raw in res.records:
                try:
                    msg = decode_record(raw)
                    change = decode(msg.body)
                except CodecError as exc:
                    level = logging.ERROR if isinstance(exc, MetadataCodecError) else logging.WARNING
                    log.log(level, "metadata record at queue offset %d not applied: %s", self.applied, exc)
                    self.applied += 1
                    continue
                if msg.queue_offset != self.applied:
                    log.warning("metadata record at queue offset %d found while applying %d", msg.queue_offset,
                                self.applied)
                self._apply(change, replay)
                self.applied = msg.queue_offset + 1
                n += 1
        self.applied_count += n
        return n

    def _apply(self, change: Change, replay: bool) -> None:
        m = self.m
        self.applying = True
        try:
            if isinstance(change, TopicSet):
                if m.topics.put(change.config):
                    m.topics_changed()
            elif isinstance(change, TopicDeleted):
                if m.topics.delete(change.name):
                    if not replay:  # at start the store recovered its own (durable) deletion
                        self.store.delete_topic(change.name)
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
