"""Producer: validates, prepares and sends messages (single, oneway, batch, async with callbacks,
request-reply) with retries and latency fault avoidance.

Queue choice is the producer's :class:`~tidemq.client.fault.FaultStrategy`: round-robin over the
topic's publish queues, skipping the broker that failed last and (``send_latency_fault_enable``,
default on) brokers made unavailable by slow or failed sends, as RocketMQ's MQFaultStrategy. A
failed attempt (connection error, timeout, or SYSTEM_ERROR / SERVICE_NOT_AVAILABLE /
TOPIC_NOT_EXIST / NO_PERMISSION) is retried up to ``retry_times_when_send_failed`` times on the
next queue, on another broker when there is one; other error codes raise
:class:`~tidemq.errors.BrokerError` at once. A send given an explicit queue or a selector is
attempted once: retrying elsewhere would break the ordering the caller asked for. ``timeout``
bounds the whole send, retries included (as RocketMQ's sendMsgTimeout does). Topics without a
route raise ClientError unless a broker offers auto-creation (TBW102, as RocketMQ's producers).

A message with ``MSG_TYPE=reply`` (built by :func:`~tidemq.client.request_reply.create_reply_message`)
goes out as SEND_REPLY_MESSAGE_V2. Callback sends and requests run as tasks the producer keeps;
``close()`` waits for them (bounded) before letting the client instance go.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from tidemq.client.base import ClientBase
from tidemq.client.batching import BATCH_LOG_OVERHEAD, split_batches
from tidemq.client.config import ClientConfig, make_config, namesrv_arg
from tidemq.client.fault import FaultStrategy, busy_backoff
from tidemq.client.instance import ClientInstance
from tidemq.client.request_reply import (
    REPLY_MESSAGE_FLAG,
    is_reply,
    new_correlation_id,
    reply_router,
    request_properties,
    timeout_error,
)
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
    prepare_message,
)
from tidemq.client.tasks import finish_or_cancel, keep
from tidemq.client.validation import (
    AUTO_CREATE_TOPIC,
    RETRY_GROUP_TOPIC_PREFIX,
    check_batch,
    check_group,
    check_message,
)
from tidemq.errors import BrokerError, ClientError, RemotingError, RemotingTimeoutError, TideMQError
from tidemq.message import Message, MessageExt, Prop
from tidemq.remoting import RemotingCommand, RequestCode, ResponseCode

log = logging.getLogger(__name__)

T = TypeVar("T")
SuccessCallback = Callable[[Any], "Awaitable[object] | object"]
ExceptionCallback = Callable[[BaseException], "Awaitable[object] | object"]

DEFAULT_REQUEST_TIMEOUT = 3.0
MAX_PREPARED_TOPICS = 10_000


# Sends merged into one SEND_BATCH_MESSAGE at most (and max_message_size bytes). More pending sends
# go out as several requests, so the broker stores one part while the client prepares the next:
# 256 coroutines sending 1 KiB on the 2-core VM (one run each): parts of 16 -> 55k msg/s, 32 -> 65-77k,
# 64 -> 43-54k, 256 -> 30k; unmerged 18-25k.
MAX_MERGED = 32
MAX_MERGED_BODY = 64 * 1024  # larger bodies are sent alone
# Properties that keep a message out of a batch: a delay level (brokers refuse any DELAY key in a
# batch element, even "0") or a delivery time (RocketMQ 5 timer keys), transactions, and
# request-reply, which keeps its own path.
_NOT_MERGED_KEYS = frozenset({Prop.DELAY, "TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TIMER_DELAY_MS",
                              "__STARTDELIVERTIME", Prop.TRAN_MSG, Prop.CORRELATION_ID})
_Pending = tuple[OutgoingMessage, "asyncio.Future[SendResult | None]", "float | None"]


def _mergeable(out: OutgoingMessage, props: dict[str, str]) -> bool:
    """Whether a send may join a SEND_BATCH_MESSAGE: a batch element has no sysFlag (so no
    compressed body or transaction flag), and brokers refuse delay levels and retry topics in
    batches; replies and WAIT=false keep their own request header. Large bodies gain nothing
    from merging and could push a batch past the broker's limit where the lone send would pass."""
    return (not out.sys_flag and len(out.body) <= MAX_MERGED_BODY
            and _NOT_MERGED_KEYS.isdisjoint(props)
            and props.get(Prop.WAIT, "true").lower() == "true" and props.get(Prop.MSG_TYPE) != REPLY_MESSAGE_FLAG
            and not out.topic.startswith(RETRY_GROUP_TOPIC_PREFIX))


