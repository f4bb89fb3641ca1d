"""The client's view of routes: topic -> route, broker name -> addresses, publish queues.

Pure state, no I/O (which publish queue a send takes is :class:`~tidemq.client.fault.FaultStrategy`'s
choice): :class:`~tidemq.client.instance.ClientInstance` fetches routes and feeds them
in. Invariants: the broker table is the union of the broker data of every cached route (a
broker's addresses are those of its most recent route; which of them is the master is
:attr:`~tidemq.client.route.BrokerData.master_addr`'s rule alone); a route once learned is kept until a
newer one replaces it (a name server that briefly forgets a topic does not stop producers, as in
RocketMQ's clients); the number of cached topics is bounded.
"""

from __future__ import annotations

from tidemq.client.route import BrokerData, MessageQueue, TopicRouteData

MAX_TOPICS = 10_000


class RouteCache:
    def __init__(self, max_topics: int = MAX_TOPICS) -> None:
        self.max_topics = max_topics
        self._routes: dict[str, TopicRouteData] = {}
        self._publish: dict[str, list[MessageQueue]] = {}
        self._brokers: dict[str, BrokerData] = {}

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

    # brokers -----------------------------------------------------------------------------------
    def master_addr(self, broker_name: str) -> str | None:
        bd = self._brokers.get(broker_name)
        return None if bd is None else bd.master_addr

    def read_addr(self, broker_name: str) -> str | None:
        """Where reads of ``broker_name`` go: its master, else its lowest-id follower."""
        bd = self._brokers.get(broker_name)
        return None if bd is None else bd.any_addr()

    def master_addrs(self) -> dict[str, str]:
        return {name: bd.master_addr for name, bd in self._brokers.items() if bd.master_addr}

    def all_addrs(self) -> set[str]:
        return {a for bd in self._brokers.values() for a in bd.broker_addrs.values()}

    # publishing --------------------------------------------------------------------------------
    def publish_queues(self, topic: str) -> list[MessageQueue]:
        return list(self._publish.get(topic, ()))
