"""Producer: validates, prepares and sends messages (single, oneway, batch) with retries.

Queue choice is round-robin over the topic's publish queues. A failed attempt (connection error,
timeout, or SYSTEM_ERROR / SERVICE_NOT_AVAILABLE / TOPIC_NOT_EXIST / NO_PERMISSION) is retried
up to ``retry_times_when_send_failed`` times on the next queue, preferring another broker; other
error codes raise :class:`~tidemq.errors.BrokerError` at once. A send given an explicit queue or
a selector is attempted once: retrying elsewhere would break the ordering the caller asked for.
``timeout`` bounds the whole send, retries included (as RocketMQ's sendMsgTimeout does).
Topics without a route raise ClientError; this client does not auto-create topics via TBW102.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from tidemq.client.config import ClientConfig, make_config
from tidemq.client.instance import ClientInstance
from tidemq.client.response import broker_error
from tidemq.client.route import MessageQueue
from tidemq.client.send import (
    RETRYABLE_SEND_CODES,
    OutgoingMessage,
    SendResult,
    build_batch_request,
    build_send_request,
    parse_send_response,
    prepare_message,
)
from tidemq.client.validation import check_batch, check_group, check_message
from tidemq.errors import BrokerError, ClientError, RemotingError, RemotingTimeoutError, TideMQError
from tidemq.message import Message
from tidemq.remoting import RemotingCommand

log = logging.getLogger(__name__)

QueueSelector = Callable[[list[MessageQueue], Message, Any], MessageQueue]


def no_route_error(topic: str) -> ClientError:
    return ClientError(
        f"no route for topic {topic}: create it with `tidemq admin updateTopic -t {topic} "
        "-c DefaultCluster` (or Admin.create_topic) and check the name server address"
    )


class Producer:
    """An asyncio producer. Use ``async with Producer("group", "127.0.0.1:9876") as p:``."""

    def __init__(
        self,
        group: str,
        name_servers: str | Sequence[str] | None = None,
        config: ClientConfig | None = None,
    ) -> None:
        self.group = check_group(group)
        self.config = make_config(name_servers, config)
        self._instance: ClientInstance | None = None

    # lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._instance is not None:
            return
        inst = await ClientInstance.acquire(self.config)
        inst.add_producer(self.group)
        self._instance = inst
        inst.schedule_heartbeat()

    async def close(self) -> None:
        inst, self._instance = self._instance, None
        if inst is None:
            return
        try:
            await inst.remove_producer(self.group)
        finally:
            await inst.release()

    async def __aenter__(self) -> "Producer":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def client_id(self) -> str:
        return self._require().client_id

    def _require(self) -> ClientInstance:
        if self._instance is None:
            raise ClientError("producer is not started: call `await producer.start()` or use "
                              "`async with Producer(...)`")
        return self._instance

    # sending -----------------------------------------------------------------------------------
    async def send(
        self,
        msg: Message,
        queue: MessageQueue | None = None,
        selector: QueueSelector | None = None,
        arg: Any = None,
        timeout: float | None = None,
    ) -> SendResult:
        """Send one message and wait for the broker's answer."""
        inst = self._require()
        check_message(msg, self.config.max_message_size)
        fixed = await self._fixed_queue(msg, queue, selector, arg)
        out = self._prepare(inst, msg)

        def build(mq: MessageQueue) -> RemotingCommand:
            return build_send_request(self.group, out, mq.queue_id, inst.now_ms())

        return await self._send(inst, msg.topic, build, out.uniq_key, fixed, timeout)

    async def send_oneway(
        self,
        msg: Message,
        queue: MessageQueue | None = None,
        selector: QueueSelector | None = None,
        arg: Any = None,
    ) -> None:
        """Send without waiting for an answer (one attempt; no result, no broker errors)."""
        inst = self._require()
        check_message(msg, self.config.max_message_size)
        mq = await self._fixed_queue(msg, queue, selector, arg)
        if mq is None:
            await self._route_queues(inst, msg.topic)
            mq = inst.routes.select_queue(msg.topic)
            if mq is None:
                raise no_route_error(msg.topic)
        out = self._prepare(inst, msg)
        addr = await inst.master_addr(msg.topic, mq.broker_name)
        await inst.invoke_oneway(
            addr, build_send_request(self.group, out, mq.queue_id, inst.now_ms(), oneway=True)
        )

    async def send_batch(
        self, msgs: Sequence[Message], queue: MessageQueue | None = None,
        timeout: float | None = None,
    ) -> SendResult:
        """Send messages of one topic as one SEND_BATCH_MESSAGE; they land on one queue with
        consecutive offsets. ``msg_id``/``offset_msg_id`` of the result are comma-joined."""
        inst = self._require()
        msgs = list(msgs)
        topic = check_batch(msgs, self.config.max_message_size)
        if queue is not None and queue.topic != topic:
            raise ClientError(f"queue {queue} does not belong to topic {topic}")
        outs = [prepare_message(m, inst.next_uniq_id(), None) for m in msgs]
        size = sum(22 + len(o.body) + len(o.properties.encode()) for o in outs)
        if size > self.config.max_message_size:
            raise ClientError(
                f"batch is {size} bytes encoded, more than max_message_size "
                f"({self.config.max_message_size}); split it into smaller batches"
            )
        msg_id = ",".join(o.uniq_key for o in outs)

        def build(mq: MessageQueue) -> RemotingCommand:
            return build_batch_request(self.group, topic, outs, mq.queue_id, inst.now_ms())

        return await self._send(inst, topic, build, msg_id, queue, timeout)

    # internals ---------------------------------------------------------------------------------
    def _prepare(self, inst: ClientInstance, msg: Message) -> OutgoingMessage:
        return prepare_message(msg, inst.next_uniq_id(), self.config.compress_threshold,
                               self.config.compress_level)

    async def _route_queues(self, inst: ClientInstance, topic: str) -> list[MessageQueue]:
        route = await inst.get_route(topic)
        if route is None:
            raise no_route_error(topic)
        queues = inst.routes.publish_queues(topic)
        if not queues:
            raise ClientError(
                f"topic {topic} has no writable queue on a running master broker; check its perm "
                "and writeQueueNums with `tidemq admin topicRoute`"
            )
        return queues

    async def _fixed_queue(self, msg: Message, queue: MessageQueue | None,
                           selector: QueueSelector | None, arg: Any) -> MessageQueue | None:
        if queue is not None and selector is not None:
            raise ClientError("pass either queue or selector, not both")
        if queue is not None:
            if not isinstance(queue, MessageQueue) or queue.topic != msg.topic:
                raise ClientError(f"queue {queue} does not belong to topic {msg.topic}")
            return queue
        if selector is None:
            return None
        queues = await self._route_queues(self._require(), msg.topic)
        chosen = selector(queues, msg, arg)
        if not isinstance(chosen, MessageQueue) or chosen.topic != msg.topic:
            raise ClientError(f"selector returned {chosen!r}, not a MessageQueue of {msg.topic}")
        return chosen

    async def _send(
        self,
        inst: ClientInstance,
        topic: str,
        build: Callable[[MessageQueue], RemotingCommand],
        msg_id: str,
        fixed: MessageQueue | None,
        timeout: float | None,
    ) -> SendResult:
        loop = asyncio.get_running_loop()
        budget = timeout if timeout is not None else self.config.request_timeout
        deadline = loop.time() + budget
        if fixed is None:
            await self._route_queues(inst, topic)
        attempts = 1 if fixed is not None else 1 + self.config.retry_times_when_send_failed
        last_broker: str | None = None
        last_exc: TideMQError | None = None
        made = 0
        for _ in range(attempts):
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            mq = fixed or inst.routes.select_queue(topic, last_broker)
            if mq is None:
                raise no_route_error(topic)
            made += 1
            try:
                addr = await inst.master_addr(topic, mq.broker_name)
                resp = await inst.invoke(addr, build(mq), remaining)
            except (RemotingError, ClientError) as exc:
                last_exc, last_broker = exc, mq.broker_name
                log.info("send to %s failed (attempt %d/%d): %s", mq, made, attempts, exc)
                continue
            if resp.code in RETRYABLE_SEND_CODES:
                last_exc, last_broker = broker_error(resp, f"send to {mq}", addr), mq.broker_name
                log.info("send to %s failed (attempt %d/%d): %s", mq, made, attempts, last_exc)
                continue
            return parse_send_response(resp, topic, mq.broker_name, msg_id, addr)
        raise _final_error(topic, made, budget, last_exc)


def _final_error(topic: str, attempts: int, budget: float, last: TideMQError | None) -> TideMQError:
    if last is None:
        return RemotingTimeoutError(f"send to topic {topic} timed out after {budget:g} s")
    text = f"send to topic {topic} failed after {attempts} attempt(s): {last}"
    if isinstance(last, BrokerError):
        return BrokerError(text, last.code, last.remark)
    if isinstance(last, RemotingError):
        return type(last)(text, last.code)
    return ClientError(text)
