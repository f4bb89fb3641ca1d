"""Splitting a list of messages into batches under the size limit (RocketMQ's ListSplitter).

A message counts topic + body + properties + 20 bytes of log overhead; the properties include
those the producer adds at send time (UNIQ_KEY, WAIT), so every part :func:`split_batches`
makes passes :meth:`Producer.send_batch`'s size check. Pure functions.
"""

from __future__ import annotations

from collections.abc import Sequence

from tidemq.client.config import MAX_MESSAGE_SIZE
from tidemq.message import MAX_BATCH_MESSAGES, Message, Prop, encode_properties

BATCH_LOG_OVERHEAD = 20
_UNIQ_PLACEHOLDER = "0" * 32  # a UNIQ_KEY is 32 hex characters


def batch_message_size(msg: Message) -> int:
    """ListSplitter's size of one message of a batch, counting the properties the producer adds
    at send time (UNIQ_KEY, WAIT)."""
    props = msg.all_properties()
    props.setdefault(Prop.UNIQ_KEY, _UNIQ_PLACEHOLDER)
    props.setdefault(Prop.WAIT, "true")
    return (len(msg.topic.encode()) + len(msg.body) + len(encode_properties(props).encode())
            + BATCH_LOG_OVERHEAD)


def split_batches(msgs: Sequence[Message], limit: int = MAX_MESSAGE_SIZE,
                  max_messages: int = MAX_BATCH_MESSAGES) -> list[list[Message]]:
    """Split ``msgs`` (in order) into batches of at most ``limit`` bytes (RocketMQ ListSplitter)
    and ``max_messages`` messages (a broker stores at most 32,767 per batch).

    A message larger than ``limit`` on its own forms a batch of one (sending it will fail with a
    clear error, as in Java).
    """
    out: list[list[Message]] = []
    current: list[Message] = []
    total = 0
    for msg in msgs:
        size = batch_message_size(msg)
        if current and (total + size > limit or len(current) >= max_messages):
            out.append(current)
            current, total = [], 0
        current.append(msg)
        total += size
        if size > limit:
            out.append(current)
            current, total = [], 0
    if current:
        out.append(current)
    return out
