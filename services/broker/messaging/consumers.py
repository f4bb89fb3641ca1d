"""The consumer registry family: heartbeats, leaving, who is in a group, and orderly consumers'
queue locks.

Invariants: a heartbeat registers nothing and creates nothing unless every group it names is
valid and every bound holds (groups per heartbeat, subscriptions per entry, the registry's room);
a consumer group's missing ``%RETRY%`` topic is created on its heartbeat, and such a heartbeat is
answered once the name servers know the topic (or after :data:`HEARTBEAT_REGISTER_WAIT`). The lock
table only holds known groups' locks on queues of known topics, so its size stays bounded.

A client's connection is a ``channel`` of the front-end's own type, known here only by its
address: the registry (tidemq.broker.clients) keys clients by it and hands it to the front-end's
notifier.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tidemq.broker.clients import (
    MAX_HEARTBEAT_GROUPS,
    MAX_HEARTBEAT_SUBSCRIPTIONS,
    Subscription,
    SubscriptionParseError,
    parse_tag_expression,
)
from tidemq.broker.messaging.context import Caller, refused
from tidemq.broker.topics import RETRY_PREFIX, loggable
from tidemq.remoting.codes import ResponseCode

if TYPE_CHECKING:
    from tidemq.broker.clients import ClientConnection, ClientRegistry
    from tidemq.broker.creation import ImplicitCreation
    from tidemq.broker.groups import SubscriptionGroupManager
    from tidemq.broker.locks import RebalanceLockManager
    from tidemq.broker.topics import TopicConfigManager

log = logging.getLogger(__name__)

HEARTBEAT_REGISTER_WAIT = 2.0  # s; clients time a heartbeat out after 3 s


@dataclass(frozen=True, slots=True)
class SubscriptionData:
    """One subscription of a heartbeat's consumer entry, as the client sent it."""

    topic: str
    expression: str  # "*" for every tag
    sub_version: int
    expression_type: str = "TAG"


@dataclass(frozen=True, slots=True)
class ConsumerData:
    """A heartbeat's consumer entry. ``listed`` counts the subscriptions the client listed
    (malformed ones included): the bound applies to what was sent."""

    group: str
    consume_type: str
    message_model: str
    consume_from_where: str
    subscriptions: tuple[SubscriptionData, ...]
    listed: int


@dataclass(frozen=True, slots=True)
class Heartbeat:
    client_id: str  # "" = the caller's address
    language: int
    version: int
    consumers: tuple[ConsumerData, ...]
    producer_groups: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class QueueRef:
    """A message queue as clients name it."""

    topic: str
    broker_name: str
    queue_id: int


@dataclass(frozen=True, slots=True)
class QueueLocks:
    """LOCK_BATCH_MQ / UNLOCK_BATCH_MQ: the queues a group's client takes or gives back."""

    group: str
    client_id: str
    queues: tuple[QueueRef, ...]


@dataclass(frozen=True, slots=True)
class ConsumerConnection:
    client_id: str
    client_addr: str
    language: int
    version: int


@dataclass(frozen=True, slots=True)
class ConsumerConnections:
    """Who consumes a group, and how (GET_CONSUMER_CONNECTION_LIST)."""

    connections: tuple[ConsumerConnection, ...]
    subscriptions: tuple[Subscription, ...]
    consume_type: str
    message_model: str
    consume_from_where: str


