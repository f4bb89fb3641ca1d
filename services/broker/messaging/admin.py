"""The admin family: topics and subscription groups (create or update, delete, list) and the
statistics mqadmin and the operator read (topic stats, consume stats, all consumer offsets).

Invariants: system topics and the cluster's and broker's own names cannot be created or deleted
here; creating a topic or group beyond the broker's total limit is refused and changes nothing.
A change is answered once it is on disk (the awaitable an operation returns); the name servers
learn a topic change in the background, so an unreachable name server cannot make an admin call
time out. In a replicated group (``metadata``: tidemq.broker.ha.metalog) a change is refused
before it is made unless this replica may acknowledge, and answered once the replicated log
holds it by the group's rule (or with the code the rule gave: FLUSH_SLAVE_TIMEOUT, ...).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from tidemq.bodies import SubscriptionGroupConfig
from tidemq.broker.messaging.context import refused
from tidemq.broker.topics import (
    TopicConfig,
    alter_attributes,
    is_system_topic,
    validate_group_name,
    validate_topic_name,
)
from tidemq.remoting.codes import ResponseCode

if TYPE_CHECKING:
    from tidemq.broker.groups import SubscriptionGroupManager
    from tidemq.broker.ha.metalog import MetadataLog
    from tidemq.broker.offsets import ConsumerOffsetManager
    from tidemq.broker.quota import CreationQuota
    from tidemq.broker.store.store import MessageStore
    from tidemq.broker.topics import TopicConfigManager

MAX_QUEUE_NUMS = 65535  # the most read or write queues a topic may declare


@dataclass(frozen=True, slots=True)
class QueueStats:
    """GET_TOPIC_STATS_INFO: one write queue's offsets and its last message's store time (0 = none)."""

    topic: str
    queue_id: int
    min_offset: int
    max_offset: int
    last_update_ms: int


@dataclass(frozen=True, slots=True)
class QueueProgress:
    """GET_CONSUME_STATS: a group's progress on one read queue; ``last_ms`` is the store time of
    the last message it consumed (0 = none)."""

    topic: str
    queue_id: int
    broker_offset: int
    consumer_offset: int
    last_ms: int


class AdminService:
    def __init__(
        self,
        *,
        topics: TopicConfigManager,
        groups: SubscriptionGroupManager,
        offsets: ConsumerOffsetManager,
        store: MessageStore,
        quota: CreationQuota,
        reserved_names: Collection[str],
        persist_topics: Callable[[], Awaitable[None]],
        topics_changed: Callable[..., object],
        persist_groups: Callable[[], Awaitable[None]],
        metadata: MetadataLog | None = None,
    ) -> None:
        self._topics = topics
        self._groups = groups
        self._offsets = offsets
        self._store = store
        self._quota = quota
        self._reserved = frozenset(reserved_names)  # the cluster's and this broker's names (route keys)
        self._persist_topics = persist_topics
        self._topics_changed = topics_changed  # re-registers with the name servers
        self._persist_groups = persist_groups
        self._metadata = metadata  # None: not replicated

    # topics -----------------------------------------------------------------------------------
    def update_topic(self, tc: TopicConfig,
                     attributes: tuple[tuple[str, str | None], ...] = ()) -> Awaitable[None]:
        """Create or replace a topic's configuration; await the result before answering.

        ``attributes`` are changes to the topic's current attributes ((key, None) removes one), as
        RocketMQ 5 applies them: an update that names none keeps what the topic has."""
        topic = tc.topic_name
        problem = validate_topic_name(topic)
        if problem:
            raise refused(ResponseCode.SYSTEM_ERROR, f"{problem}; fix the topic name")
        self._refuse_system(topic)
        read, write, perm = tc.read_queue_nums, tc.write_queue_nums, tc.perm
        if not (0 <= read <= MAX_QUEUE_NUMS and 0 <= write <= MAX_QUEUE_NUMS) or read + write == 0:
            raise refused(ResponseCode.SYSTEM_ERROR, f"queue counts read={read} write={write} are out of range")
        if perm not in (0, 2, 4, 6) and perm & ~0xF:
            raise refused(ResponseCode.SYSTEM_ERROR, f"perm {perm} is invalid; use 2 (W), 4 (R) or 6 (RW)")
        current = self._topics.get(topic)
        try:
            tc = replace(tc, attributes=alter_attributes(current.attributes if current else (), attributes))
        except ValueError as exc:
            raise refused(ResponseCode.SYSTEM_ERROR, str(exc)) from None
        if current is None:
            full = self._quota.check_total("topic", len(self._topics.topics))
            if full is not None:
                raise refused(ResponseCode.SYSTEM_ERROR, f"topic {topic} was not created: {full}")
        if self._metadata is not None:
            self._metadata.check()
        return self._topic_changed(self._topics.put(tc))

    def delete_topic(self, topic: str) -> Awaitable[None]:
        """Delete a topic, its messages and its committed offsets; await the result before answering."""
        self._refuse_system(topic)
        if self._metadata is not None:
            self._metadata.check()
        changed = self._topics.delete(topic)
        if changed:
            self._store.delete_topic(topic)
            self._offsets.delete_topic(topic)
        return self._topic_changed(changed)

    def topic_table(self) -> dict[str, Any]:
        """Every topic's configuration with the table's data version (RocketMQ's TopicConfigSerializeWrapper)."""
        return self._topics.wrapper()

    def _refuse_system(self, topic: str) -> None:
        if is_system_topic(topic) or topic in self._reserved:
            raise refused(ResponseCode.SYSTEM_ERROR, f"The topic[{topic}] is conflict with system topic.")

    async def _topic_changed(self, changed: bool) -> None:
        if changed:
            await self._persist_topics()
            self._topics_changed(persist=False)
        if self._metadata is not None:  # unchanged too: an earlier try's record may still be in flight
            await self._metadata.settle()

    # groups -----------------------------------------------------------------------------------
    def update_group(self, g: SubscriptionGroupConfig) -> Awaitable[None] | None:
        """Create or replace a group's settings: None when nothing changed, else an awaitable
        that ends once the change is on disk."""
        problem = validate_group_name(g.group_name)
        if problem:
            raise refused(ResponseCode.SYSTEM_ERROR, problem)
        if self._groups.get(g.group_name) is None:
            full = self._quota.check_total("group", len(self._groups.groups))
            if full is not None:
                raise refused(ResponseCode.SYSTEM_ERROR, f"group {g.group_name} was not created: {full}")
        if self._metadata is not None:
            self._metadata.check()
            return self._group_changed(self._groups.put(g))
        return self._persist_groups() if self._groups.put(g) else None

    def delete_group(self, name: str, remove_offsets: bool) -> Awaitable[None] | None:
        """Delete a group (and its committed offsets when asked): None when there was none."""
        if self._metadata is not None:
            self._metadata.check()
        if not self._groups.delete(name):
            return None
        if remove_offsets:
            self._offsets.delete_group(name)
        return self._persist_groups() if self._metadata is None else self._group_changed(True)

    async def _group_changed(self, changed: bool) -> None:
        if changed:
            await self._persist_groups()
        assert self._metadata is not None  # only replicated groups get here
        await self._metadata.settle()

    def group_table(self) -> dict[str, Any]:
        """Every group's settings with the table's data version (RocketMQ's SubscriptionGroupWrapper)."""
        return self._groups.wrapper()

    # statistics -------------------------------------------------------------------------------
    def topic_stats(self, topic: str) -> tuple[QueueStats, ...]:
        tc = self._topics.get(topic)
        if tc is None:
            raise refused(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        store = self._store
        out = []
        for q in range(tc.write_queue_nums):
            mx = store.max_offset(topic, q)
            out.append(QueueStats(topic, q, store.min_offset(topic, q), mx,
                                  store.store_time_at(topic, q, mx - 1) if mx > 0 else 0))
        return tuple(out)

    def consume_stats(self, group: str, topic: str = "") -> tuple[QueueProgress, ...]:
        """The group's progress on ``topic``'s read queues, or on every topic it committed on."""
        store = self._store
        out = []
        for t in [topic] if topic else self._offsets.topics_of_group(group):
            tc = self._topics.get(t)
            if tc is None:
                continue
            committed = self._offsets.offsets(group, t)
            for q in range(tc.read_queue_nums):
                co = committed.get(q, 0)
                out.append(QueueProgress(t, q, store.max_offset(t, q), co,
                                         store.store_time_at(t, q, co - 1) if co > 0 else 0))
        return tuple(out)

    def consumer_offsets(self) -> dict[str, dict[int, int]]:
        """Every committed offset: "topic@group" -> {queue id: offset} (a copy)."""
        return {k: dict(v) for k, v in self._offsets.table.items()}
