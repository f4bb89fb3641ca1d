"""Checks a producer makes before anything goes on the wire (RocketMQ's client Validators).

Pure functions raising :class:`tidemq.errors.ClientError` with a sentence that says what to fix.
"""

from __future__ import annotations

import re

from tidemq.errors import ClientError
from tidemq.message import (
    MAX_BATCH_MESSAGES,
    MAX_PROPERTIES_LENGTH,
    MAX_TOPIC_LENGTH,
    NAME_VALUE_SEP,
    PROPERTY_SEP,
    Message,
    Prop,
)

TOPIC_PATTERN = re.compile(r"[%|a-zA-Z0-9_-]+")  # used with fullmatch (no "$": it allows "\n")
GROUP_PATTERN = TOPIC_PATTERN
MAX_GROUP_LENGTH = 255
AUTO_CREATE_TOPIC = "TBW102"
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"

# Topics a client may never send to (RocketMQ TopicValidator.NOT_ALLOWED_SEND_TOPIC_SET) plus the
# auto-create template, which Java's Validators refuse too.
NOT_ALLOWED_SEND_TOPICS = frozenset(
    {
        "SCHEDULE_TOPIC_XXXX",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "TRANS_CHECK_MAX_TIME_TOPIC",
        "SELF_TEST_TOPIC",
        "OFFSET_MOVED_EVENT",
        "rmq_sys_TIDEMQ_METADATA",  # a replicated group's metadata log (tidemq.broker.topics.METADATA_TOPIC)
        AUTO_CREATE_TOPIC,
    }
)


def check_topic_name(topic: object) -> str:
    """A legal topic name: ``[%|a-zA-Z0-9_-]``, 1..127 characters."""
    if not isinstance(topic, str) or not topic.strip():
        raise ClientError("topic is blank: give a topic name such as 'TopicTest'")
    if len(topic) > MAX_TOPIC_LENGTH:
        raise ClientError(
            f"topic {topic[:40]!r}... is {len(topic)} characters long; at most "
            f"{MAX_TOPIC_LENGTH} are allowed"
        )
    if not TOPIC_PATTERN.fullmatch(topic):
        raise ClientError(
            f"topic {topic!r} contains illegal characters; use only letters, digits, '%', '|', "
            "'_' and '-'"
        )
    return topic


def check_send_topic(topic: object) -> str:
    if topic.__class__ is str and topic in _GOOD_SEND_TOPICS:  # hot path: bench/produce_consume.py
        return topic
    name = check_topic_name(topic)
    if name in NOT_ALLOWED_SEND_TOPICS:
        raise ClientError(f"topic {name!r} is a system topic; clients may not send to it")
    if name.__class__ is str:  # plain str only: a subclass could compare differently
        if len(_GOOD_SEND_TOPICS) >= _GOOD_SEND_TOPICS_MAX:
            _GOOD_SEND_TOPICS.clear()
        _GOOD_SEND_TOPICS.add(name)
    return name


# Topic names already found legal for sending (validation is a pure function of the name).
_GOOD_SEND_TOPICS: set[str] = set()
_GOOD_SEND_TOPICS_MAX = 10_000


def check_group(group: object) -> str:
    if not isinstance(group, str) or not group.strip():
        raise ClientError("group is blank: give a group name such as 'my-group'")
    if len(group) > MAX_GROUP_LENGTH:
        raise ClientError(f"group name is {len(group)} characters; at most {MAX_GROUP_LENGTH}")
    if not GROUP_PATTERN.fullmatch(group):
        raise ClientError(
            f"group {group!r} contains illegal characters; use only letters, digits, '%', '|', "
            "'_' and '-'"
        )
    return group


def check_body(body: object, max_size: int) -> bytes:
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise ClientError(
            f"message body must be bytes, not {type(body).__name__} (encode text with .encode())"
        )
    size = len(body)
    if size == 0:
        raise ClientError("message body is empty; RocketMQ does not accept empty messages")
    if size > max_size:
        raise ClientError(
            f"message body is {size} bytes, more than the limit of {max_size} bytes "
            "(max_message_size); split it or store it elsewhere and send a reference"
        )
    return bytes(body)


def check_properties(props: dict[str, str]) -> None:
    for k, v in props.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise ClientError(f"property {k!r}={v!r}: names and values must be strings")
        if not k:
            raise ClientError("property with an empty name")
        for ch in (NAME_VALUE_SEP, PROPERTY_SEP):
            if ch in k or ch in v:
                raise ClientError(
                    f"property {k!r} contains a control character \\x01 or \\x02, which the wire "
                    "format reserves"
                )


def check_properties_size(encoded: str) -> None:
    if len(encoded) * 4 <= MAX_PROPERTIES_LENGTH:  # hot path: UTF-8 takes at most 4 bytes a char
        return
    size = len(encoded.encode("utf-8"))
    if size > MAX_PROPERTIES_LENGTH:
        raise ClientError(
            f"message properties take {size} bytes, more than {MAX_PROPERTIES_LENGTH}; "
            "use fewer or shorter keys and properties"
        )


def check_message(msg: Message, max_size: int) -> dict[str, str]:
    """Validate ``msg``; return its properties (``all_properties()``, computed once)."""
    if not isinstance(msg, Message):
        raise ClientError(f"expected a tidemq.Message, got {type(msg).__name__}")
    check_send_topic(msg.topic)
    check_body(msg.body, max_size)
    props = msg.all_properties()
    check_properties(props)
    return props


def check_batch(msgs: list[Message], max_size: int) -> str:
    """Validate a batch; return its topic."""
    if not msgs:
        raise ClientError("batch is empty: pass at least one message")
    if len(msgs) > MAX_BATCH_MESSAGES:
        raise ClientError(f"a batch holds at most {MAX_BATCH_MESSAGES} messages (this one {len(msgs)}): "
                          "use send_batches() or split_batches()")
    topic = msgs[0].topic if isinstance(msgs[0], Message) else None
    for msg in msgs:
        props = check_message(msg, max_size)
        if msg.topic != topic:
            raise ClientError(
                f"all messages of a batch must share one topic; found {topic!r} and {msg.topic!r}"
            )
        if props.get(Prop.DELAY, "0") not in ("", "0"):
            raise ClientError("batch messages cannot have a delay level; send them one by one")
    assert topic is not None
    if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        raise ClientError(f"batches cannot be sent to retry topic {topic!r}")
    return topic
