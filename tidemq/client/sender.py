"""The producer's sender: routes a prepared request to a queue, sends it with retries and reports
every attempt to the latency fault strategy (aiokafka's ``producer/sender.py`` role).

Queue choice is the producer's :class:`~tidemq.client.fault.FaultStrategy`: round-robin over the
topic's publish queues, skipping the broker that failed last and (``send_latency_fault_enable``,
default on) brokers made unavailable by slow or failed sends, as RocketMQ's MQFaultStrategy. A
failed attempt (connection error, timeout, or SYSTEM_ERROR / SERVICE_NOT_AVAILABLE /
TOPIC_NOT_EXIST / NO_PERMISSION) is retried up to ``retry_times_when_send_failed`` times on the
next queue, on another broker when there is one; other error codes raise
:class:`~tidemq.errors.BrokerError` at once; SYSTEM_BUSY (flow control, nothing stored) is retried
after a back-off without using up the retry budget. A send given a fixed queue (an explicit queue
or a selector's choice) is attempted once and reports no fault: retrying elsewhere would break the
ordering the caller asked for. ``timeout`` bounds the whole send, retries included (as RocketMQ's
sendMsgTimeout does). Topics without a route raise ClientError unless a broker offers
auto-creation (TBW102, as RocketMQ's producers).

What is sent is a *request builder*: a function of the chosen queue that returns the request, so
a retry on another queue resends the same prepared message (same UNIQ_KEY, same bytes) with only
the queue id changed. A Sender lives from a producer's start to its close (it holds the started
client instance); it keeps no state of its own beyond the fault strategy it is given.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

from tidemq.client.config import ClientConfig, namesrv_arg
from tidemq.client.fault import FaultStrategy, busy_backoff
from tidemq.client.instance import ClientInstance
from tidemq.client.response import broker_error
from tidemq.client.route import MessageQueue, Perm, TopicRouteData
from tidemq.client.selectors import QueueSelector
from tidemq.client.send import (
    DEFAULT_TOPIC_QUEUE_NUMS,
    RETRYABLE_SEND_CODES,
    OutgoingMessage,
    SendResult,
    build_batch_request,
    build_send_request,
    parse_send_response,
)
from tidemq.client.validation import AUTO_CREATE_TOPIC
from tidemq.errors import (
    BrokerError,
    ClientError,
    RemotingError,
    RemotingTimeoutError,
    TideMQError,
)
from tidemq.message import Message
from tidemq.remoting import RemotingCommand, RequestCode, ResponseCode

log = logging.getLogger(__name__)

RequestBuilder = Callable[[MessageQueue], RemotingCommand]


def no_route_error(topic: str, name_servers: Sequence[str]) -> ClientError:
    return ClientError(
        f"no route for topic {topic}: create it with `tidemq admin updateTopic "
        f"-n {namesrv_arg(name_servers)} -c DefaultCluster -t {topic}` (or Admin.create_topic) and "
        "check the name server address"
    )


class Sender:
    """Routes, sends and retries the requests of one producer group over a started instance."""

    def __init__(self, inst: ClientInstance, group: str, config: ClientConfig,
                 fault: FaultStrategy) -> None:
        self.inst = inst
        self.group = group
        self.config = config
        self.fault = fault

    # request builders --------------------------------------------------------------------------
    def single(self, out: OutgoingMessage, reply: bool = False) -> RequestBuilder:
        """The request builder of one message (SEND_MESSAGE_V2, or SEND_REPLY_MESSAGE_V2 for a reply)."""
        inst, group = self.inst, self.group

        def build(mq: MessageQueue) -> RemotingCommand:
            cmd = build_send_request(group, out, mq.queue_id, inst.now_ms())
            if reply:
                cmd.code = RequestCode.SEND_REPLY_MESSAGE_V2
            return cmd

        return build

    def batch(self, topic: str, outs: list[OutgoingMessage]) -> RequestBuilder:
        """The request builder of messages of one topic as one SEND_BATCH_MESSAGE."""
        inst, group = self.inst, self.group

        def build(mq: MessageQueue) -> RemotingCommand:
            return build_batch_request(group, topic, outs, mq.queue_id, inst.now_ms())

        return build

    # routing -----------------------------------------------------------------------------------
    async def queues(self, topic: str) -> list[MessageQueue]:
        """The topic's publish queues, learning its route first (or borrowing TBW102's) when needed."""
        inst = self.inst
        route = await inst.get_route(topic)
        if route is None:
            route = await _auto_create_route(inst, topic)
        if route is None:
            raise no_route_error(topic, self.config.name_servers)
        queues = inst.routes.publish_queues(topic)
        if not queues:
            raise ClientError(
                f"topic {topic} has no writable queue on a running master broker; check its perm "
                "and writeQueueNums with `tidemq admin topicRoute`"
            )
        return queues

    async def fixed_queue(self, msg: Message, queue: MessageQueue | None,
                          selector: QueueSelector | None, arg: Any) -> MessageQueue | None:
        """The queue the caller fixed (``queue``, or ``selector``'s choice), checked to belong to
        the message's topic; None when the caller left the choice to the fault strategy."""
        if queue is not None and selector is not None:
            raise ClientError("pass either queue or selector, not both")
        if queue is not None:
            if not isinstance(queue, MessageQueue) or queue.topic != msg.topic:
                raise ClientError(f"queue {queue} does not belong to topic {msg.topic}")
            return queue
        if selector is None:
            return None
        queues = await self.queues(msg.topic)
        chosen = selector(queues, msg, arg)
        if not isinstance(chosen, MessageQueue) or chosen.topic != msg.topic:
            raise ClientError(f"selector returned {chosen!r}, not a MessageQueue of {msg.topic}")
        return chosen

    # sending -----------------------------------------------------------------------------------
    async def send_oneway(self, topic: str, fixed: MessageQueue | None, build: RequestBuilder) -> None:
        """One attempt, no answer awaited (so no result, no broker error and no fault report)."""
        mq = fixed
        if mq is None:
            mq = self.fault.select(topic, await self.queues(topic))
            if mq is None:
                raise no_route_error(topic, self.config.name_servers)
        addr = await self.inst.master_addr(topic, mq.broker_name)
        await self.inst.invoke_oneway(addr, build(mq))

    async def send_merged(self, topic: str, outs: list[OutgoingMessage], timeout: float) -> SendResult:
        """Send ``outs`` as one SEND_BATCH_MESSAGE on a queue the fault strategy picks; the
        result's ``msg_id`` is empty (each merged caller has its own UNIQ_KEY)."""
        return await self.send(topic, self.batch(topic, outs), "", None, timeout)

    async def send_one(self, out: OutgoingMessage, timeout: float) -> SendResult:
        """Send one prepared message on a queue the fault strategy picks."""
        return await self.send(out.topic, self.single(out), out.uniq_key, None, timeout)

    async def send(
        self,
        topic: str,
        build: RequestBuilder,
        msg_id: str,
        fixed: MessageQueue | None,
        timeout: float | None,
        reply: bool = False,
    ) -> SendResult:
        """Send what ``build`` makes, retrying as the module docstring says; ``reply`` marks a
        SEND_REPLY_MESSAGE_V2, whose refusal (requester gone) is no fault of the broker."""
        inst = self.inst
        loop = asyncio.get_running_loop()
        budget = timeout if timeout is not None else self.config.request_timeout
        deadline = loop.time() + budget
        queues: list[MessageQueue] | None = None
        if fixed is None:
            # hot path (bench/produce_consume.py): a cached route needs no coroutine
            if inst.routes.get(topic) is not None:
                queues = inst.routes.publish_queues(topic)
            if not queues:
                queues = await self.queues(topic)
        attempts = 1 if fixed is not None else 1 + self.config.retry_times_when_send_failed
        fault = self.fault
        last_broker: str | None = None
        last_exc: TideMQError | None = None
        made = busy = 0
        while made - busy < attempts:  # SYSTEM_BUSY answers do not use up the retry budget
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            if fixed is None and made:  # a retry: the route may have changed meanwhile
                queues = inst.routes.publish_queues(topic)
            mq = fixed or fault.select(topic, queues, last_broker)  # type: ignore[arg-type]
            if mq is None:
                raise no_route_error(topic, self.config.name_servers)
            made += 1
            started = fault.now()
            try:
                # hot path (bench/produce_consume.py): a cached master address needs no coroutine
                addr = (inst.routes.master_addr(mq.broker_name)
                        or await inst.master_addr(topic, mq.broker_name))
                resp = await inst.invoke(addr, build(mq), remaining)
            except (RemotingError, ClientError) as exc:
                last_exc, last_broker = exc, mq.broker_name
                if fixed is None:
                    fault.report(mq.broker_name, (fault.now() - started) * 1000, isolation=True)
                log.info("send to %s failed (attempt %d/%d): %s", mq, made, attempts, exc)
                continue
            latency_ms = (fault.now() - started) * 1000
            if resp.code == ResponseCode.SYSTEM_BUSY:  # flow control: not stored, back off and retry
                busy += 1
                last_exc, last_broker = broker_error(resp, f"send to {mq}", addr), mq.broker_name
                await asyncio.sleep(min(busy_backoff(busy), max(0.0, deadline - loop.time())))
                continue
            if resp.code in RETRYABLE_SEND_CODES:
                last_exc, last_broker = broker_error(resp, f"send to {mq}", addr), mq.broker_name
                if fixed is None:
                    # A reply refused because its requester is gone is no fault of the broker.
                    fault.report(mq.broker_name, latency_ms, isolation=not reply)
                log.info("send to %s failed (attempt %d/%d): %s", mq, made, attempts, last_exc)
                continue
            if fixed is None:
                fault.report(mq.broker_name, latency_ms)
            return parse_send_response(resp, topic, mq.broker_name, msg_id, addr, mq)
        raise _final_error(topic, made, budget, last_exc)


async def _auto_create_route(inst: ClientInstance, topic: str) -> TopicRouteData | None:
    """RocketMQ's producers send to a topic the name servers do not know along the route of
    TBW102, which only brokers with autoCreateTopicEnable register; such a broker creates the topic
    on the first send (with at most DEFAULT_TOPIC_QUEUE_NUMS queues, as the request says) and
    registers it, and the next route refresh replaces this borrowed route by the topic's own. None
    when no broker offers auto-creation (the caller then says to create the topic)."""
    if topic == AUTO_CREATE_TOPIC:
        return None
    default = await inst.get_route(AUTO_CREATE_TOPIC)
    if default is None:
        return None
    n = DEFAULT_TOPIC_QUEUE_NUMS
    queue_datas = tuple(
        dataclasses.replace(q, read_queue_nums=min(n, q.read_queue_nums), write_queue_nums=min(n, q.write_queue_nums))
        for q in default.queue_datas if q.perm & Perm.WRITE
    )
    if not queue_datas:
        return None
    route = TopicRouteData(queue_datas, default.broker_datas)
    inst.routes.update(topic, route)
    log.info("topic %s is not known to the name servers: sending along the route of %s (brokers that "
             "create topics on first send)", topic, AUTO_CREATE_TOPIC)
    return route


def _final_error(topic: str, attempts: int, budget: float, last: TideMQError | None) -> TideMQError:
    if last is None:
        return RemotingTimeoutError(f"send to topic {topic} timed out after {budget:g} s")
    text = f"send to topic {topic} failed after {attempts} attempt(s): {last}"
    if isinstance(last, BrokerError):
        return BrokerError(text, last.code, last.remark)
    if isinstance(last, RemotingError):
        return type(last)(text, last.code)
    return ClientError(text)
