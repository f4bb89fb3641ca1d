"""Headers of the consumer-registry requests: UNREGISTER_CLIENT (35), GET_CONSUMER_LIST_BY_GROUP
(38) and GET_CONSUMER_CONNECTION_LIST (203), and the enums of HEART_BEAT's body (HEART_BEAT and
the queue locks carry JSON bodies and no header fields the broker reads).

An absent group is the empty string (RocketMQ's clients always send the fields they use).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# A heartbeat's consumer enums, in Java's ordinal order.
CONSUME_TYPES = ("CONSUME_ACTIVELY", "CONSUME_PASSIVELY")
MESSAGE_MODELS = ("BROADCASTING", "CLUSTERING")
CONSUME_FROM = (
    "CONSUME_FROM_LAST_OFFSET",
    "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
    "CONSUME_FROM_MIN_OFFSET",
    "CONSUME_FROM_MAX_OFFSET",
    "CONSUME_FROM_FIRST_OFFSET",
    "CONSUME_FROM_TIMESTAMP",
)


def enum_name(value: object, names: Sequence[str], default: str) -> str:
    """Heartbeat enums arrive as names (Java) or ordinals (C++), as numbers or digit strings;
    anything else is ``default``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return names[value] if 0 <= value < len(names) else default
    if isinstance(value, str):
        # ASCII digits only ("²" is a digit to str.isdigit but not to int) and few of them (an
        # ordinal has one or two; a long digit string is no ordinal and costs int() time)
        if value.isascii() and value.isdigit() and len(value) <= 9:
            return enum_name(int(value), names, default)
        return value if value in names else default
    return default


@dataclass(frozen=True, slots=True)
class UnregisterClientHeader:
    """UNREGISTER_CLIENT: the producer and/or consumer group a client leaves ("" for none)."""

    producer_group: str
    consumer_group: str


@dataclass(frozen=True, slots=True)
class ConsumerGroupHeader:
    """GET_CONSUMER_LIST_BY_GROUP and GET_CONSUMER_CONNECTION_LIST: the group asked about."""

    consumer_group: str


def decode_unregister_client_header(fields: Mapping[str, str]) -> UnregisterClientHeader:
    return UnregisterClientHeader(fields.get("producerGroup") or "", fields.get("consumerGroup") or "")


def decode_consumer_group_header(fields: Mapping[str, str]) -> ConsumerGroupHeader:
    return ConsumerGroupHeader(fields.get("consumerGroup") or "")
