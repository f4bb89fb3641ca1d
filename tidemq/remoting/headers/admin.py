"""Headers of the admin requests: UPDATE_AND_CREATE_TOPIC (17), DELETE_TOPIC_IN_BROKER (215),
DELETE_SUBSCRIPTIONGROUP (207), GET_TOPIC_STATS_INFO (202) and GET_CONSUME_STATS (208).

Queue counts, perm and topicSysFlag are Java ints (defaults as RocketMQ's mqadmin: 8 queues each
way, perm 6); the broker checks their ranges. An absent name is the empty string.
``attributes`` of UPDATE_AND_CREATE_TOPIC is RocketMQ 5's modification list, ``+key=value`` to
set and ``-key`` to remove, comma-separated (e.g. ``+message.type=FIFO``); absent, it changes none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tidemq.remoting.command import field_int
from tidemq.remoting.headers.fields import INT, field_bool


@dataclass(frozen=True, slots=True)
class CreateTopicHeader:
    """UPDATE_AND_CREATE_TOPIC: a topic's whole configuration."""

    topic: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int
    topic_filter_type: str
    order: bool
    # (key, value) to set, (key, None) to remove; empty: leave the topic's attributes as they are
    attributes: tuple[tuple[str, str | None], ...] = ()


@dataclass(frozen=True, slots=True)
class TopicHeader:
    """DELETE_TOPIC_IN_BROKER and GET_TOPIC_STATS_INFO: the topic named."""

    topic: str


@dataclass(frozen=True, slots=True)
class DeleteGroupHeader:
    """DELETE_SUBSCRIPTIONGROUP: the group, and whether its committed offsets go too."""

    group_name: str
    remove_offset: bool


@dataclass(frozen=True, slots=True)
class ConsumeStatsHeader:
    """GET_CONSUME_STATS: a group's progress on one topic ("" = every topic it committed on)."""

    consumer_group: str
    topic: str


def decode_create_topic_header(fields: Mapping[str, str]) -> CreateTopicHeader:
    return CreateTopicHeader(
        fields.get("topic") or "",
        field_int(fields.get("readQueueNums"), "readQueueNums", 8, INT),
        field_int(fields.get("writeQueueNums"), "writeQueueNums", 8, INT),
        field_int(fields.get("perm"), "perm", 6, INT),
        field_int(fields.get("topicSysFlag"), "topicSysFlag", 0, INT),
        fields.get("topicFilterType") or "SINGLE_TAG",
        field_bool(fields.get("order")),
        decode_attributes(fields.get("attributes") or ""),
    )


MAX_ATTRIBUTES_LENGTH = 4096  # a handful of short keys; far above what RocketMQ defines


# GET_BROKER_RUNTIME_INFO: TideMQ's key (not RocketMQ's), the transaction checker's progress offset
# in the half queue (RMQ_SYS_TRANS_HALF_TOPIC, queue 0): every half message below it is committed,
# rolled back or discarded. A scale-in waits until it reaches the queue's max offset.
TRANSACTION_HALF_PROGRESS = "transactionHalfProgress"


def decode_attributes(text: str) -> tuple[tuple[str, str | None], ...]:
    """``+k=v,-k2`` -> ((k, v), (k2, None)); ValueError naming the bad item (as RocketMQ's
    AttributeParser refuses it: no sign, a set without a value, a key twice)."""
    if not text:
        return ()
    if len(text) > MAX_ATTRIBUTES_LENGTH:
        raise ValueError(f"header field 'attributes' is longer than {MAX_ATTRIBUTES_LENGTH} characters")
    out: dict[str, str | None] = {}
    for item in text.split(","):
        key, eq, value = item.partition("=")
        if key.startswith("+") and len(key) > 1 and eq and value:
            name, new = key[1:], value
        elif key.startswith("-") and len(key) > 1 and not eq:
            name, new = key[1:], None
        else:
            raise ValueError(f"attribute {item!r} is neither +key=value (set) nor -key (remove)")
        if name in out:
            raise ValueError(f"attribute {name!r} appears twice")
        out[name] = new
    return tuple(out.items())


def encode_attributes(changes: Mapping[str, str | None]) -> str:
    """The inverse of :func:`decode_attributes` (None removes the key)."""
    return ",".join(f"+{k}={v}" if v is not None else f"-{k}" for k, v in changes.items())


def decode_topic_header(fields: Mapping[str, str]) -> TopicHeader:
    return TopicHeader(fields.get("topic") or "")


def decode_delete_group_header(fields: Mapping[str, str]) -> DeleteGroupHeader:
    return DeleteGroupHeader(fields.get("groupName") or "", field_bool(fields.get("removeOffset")))


def decode_consume_stats_header(fields: Mapping[str, str]) -> ConsumeStatsHeader:
    return ConsumeStatsHeader(fields.get("consumerGroup") or "", fields.get("topic") or "")
