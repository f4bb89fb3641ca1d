"""Returning a message the listener failed on to the broker, so it is delivered again later
(``%RETRY%<group>`` after a delay) or parked in ``%DLQ%<group>``.

First CONSUMER_SEND_MSG_BACK to the broker that stored the message; if that fails, the message
itself is re-sent to ``%RETRY%<group>`` by an inner producer (group CLIENT_INNER_PRODUCER, started
on first need) with the retry bookkeeping (reconsume count + 1, RETRY_TOPIC, origin id, delay level
``3 + reconsumeTimes``). If both fail the caller keeps the message and consumes it again locally.
"""

from __future__ import annotations

import asyncio
import logging

from tidemq.client.config import ClientConfig
from tidemq.client.producer import Producer
from tidemq.client.push.broker_api import ConsumerBrokerApi
from tidemq.client.push.protocol import build_retry_message
from tidemq.client.route import MessageQueue
from tidemq.errors import TideMQError
from tidemq.message import MessageExt

log = logging.getLogger(__name__)

INNER_PRODUCER_GROUP = "CLIENT_INNER_PRODUCER"
DLQ_DELAY_LEVEL = -1


class SendBack:
    def __init__(self, api: ConsumerBrokerApi, config: ClientConfig, max_reconsume_times: int) -> None:
        self.api = api
        self.config = config
        self.max_reconsume_times = max_reconsume_times
        self._producer: Producer | None = None
        self._producer_lock = asyncio.Lock()
        self.sent_back = 0
        self.resent = 0

    async def send(self, mq: MessageQueue, msg: MessageExt, delay_level: int = 0) -> bool:
        """True once the broker holds the message for re-delivery (or the DLQ)."""
        try:
            await self.api.send_back(mq, msg, delay_level, self.max_reconsume_times)
            self.sent_back += 1
            return True
        except TideMQError as exc:
            log.info("send-back of message %s (group %s) failed, re-sending it to the retry topic: "
                     "%s", msg.msg_id, self.api.group, exc)
        try:
            producer = await self._inner_producer()
            await producer.send(build_retry_message(msg, self.api.group, self.max_reconsume_times))
            self.resent += 1
            return True
        except TideMQError as exc:
            log.warning("re-sending message %s to the retry topic of group %s failed: %s",
                        msg.msg_id, self.api.group, exc)
            return False

    async def _inner_producer(self) -> Producer:
        async with self._producer_lock:
            if self._producer is None:
                producer = Producer(INNER_PRODUCER_GROUP, config=self.config)
                await producer.start()
                self._producer = producer
            return self._producer

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.close()
