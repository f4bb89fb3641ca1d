"""Registry of connected producers and consumers, fed by heartbeats.

A client is identified by its connection, a hashable value of the front-end's own type (``C``;
the remoting front-end's :class:`~tidemq.remoting.Connection`). Consumers silent for ``expiry``
seconds, or whose connection closed, leave their group; when a group's membership changes, every
remaining member is told through the front-end's ``notify`` (remoting: a oneway
NOTIFY_CONSUMER_IDS_CHANGED) so it rebalances at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from tidemq.message import java_hash

log = logging.getLogger(__name__)


class ClientConnection(Protocol):
    """What the registry needs of a client's connection: a key, and the address it came from."""

    @property
    def peer(self) -> str: ...  # "host:port"

    def __hash__(self) -> int: ...


C = TypeVar("C", bound=ClientConnection)  # a client's connection, as the front-end serving it knows it


class SubscriptionParseError(ValueError):
    pass


def parse_tag_expression(expression: str | None) -> tuple[frozenset[str], frozenset[int]] | None:
    """``*``/empty -> None (all). ``A || B`` -> (tags, java hash codes)."""
    if expression is None:
        return None
    expr = expression.strip()
    if not expr or expr == "*":
        return None
    tags = frozenset(t.strip() for t in expr.split("||") if t.strip())
    if not tags:
        raise SubscriptionParseError(f"subscription {expression!r} names no tag")
    return tags, frozenset(java_hash(t) for t in tags)


@dataclass(slots=True)
class Subscription:
    topic: str
    expression: str
    sub_version: int
    tag_codes: frozenset[int] | None
    expression_type: str = "TAG"

    def to_json(self) -> dict[str, object]:
        parsed = parse_tag_expression(self.expression)
        tags = sorted(parsed[0]) if parsed else []
        return {
            "topic": self.topic,
            "subString": self.expression,
            "tagsSet": tags,
            "codeSet": sorted(parsed[1]) if parsed else [],
            "subVersion": self.sub_version,
            "expressionType": self.expression_type,
            "classFilterMode": False,
        }


@dataclass(slots=True)
class ClientChannel(Generic[C]):
    conn: C
    client_id: str
    language: int
    version: int
    last_update: float


@dataclass(slots=True)
class ConsumerGroupInfo(Generic[C]):
    group: str
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    channels: dict[C, ClientChannel[C]] = field(default_factory=dict)
    subscriptions: dict[str, Subscription] = field(default_factory=dict)

    def client_ids(self) -> list[str]:
        return [c.client_id for c in self.channels.values()]


# Bounds on what heartbeats can make the registry hold (a client names groups and topics freely):
MAX_HEARTBEAT_GROUPS = 256  # consumer + producer entries in one heartbeat
MAX_HEARTBEAT_SUBSCRIPTIONS = 1024  # subscriptions of one consumer entry
MAX_CONNECTION_GROUPS = 256  # groups one connection is registered in
MAX_REGISTRATIONS = 200_000  # (group, connection) registrations on the broker
MAX_GROUP_SUBSCRIPTIONS = 4096  # topics a consumer group's subscription table keeps


