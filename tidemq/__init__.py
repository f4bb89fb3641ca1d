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

_LAZY = {
    "Message": "tidemq.message",
    "MessageExt": "tidemq.message",
    "MessageQueue": "tidemq.client.route",
    "ClientConfig": "tidemq.client.config",
    "Producer": "tidemq.client.producer",
    "PullConsumer": "tidemq.client.consumer",
    "Admin": "tidemq.client.admin",
    "SendResult": "tidemq.client.send",
    "SendStatus": "tidemq.client.send",
    "PullResult": "tidemq.client.pull",
    "PullStatus": "tidemq.client.pull",
    "SyncProducer": "tidemq.client.sync",
    "SyncPullConsumer": "tidemq.client.sync",
    "SyncAdmin": "tidemq.client.sync",
    "create_reply_message": "tidemq.client.request_reply",
    "select_by_hash": "tidemq.client.selectors",
    "select_queue": "tidemq.client.selectors",
    "split_batches": "tidemq.client.batching",
    "PushConsumer": "tidemq.client.push",
    "LitePullConsumer": "tidemq.client.lite_pull",
    "SyncPushConsumer": "tidemq.client.push.blocking",
    "SyncLitePullConsumer": "tidemq.client.push.blocking",
    "ConsumeStatus": "tidemq.client.push",
    "ConsumeConcurrentlyStatus": "tidemq.client.push",
    "ConsumeOrderlyStatus": "tidemq.client.push",
    "MessageModel": "tidemq.client.push",
    "ConsumeFromWhere": "tidemq.client.push",
    "LocalTransactionState": "tidemq.client.transaction",
    "TransactionListener": "tidemq.client.transaction",
    "TransactionProducer": "tidemq.client.transaction",
    "TransactionSendResult": "tidemq.client.transaction",
    "SyncTransactionProducer": "tidemq.client.transaction",
}

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
    from tidemq.client.admin import Admin
    from tidemq.client.config import ClientConfig
    from tidemq.client.consumer import PullConsumer
    from tidemq.client.producer import Producer
    from tidemq.client.lite_pull import LitePullConsumer
    from tidemq.client.pull import PullResult, PullStatus
    from tidemq.client.batching import split_batches
    from tidemq.client.request_reply import create_reply_message
    from tidemq.client.selectors import select_by_hash, select_queue
    from tidemq.client.push import (
        ConsumeConcurrentlyStatus,
        ConsumeFromWhere,
        ConsumeOrderlyStatus,
        ConsumeStatus,
        MessageModel,
        PushConsumer,
    )
    from tidemq.client.push.blocking import SyncLitePullConsumer, SyncPushConsumer
    from tidemq.client.route import MessageQueue
    from tidemq.client.send import SendResult, SendStatus
    from tidemq.client.sync import SyncAdmin, SyncProducer, SyncPullConsumer
    from tidemq.client.transaction import (
        LocalTransactionState,
        SyncTransactionProducer,
        TransactionListener,
        TransactionProducer,
        TransactionSendResult,
    )
    from tidemq.message import Message, MessageExt


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tidemq' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
