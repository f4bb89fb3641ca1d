"""Push consumption: PushConsumer (concurrent or orderly listeners), rebalancing, process
queues, offset stores, send-back. LitePullConsumer (tidemq.client.lite_pull) reuses the
rebalancer, pull loop, process queue and offset stores.

Modules: ``types`` (enums, listener type), ``settings``, ``protocol`` (pure wire builders),
``broker_api`` (requests over a ClientInstance), ``offset_store``, ``process_queue``,
``rebalance``, ``puller``, ``invoker``, ``send_back``, ``consume_service`` (what the next two
share), ``consume_concurrently``, ``consume_orderly``, ``push_consumer``, ``blocking``
(thread-friendly facade).
"""

from tidemq.client.push.push_consumer import PushConsumer
from tidemq.client.push.types import (
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    MessageListener,
    MessageModel,
    ProcessQueueStats,
)

__all__ = [
    "ConsumeConcurrentlyStatus",
    "ConsumeFromWhere",
    "ConsumeOrderlyStatus",
    "ConsumeStatus",
    "MessageListener",
    "MessageModel",
    "ProcessQueueStats",
    "PushConsumer",
]