class ClientRegistry(Generic[C]):
    def __init__(self, expiry: float = 120.0, clock: Callable[[], float] = time.monotonic, *,
                 notify: Callable[[C, str], None] | None = None) -> None:
        self.expiry = expiry
        self.clock = clock
        self.consumers: dict[str, ConsumerGroupInfo[C]] = {}
        self.producers: dict[str, dict[C, ClientChannel[C]]] = {}
        # Tells a member that its group changed (conn, group); None: nobody is told.
        self._notify_member = notify
        # Whether a group's members are told (its notifyConsumerIdsChangedEnable setting).
        self.notify_enabled: Callable[[str], bool] = lambda _g: True
        self._per_conn: dict[C, int] = {}  # registrations per connection
        self.registrations = 0

    def room_for(self, conn: C, consumer_groups: list[str], producer_groups: list[str]) -> str | None:
        """Why registering ``conn`` in these groups would pass a bound, else None."""
        new = sum(1 for g in consumer_groups if conn not in getattr(self.consumers.get(g), "channels", {}))
        new += sum(1 for g in producer_groups if conn not in self.producers.get(g, {}))
        mine = self._per_conn.get(conn, 0)
        if mine + new > MAX_CONNECTION_GROUPS:
            return (f"this connection would be registered in {mine + new} groups, more than "
                    f"{MAX_CONNECTION_GROUPS}; use fewer groups per client instance")
        if self.registrations + new > MAX_REGISTRATIONS:
            return (f"the broker holds {self.registrations} client registrations, its limit "
                    f"{MAX_REGISTRATIONS}; retry later")
        return None

    def _count(self, conn: C, delta: int) -> None:
        n = self._per_conn.get(conn, 0) + delta
        if n > 0:
            self._per_conn[conn] = n
        else:
            self._per_conn.pop(conn, None)
        self.registrations += delta

    # consumers --------------------------------------------------------------------------------
    def register_consumer(
        self,
        group: str,
        conn: C,
        client_id: str,
        language: int,
        version: int,
        consume_type: str,
        message_model: str,
        consume_from_where: str,
        subscriptions: list[Subscription],
    ) -> bool:
        """Record a consumer heartbeat. Return True when the group's membership changed."""
        info = self.consumers.get(group)
        if info is None:
            info = self.consumers[group] = ConsumerGroupInfo(group)
        info.consume_type = consume_type
        info.message_model = message_model
        info.consume_from_where = consume_from_where
        now = self.clock()
        ch = info.channels.get(conn)
        changed = ch is None
        if ch is None:
            info.channels[conn] = ClientChannel(conn, client_id, language, version, now)
            self._count(conn, 1)
            log.info("consumer %s joined group %s (%d members)", client_id, group, len(info.channels))
        else:
            ch.last_update = now
            ch.client_id = client_id
        for sub in subscriptions:
            old = info.subscriptions.get(sub.topic)
            if old is None and len(info.subscriptions) >= MAX_GROUP_SUBSCRIPTIONS:
                continue  # bounded; the group's real topics were registered long before
            if old is None or old.sub_version < sub.sub_version or old.expression != sub.expression:
                info.subscriptions[sub.topic] = sub
        if changed:
            self._notify(info)
        return changed

    def unregister_consumer(self, group: str, conn: C) -> bool:
        info = self.consumers.get(group)
        if info is None or info.channels.pop(conn, None) is None:
            return False
        self._count(conn, -1)
        log.info("a consumer left group %s (%d members)", group, len(info.channels))
        if not info.channels:
            del self.consumers[group]
        else:
            self._notify(info)
        return True

    def register_producer(self, group: str, conn: C, client_id: str, language: int, version: int) -> None:
        chans = self.producers.setdefault(group, {})
        ch = chans.get(conn)
        if ch is None:
            chans[conn] = ClientChannel(conn, client_id, language, version, self.clock())
            self._count(conn, 1)
        else:
            ch.last_update = self.clock()

    def unregister_producer(self, group: str, conn: C) -> None:
        chans = self.producers.get(group)
        if chans is not None:
            if chans.pop(conn, None) is not None:
                self._count(conn, -1)
            if not chans:
                del self.producers[group]

    def connection_closed(self, conn: C) -> None:
        for group in list(self.consumers):
            self.unregister_consumer(group, conn)
        for group in list(self.producers):
            self.unregister_producer(group, conn)

    def scan_expired(self) -> int:
        deadline = self.clock() - self.expiry
        dropped = 0
        for group, info in list(self.consumers.items()):
            stale = [c for c, ch in info.channels.items() if ch.last_update < deadline]
            for conn in stale:
                self.unregister_consumer(group, conn)
                dropped += 1
        for group, chans in list(self.producers.items()):
            for conn in [c for c, ch in chans.items() if ch.last_update < deadline]:
                self.unregister_producer(group, conn)
                dropped += 1
        if dropped:
            log.info("dropped %d clients silent for %.0f s", dropped, self.expiry)
        return dropped

    def group(self, group: str) -> ConsumerGroupInfo[C] | None:
        return self.consumers.get(group)

    def subscription(self, group: str, topic: str) -> Subscription | None:
        info = self.consumers.get(group)
        return None if info is None else info.subscriptions.get(topic)

    def _notify(self, info: ConsumerGroupInfo[C]) -> None:
        notify = self._notify_member
        if notify is None or not self.notify_enabled(info.group):
            return
        for conn, ch in list(info.channels.items()):
            try:
                notify(conn, info.group)
            except Exception as exc:  # noqa: BLE001 (any failure: connection_closed cleans up a closing connection)
                log.debug("could not notify client %s of group %s: %s", ch.client_id, info.group, exc)
