"""The offsets family: consumer groups' committed offsets and the offsets of a queue (min, max,
by store time, the earliest store time).

Invariants: the offset table only holds queues that exist, of groups that exist (RocketMQ 5): a
commit creates its group when allowed and is refused for an unknown topic or a queue id outside
the topic's queues. A negative commit (Java clients commit -1 for a queue they never read) keeps
what is stored. In a replicated group (``metadata``: tidemq.broker.ha.metalog) a commit is refused
unless this replica may acknowledge, and answered once the replicated log holds it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tidemq.broker.messaging.context import Caller, refused
from tidemq.broker.topics import loggable
from tidemq.remoting.codes import ResponseCode

if TYPE_CHECKING:
    from tidemq.broker.creation import ImplicitCreation
    from tidemq.broker.ha.metalog import MetadataLog
    from tidemq.broker.offsets import ConsumerOffsetManager
    from tidemq.broker.store.store import MessageStore
    from tidemq.broker.topics import TopicConfigManager

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class OffsetCommit:
    """A group's next offset to consume on one queue."""

    group: str
    topic: str
    queue_id: int
    offset: int


class OffsetService:
    def __init__(self, *, offsets: ConsumerOffsetManager, store: MessageStore, topics: TopicConfigManager,
                 creation: ImplicitCreation, metadata: MetadataLog | None = None) -> None:
        self._offsets = offsets
        self._metadata = metadata  # None: not replicated
        self._store = store
        self._topics = topics
        self._creation = creation

    def committed(self, group: str, topic: str, queue_id: int) -> int:
        """The group's offset on the queue; refused QUERY_NOT_FOUND when it has none to give."""
        self._creation.check_group_name(group)
        offset = self._offsets.query(group, topic, queue_id)
        if offset is not None and offset >= 0:
            return offset
        # RocketMQ answers 0 for a group without an offset on a queue that still starts at 0 and
        # is not far behind, so a new group reads a young queue from its first message.
        if self._store.min_offset(topic, queue_id) <= 0:
            return 0
        raise refused(ResponseCode.QUERY_NOT_FOUND, "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first")

    def commit(self, caller: Caller, c: OffsetCommit) -> Awaitable[None] | None:
        """Store the commit; None when answered now, else an awaitable to await before answering
        (replicated: until the group's rule holds it; it raises BrokerError otherwise)."""
        if self._metadata is not None:
            self._metadata.check()
        # The group is created (charged to the caller) before the topic is checked, as RocketMQ 5.
        self._creation.group(c.group, caller.principal, ResponseCode.SYSTEM_ERROR)
        tc = self._topics.get(c.topic)
        if tc is None:
            raise refused(ResponseCode.TOPIC_NOT_EXIST, f"Topic {loggable(c.topic)} not exist!")
        if not 0 <= c.queue_id < tc.queue_nums:
            raise refused(ResponseCode.SYSTEM_ERROR,
                          f"queueId[{c.queue_id}] is illegal, topic {c.topic} has {tc.queue_nums} queues")
        if c.offset < 0:
            if c.offset != -1:
                log.debug("commitOffset %d of %s on %s/%d ignored", c.offset, loggable(c.group), c.topic, c.queue_id)
            return None
        self._offsets.commit(c.group, c.topic, c.queue_id, c.offset)
        return None if self._metadata is None else self._metadata.commit_offsets()

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self._store.max_offset(topic, queue_id)

    def min_offset(self, topic: str, queue_id: int) -> int:
        return self._store.min_offset(topic, queue_id)

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        return self._store.offset_by_time(topic, queue_id, timestamp_ms)

    def earliest_store_time(self, topic: str, queue_id: int) -> int:
        """The store time (ms) of the queue's first message; -1 for a queue never written."""
        if self._store.max_offset(topic, queue_id) > 0:
            return self._store.earliest_store_time(topic, queue_id)
        return -1
