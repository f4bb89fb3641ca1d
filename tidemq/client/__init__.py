"""TideMQ's client: Producer, PullConsumer, Admin (asyncio) and their blocking facades.

Layout (aiokafka-like): pure wire codecs in ``send``, ``pull``, ``heartbeat``,
``admin_protocol`` and ``route``; state in ``route_cache``; I/O in ``instance`` (connections,
name servers, heartbeats) used by ``producer``, ``consumer`` and ``admin`` (their shared lifecycle
in ``base``); ``sync`` wraps them in blocking facades (machinery in ``facade``). ``producer`` is a
front over ``accumulator`` (merges concurrent sends) and ``sender`` (routes, retries, reports to
``fault``); ``transaction`` builds on the front.
``push`` holds PushConsumer (rebalancing, process queues, offset stores, concurrent and orderly
consumption); ``lite_pull`` the poll()-style LitePullConsumer built on the same parts.
"""

from tidemq.client.admin import Admin
from tidemq.client.admin_protocol import ConsumerProgress, QueueProgress, TopicOffset
from tidemq.client.allocate import allocate_averagely, allocate_averagely_by_circle
from tidemq.client.config import ClientConfig
from tidemq.client.consumer import PullConsumer
from tidemq.client.instance import ClientInstance
from tidemq.client.lite_pull import LitePullConsumer
from tidemq.client.producer import Producer
from tidemq.client.batching import split_batches
from tidemq.client.request_reply import create_reply_message
from tidemq.client.selectors import select_by_hash, select_queue
from tidemq.client.pull import PullResult, PullStatus
from tidemq.client.push import (
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    MessageModel,
    PushConsumer,
)
from tidemq.client.push.blocking import SyncLitePullConsumer, SyncPushConsumer
from tidemq.client.route import BrokerData, ClusterInfo, MessageQueue, Perm, QueueData, TopicRouteData
from tidemq.client.send import SendResult, SendStatus
from tidemq.client.sync import SyncAdmin, SyncProducer, SyncPullConsumer
from tidemq.client.transaction import (
    LocalTransactionState,
    SyncTransactionProducer,
    TransactionListener,
    TransactionProducer,
    TransactionSendResult,
)

__all__ = [
    "Admin",
    "BrokerData",
    "ClientConfig",
    "ClientInstance",
    "ClusterInfo",
    "ConsumeConcurrentlyStatus",
    "ConsumeFromWhere",
    "ConsumeOrderlyStatus",
    "ConsumeStatus",
    "ConsumerProgress",
    "LitePullConsumer",
    "LocalTransactionState",
    "MessageModel",
    "MessageQueue",
    "Perm",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "QueueData",
    "QueueProgress",
    "SendResult",
    "SendStatus",
    "SyncAdmin",
    "SyncLitePullConsumer",
    "SyncProducer",
    "SyncPullConsumer",
    "SyncPushConsumer",
    "SyncTransactionProducer",
    "TopicOffset",
    "TopicRouteData",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
    "allocate_averagely",
    "allocate_averagely_by_circle",
    "create_reply_message",
    "select_by_hash",
    "select_queue",
    "split_batches",
]
