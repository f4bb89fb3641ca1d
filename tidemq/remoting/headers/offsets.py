"""Headers of the offset requests: QUERY_CONSUMER_OFFSET (14), UPDATE_CONSUMER_OFFSET (15),
GET_MAX_OFFSET (30), GET_MIN_OFFSET (31), GET_EARLIEST_MSG_STORETIME (32) and
SEARCH_OFFSET_BY_TIMESTAMP (29).

A queue id is a Java int, offsets and timestamps Java longs; a missing or malformed number raises
``ValueError`` naming the field (the broker answers it as a bad request). Fields are read in the
order RocketMQ's broker reads them, so the first bad field is the one named.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tidemq.remoting.command import field_int
from tidemq.remoting.headers.fields import INT


@dataclass(frozen=True, slots=True)
class QueueHeader:
    """GET_MAX_OFFSET, GET_MIN_OFFSET, GET_EARLIEST_MSG_STORETIME: one queue of a topic."""

    topic: str
    queue_id: int


@dataclass(frozen=True, slots=True)
class SearchOffsetHeader:
    """SEARCH_OFFSET_BY_TIMESTAMP: the queue, and the store time in ms to find."""

    topic: str
    queue_id: int
    timestamp: int


@dataclass(frozen=True, slots=True)
class QueryConsumerOffsetHeader:
    """QUERY_CONSUMER_OFFSET: a group's committed offset on one queue."""

    consumer_group: str
    topic: str
    queue_id: int


@dataclass(frozen=True, slots=True)
class UpdateConsumerOffsetHeader:
    """UPDATE_CONSUMER_OFFSET: a group's commit of the next offset to consume on one queue."""

    consumer_group: str
    topic: str
    queue_id: int
    commit_offset: int


def decode_queue_header(fields: Mapping[str, str]) -> QueueHeader:
    return QueueHeader(fields.get("topic") or "", field_int(fields.get("queueId"), "queueId", None, INT))


def decode_search_offset_header(fields: Mapping[str, str]) -> SearchOffsetHeader:
    return SearchOffsetHeader(fields.get("topic") or "", field_int(fields.get("queueId"), "queueId", None, INT),
                              field_int(fields.get("timestamp"), "timestamp"))


def decode_query_consumer_offset_header(fields: Mapping[str, str]) -> QueryConsumerOffsetHeader:
    return QueryConsumerOffsetHeader(fields.get("consumerGroup") or "", fields.get("topic") or "",
                                     field_int(fields.get("queueId"), "queueId", None, INT))


def decode_update_consumer_offset_header(fields: Mapping[str, str]) -> UpdateConsumerOffsetHeader:
    group = fields.get("consumerGroup") or ""
    topic = fields.get("topic") or ""
    if not group or not topic:
        raise ValueError("consumerGroup and topic are required")
    offset = field_int(fields.get("commitOffset"), "commitOffset")
    return UpdateConsumerOffsetHeader(group, topic, field_int(fields.get("queueId"), "queueId", None, INT), offset)
