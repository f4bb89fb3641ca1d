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
or a selector's choice) never moves to another queue and reports no fault: that would break the
ordering the caller asked for; it is retried only after a route fault (below), on the same queue
id of the same broker group. ``timeout`` bounds the whole send, retries included (as RocketMQ's
sendMsgTimeout does). Topics without a route raise ClientError unless a broker offers
auto-creation (TBW102, as RocketMQ's producers).

Following a failover (issue 17): a connection error, a timeout, or an answer of
:data:`~tidemq.client.send.ROUTE_FAULT_CODES` (the broker may no longer be its group's master)
re-reads the topic's route at once through the instance's bounded
:class:`~tidemq.client.route_refresh.FaultRefresher`. The retry waits for that refresh only when
no other broker serves the topic (else it goes elsewhere at once, as before); when the route then
names a new master for the failed group, that group's fault record (the old master's) is
forgotten and the retry may go to it. When that group is the only one serving the topic, a retry
after a connection error or a not-master answer waits until the route names another master, or
for ``fault_route_refresh_interval`` and one more refresh; an attempt that finds no master in the
route sends nothing and does not use up the retry budget; and a route whose writable queues all
belong to groups without a master (an election) is re-read until one has a master: a send during
a failover waits for the new master within its timeout instead of failing. SLAVE_NOT_AVAILABLE /
FLUSH_SLAVE_TIMEOUT (stored, not replicated) are sent again while retries last and the last such
result is returned when none does better. Where RocketMQ differs: DefaultMQProducerImpl.sendDefaultImpl retries on another
broker and updates fault items but learns a new master only from the 30 s
updateTopicRouteInfoFromNameServer poll (or when the route has no address at all), and returns a
not-stored-OK result at once unless retryAnotherBrokerWhenNotStoreOK is set.

A fixed-queue send after a route fault (connection error, timeout, no master address,
SERVICE_NOT_AVAILABLE, NO_PERMISSION) waits for the bounded refresh and retries the same queue id
on the group's new master once the route names one (the queue id is the same there: it is the
same broker group); while the route still names the failed address, the retry goes there again
no sooner than ``fault_route_refresh_interval`` after the fault and after one more refresh (a
broker restarted in place), within the same retry budget and timeout. While the route names no
master at all (an election), nothing is sent and the send keeps waiting, up to its timeout,
without using up its retry budget. A selector chooses among
:meth:`~tidemq.client.route.TopicRouteData.ordered_queues`, where a group without a master keeps
its queues, so a key does not move to another group's queue during an election. A not-replicated answer
to a fixed-queue send is returned, not sent again (a second copy would land behind later
messages of the queue). RocketMQ's sendSelectImpl tries such a send once.

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
from tidemq.client.route_refresh import QUICK_LOOK
from tidemq.client.instance import ClientInstance
from tidemq.client.response import broker_error
from tidemq.client.route import MessageQueue, Perm, TopicRouteData
from tidemq.client.selectors import QueueSelector
from tidemq.client.send import (
    DEFAULT_TOPIC_QUEUE_NUMS,
    NOT_STORE_OK_CODES,
    RETRYABLE_SEND_CODES,
    ROUTE_FAULT_CODES,
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
from tidemq.message import NAME_VALUE_SEP, Message, Prop
from tidemq.remoting import RemotingCommand, RequestCode, ResponseCode

log = logging.getLogger(__name__)

# A half message's encoded properties hold this (tidemq.client.transaction sets TRAN_MSG=true).
_HALF_MARK = f"{Prop.TRAN_MSG}{NAME_VALUE_SEP}true"

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
    async def queues(self, topic: str, deadline: float | None = None) -> list[MessageQueue]:
        """The topic's publish queues, learning its route first (or borrowing TBW102's) when needed.
        While the route has writable queues only on groups without a master (an election), the
        route is re-read (the bounded fault refresh) until one names a master, up to ``deadline``
        (default: ``request_timeout`` from now)."""
        await self._route(topic)
        inst = self.inst
        queues = inst.routes.publish_queues(topic)
        if queues:
            return queues
        if deadline is None:
            deadline = asyncio.get_running_loop().time() + self.config.request_timeout

        def settled() -> bool:  # a group has a master, or no group with writable queues lacks one
            route = inst.routes.get(topic)
            return bool(inst.routes.publish_queues(topic)) or route is None or not route.ordered_queues(topic)

        # No group has a master in the cached route: re-read it until one does.
        await self._refresh_until(topic, inst.refresh_route_after_fault(topic), settled, deadline, deadline)
        return self._some(inst.routes.publish_queues(topic), topic)

    async def _route(self, topic: str) -> TopicRouteData:
        inst = self.inst
        route = await inst.get_route(topic)
        if route is None:
            route = await _auto_create_route(inst, topic)
        if route is None:
            raise no_route_error(topic, self.config.name_servers)
        return route

    @staticmethod
    def _some(queues: list[MessageQueue], topic: str) -> list[MessageQueue]:
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
        # A group without a master keeps its queues here (TopicRouteData.ordered_queues): the
        # key keeps its queue and the send waits for the group's new master.
        queues = self._some((await self._route(msg.topic)).ordered_queues(msg.topic), msg.topic)
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
        try:
            await self.inst.invoke_oneway(addr, build(mq))
        except RemotingError:
            self.inst.refresh_route_after_fault(topic)  # the next send may find a new master
            raise

    async def send_merged(self, topic: str, outs: list[OutgoingMessage], timeout: float) -> SendResult:
        """Send ``outs`` as one SEND_BATCH_MESSAGE on a queue the fault strategy picks; the
        result's ``msg_id`` is empty (each merged caller has its own UNIQ_KEY)."""
        return await self.send(topic, self.batch(topic, outs), "", None, timeout)

    async def send_one(self, out: OutgoingMessage, timeout: float) -> SendResult:
        """Send one prepared message on a queue the fault strategy picks. A transaction's half
        message is not sent again after a stored-but-not-replicated answer: the stored half is
        already in the broker's transaction check, and a second one would be delivered too."""
        return await self.send(out.topic, self.single(out), out.uniq_key, None, timeout,
                               resend_not_stored=_HALF_MARK not in out.properties)

    async def send(
        self,
        topic: str,
        build: RequestBuilder,
        msg_id: str,
        fixed: MessageQueue | None,
        timeout: float | None,
        reply: bool = False,
        resend_not_stored: bool = True,
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
                queues = await self.queues(topic, deadline)
        attempts = 1 + self.config.retry_times_when_send_failed
        fault = self.fault
        last_broker: str | None = None
        last_exc: TideMQError | None = None
        not_stored_ok: SendResult | None = None  # stored, not replicated: returned if nothing better
        refresh: asyncio.Future[None] | None = None  # the route refresh the last fault started
        failed_addr: str | None = None
        faulted = False  # the last attempt failed in a way the group's new master may cure
        made = busy = unsent = 0
        # SYSTEM_BUSY answers, and fixed-queue attempts that found no master to send to, do not
        # use up the retry budget (nothing was stored; the deadline bounds them).
        while made - busy - unsent < attempts:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            if fixed is None and made:  # a retry: the route may have changed meanwhile
                if last_broker is not None and await self._follow(
                        topic, refresh, last_broker, failed_addr, queues or (), remaining, faulted):
                    last_broker = None  # the same group's new master may take the retry
                refresh = None
                # During a failover the route may name no master for a while: keep the queues
                # (the attempt then fails with what is wrong) rather than claim the topic has none.
                queues = inst.routes.publish_queues(topic) or queues
            elif faulted and fixed is not None:
                await self._await_new_master(topic, refresh, fixed.broker_name, failed_addr, deadline)
                refresh = None
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
            mq = fixed or fault.select(topic, queues, last_broker)  # type: ignore[arg-type]
            if mq is None:
                raise no_route_error(topic, self.config.name_servers)
            made += 1
            faulted = False
            started = fault.now()
            failed_addr = inst.routes.master_addr(mq.broker_name)
            try:
                # hot path (bench/produce_consume.py): a cached master address needs no coroutine
                addr = failed_addr or await inst.master_addr(topic, mq.broker_name)
            except ClientError as exc:  # no master registered: the group is electing one
                # Nothing was sent: the attempt does not use up the retry budget (the deadline
                # bounds the wait for the new master).
                last_exc, last_broker, faulted = exc, mq.broker_name, True
                unsent += 1
                if fixed is not None:
                    continue
                refresh = inst.refresh_route_after_fault(topic)
                fault.report(mq.broker_name, (fault.now() - started) * 1000, isolation=True)
                log.info("send to %s found no master (%s); waiting for the route to name one", mq, exc)
                continue
            try:
                resp = await inst.invoke(addr, build(mq), remaining)
            except RemotingError as exc:
                last_exc, last_broker, faulted = exc, mq.broker_name, True
                refresh = inst.refresh_route_after_fault(topic)
                if fixed is None:
                    fault.report(mq.broker_name, (fault.now() - started) * 1000, isolation=True)
                log.info("send to %s failed (attempt %d/%d): %s", mq, made, attempts, exc)
                continue
            latency_ms = (fault.now() - started) * 1000
            code = resp.code
            if code == ResponseCode.SUCCESS:
                if fixed is None:
                    fault.report(mq.broker_name, latency_ms)
                return parse_send_response(resp, topic, mq.broker_name, msg_id, addr, mq)
            if code in ROUTE_FAULT_CODES:  # the group may have a new master: learn it at once
                # Stored but not replicated: this master is alive, a retry needs no new one.
                refresh, faulted = inst.refresh_route_after_fault(topic), code not in NOT_STORE_OK_CODES
            if code == ResponseCode.SYSTEM_BUSY:  # flow control: not stored, back off and retry
                busy += 1
                last_exc, last_broker = broker_error(resp, f"send to {mq}", addr), mq.broker_name
                await asyncio.sleep(min(busy_backoff(busy), max(0.0, deadline - loop.time())))
                continue
            if code in RETRYABLE_SEND_CODES:
                last_exc, last_broker = broker_error(resp, f"send to {mq}", addr), mq.broker_name
                if fixed is None:
                    # A reply refused because its requester is gone is no fault of the broker.
                    fault.report(mq.broker_name, latency_ms, isolation=not reply)
                log.info("send to %s failed (attempt %d/%d): %s", mq, made, attempts, last_exc)
                if fixed is not None and code not in ROUTE_FAULT_CODES:
                    break  # not a failover: the same queue would refuse it again
                continue
            if fixed is None:
                fault.report(mq.broker_name, latency_ms)
            result = parse_send_response(resp, topic, mq.broker_name, msg_id, addr, mq)
            if code in NOT_STORE_OK_CODES and resend_not_stored and fixed is None and made - busy - unsent < attempts:
                not_stored_ok, last_broker = result, mq.broker_name
                log.info("send to %s was stored but not replicated (%s, attempt %d/%d): sending "
                         "again", mq, result.status.value, made, attempts)
                continue
            return result
        if not_stored_ok is not None:
            return not_stored_ok
        raise _final_error(topic, made, budget, last_exc)

    async def _await_new_master(self, topic: str, refresh: asyncio.Future[None] | None, broker: str,
                                failed_addr: str | None, deadline: float) -> None:
        """Before retrying on ``broker`` after a route fault (a fixed queue, or the only group
        serving the topic): wait for the route refresh the fault started until the route names
        another master for ``broker`` (the retry goes there), or, while it still names
        ``failed_addr``, until ``fault_route_refresh_interval`` has passed and one more (bounded)
        refresh has run; never past ``deadline``."""
        routes = self.inst.routes

        def moved() -> bool:
            master = routes.master_addr(broker)
            return master is not None and master != failed_addr

        until = min(deadline, asyncio.get_running_loop().time() + self.config.fault_route_refresh_interval)
        if await self._refresh_until(topic, refresh, moved, until, deadline):
            log.info("broker %s of topic %s has a new master %s (was %s): retrying there", broker,
                     topic, routes.master_addr(broker), failed_addr)

    async def _refresh_until(self, topic: str, refresh: asyncio.Future[None] | None,
                             done: Callable[[], bool], until: float, deadline: float) -> bool:
        """Wait for ``refresh`` (the bounded fault refresh of ``topic``'s route, None: none in
        flight), then look again every QUICK_LOOK s, re-reading the route as often as the
        refresher's bound allows (a burst, then once per ``fault_route_refresh_interval``), until
        ``done()`` (True) or ``until`` has passed and one more look has been made (False); a
        refresh is waited for no later than ``deadline``."""
        inst, loop = self.inst, asyncio.get_running_loop()
        while True:
            if refresh is not None:
                try:
                    await asyncio.wait_for(asyncio.shield(refresh), max(0.0, deadline - loop.time()))
                except asyncio.TimeoutError:
                    return done()
            if done():
                return True
            now = loop.time()
            if now >= until:
                return False
            await asyncio.sleep(min(until - now, QUICK_LOOK))
            refresh = inst.refresh_route_after_fault(topic)

    async def _follow(self, topic: str, refresh: asyncio.Future[None] | None, broker: str,
                      failed_addr: str | None, queues: Sequence[MessageQueue],
                      remaining: float, faulted: bool) -> bool:
        """Before a retry after a fault on ``broker``: after a route fault (``faulted``) when no
        other broker serves the topic, wait (within the send's deadline) for the group's new
        master, since only it can take the retry. True when the route now names another master
        for ``broker``: its fault record belonged to the old master and is forgotten."""
        if faulted and all(q.broker_name == broker for q in queues):
            # Only that group serves the topic: wait for its new master, or for the interval and
            # one more refresh (a broker restarted in place), as a fixed-queue retry does.
            loop = asyncio.get_running_loop()
            await self._await_new_master(topic, refresh, broker, failed_addr, loop.time() + remaining)
        master = self.inst.routes.master_addr(broker)
        if master is None or master == failed_addr:
            return False
        self.fault.tolerance.remove(broker)
        log.info("broker %s of topic %s has a new master %s (was %s): retrying there", broker,
                 topic, master, failed_addr)
        return True


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
