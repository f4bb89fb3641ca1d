"""Client-side rebalancing (RocketMQ's RebalanceImpl), shared by PushConsumer and
LitePullConsumer in subscribe mode.

For each subscribed topic: the topic's readable queues from the route; in CLUSTERING the group's
consumer ids from one broker, both sorted, and this client's share from the allocation strategy;
in BROADCASTING every queue. Then the process-queue table is brought to that share: queues no
longer ours are dropped (the host persists their offset, stops their pull loop, unlocks them in
orderly mode; it may refuse while an orderly listener still runs, and the drop is retried next
round), new ones are added (orderly: only once locked at the broker) with the start offset of
:func:`compute_pull_from_where`. A round with no route or no consumer list changes nothing.

Invariants: one rebalance runs at a time (a lock); the table holds at most one ProcessQueue per
queue; a dropped ProcessQueue is never pulled or consumed again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from tidemq.client.allocate import AllocateStrategy
from tidemq.client.config import ClientConfig
from tidemq.client.heartbeat import Subscription
from tidemq.client.instance import ClientInstance, ConsumerMember
from tidemq.client.push.broker_api import ConsumerBrokerApi
from tidemq.client.push.offset_store import NOT_FOUND, OffsetStore, ReadOffsetType
from tidemq.client.push.process_queue import ProcessQueue
from tidemq.client.push.types import ConsumeFromWhere, MessageModel
from tidemq.client.route import MessageQueue
from tidemq.client.validation import RETRY_GROUP_TOPIC_PREFIX
from tidemq.errors import ClientError, TideMQError

log = logging.getLogger(__name__)


class RebalanceHost(Protocol):
    """What the consumer does when its share changes."""

    async def on_queue_added(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        """Start consuming ``mq``; False when its start offset is not known yet (retry later)."""
        ...

    async def on_queue_removed(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        """Stop consuming ``mq`` and mark ``pq`` dropped; False (nothing changed, consumption
        goes on) to be asked again next round."""
        ...

    async def lock_queues(self, mqs: list[MessageQueue]) -> set[MessageQueue]:
        """Orderly only: lock queues at their brokers; the ones now held."""
        ...


async def compute_pull_from_where(api: ConsumerBrokerApi, store: OffsetStore, mq: MessageQueue,
                                  consume_from: ConsumeFromWhere, timestamp_ms: int) -> int:
    """Where to start on ``mq``: the stored offset, else by ``consume_from`` (reference 6.3):

    ============  ================================  ==============
    consume_from  normal topic                      %RETRY% topic
    ============  ================================  ==============
    LAST_OFFSET   max offset                        0
    FIRST_OFFSET  0                                 0
    TIMESTAMP     offset of ``timestamp_ms``        max offset
    ============  ================================  ==============

    -1 when the store or the broker could not answer.
    """
    stored = await store.read(mq, ReadOffsetType.STORE)
    if stored >= 0:
        return stored
    if stored != NOT_FOUND:
        return -1
    retry = mq.topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
    try:
        if consume_from is ConsumeFromWhere.FIRST_OFFSET:
            return 0
        if consume_from is ConsumeFromWhere.TIMESTAMP:
            if retry:
                return await api.max_offset(mq)
            return await api.search_offset(mq, timestamp_ms)
        return 0 if retry else await api.max_offset(mq)
    except TideMQError as exc:
        log.warning("start offset of %s for group %s unknown: %s", mq, api.group, exc)
        return -1


_members: set[tuple[int, str]] = set()


def claim_group(inst: object, group: str) -> None:
    """Refuse a second rebalancing consumer of ``group`` on one client instance: both would have
    the same client id and each would take every queue."""
    key = (id(inst), group)
    if key in _members:
        raise ClientError(
            f"a consumer of group {group} already runs on this client instance; give the second "
            "one its own ClientConfig(instance_name=...)"
        )
    _members.add(key)


def release_group(inst: object, group: str) -> None:
    _members.discard((id(inst), group))


async def acquire_for_group(config: ClientConfig, group: str) -> ClientInstance:
    """The shared client instance of ``config``, with ``group`` claimed on it (claim_group)."""
    inst = await ClientInstance.acquire(config)
    try:
        claim_group(inst, group)
    except ClientError:
        await inst.release()
        raise
    return inst


async def release_for_group(inst: ClientInstance, consumer: ConsumerMember) -> None:
    """Undo :func:`acquire_for_group` for a consumer that joined the instance: release the
    group, unregister the consumer from the brokers, release the instance."""
    release_group(inst, consumer.group)
    try:
        await inst.remove_consumer(consumer)
    finally:
        await inst.release()


class Rebalancer:
    def __init__(
        self,
        api: ConsumerBrokerApi,
        host: RebalanceHost,
        message_model: MessageModel,
        strategy: AllocateStrategy,
        orderly: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.host = host
        self.message_model = message_model
        self.strategy = strategy
        self.orderly = orderly
        self.clock = clock
        self.subscriptions: dict[str, Subscription] = {}
        self.process_queues: dict[MessageQueue, ProcessQueue] = {}
        self.rounds = 0
        self._lock = asyncio.Lock()

    @property
    def group(self) -> str:
        return self.api.group

    def assigned(self, topic: str | None = None) -> list[MessageQueue]:
        return sorted(mq for mq, pq in self.process_queues.items()
                      if not pq.dropped and (topic is None or mq.topic == topic))

    async def rebalance(self) -> None:
        async with self._lock:
            self.rounds += 1
            for topic in list(self.subscriptions):
                try:
                    await self._rebalance_topic(topic)
                except TideMQError as exc:
                    log.warning("rebalance of topic %s for group %s failed: %s", topic,
                                self.group, exc)
            for mq in [m for m in self.process_queues if m.topic not in self.subscriptions]:
                await self._remove(mq)

    async def assign(self, queues: set[MessageQueue]) -> None:
        """Assign mode (lite pull): own exactly ``queues``, no allocation."""
        async with self._lock:
            topics = {mq.topic for mq in queues} | {mq.topic for mq in self.process_queues}
            for topic in sorted(topics):
                await self._update(topic, {mq for mq in queues if mq.topic == topic})

    def clear(self) -> None:
        """Mark every process queue dropped and forget it, without asking the host (closing:
        the consumer has stopped its pull loops and stored its offsets itself)."""
        for pq in self.process_queues.values():
            pq.dropped = True
        self.process_queues.clear()

    async def _rebalance_topic(self, topic: str) -> None:
        inst = self.api.inst
        route = inst.routes.get(topic) or await inst.get_route(topic)
        if route is None:
            log.info("no route for topic %s yet; group %s skips it this round", topic, self.group)
            return
        queues = route.subscribe_queues(topic)
        if self.message_model is MessageModel.BROADCASTING:
            mine = queues
        else:
            ids = await self.api.consumer_ids(topic)
            if not ids:
                return
            mine = self.strategy(queues, ids, inst.client_id)
        await self._update(topic, set(mine))

    async def _update(self, topic: str, mine: set[MessageQueue]) -> None:
        before = set(self.assigned(topic))
        for mq, pq in list(self.process_queues.items()):
            if mq.topic == topic and (mq not in mine or pq.dropped):
                await self._remove(mq)
        new = sorted(mq for mq in mine if mq not in self.process_queues)
        locked: set[MessageQueue] = set(new)
        if new and self.orderly and self.message_model is MessageModel.CLUSTERING:
            locked = await self.host.lock_queues(new)
        for mq in new:
            if mq not in locked:
                continue
            pq = ProcessQueue(self.clock)
            if self.orderly:
                pq.set_locked(True)
            self.process_queues[mq] = pq
            if not await self.host.on_queue_added(mq, pq):
                pq.dropped = True
                del self.process_queues[mq]
        after = set(self.assigned(topic))
        if after != before:
            log.info("group %s client %s now owns %d queue(s) of %s (+%d -%d)", self.group,
                     self.api.inst.client_id, len(after), topic, len(after - before),
                     len(before - after))

    async def _remove(self, mq: MessageQueue) -> None:
        pq = self.process_queues.get(mq)
        if pq is None:
            return
        if await self.host.on_queue_removed(mq, pq):
            pq.dropped = True
            self.process_queues.pop(mq, None)

    # orderly -----------------------------------------------------------------------------------
    async def lock_all(self) -> None:
        """Renew the locks of every owned queue; queues whose lock failed stop being consumed
        until a later renewal succeeds."""
        if not self.orderly or self.message_model is not MessageModel.CLUSTERING:
            return
        owned = {mq: pq for mq, pq in self.process_queues.items() if not pq.dropped}
        if not owned:
            return
        locked = await self.host.lock_queues(list(owned))
        for mq, pq in owned.items():
            if mq in locked:
                pq.set_locked(True)
            elif pq.locked:
                log.warning("group %s lost the lock of %s", self.group, mq)
                pq.set_locked(False)
