"""LitePullConsumer: Kafka-style ``poll()`` over RocketMQ queues (RocketMQ's
DefaultLitePullConsumer).

Either ``subscribe(topic, expression)`` (queues come from the same rebalancing as the push
consumer) or ``assign(queues)`` (the application picks them). Behind the scenes one long-polling
pull loop per owned queue fills a bounded cache; ``poll()`` hands out up to ``pull_batch_size``
cached messages across queues. The *position* of a queue is the smallest offset not yet handed
out; ``commit()`` stores positions at the broker (CLUSTERING) or in the local offset file
(BROADCASTING), and with ``auto_commit`` that happens every ``auto_commit_interval`` seconds.
``seek()`` moves a queue's position and discards what was cached for it.

Invariants: a message is handed out at most once per position (a seek or a new owner may hand
it out again: delivery is at least once); a queue given up in a rebalance keeps its last
committed offset (auto-commit on: its position) for its next owner.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

from tidemq.client.base import ClientBase
from tidemq.client.config import ClientConfig, make_config
from tidemq.client.heartbeat import CONSUME_ACTIVELY, ConsumerData, Subscription
from tidemq.client.instance import ClientInstance
from tidemq.client.pull import normalize_expression
from tidemq.client.push.broker_api import ConsumerBrokerApi
from tidemq.client.push.offset_store import OffsetStore, ReadOffsetType, make_offset_store
from tidemq.client.push.poll_cache import PollCache
from tidemq.client.push.process_queue import ProcessQueue
from tidemq.client.push.puller import FLOW_CONTROL_DELAY, PullSettings, QueuePuller
from tidemq.client.push.rebalance import (
    Rebalancer,
    acquire_for_group,
    compute_pull_from_where,
    release_for_group,
)
from tidemq.client.push.settings import LitePullSettings
from tidemq.client.push.types import MessageModel
from tidemq.client.route import MessageQueue
from tidemq.client.tasks import cancel_all, every, pop_and_cancel
from tidemq.client.validation import check_group, check_topic_name
from tidemq.errors import ClientError
from tidemq.message import MessageExt
from tidemq.remoting import Connection, RemotingCommand, RequestCode

log = logging.getLogger(__name__)

MIB = 1024 * 1024
PAUSED_DELAY = 0.2


class LitePullConsumer(ClientBase):
    _not_started = ("consumer is not started: call `await consumer.start()` or use "
                    "`async with LitePullConsumer(...)`")

    def __init__(
        self,
        group: str,
        name_servers: str | Sequence[str] | None = None,
        config: ClientConfig | None = None,
        *,
        settings: LitePullSettings | None = None,
        **options: Any,
    ) -> None:
        """``options`` are :class:`~tidemq.client.push.settings.LitePullSettings` fields by name
        (``auto_commit=False``, ``pull_batch_size=32``, ``pull_threshold_size_for_queue`` in MiB,
        ``consume_timestamp`` in ms, ...), each replacing the one of ``settings`` (default: the
        defaults); a name that is no field raises ConfigError."""
        self.group = check_group(group)
        self.config = make_config(name_servers, config)
        self.settings = s = LitePullSettings.make(settings, **options)
        self._pull_settings = PullSettings(s.pull_batch_size, s.suspend_ms, commit_offset=False)
        self._subscriptions: dict[str, Subscription] = {}
        self._assigned: set[MessageQueue] | None = None  # assign mode when not None
        self._assignment_dirty = False
        self._paused: set[MessageQueue] = set()
        self._positions: dict[MessageQueue, int] = {}
        self._pullers: dict[MessageQueue, asyncio.Task] = {}
        self._cache = PollCache()
        self._tasks: list[asyncio.Task] = []
        self._state = "new"

    # what to consume ---------------------------------------------------------------------------
    def subscribe(self, topic: str, expression: str = "*") -> None:
        if self._assigned is not None:
            raise ClientError("this consumer uses assign(); subscribe and assign cannot be mixed")
        check_topic_name(topic)
        self._subscriptions[topic] = Subscription(topic, normalize_expression(expression),
                                                  int(time.time() * 1000))
        self._changed()

    def unsubscribe(self, topic: str) -> None:
        if self._subscriptions.pop(topic, None) is not None:
            self._changed()

    def assign(self, queues: Iterable[MessageQueue]) -> None:
        """Consume exactly ``queues`` (replacing an earlier assignment); no rebalancing."""
        if self._subscriptions:
            raise ClientError("this consumer uses subscribe(); subscribe and assign cannot be mixed")
        queues = set(queues)
        for mq in queues:
            if not isinstance(mq, MessageQueue):
                raise ClientError(f"assign() takes MessageQueue objects, got {type(mq).__name__}")
        self._assigned = queues
        self._assignment_dirty = True
        self._changed()

    def _changed(self) -> None:
        if self._state == "started":
            self._sync_subscriptions()
            self._instance.schedule_heartbeat()  # type: ignore[union-attr]
            self._wake.set()

    def _sync_subscriptions(self) -> None:
        self.rebalancer.subscriptions = dict(self._subscriptions)

    def subscription(self, topic: str) -> Subscription | None:
        sub = self._subscriptions.get(topic)
        if sub is None and self._assigned is not None:
            return Subscription(topic, "*", 0)
        return sub

    @property
    def message_model(self) -> MessageModel:
        return self.settings.message_model

    @property
    def auto_commit(self) -> bool:
        return self.settings.auto_commit

    def consumer_data(self) -> ConsumerData:
        subs = list(self._subscriptions.values())
        if self._assigned is not None:
            subs = [Subscription(t, "*", 0) for t in sorted({mq.topic for mq in self._assigned})]
        return ConsumerData(self.group, tuple(subs), CONSUME_ACTIVELY, self.message_model.value,
                            self.settings.consume_from.value)

    def assignment(self) -> list[MessageQueue]:
        """The queues this consumer pulls now."""
        return self.rebalancer.assigned() if self._state == "started" else []

    async def fetch_queues(self, topic: str) -> list[MessageQueue]:
        inst = self._require()
        route = await inst.get_route(check_topic_name(topic))
        if route is None:
            raise ClientError(f"no route for topic {topic}: create it first")
        return route.subscribe_queues(topic)

    def pause(self, queues: Iterable[MessageQueue]) -> None:
        """Stop pulling ``queues`` (what was already fetched is still handed out)."""
        self._paused |= set(queues)

    def resume(self, queues: Iterable[MessageQueue]) -> None:
        self._paused -= set(queues)

    # lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._state == "started":
            return
        if self._state not in ("new", "closed"):
            raise ClientError(f"consumer is {self._state}")
        inst = await acquire_for_group(self.config, self.group)
        self._instance = inst
        self.instance = inst
        self._positions.clear()
        self._assignment_dirty = self._assigned is not None
        self.api = ConsumerBrokerApi(inst, self.group)
        self.offset_store: OffsetStore = make_offset_store(
            self.message_model, self.api, self.settings.offset_store_dir, self.config.instance_name)
        self._wake = asyncio.Event()
        self._arrived = asyncio.Event()
        self.rebalancer = Rebalancer(self.api, self, self.message_model, self.settings.allocate_strategy)
        self._sync_subscriptions()
        self._state = "started"
        try:
            await self.offset_store.load()
            inst.add_consumer(self)
            inst.register_request_handler(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, self._on_notify)
            for topic in self._subscriptions:
                await inst.get_route(topic)
            await inst.send_heartbeat()
            await self._balance()
        except BaseException:
            await self.close()
            raise
        s = self.settings
        jobs = [every(s.rebalance_interval, self._balance, "rebalance", self.group, self._wake)]
        if self.auto_commit:
            jobs.append(every(s.auto_commit_interval, self._auto_commit, "auto-commit", self.group))
        self._tasks = [asyncio.ensure_future(job) for job in jobs]

    async def close(self) -> None:
        """Stop pulling; with auto_commit, commit the positions; unregister. Idempotent."""
        if self._state != "started":
            return
        self._state = "closing"
        inst = self._instance
        assert inst is not None
        try:
            inst.unregister_request_handler(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, self._on_notify)
            await cancel_all(self._tasks)
            await cancel_all(list(self._pullers.values()))
            self._pullers.clear()
            if self.auto_commit:
                await self._commit_positions(None)
            else:
                await self._persist(oneway=False)
        finally:
            self.rebalancer.clear()
            self._cache.clear()
            self._instance = None
            try:
                await release_for_group(inst, self)
            finally:
                self._state = "closed"

    def _require(self) -> ClientInstance:
        if self._state != "started":
            raise ClientError(self._not_started)
        return super()._require()

    # rebalancing -------------------------------------------------------------------------------
    async def _balance(self) -> None:
        if self._assigned is not None:
            if self._assignment_dirty:
                self._assignment_dirty = False
                await self.rebalancer.assign(set(self._assigned))
        else:
            await self.rebalancer.rebalance()

    def _on_notify(self, conn: Connection, cmd: RemotingCommand) -> None:
        if cmd.get_str("consumerGroup") == self.group and self._assigned is None:
            self._wake.set()
        return None

    async def _auto_commit(self) -> None:
        await self._commit_positions(None, oneway=True)

    async def lock_queues(self, mqs: list[MessageQueue]) -> set[MessageQueue]:
        return set(mqs)  # lite pull does not lock

    async def on_queue_added(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        self.offset_store.remove(mq)
        ts = self.settings.start_timestamp(self._require().now_ms())
        offset = await compute_pull_from_where(self.api, self.offset_store, mq,
                                               self.settings.consume_from, ts)
        if offset < 0:
            return False
        self._start_puller(mq, pq, offset)
        return True

    def _start_puller(self, mq: MessageQueue, pq: ProcessQueue, offset: int) -> None:
        self._positions[mq] = offset
        puller = QueuePuller(self, mq, pq, offset, self._pull_settings)
        self._pullers[mq] = asyncio.ensure_future(puller.run())

    async def on_queue_removed(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        pq.dropped = True
        await pop_and_cancel(self._pullers, mq)
        self._cache.drop(mq)
        position = self._positions.pop(mq, None)
        if self.auto_commit and position is not None:
            self.offset_store.update(mq, position, increase_only=False)
        await self.offset_store.persist(mq)
        self.offset_store.remove(mq)
        return True

    # PullHost ----------------------------------------------------------------------------------
    async def pull_gate(self, puller: QueuePuller) -> float:
        pq, s = puller.pq, self.settings
        if puller.mq in self._paused:
            return PAUSED_DELAY
        if (self._cache.count > s.pull_threshold_for_all
                or pq.msg_count > s.pull_threshold_for_queue
                or pq.msg_size > s.pull_threshold_size_for_queue * MIB
                or pq.max_span() > s.consume_max_span):
            return FLOW_CONTROL_DELAY
        return 0.0

    def deliver(self, puller: QueuePuller, msgs: list[MessageExt]) -> None:
        puller.pq.put_messages(msgs)
        self._cache.add(puller.mq, puller.pq, msgs)
        self._arrived.set()

    def on_caught_up(self, puller: QueuePuller, next_offset: int) -> None:
        if not self._cache.holds(puller.mq):
            self._positions[puller.mq] = next_offset

    # the application's side --------------------------------------------------------------------
    async def poll(self, timeout: float | None = None) -> list[MessageExt]:
        """Up to ``pull_batch_size`` messages, waiting up to ``timeout`` seconds (default
        ``poll_timeout``) for the first; [] when none came."""
        self._require()
        if self._assignment_dirty:
            await self._balance()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.settings.poll_timeout if timeout is None else timeout)
        while True:
            out = self._take(self.settings.pull_batch_size)
            if out:
                return out
            remaining = deadline - loop.time()
            if remaining <= 0:
                return []
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except asyncio.TimeoutError:
                return []

    def _take(self, n: int) -> list[MessageExt]:
        out: list[MessageExt] = []
        for mq, pq, msgs in self._cache.take(n):
            out.extend(msgs)
            position = pq.remove_messages(msgs)
            if position >= 0:
                self._positions[mq] = position
        return out

    async def seek(self, mq: MessageQueue, offset: int) -> None:
        """Hand out ``mq``'s messages from ``offset`` on (between its min and max offset)."""
        self._require()
        if self._assignment_dirty:
            await self._balance()
        pq = self.rebalancer.process_queues.get(mq)
        if pq is None or pq.dropped:
            raise ClientError(f"queue {mq} is not assigned to this consumer; assign or subscribe first")
        low, high = await self.api.min_offset(mq), await self.api.max_offset(mq)
        if not low <= offset <= high:
            raise ClientError(f"seek offset {offset} of {mq} is outside {low}..{high}")
        await pop_and_cancel(self._pullers, mq)
        self._cache.drop(mq)
        pq.clear()
        if not pq.dropped:
            self._start_puller(mq, pq, offset)

    async def seek_to_begin(self, mq: MessageQueue) -> None:
        self._require()
        await self.seek(mq, await self.api.min_offset(mq))

    async def seek_to_end(self, mq: MessageQueue) -> None:
        self._require()
        await self.seek(mq, await self.api.max_offset(mq))

    def position(self, mq: MessageQueue) -> int | None:
        """The next offset poll() hands out for ``mq`` (None when not owned)."""
        return self._positions.get(mq)

    async def committed(self, mq: MessageQueue) -> int:
        """The stored offset of ``mq`` (-1 when the group has none)."""
        self._require()
        return await self.offset_store.read(mq, ReadOffsetType.STORE)

    async def commit(self, offsets: dict[MessageQueue, int] | None = None) -> None:
        """Store the positions of everything polled so far (or ``offsets``) and wait until the
        broker (or the offset file) has them."""
        self._require()
        await self._commit_positions(offsets)

    commit_sync = commit

    async def _commit_positions(self, offsets: dict[MessageQueue, int] | None,
                                oneway: bool = False) -> None:
        table = self._positions if offsets is None else offsets
        for mq, off in table.items():
            if off < 0:
                raise ClientError(f"offset of {mq} must be >= 0, got {off}")
            self.offset_store.update(mq, off, increase_only=False)
        await self._persist(oneway)

    async def _persist(self, oneway: bool) -> None:
        await self.offset_store.persist_all(self.rebalancer.assigned(), oneway=oneway)