class ConsumerService:
    def __init__(
        self,
        *,
        clients: ClientRegistry[Any],
        groups: SubscriptionGroupManager,
        topics: TopicConfigManager,
        creation: ImplicitCreation,
        locks: RebalanceLockManager,
        auto_create_group: Callable[[], bool],
        registration: Callable[[], Awaitable[Any] | None],
    ) -> None:
        self._clients = clients
        self._groups = groups
        self._topics = topics
        self._creation = creation
        self._locks = locks
        # Read per heartbeat: UPDATE_BROKER_CONFIG may switch autoCreateSubscriptionGroup.
        self._auto_create_group = auto_create_group
        # The name-server registration round running now (started by a topic change), if any.
        self._registration = registration

    def heartbeat(self, caller: Caller, channel: ClientConnection, hb: Heartbeat) -> Awaitable[None] | None:
        """Register the caller's groups. None when done; an awaitable to wait for when the
        heartbeat created a retry topic (as Java, it is answered once the name servers know it)."""
        consumers, producers = hb.consumers, hb.producer_groups
        if len(consumers) + len(producers) > MAX_HEARTBEAT_GROUPS:
            raise refused(ResponseCode.SYSTEM_ERROR, f"a heartbeat names {len(consumers) + len(producers)} groups, "
                          f"more than {MAX_HEARTBEAT_GROUPS}")
        for name in (*(cd.group for cd in consumers), *producers):  # nothing registered unless all are valid
            self._creation.check_group_name(name)
        for cd in consumers:
            if cd.listed > MAX_HEARTBEAT_SUBSCRIPTIONS:
                raise refused(ResponseCode.SYSTEM_ERROR, f"consumer group {loggable(cd.group)} subscribes "
                              f"more than {MAX_HEARTBEAT_SUBSCRIPTIONS} topics in one heartbeat")
        full = self._clients.room_for(channel, [cd.group for cd in consumers], list(producers))
        if full is not None:
            raise refused(ResponseCode.SYSTEM_ERROR, full)
        created_topic = False
        for cd in consumers:
            g = self._groups.get(cd.group)
            if g is None and self._auto_create_group():
                g = self._creation.group(cd.group, caller.principal, ResponseCode.SYSTEM_ERROR)
            retry = RETRY_PREFIX + cd.group
            if g is not None and g.retry_queue_nums > 0 and self._topics.get(retry) is None:
                self._creation.retry_topic(retry, caller.principal)
                created_topic = True
        client_id = hb.client_id or caller.peer
        for cd in consumers:
            self._clients.register_consumer(
                cd.group, channel, client_id, hb.language, hb.version,
                cd.consume_type, cd.message_model, cd.consume_from_where,
                [_subscription(sd) for sd in cd.subscriptions],
            )
        for group in producers:
            self._clients.register_producer(group, channel, client_id, hb.language, hb.version)
        return self._registered() if created_topic else None

    async def _registered(self) -> None:
        pending = self._registration()
        if pending is None:
            return
        try:  # shielded: a client that goes away must not cancel the registration round
            await asyncio.wait_for(asyncio.shield(pending), HEARTBEAT_REGISTER_WAIT)
        except TimeoutError:
            log.info("heartbeat answered before the name servers confirmed the new retry topic "
                     "(registration still running after %.1f s)", HEARTBEAT_REGISTER_WAIT)
        except Exception as exc:  # noqa: BLE001 (the consumer is registered; the next round registers the topic)
            log.warning("heartbeat answered although registering its new retry topic failed: %s", exc)

    def unregister(self, channel: ClientConnection, producer_group: str, consumer_group: str) -> None:
        if producer_group:
            self._clients.unregister_producer(producer_group, channel)
        if consumer_group:
            self._clients.unregister_consumer(consumer_group, channel)

    def consumer_ids(self, group: str) -> list[str]:
        """The client ids of the group's consumers (refused when none is online)."""
        info = self._clients.group(group)
        if info is None or not info.channels:
            raise refused(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return info.client_ids()

    def connections(self, group: str) -> ConsumerConnections:
        info = self._clients.group(group)
        if info is None or not info.channels:
            raise refused(ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online")
        return ConsumerConnections(
            tuple(ConsumerConnection(ch.client_id, ch.conn.peer, ch.language, ch.version)
                  for ch in info.channels.values()),
            tuple(info.subscriptions.values()),
            info.consume_type, info.message_model, info.consume_from_where,
        )

    def lock(self, req: QueueLocks) -> tuple[QueueRef, ...]:
        """The queues of ``req`` now held by its client (unknown groups and queues are left out)."""
        locked = self._locks.try_lock(req.group, req.client_id, self._known(req))
        return tuple(QueueRef(t, bn, q) for t, bn, q in locked)

    def unlock(self, req: QueueLocks) -> None:
        self._locks.unlock(req.group, req.client_id, self._known(req))

    def _known(self, req: QueueLocks) -> list[tuple[str, str, int]]:
        if self._groups.get(req.group) is None:
            return []
        mqs = []
        for mq in req.queues:
            tc = self._topics.get(mq.topic)
            if tc is not None and 0 <= mq.queue_id < tc.queue_nums:
                mqs.append((tc.topic_name, mq.broker_name, mq.queue_id))
        return mqs


def _subscription(sd: SubscriptionData) -> Subscription:
    """The registry's subscription; a malformed tag expression is kept as sent, without tag codes."""
    try:
        parsed = parse_tag_expression(sd.expression)
    except SubscriptionParseError:
        parsed = None
    return Subscription(topic=sd.topic, expression=sd.expression, sub_version=sd.sub_version,
                        tag_codes=parsed[1] if parsed else None, expression_type=sd.expression_type)
