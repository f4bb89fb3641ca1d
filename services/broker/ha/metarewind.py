"""Undoing the metadata changes of a cut log tail (issue 17).

A replica that follows a new master cuts the tail of its CommitLog the new master does not hold
(``ReplicationFollower``'s truncation at the handshake): an old master's writes that were never
acknowledged. Metadata records in that tail (a topic or group created, changed or deleted, offsets
committed, progress moved) were already in effect in the replica's managers. Every record is a
value to set, so the value a key had before the cut is the value the last record of it *kept* in
the log gives; a key no kept record names did not exist, when the metadata queue still holds its
whole history (nothing removed by retention).

:func:`plan` is pure: the cut changes and the kept ones in, what to set out (:class:`Planner`
takes the kept ones one at a time). The applier
(:meth:`tidemq.broker.ha.metaapply.MetadataApplier.rewind`) reads the records and carries it out.

Invariants:
- Only keys a cut record names are touched (a follower's local changes, e.g. groups its
  heartbeats created, stay unless a cut record names them).
- A key no kept record names is removed only when the history is complete; otherwise it is kept
  and listed in ``unknown`` (the caller logs it): its earlier value is gone with the old segments.
- Progress (delay levels, the delivery timer, the transaction checker) goes back to the last kept
  record's value, or to zero with a complete history; the caller decides what can go back.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tidemq.bodies import SubscriptionGroupConfig
from tidemq.broker.ha.metadata import (
    Change,
    DelayProgress,
    GroupDeleted,
    GroupSet,
    OffsetsCommitted,
    OffsetsDropped,
    TopicDeleted,
    TopicSet,
    TransactionProgress,
)
from tidemq.broker.topics import TopicConfig

OffsetKey = tuple[str, str, int]  # (group, topic, queue id)
Drop = tuple[str | None, str | None]  # (topic, group) of an OffsetsDropped; None matches any


@dataclass
class Plan:
    """What to set after a cut. ``None`` values mean "remove"; keys absent from a mapping are
    not touched."""

    topics: dict[str, TopicConfig | None] = field(default_factory=dict)
    groups: dict[str, SubscriptionGroupConfig | None] = field(default_factory=dict)
    offsets: dict[OffsetKey, int | None] = field(default_factory=dict)
    delay: DelayProgress | None = None  # the progress to go back to (None: untouched)
    transactions: TransactionProgress | None = None
    restored_topics: tuple[str, ...] = ()  # deleted in the cut tail, set again: their queues are rebuilt
    # What a cut record named that no kept record does, with part of the history gone: kept as is.
    unknown: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.topics or self.groups or self.offsets or self.delay or self.transactions)


def _matches(drop: Drop, topic: str, group: str) -> bool:
    return (drop[0] is None or drop[0] == topic) and (drop[1] is None or drop[1] == group)


def plan(cut: Sequence[Change], kept: Iterable[Change], complete: bool,
         delay_levels: Sequence[int] = ()) -> Plan:
    """What to set so the keys ``cut`` names hold what ``kept`` (the records left, oldest
    first) gives them. ``complete``: ``kept`` starts at the metadata queue's first record ever.
    ``delay_levels``: the levels a zero delay progress names (a complete history without any)."""
    planner = Planner(cut)
    for c in kept:
        planner.feed(c)
    return planner.result(complete, delay_levels)


class Planner:
    """:func:`plan` a kept change at a time (a long kept log is read in batches)."""

    def __init__(self, cut: Sequence[Change]) -> None:
        self.topics: set[str] = set()
        self.groups: set[str] = set()
        self.offsets: set[OffsetKey] = set()
        self.drops: list[Drop] = []
        self.deleted_topics: set[str] = set()
        self.delay = self.transactions = False
        for c in cut:
            named = _named(c)
            if named is not None:
                is_topic, name, value = named
                (self.topics if is_topic else self.groups).add(name)
                if is_topic and value is None:
                    self.deleted_topics.add(name)
            elif isinstance(c, OffsetsCommitted):
                self.offsets.update((e.group, e.topic, e.queue_id) for e in c.entries)
            elif isinstance(c, OffsetsDropped):
                self.drops.append((c.topic, c.group))
            elif isinstance(c, DelayProgress):
                self.delay = True
            else:
                self.transactions = True
        self.out = Plan()
        self.last_delay: DelayProgress | None = None
        self.last_tx: TransactionProgress | None = None

    def feed(self, c: Change) -> None:
        """The next kept change, oldest first."""
        out = self.out
        named = _named(c)
        if named is not None:
            is_topic, name, value = named
            if name in (self.topics if is_topic else self.groups):
                into: dict[str, Any] = out.topics if is_topic else out.groups
                into[name] = value
        elif isinstance(c, OffsetsCommitted):
            drops = self.drops
            for e in c.entries:
                key = (e.group, e.topic, e.queue_id)
                if key in self.offsets or any(_matches(d, e.topic, e.group) for d in drops):
                    out.offsets[key] = e.offset
        elif isinstance(c, OffsetsDropped):
            gone = (c.topic, c.group)
            for key in self.offsets.union(out.offsets):
                if _matches(gone, key[1], key[0]):
                    out.offsets[key] = None
        elif isinstance(c, DelayProgress):
            self.last_delay = c
        elif isinstance(c, TransactionProgress):
            self.last_tx = c

    def result(self, complete: bool, delay_levels: Sequence[int] = ()) -> Plan:
        """The plan, once every kept change was fed."""
        out = self.out
        for name in sorted(self.topics - out.topics.keys()):
            _absent(out, out.topics, name, f"topic {name}", complete)
        for name in sorted(self.groups - out.groups.keys()):
            _absent(out, out.groups, name, f"subscription group {name}", complete)
        for key in sorted(self.offsets - out.offsets.keys()):
            _absent(out, out.offsets, key, f"offset of group {key[0]} on {key[1]} queue {key[2]}", complete)
        if self.drops and not complete:
            out.unknown.append("offsets removed in the cut tail that no kept record names "
                               f"({', '.join(f'topic={t} group={g}' for t, g in self.drops)})")
        if self.delay:
            if self.last_delay is not None:
                out.delay = self.last_delay
            elif complete:
                out.delay = DelayProgress(tuple((level, 0) for level in delay_levels), 0)
            else:
                out.unknown.append("delay progress")
        if self.transactions:
            if self.last_tx is not None:
                out.transactions = self.last_tx
            elif complete:
                out.transactions = TransactionProgress(0, 0)
            else:
                out.unknown.append("transaction checker progress")
        out.restored_topics = tuple(sorted(n for n in self.deleted_topics if out.topics.get(n) is not None))
        return out


def _named(c: Change) -> tuple[bool, str, TopicConfig | SubscriptionGroupConfig | None] | None:
    """(is a topic, its name, its value or None when deleted) of a topic or group change."""
    if isinstance(c, TopicSet):
        return True, c.config.topic_name, c.config
    if isinstance(c, TopicDeleted):
        return True, c.name, None
    if isinstance(c, GroupSet):
        return False, c.config.group_name, c.config
    if isinstance(c, GroupDeleted):
        return False, c.name, None
    return None


def _absent(out: Plan, into: dict, key: object, what: str, complete: bool) -> None:
    if complete:
        into[key] = None
    else:
        out.unknown.append(what)
