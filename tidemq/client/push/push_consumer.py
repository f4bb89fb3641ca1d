"""PushConsumer: subscribe, register a listener, and the client pulls, balances and commits.

Composition (aiokafka-like): a :class:`~tidemq.client.push.rebalance.Rebalancer` owns the
queue -> ProcessQueue table; one :class:`~tidemq.client.push.puller.QueuePuller` task long-polls
each owned queue; a consume service (concurrent or orderly) calls the listener; an offset store
(broker for CLUSTERING, local file for BROADCASTING) remembers progress. Background tasks:
rebalance every ``rebalance_interval`` and at once on NOTIFY_CONSUMER_IDS_CHANGED, persist
offsets every ``persist_interval``, and (orderly, CLUSTERING) renew queue locks every
``lock_interval``.

Shutdown order: stop rebalancing and pulling, let the listener finish what it is doing (bounded
by ``shutdown_timeout``), commit offsets and wait for the broker, unlock queues, unregister.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from tidemq.client.base import ClientBase
from tidemq.client.config import ClientConfig, make_config
from tidemq.client.heartbeat import CONSUME_PASSIVELY, ConsumerData, Subscription
from tidemq.client.instance import ClientInstance
from tidemq.client.pull import normalize_expression
from tidemq.client.push.broker_api import ConsumerBrokerApi
from tidemq.client.push.consume_concurrently import ConcurrentConsumeService
from tidemq.client.push.consume_orderly import OrderlyConsumeService
from tidemq.client.push.consume_service import ConsumeSetup
from tidemq.client.push.invoker import ListenerInvoker
from tidemq.client.push.offset_store import OffsetStore, ReadOffsetType, make_offset_store
from tidemq.client.push.process_queue import ProcessQueue
from tidemq.client.push.protocol import retry_topic
from tidemq.client.push.puller import ERROR_BACKOFF, FLOW_CONTROL_DELAY, PullSettings, QueuePuller
from tidemq.client.push.rebalance import (
    Rebalancer,
    acquire_for_group,
    compute_pull_from_where,
    release_for_group,
)
from tidemq.client.push.send_back import SendBack
from tidemq.client.push.settings import PushSettings
from tidemq.client.push.types import (
    MessageListener,
    MessageModel,
    ProcessQueueStats,
)
from tidemq.client.route import MessageQueue
from tidemq.client.tasks import cancel_all, every, pop_and_cancel
from tidemq.client.validation import check_group, check_topic_name
from tidemq.errors import ClientError
from tidemq.message import MessageExt
from tidemq.remoting import Connection, RemotingCommand, RequestCode

log = logging.getLogger(__name__)

MIB = 1024 * 1024
CONSUME_LOCK_WAIT = 1.0  # orderly: how long a rebalance waits for a running listener
NOT_LOCKED_DELAY = 1.0


class PushConsumer(ClientBase):
    """An asyncio push consumer::

        consumer = PushConsumer("my-group", "127.0.0.1:9876")
        consumer.subscribe("TopicTest", "TagA || TagB")
        consumer.register_listener(handle)   # handle(msgs) -> ConsumeConcurrentlyStatus
        async with consumer:
            ...
    """

    _not_started = "consumer is not started"

    def __init__(
        self,
        group: str,
        name_servers: str | Sequence[str] | None = None,
        config: ClientConfig | None = None,
        *,
        settings: PushSettings | None = None,
        **options: Any,
    ) -> None:
        """``options`` are :class:`~tidemq.client.push.settings.PushSettings` fields by name
        (``orderly=True``, ``max_reconsume_times=3``, ``pull_threshold_size_for_queue`` in MiB,
        ``consume_timestamp`` in ms, ...), each replacing the one of ``settings`` (default: the
        defaults); a name that is no field raises ConfigError."""
        self.group = check_group(group)
        self.config = make_config(name_servers, config)
        self.settings = PushSettings.make(settings, **options)
        self._subscriptions: dict[str, Subscription] = {}
        self._listener: MessageListener | None = None
        self._pullers: dict[MessageQueue, asyncio.Task] = {}
        self._tasks: list[asyncio.Task] = []
        self._rebalance_now = asyncio.Event()
        self._flow_controlled = 0
        self._state = "new"  # new -> starting -> started -> closing -> closed

    # configuration -----------------------------------------------------------------------------
    @property
    def message_model(self) -> MessageModel:
        return self.settings.message_model

    @property
    def orderly(self) -> bool:
        return self.settings.orderly

    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Consume ``topic`` messages matching ``expression`` (``*`` or ``TagA || TagB``).
        Allowed after start too: the next rebalance picks the topic up."""
        check_topic_name(topic)
        expr = normalize_expression(expression)
        current = self._subscriptions.get(topic)
        if current is not None and current.expression == expr:
            return
        self._subscriptions[topic] = Subscription(topic, expr, int(time.time() * 1000))
        self._changed()

    def unsubscribe(self, topic: str) -> None:
        if self._subscriptions.pop(topic, None) is not None:
            self._changed()

    def _changed(self) -> None:
        if self._state == "started":
            self._sync_subscriptions()
            self._instance.schedule_heartbeat()  # type: ignore[union-attr]
            self._rebalance_now.set()

    def register_listener(self, listener: MessageListener) -> None:
        """``listener(msgs)`` returns ConsumeConcurrentlyStatus (or ConsumeOrderlyStatus when
        ``orderly``); plain functions run in a pool of ``consume_concurrency`` threads, async
        ones on the event loop. An exception means "consume again later"."""
        if not callable(listener):
            raise ClientError("the listener must be a callable taking a list of messages")
        if self._state not in ("new", "closed"):
            raise ClientError("register the listener before start()")
        self._listener = listener

    def subscription(self, topic: str) -> Subscription | None:
        if topic == self._retry_topic():
            return Subscription(topic, "*", 0)
        return self._subscriptions.get(topic)

    def _retry_topic(self) -> str:
        return retry_topic(self.group)

    def consumer_data(self) -> ConsumerData:
        subs = list(self._subscriptions.values())
        if self.message_model is MessageModel.CLUSTERING:
            subs.append(Subscription(self._retry_topic(), "*", 0))
        return ConsumerData(
            group=self.group,
            subscriptions=tuple(subs),
            consume_type=CONSUME_PASSIVELY,
            message_model=self.message_model.value,
            consume_from_where=self.settings.consume_from.value,
        )

    def _sync_subscriptions(self) -> None:
        table = dict(self._subscriptions)
        if self.message_model is MessageModel.CLUSTERING:
            table[self._retry_topic()] = Subscription(self._retry_topic(), "*", 0)
        self.rebalancer.subscriptions = table

    # lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._state == "started":
            return
        if self._state not in ("new", "closed"):
            raise ClientError(f"consumer is {self._state}; wait for it before starting again")
        if self._listener is None:
            raise ClientError("register a listener before start(): consumer.register_listener(fn)")
        if not self._subscriptions:
            raise ClientError("subscribe to a topic before start(): consumer.subscribe(topic)")
        self._state = "starting"
        try:
            inst = await acquire_for_group(self.config, self.group)
        except ClientError:
            self._state = "new"
            raise
        try:
            await self._start(inst)
        except BaseException:
            self._state = "started"
            await self.close()
            raise

    async def _start(self, inst: ClientInstance) -> None:
        s = self.settings
        self._instance = inst
        self.instance = inst
        self.api = ConsumerBrokerApi(inst, self.group)
        self.offset_store: OffsetStore = make_offset_store(
            s.message_model, self.api, s.offset_store_dir, self.config.instance_name)
        await self.offset_store.load()
        self.rebalancer = Rebalancer(self.api, self, s.message_model, s.allocate_strategy,
                                     orderly=s.orderly)
        self._sync_subscriptions()
        assert self._listener is not None
        self.invoker = ListenerInvoker(self._listener, s.consume_concurrency, self.group)
        self.send_back = SendBack(self.api, self.config, s.max_reconsume_times)
        clustering = s.message_model is MessageModel.CLUSTERING
        self._pull_settings = PullSettings(s.pull_batch_size, s.suspend_ms, commit_offset=clustering)
        setup = ConsumeSetup(self.group, self.invoker, self.offset_store, self.send_back,
                             s.consume_batch_max_size, clustering)
        self._concurrent = ConcurrentConsumeService(setup)
        self._orderly = OrderlyConsumeService(setup, self.lock_queues, s.max_reconsume_times)
        self._rebalance_now = asyncio.Event()
        inst.add_consumer(self)
        inst.register_request_handler(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, self._on_notify)
        for topic in self._subscriptions:
            if await inst.get_route(topic) is None:
                log.warning("topic %s has no route yet; group %s consumes it once it exists",
                            topic, self.group)
        await inst.send_heartbeat()
        self._state = "started"
        await self.rebalancer.rebalance()
        group = self.group
        jobs = [
            every(s.rebalance_interval, self.rebalancer.rebalance, "rebalance", group,
                  self._rebalance_now),
            every(s.persist_interval, self._persist_owned, "offset persist", group),
        ]
        if s.orderly and clustering:
            jobs.append(every(s.lock_interval, self.rebalancer.lock_all, "queue relock", group))
        self._tasks = [asyncio.ensure_future(job) for job in jobs]
        log.info("push consumer of group %s started (client %s, %s%s)", self.group,
                 inst.client_id, s.message_model.value, ", orderly" if s.orderly else "")

    async def close(self) -> None:
        """Stop pulling, finish in-flight consumption (bounded), commit offsets, unlock queues,
        unregister. Idempotent."""
        if self._state not in ("started", "starting"):
            return
        self._state = "closing"
        inst = self._instance
        assert inst is not None
        try:
            inst.unregister_request_handler(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, self._on_notify)
            await cancel_all(self._tasks)
            self._tasks = []
            if hasattr(self, "rebalancer"):
                await self._shutdown_consumption()
            if hasattr(self, "send_back"):
                await self.send_back.close()
        finally:
            self._instance = None
            try:
                await release_for_group(inst, self)
            finally:
                if hasattr(self, "invoker"):
                    self.invoker.shutdown()
                self._state = "closed"
                log.info("push consumer of group %s closed", self.group)

    async def _shutdown_consumption(self) -> None:
        await cancel_all(list(self._pullers.values()))
        self._pullers.clear()
        timeout = self.settings.shutdown_timeout
        await self._concurrent.close(timeout)
        await self._orderly.close(timeout)
        owned = list(self.rebalancer.process_queues)
        await self.offset_store.persist_all(owned, oneway=False)
        if self.orderly and self.message_model is MessageModel.CLUSTERING and owned:
            await self.api.unlock(self.instance.client_id, owned)
        self.rebalancer.clear()

    @property
    def client_id(self) -> str:
        return self._require().client_id

    # observation -------------------------------------------------------------------------------
    def assigned_queues(self, topic: str | None = None) -> list[MessageQueue]:
        """The queues this consumer owns now (including ``%RETRY%<group>`` ones)."""
        if self._state != "started":
            return []
        return self.rebalancer.assigned(topic)

    def process_queues(self) -> dict[MessageQueue, ProcessQueueStats]:
        if self._state != "started":
            return {}
        return {mq: pq.stats() for mq, pq in self.rebalancer.process_queues.items()}

    async def rebalance(self) -> None:
        """Rebalance now (normally done every ``rebalance_interval`` and on group changes)."""
        if self._state == "started":
            await self.rebalancer.rebalance()

    # background --------------------------------------------------------------------------------
    def _on_notify(self, conn: Connection, cmd: RemotingCommand) -> None:
        if cmd.get_str("consumerGroup") == self.group:
            log.debug("group %s changed (told by %s); rebalancing", self.group, conn.peer)
            self._rebalance_now.set()
        return None

    async def _persist_owned(self) -> None:
        await self.offset_store.persist_all(self.rebalancer.assigned())

    # RebalanceHost -----------------------------------------------------------------------------
    async def lock_queues(self, mqs: list[MessageQueue]) -> set[MessageQueue]:
        return await self.api.lock(self.instance.client_id, mqs)

    async def on_queue_added(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        self.offset_store.remove(mq)
        offset = await self._start_offset(mq)
        if offset < 0:
            return False
        self.offset_store.update(mq, offset, increase_only=False)
        puller = QueuePuller(self, mq, pq, offset, self._pull_settings)
        self._pullers[mq] = asyncio.ensure_future(puller.run())
        return True

    async def _start_offset(self, mq: MessageQueue) -> int:
        s = self.settings
        ts = s.start_timestamp(self.instance.now_ms())
        return await compute_pull_from_where(self.api, self.offset_store, mq, s.consume_from, ts)

    async def on_queue_removed(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        if self.orderly and self.message_model is MessageModel.CLUSTERING:
            lock = self._orderly.consume_lock(mq)
            try:
                await asyncio.wait_for(lock.acquire(), CONSUME_LOCK_WAIT)
            except asyncio.TimeoutError:
                log.info("queue %s is being consumed; group %s gives it up next round", mq, self.group)
                return False
            try:
                await self._stop_queue(mq, pq)
                await self.api.unlock(self.instance.client_id, [mq])
            finally:
                lock.release()
                self._orderly.forget(mq)
            return True
        await self._stop_queue(mq, pq)
        return True

    async def _stop_queue(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        pq.dropped = True
        await pop_and_cancel(self._pullers, mq)
        await self.offset_store.persist(mq)
        self.offset_store.remove(mq)

    # PullHost ----------------------------------------------------------------------------------
    async def pull_gate(self, puller: QueuePuller) -> float:
        pq, s = puller.pq, self.settings
        if s.orderly and s.message_model is MessageModel.CLUSTERING:
            if not pq.locked:
                puller.previously_locked = False
                return NOT_LOCKED_DELAY
            if not puller.previously_locked:
                # The lock came back: another client may have consumed meanwhile, so ask the
                # broker and skip what it consumed; never go behind what this client already
                # pulled or acknowledged itself.
                mine = await self.offset_store.read(puller.mq, ReadOffsetType.MEMORY)
                broker = await self._start_offset(puller.mq)
                if broker < 0:
                    return ERROR_BACKOFF
                self.offset_store.update(puller.mq, max(mine, broker), increase_only=False)
                puller.next_offset = max(puller.next_offset, broker)
                puller.previously_locked = True
        if (pq.msg_count > s.pull_threshold_for_queue
                or pq.msg_size > s.pull_threshold_size_for_queue * MIB
                or (not s.orderly and pq.max_span() > s.consume_concurrently_max_span)):
            self._flow_controlled += 1
            if self._flow_controlled % 1000 == 1:
                log.info("flow control of group %s on %s: %d message(s), %d bytes, span %d "
                         "cached (%d times so far)", self.group, puller.mq, pq.msg_count,
                         pq.msg_size, pq.max_span(), self._flow_controlled)
            return FLOW_CONTROL_DELAY
        return 0.0

    def deliver(self, puller: QueuePuller, msgs: list[MessageExt]) -> None:
        dispatch = puller.pq.put_messages(msgs)
        if self.orderly:
            self._orderly.submit(puller.mq, puller.pq, dispatch)
        else:
            self._concurrent.submit(puller.mq, puller.pq, msgs)

    def on_caught_up(self, puller: QueuePuller, next_offset: int) -> None:
        self.offset_store.update(puller.mq, next_offset, increase_only=True)

