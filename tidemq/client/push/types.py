"""The vocabulary of push consumption: message models, where a new group starts, what a
listener returns, and the listener's type.

Values are RocketMQ's enum names, which is also how the heartbeat carries them (Java's form).
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Union

from tidemq.message import MessageExt


class MessageModel(enum.Enum):
    """CLUSTERING: the group shares the queues, offsets live at the broker. BROADCASTING: every
    consumer reads every queue, offsets live in a local file."""

    BROADCASTING = "BROADCASTING"
    CLUSTERING = "CLUSTERING"


class ConsumeFromWhere(enum.Enum):
    """Where a group starts on a queue it has no offset for (its first start)."""

    LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    TIMESTAMP = "CONSUME_FROM_TIMESTAMP"


class ConsumeConcurrentlyStatus(enum.Enum):
    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


ConsumeStatus = ConsumeConcurrentlyStatus


class ConsumeOrderlyStatus(enum.Enum):
    SUCCESS = "SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


AnyStatus = Union[ConsumeConcurrentlyStatus, ConsumeOrderlyStatus, None]

# fn(msgs) -> status, plain or async. Plain ones run in the consumer's thread pool.
MessageListener = Callable[[list[MessageExt]], Union[AnyStatus, Awaitable[AnyStatus]]]


def succeeded(status: object) -> bool:
    """Whether a listener's answer acknowledges its messages. Both status families are accepted
    in both modes; anything else (None, an exception) means "later", as in RocketMQ."""
    return status in (ConsumeConcurrentlyStatus.CONSUME_SUCCESS, ConsumeOrderlyStatus.SUCCESS)


@dataclass(frozen=True, slots=True)
class ProcessQueueStats:
    """A snapshot of one owned queue's local cache, for monitoring and tests."""

    msg_count: int
    msg_size: int
    max_span: int
    locked: bool
    dropped: bool