def _abandon(entries: list[_Pending]) -> None:
    """Answer merged sends whose request was abandoned (the producer closed): an error that
    says the outcome is unknown, not a cancellation the caller never asked for."""
    for out, fut, _t in entries:
        if not fut.done():
            fut.set_exception(ClientError(
                f"send of message {out.uniq_key} to topic {out.topic} was abandoned when the producer "
                "closed before the broker answered; it may or may not have been stored"))


def no_route_error(topic: str, name_servers: Sequence[str]) -> ClientError:
    return ClientError(
        f"no route for topic {topic}: create it with `tidemq admin updateTopic "
        f"-n {namesrv_arg(name_servers)} -c DefaultCluster -t {topic}` (or Admin.create_topic) and "
        "check the name server address"
    )


class Producer(ClientBase):
    """An asyncio producer. Use ``async with Producer("group", "127.0.0.1:9876") as p:``.

    ``send_latency_fault_enable`` turns RocketMQ's latency fault avoidance on (the default here;
    Java's default is off); ``clock`` (seconds, monotonic) drives it.
    """

    _not_started = ("producer is not started: call `await producer.start()` or use "
                    "`async with Producer(...)`")

    def __init__(
        self,
        group: str,
        name_servers: str | Sequence[str] | None = None,
        config: ClientConfig | None = None,
        *,
        send_latency_fault_enable: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.group = check_group(group)
        self.config = make_config(name_servers, config)
        self.fault = FaultStrategy(send_latency_fault_enable, clock)
        self._tasks: set[asyncio.Task] = set()
        self._requests: set[str] = set()
        self._request_topics: set[str] = set()
        # (topic, timeout) -> sends to merge in this loop iteration
        self._pending: dict[tuple[str, float], list[_Pending]] = {}
        self._closing = False

    # lifecycle ---------------------------------------------------------------------------------
    def _attach(self, inst: ClientInstance) -> None:
        inst.add_producer(self.group)
        inst.schedule_heartbeat()

    async def close(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` (default: the request timeout) for callback sends and requests
        in flight, cancel what is left, then unregister and release the client instance."""
        if self._instance is None or self._closing:
            return
        self._closing = True
        pending = [t for t in self._tasks if t is not asyncio.current_task()]
        wait = self.config.request_timeout if timeout is None else timeout
        late = await finish_or_cancel(pending, wait)
        if late:
            log.warning("producer %s closed with %d callback send(s)/request(s) unfinished",
                        self.group, late)
        for entries in self._pending.values():  # queued for a merge that will not run now
            _abandon(entries)
        self._pending.clear()
        self._closing = False
        await super().close()

    async def _detach(self, inst: ClientInstance) -> None:
        if self._requests:
            router = reply_router(inst)
            for cid in list(self._requests):
                router.fail(cid, ClientError(f"producer {self.group} was closed while the request "
                                             "waited for its reply"))
        await inst.remove_producer(self.group)

    @property
    def client_id(self) -> str:
        return self._require().client_id

    # sending -----------------------------------------------------------------------------------
    async def send(
        self,
        msg: Message,
        queue: MessageQueue | None = None,
        selector: QueueSelector | None = None,
        arg: Any = None,
        timeout: float | None = None,
    ) -> SendResult:
        """Send one message and wait for the broker's answer.

        Sends of one topic made in the same loop iteration (many in flight) are merged into
        SEND_BATCH_MESSAGEs (``ClientConfig.coalesce_sends``, on by default): each caller gets its
        own SendResult, the merged messages land on one queue with consecutive offsets, and a
        failure fails each of them, except a refusal for one message's sake (MESSAGE_ILLEGAL: stored
        none), after which each is resent alone so only the culprit's caller fails. Never merged: a
        lone send, a send with a queue or selector, bodies over 64 KiB, compressed bodies, delay
        levels, transactional, reply and retry-topic messages, WAIT=false."""
        inst = self._require()
        props = check_message(msg, self.config.max_message_size)
        fixed = (await self._fixed_queue(msg, queue, selector, arg)
                 if queue is not None or selector is not None else None)
        out = self._prepare(inst, msg)
        if fixed is None and self.config.coalesce_sends and _mergeable(out, props):
            merged = await self._coalesce(inst, out, timeout)
            if merged is not None:
                return merged
        reply = is_reply(msg)
        return await self._send(inst, msg.topic, self._single(inst, out, reply), out.uniq_key, fixed, timeout,
                                reply)

    def _single(self, inst: ClientInstance, out: OutgoingMessage,
                reply: bool = False) -> Callable[[MessageQueue], RemotingCommand]:
        """The request builder of one message (SEND_MESSAGE_V2, or SEND_REPLY_MESSAGE_V2 for a reply)."""
        def build(mq: MessageQueue) -> RemotingCommand:
            cmd = build_send_request(self.group, out, mq.queue_id, inst.now_ms())
            if reply:
                cmd.code = RequestCode.SEND_REPLY_MESSAGE_V2
            return cmd

        return build

    def send_async(
        self,
        msg: Message,
        on_success: SuccessCallback | None = None,
        on_exception: ExceptionCallback | None = None,
        queue: MessageQueue | None = None,
        selector: QueueSelector | None = None,
        arg: Any = None,
        timeout: float | None = None,
    ) -> "asyncio.Task[SendResult | None]":
        """Start sending ``msg`` and return at once; ``on_success(SendResult)`` or
        ``on_exception(error)`` is called (awaited if it returns an awaitable) when done.

        The returned task yields the SendResult, or None after a failure (which goes to
        ``on_exception``, or to the log without one). Misuse (not started, invalid message)
        raises here, before anything is scheduled.
        """
        self._require()
        check_message(msg, self.config.max_message_size)
        return self._spawn(self.send(msg, queue, selector, arg, timeout), on_success, on_exception,
                           f"send to topic {msg.topic}")

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
            mq = self.fault.select(msg.topic, await self._route_queues(inst, msg.topic))
            if mq is None:
                raise no_route_error(msg.topic, self.config.name_servers)
        out = self._prepare(inst, msg)
        addr = await inst.master_addr(msg.topic, mq.broker_name)
        cmd = build_send_request(self.group, out, mq.queue_id, inst.now_ms(), oneway=True)
        if is_reply(msg):
            cmd.code = RequestCode.SEND_REPLY_MESSAGE_V2
        await inst.invoke_oneway(addr, cmd)

    async def send_batch(
        self, msgs: Sequence[Message], queue: MessageQueue | None = None,
        timeout: float | None = None,
    ) -> SendResult:
        """Send messages of one topic as one SEND_BATCH_MESSAGE; they land on one queue with
        consecutive offsets. ``msg_id``/``offset_msg_id`` of the result are comma-joined.

        A batch larger than ``max_message_size`` (4 MiB; sizes as RocketMQ's ListSplitter counts
        them) raises ClientError: use :meth:`send_batches` or :func:`split_batches`.
        """
        inst = self._require()
        msgs = list(msgs)
        topic = check_batch(msgs, self.config.max_message_size)
        if queue is not None and queue.topic != topic:
            raise ClientError(f"queue {queue} does not belong to topic {topic}")
        outs = [prepare_message(m, inst.next_uniq_id(), None) for m in msgs]
        per_message = len(topic.encode()) + BATCH_LOG_OVERHEAD  # hot path: bench/produce_consume.py batch
        size = sum(per_message + len(o.body)
                   + (len(o.properties) if o.properties.isascii() else len(o.properties.encode()))
                   for o in outs)
        if size > self.config.max_message_size:
            raise ClientError(
                f"batch of {len(msgs)} messages is {size} bytes, more than max_message_size "
                f"({self.config.max_message_size}); send it with send_batches(), which splits it, "
                "or split it with split_batches()"
            )
        msg_id = ",".join(o.uniq_key for o in outs)

        def build(mq: MessageQueue) -> RemotingCommand:
            return build_batch_request(self.group, topic, outs, mq.queue_id, inst.now_ms())

        return await self._send(inst, topic, build, msg_id, queue, timeout)

    async def send_batches(
        self, msgs: Sequence[Message], queue: MessageQueue | None = None,
        timeout: float | None = None,
    ) -> list[SendResult]:
        """Split ``msgs`` to the size limit (:func:`split_batches`) and send each part in order
        with :meth:`send_batch`; ``timeout`` applies to each part."""
        msgs = list(msgs)
        check_batch(msgs, self.config.max_message_size)
        return [await self.send_batch(part, queue, timeout)
                for part in split_batches(msgs, self.config.max_message_size)]

    # request-reply -----------------------------------------------------------------------------
    async def request(
        self,
        msg: Message,
        timeout: float = DEFAULT_REQUEST_TIMEOUT,
        queue: MessageQueue | None = None,
        selector: QueueSelector | None = None,
        arg: Any = None,
    ) -> MessageExt:
        """Send ``msg`` as a request and wait for its reply (RocketMQ's request-reply).

        ``timeout`` bounds the send and the wait together; without a reply in time
        :class:`~tidemq.errors.RequestTimeoutError` is raised. Send failures raise as for
        :meth:`send`. ``msg`` itself is not modified.
        """
        inst = self._require()
        check_message(msg, self.config.max_message_size)
        if not timeout > 0:
            raise ClientError(f"request timeout must be positive, got {timeout!r}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        await self._prepare_request(inst, msg.topic)
        cid = new_correlation_id()
        props = {**msg.properties, **request_properties(inst.client_id, int(timeout * 1000), cid)}
        request = dataclasses.replace(msg, properties=props)
        router = reply_router(inst)
        waiter = router.register(cid, msg.topic, timeout)
        self._requests.add(cid)
        try:
            await self.send(request, queue, selector, arg, max(deadline - loop.time(), 0.001))
            try:
                return await asyncio.wait_for(waiter, max(deadline - loop.time(), 0))
            except asyncio.TimeoutError:
                raise timeout_error(msg.topic, timeout, cid) from None
        finally:
            router.discard(cid)
            self._requests.discard(cid)
            if not waiter.done():
                waiter.cancel()

    def request_with_callback(
        self,
        msg: Message,
        on_success: SuccessCallback | None = None,
        on_exception: ExceptionCallback | None = None,
        timeout: float = DEFAULT_REQUEST_TIMEOUT,
        queue: MessageQueue | None = None,
        selector: QueueSelector | None = None,
        arg: Any = None,
    ) -> "asyncio.Task[MessageExt | None]":
        """:meth:`request` in a task: ``on_success(reply)`` or ``on_exception(error)`` (e.g.
        RequestTimeoutError) is called when it ends. The task yields the reply or None."""
        self._require()
        check_message(msg, self.config.max_message_size)
        return self._spawn(self.request(msg, timeout, queue, selector, arg), on_success,
                           on_exception, f"request to topic {msg.topic}")

    async def _prepare_request(self, inst: ClientInstance, topic: str) -> None:
        """First request to a topic: learn its route and heartbeat to its brokers now, so that
        they know this client id before a reply for it arrives (Java's prepareSendRequest)."""
        if topic in self._request_topics:
            return
        await self._route_queues(inst, topic)
        await inst.send_heartbeat()
        if len(self._request_topics) >= MAX_PREPARED_TOPICS:
            self._request_topics.clear()
        self._request_topics.add(topic)

    # coalescing concurrent sends ---------------------------------------------------------------
    def _coalesce(self, inst: ClientInstance, out: OutgoingMessage,
                  timeout: float | None) -> "asyncio.Future[SendResult | None]":
        """Queue ``out`` for this loop iteration's merge; the future yields its SendResult, or None
        when it was alone (the caller sends it as usual)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[SendResult | None] = loop.create_future()
        # Only sends with the same time budget are merged: one caller's short timeout must not
        # become its neighbours'.
        key = (out.topic, self.config.request_timeout if timeout is None else timeout)
        pending = self._pending.get(key)
        if pending is None:
            self._pending[key] = pending = []
            loop.call_soon(self._flush_merged, inst, key)
        pending.append((out, fut, timeout))
        return fut

    def _flush_merged(self, inst: ClientInstance, key: tuple[str, float]) -> None:
        entries = [e for e in self._pending.pop(key, ()) if not e[1].done()]  # cancelled callers drop out
        if len(entries) == 1:
            entries[0][1].set_result(None)
        elif entries:
            task = keep(self._tasks, self._send_merged(inst, key[0], entries))
            task.add_done_callback(lambda _t: _abandon(entries))  # e.g. cancelled by close() before it ran

    async def _send_merged(self, inst: ClientInstance, topic: str, entries: list[_Pending]) -> None:
        per_message = len(topic.encode()) + BATCH_LOG_OVERHEAD
        parts: list[list[_Pending]] = []
        size = self.config.max_message_size
        for e in entries:
            n = per_message + len(e[0].body) + len(e[0].properties.encode())
            if size + n > self.config.max_message_size or len(parts[-1]) >= MAX_MERGED:
                parts.append([])
                size = 0
            parts[-1].append(e)
            size += n
        await asyncio.gather(*(self._send_part(inst, topic, part) for part in parts))

    async def _send_part(self, inst: ClientInstance, topic: str, part: list[_Pending]) -> None:
        outs = [e[0] for e in part]
        timeouts = [self.config.request_timeout if e[2] is None else e[2] for e in part]

        def build(mq: MessageQueue) -> RemotingCommand:
            return build_batch_request(self.group, topic, outs, mq.queue_id, inst.now_ms())

        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(timeouts)
        try:
            res = await self._send(inst, topic, build, "", None, min(timeouts))
        except Exception as exc:  # every merged send fails with it (cancellation: _cancel_unanswered)
            if (len(part) > 1 and isinstance(exc, BrokerError) and exc.code == ResponseCode.MESSAGE_ILLEGAL
                    and deadline - loop.time() > 0):
                # Refused whole before anything was stored, for one element's sake (e.g. a broker whose
                # body limit is below ours): each goes alone, so only the culprit's caller fails.
                await asyncio.gather(*(self._send_alone(inst, topic, e, deadline) for e in part))
                return
            for _out, fut, _t in part:
                if not fut.done():
                    fut.set_exception(exc)
            return
        ids = res.offset_msg_id.split(",")
        if len(ids) != len(outs):  # a broker that answers a batch with one id: all share it
            log.warning("broker answered a batch of %d with %d message ids", len(outs), len(ids))
            ids = [res.offset_msg_id] * len(outs)
        for i, (o, fut, _t) in enumerate(part):
            if not fut.done():
                fut.set_result(SendResult(res.status, o.uniq_key, ids[i], res.message_queue, res.queue_offset + i))

    async def _send_alone(self, inst: ClientInstance, topic: str, entry: _Pending, deadline: float) -> None:
        out, fut, _t = entry
        if fut.done():
            return
        try:
            remaining = max(0.001, deadline - asyncio.get_running_loop().time())
            res = await self._send(inst, topic, self._single(inst, out), out.uniq_key, None, remaining)
        except Exception as exc:
            if not fut.done():
                fut.set_exception(exc)
        else:
            if not fut.done():
                fut.set_result(res)

    # internals ---------------------------------------------------------------------------------
    def _spawn(self, coro: Awaitable[T], on_success: SuccessCallback | None,
               on_exception: ExceptionCallback | None, what: str) -> "asyncio.Task[T | None]":
        return keep(self._tasks, _with_callbacks(coro, on_success, on_exception, what))

    def _prepare(self, inst: ClientInstance, msg: Message) -> OutgoingMessage:
        return prepare_message(msg, inst.next_uniq_id(), self.config.compress_threshold,
                               self.config.compress_level)

    async def _route_queues(self, inst: ClientInstance, topic: str) -> list[MessageQueue]:
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
        reply: bool = False,
    ) -> SendResult:
        loop = asyncio.get_running_loop()
        budget = timeout if timeout is not None else self.config.request_timeout
        deadline = loop.time() + budget
        queues: list[MessageQueue] | None = None
        if fixed is None:
            # hot path (bench/produce_consume.py): a cached route needs no coroutine
            if inst.routes.get(topic) is not None:
                queues = inst.routes.publish_queues(topic)
            if not queues:
                queues = await self._route_queues(inst, topic)
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


async def _with_callbacks(coro: Awaitable[T], on_success: SuccessCallback | None,
                          on_exception: ExceptionCallback | None, what: str) -> T | None:
    try:
        result = await coro
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        if on_exception is None:
            log.warning("%s failed and no on_exception callback was given: %s", what, exc)
        else:
            await _call(on_exception, exc, what)
        return None
    if on_success is not None:
        await _call(on_success, result, what)
    return result


async def _call(callback: Callable[[Any], Any], value: Any, what: str) -> None:
    try:
        outcome = callback(value)
        if inspect.isawaitable(outcome):
            await outcome
    except Exception:
        log.exception("callback %r of %s raised", callback, what)


def _final_error(topic: str, attempts: int, budget: float, last: TideMQError | None) -> TideMQError:
    if last is None:
        return RemotingTimeoutError(f"send to topic {topic} timed out after {budget:g} s")
    text = f"send to topic {topic} failed after {attempts} attempt(s): {last}"
    if isinstance(last, BrokerError):
        return BrokerError(text, last.code, last.remark)
    if isinstance(last, RemotingError):
        return type(last)(text, last.code)
    return ClientError(text)
