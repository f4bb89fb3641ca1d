"""TideMQ: a message queue speaking Apache RocketMQ's wire protocol, and its Python client.

``import tidemq`` is cheap: the errors load eagerly, everything else on first use.

    import tidemq
    async with tidemq.Producer("my-group", "127.0.0.1:9876") as producer:
        await producer.send(tidemq.Message("TopicTest", b"hello", tags="TagA"))
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tidemq.errors import (
    AdminError,
    BrokerError,
    ClientError,
    CodecError,
    ConfigError,
    ConnectError,
    FrameError,
    RemotingError,
    RemotingTimeoutError,
    RequestTimeoutError,
    StoreCorruptError,
    StoreError,
    TideMQError,
)

__version__ = "0.1.0"

# The rest of __all__ loads on first use: Message and MessageExt from tidemq.message, everything
# else from tidemq.client (whose __all__ it is part of).
_FROM_MESSAGE = ("Message", "MessageExt")

__all__ = [
    "Admin",
    "AdminError",
    "BrokerError",
    "ClientConfig",
    "ClientError",
    "CodecError",
    "ConfigError",
    "ConnectError",
    "ConsumeConcurrentlyStatus",
    "ConsumeFromWhere",
    "ConsumeOrderlyStatus",
    "ConsumeStatus",
    "FrameError",
    "LitePullConsumer",
    "LocalTransactionState",
    "Message",
    "MessageExt",
    "MessageModel",
    "MessageQueue",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "RemotingError",
    "RemotingTimeoutError",
    "RequestTimeoutError",
    "SendResult",
    "SendStatus",
    "StoreCorruptError",
    "StoreError",
    "SyncAdmin",
    "SyncLitePullConsumer",
    "SyncProducer",
    "SyncPullConsumer",
    "SyncPushConsumer",
    "SyncTransactionProducer",
    "TideMQError",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
    "__version__",
    "create_reply_message",
    "select_by_hash",
    "select_queue",
    "split_batches",
]

if TYPE_CHECKING:
    from tidemq.client import (
        Admin, ClientConfig, ConsumeConcurrentlyStatus, ConsumeFromWhere, ConsumeOrderlyStatus,
        ConsumeStatus, LitePullConsumer, LocalTransactionState, MessageModel, MessageQueue,
        Producer, PullConsumer, PullResult, PullStatus, PushConsumer, SendResult, SendStatus,
        SyncAdmin, SyncLitePullConsumer, SyncProducer, SyncPullConsumer, SyncPushConsumer,
        SyncTransactionProducer, TransactionListener, TransactionProducer, TransactionSendResult,
        create_reply_message, select_by_hash, select_queue, split_batches,
    )
    from tidemq.message import Message, MessageExt


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'tidemq' has no attribute {name!r}")
    module = "tidemq.message" if name in _FROM_MESSAGE else "tidemq.client"
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
