"""The client's view of routes: topic -> route, broker name -> addresses, publish rotation.

Pure state, no I/O: :class:`~tidemq.client.instance.ClientInstance` fetches routes and feeds them
in. Invariants: the broker table is the union of the broker data of every cached route (a
broker's addresses are those of its most recent route; which of them is the master is
:attr:`~tidemq.client.route.BrokerData.master_addr`'s rule alone); a route once learned is kept until a
newer one replaces it (a name server that briefly forgets a topic does not stop producers, as in
RocketMQ's clients); the number of cached topics is bounded.
"""

from __future__ import annotations

import random

from tidemq.client.route import BrokerData, MessageQueue, TopicRouteData

MAX_TOPICS = 10_000


class RouteCache:
    def __init__(self, max_topics: int = MAX_TOPICS, seed: int | None = None) -> None:
        self.max_topics = max_topics
        self._routes: dict[str, TopicRouteData] = {}
        self._publish: dict[str, list[MessageQueue]] = {}
        self._brokers: dict[str, BrokerData] = {}
        self._rr: dict[str, int] = {}
        self._rand = random.Random(seed)

    # routes ------------------------------------------------------------------------------------
    def topics(self) -> list[str]:
        return list(self._routes)

    def get(self, topic: str) -> TopicRouteData | None:
        return self._routes.get(topic)

    def update(self, topic: str, route: TopicRouteData) -> set[str]:
        """Store ``route``; return the broker addresses that were not known before."""
        if topic not in self._routes and len(self._routes) >= self.max_topics:
            oldest = next(iter(self._routes))
            self.forget(oldest)
        before = self.all_addrs()
        self._routes[topic] = route
        self._publish[topic] = route.publish_queues(topic)
        for bd in route.broker_datas:
            self._brokers[bd.broker_name] = bd
        return self.all_addrs() - before

    def forget(self, topic: str) -> None:
        self._routes.pop(topic, None)
        self._publish.pop(topic, None)
        self._rr.pop(topic, None)

    # brokers -----------------------------------------------------------------------------------
    def master_addr(self, broker_name: str) -> str | None:
        bd = self._brokers.get(broker_name)
        return None if bd is None else bd.master_addr

    def master_addrs(self) -> dict[str, str]:
        return {name: bd.master_addr for name, bd in self._brokers.items() if bd.master_addr}

    def all_addrs(self) -> set[str]:
        return {a for bd in self._brokers.values() for a in bd.broker_addrs.values()}

    def broker_name_of(self, addr: str) -> str | None:
        for name, bd in self._brokers.items():
            if addr in bd.broker_addrs.values():
                return name
        return None

    # publishing --------------------------------------------------------------------------------
    def publish_queues(self, topic: str) -> list[MessageQueue]:
        return list(self._publish.get(topic, ()))

    def select_queue(self, topic: str, avoid_broker: str | None = None) -> MessageQueue | None:
        """Next publish queue round-robin, preferring one not on ``avoid_broker``.

        The rotation starts at a random place per topic so that many producers spread out.
        """
        queues = self._publish.get(topic)
        if not queues:
            return None
        n = len(queues)
        index = self._rr.get(topic)
        if index is None:
            index = self._rand.randrange(n)
        for step in range(n):
            mq = queues[(index + step) % n]
            if avoid_broker is None or mq.broker_name != avoid_broker:
                self._rr[topic] = index + step + 1
                return mq
        mq = queues[index % n]
        self._rr[topic] = index + 1
        return mq
