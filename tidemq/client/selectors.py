"""Queue selectors for ordered sends: ``selector(queues, msg, arg) -> MessageQueue``.

A selector gets the topic's publish queues (sorted by broker name, then queue id, the same list
in every client) and returns one of them. Pure functions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tidemq.client.route import MessageQueue
from tidemq.errors import ClientError
from tidemq.message import Message, java_hash

QueueSelector = Callable[[list[MessageQueue], Message, Any], MessageQueue]


def select_by_hash(key: str | int) -> QueueSelector:
    """A selector sending every message with ``key`` to the same queue.

    The hash is Java's ``hashCode`` (deterministic, unlike Python's ``hash``), taken modulo the
    queue count as RocketMQ's SelectMessageQueueByHash does, so Python and Java producers using
    the same key pick the same queue.
    """
    if isinstance(key, bool) or not isinstance(key, (str, int)):
        raise ClientError(f"select_by_hash needs a str or int key, not {type(key).__name__}")
    code = java_hash(key) if isinstance(key, str) else _java_int(key)

    def select(queues: list[MessageQueue], _msg: Message, _arg: Any) -> MessageQueue:
        return queues[abs(code) % len(queues)]

    return select


def select_queue(index: int) -> QueueSelector:
    """A selector choosing the ``index``-th publish queue of the topic (brokers by name, then
    queue id); ClientError if the topic has fewer queues."""
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ClientError(f"queue index must be an int >= 0, got {index!r}")

    def select(queues: list[MessageQueue], msg: Message, _arg: Any) -> MessageQueue:
        if index >= len(queues):
            raise ClientError(f"topic {msg.topic} has {len(queues)} publish queues; there is no "
                              f"queue index {index}")
        return queues[index]

    return select


def _java_int(value: int) -> int:
    """Java ``Long.hashCode`` for ints beyond 32 bits, the value itself within them."""
    if -(1 << 31) <= value < (1 << 31):
        return value
    v = value & 0xFFFFFFFFFFFFFFFF
    h = (v ^ (v >> 32)) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h
