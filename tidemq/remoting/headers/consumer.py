"""Headers of the consumer-registry requests: UNREGISTER_CLIENT (35), GET_CONSUMER_LIST_BY_GROUP
(38) and GET_CONSUMER_CONNECTION_LIST (203). HEART_BEAT and the queue locks carry JSON bodies
and no header fields the broker reads.

An absent group is the empty string (RocketMQ's clients always send the fields they use).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


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
