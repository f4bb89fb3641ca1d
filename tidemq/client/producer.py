"""Producer: the public front of sending (single, oneway, batch, async with callbacks,
request-reply). It validates and prepares each message (UNIQ_KEY, compression, properties) and
hands it on, as aiokafka's producer is a front over an accumulator and a sender:

- :class:`~tidemq.client.accumulator.SendAccumulator` merges the concurrent sends of one topic
  into SEND_BATCH_MESSAGEs (``ClientConfig.coalesce_sends``);
- :class:`~tidemq.client.sender.Sender` routes each request to a queue, retries it and reports
  faults (RocketMQ's latency fault avoidance; its docstring has the retry rules);
- transactions are :mod:`tidemq.client.transaction`'s, on top of this front.

A message with ``MSG_TYPE=reply`` (built by :func:`~tidemq.client.request_reply.create_reply_message`)
goes out as SEND_REPLY_MESSAGE_V2. Callback sends, requests and merge tasks run as tasks the
producer keeps; ``close()`` waits for them (bounded) before letting the client instance go.
The sender and the accumulator live from ``start()`` to ``close()`` (they hold the started
client instance); the fault strategy lives as long as the producer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from tidemq.client.accumulator import SendAccumulator, mergeable
from tidemq.client.base import ClientBase
from tidemq.client.batching import BATCH_LOG_OVERHEAD, split_batches
from tidemq.client.config import ClientConfig, make_config
from tidemq.client.fault import FaultStrategy
from tidemq.client.instance import ClientInstance
from tidemq.client.request_reply import (
    is_reply,
    new_correlation_id,
    reply_router,
    request_properties,
    timeout_error,
)
from tidemq.client.route import MessageQueue
from tidemq.client.selectors import QueueSelector
from tidemq.client.send import OutgoingMessage, SendResult, build_send_request, prepare_message
from tidemq.client.sender import Sender
from tidemq.client.tasks import finish_or_cancel, keep
from tidemq.client.validation import check_batch, check_group, check_message
from tidemq.errors import ClientError
from tidemq.message import Message, MessageExt
from tidemq.remoting import RemotingCommand, RequestCode

log = logging.getLogger(__name__)

T = TypeVar("T")
SuccessCallback = Callable[[Any], "Awaitable[object] | object"]
ExceptionCallback = Callable[[BaseException], "Awaitable[object] | object"]

DEFAULT_REQUEST_TIMEOUT = 3.0
MAX_PREPARED_TOPICS = 10_000


class Producer(ClientBase):
    """An asyncio producer. Use ``async with Producer("group", "127.0.0.1:9876") as p:``.

    ``send_latency_fault_enable`` turns RocketMQ's latency fault avoidance on (the default here;
    Java's default is off); ``clock`` (seconds, monotonic) drives it.
    """

    _not_started = ("producer is not started: call `await producer.start()` or use "
                    "`async with Producer(...)`")
    # Made by _attach, used only while _instance is set (see _started).
    _sender: Sender
    _accumulator: SendAccumulator

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
        self._closing = False
        self._in_flight = 0  # sends awaiting their answer (Producer.send: a lone one is not merged)

    # lifecycle ---------------------------------------------------------------------------------
    def _attach(self, inst: ClientInstance) -> None:
        self._sender = sender = Sender(inst, self.group, self.config, self.fault)
        self._accumulator = SendAccumulator(
            sender.send_merged, sender.send_one, max_size=self.config.max_message_size,
            default_timeout=self.config.request_timeout, tasks=self._tasks)
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
        self._accumulator.abandon()  # queued for a merge that will not run now
        self._closing = False
        await super().close()

    async def _detach(self, inst: ClientInstance) -> None:
        if self._requests:
            router = reply_router(inst)
            for cid in list(self._requests):
                router.fail(cid, ClientError(f"producer {self.group} was closed while the request "
                                             "waited for its reply"))
        await inst.remove_producer(self.group)

    def _started(self) -> Sender:
        if self._instance is None:
            raise ClientError(self._not_started)
        return self._sender

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
        send made while none of this producer's sends is in flight (it goes out at once), a send
        with a queue or selector, bodies over 64 KiB, compressed bodies, delay levels,
        transactional, reply and retry-topic messages, WAIT=false."""
        sender = self._started()
        props = check_message(msg, self.config.max_message_size)
        fixed = (await sender.fixed_queue(msg, queue, selector, arg)
                 if queue is not None or selector is not None else None)
        out = self._prepare(sender.inst, msg, props)
        # A send made while none of this producer's is in flight has nothing to be merged with
        # yet and goes out at once (as the transport writes a lone request at once): waiting for
        # the end of the loop iteration would cost it two iterations (bench/compare.py row 1).
        # Sends that join it in the same iteration are merged among themselves.
        merge = (self._in_flight and fixed is None and self.config.coalesce_sends
                 and mergeable(out, props))
        self._in_flight += 1
        try:
            if merge:
                merged = await self._accumulator.add(out, timeout)
                if merged is not None:
                    return merged
            reply = is_reply(msg)
            return await sender.send(msg.topic, sender.single(out, reply), out.uniq_key, fixed, timeout, reply)
        finally:
            self._in_flight -= 1

    def send_async(
        self,
        msg: Message,
        on_success: SuccessCallback | None = None,
        on_exception: ExceptionCallback | None = None,
        queue: MessageQueue | None = None,
        selector: QueueSelector | None = None,
        arg: Any = None,
        timeout: float | None = None,
    ) -> asyncio.Task[SendResult | None]:
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
        sender = self._started()
        inst = sender.inst
        check_message(msg, self.config.max_message_size)
        fixed = await sender.fixed_queue(msg, queue, selector, arg)

        def build(mq: MessageQueue) -> RemotingCommand:
            cmd = build_send_request(self.group, self._prepare(inst, msg), mq.queue_id, inst.now_ms(),
                                     oneway=True)
            if is_reply(msg):
                cmd.code = RequestCode.SEND_REPLY_MESSAGE_V2
            return cmd

        await sender.send_oneway(msg.topic, fixed, build)

    async def send_batch(
        self, msgs: Sequence[Message], queue: MessageQueue | None = None,
        timeout: float | None = None,
    ) -> SendResult:
        """Send messages of one topic as one SEND_BATCH_MESSAGE; they land on one queue with
        consecutive offsets. ``msg_id``/``offset_msg_id`` of the result are comma-joined.

        A batch larger than ``max_message_size`` (4 MiB; sizes as RocketMQ's ListSplitter counts
        them) raises ClientError: use :meth:`send_batches` or :func:`split_batches`.
        """
        sender = self._started()
        inst = sender.inst
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
        return await sender.send(topic, sender.batch(topic, outs), msg_id, queue, timeout)

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
        sender = self._started()
        inst = sender.inst
        check_message(msg, self.config.max_message_size)
        if not timeout > 0:
            raise ClientError(f"request timeout must be positive, got {timeout!r}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        await self._prepare_request(sender, msg.topic)
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
            except TimeoutError:
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
    ) -> asyncio.Task[MessageExt | None]:
        """:meth:`request` in a task: ``on_success(reply)`` or ``on_exception(error)`` (e.g.
        RequestTimeoutError) is called when it ends. The task yields the reply or None."""
        self._require()
        check_message(msg, self.config.max_message_size)
        return self._spawn(self.request(msg, timeout, queue, selector, arg), on_success,
                           on_exception, f"request to topic {msg.topic}")

    async def _prepare_request(self, sender: Sender, topic: str) -> None:
        """First request to a topic: learn its route and heartbeat to its brokers now, so that
        they know this client id before a reply for it arrives (Java's prepareSendRequest)."""
        if topic in self._request_topics:
            return
        await sender.queues(topic)
        await sender.inst.send_heartbeat()
        if len(self._request_topics) >= MAX_PREPARED_TOPICS:
            self._request_topics.clear()
        self._request_topics.add(topic)

    # internals ---------------------------------------------------------------------------------
    def _spawn(self, coro: Awaitable[T], on_success: SuccessCallback | None,
               on_exception: ExceptionCallback | None, what: str) -> asyncio.Task[T | None]:
        return keep(self._tasks, _with_callbacks(coro, on_success, on_exception, what))

    def _prepare(self, inst: ClientInstance, msg: Message,
                 props: dict[str, str] | None = None) -> OutgoingMessage:
        return prepare_message(msg, inst.next_uniq_id(), self.config.compress_threshold,
                               self.config.compress_level, props)


async def _with_callbacks(coro: Awaitable[T], on_success: SuccessCallback | None,
                          on_exception: ExceptionCallback | None, what: str) -> T | None:
    try:
        result = await coro
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 (an async send's failure goes to on_exception or the log)
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
