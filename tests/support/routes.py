"""Waiting for a topic's route to reach the name server (brokers register asynchronously).

A route counts once it lists ``queues`` publish queues of the topic; until the first registration
the name server answers TOPIC_NOT_EXIST (AdminError), which counts as "not yet".
"""

from __future__ import annotations

from tests.support.waiting import wait_until, wait_until_sync
from tidemq.client import Admin
from tidemq.client.sync import SyncAdmin
from tidemq.errors import AdminError


def _what(topic: str, queues: int) -> str:
    return f"the name server to route {queues} publish queues of topic {topic}"


async def wait_for_route(admin: Admin, topic: str, queues: int, timeout: float = 10.0,
                         interval: float = 0.1) -> None:
    """Return once the name servers route ``queues`` publish queues of ``topic``."""
    async def routed() -> bool:
        try:
            route = await admin.topic_route(topic)
        except AdminError:
            return False
        return len(route.publish_queues(topic)) == queues

    await wait_until(routed, _what(topic, queues), timeout=timeout, interval=interval)


def wait_for_route_sync(admin: SyncAdmin, topic: str, queues: int, timeout: float = 10.0,
                        interval: float = 0.1) -> None:
    """Blocking `wait_for_route`, through a SyncAdmin."""
    def routed() -> bool:
        try:
            route = admin.topic_route(topic)
        except AdminError:
            return False
        return len(route.publish_queues(topic)) == queues

    wait_until_sync(routed, _what(topic, queues), timeout=timeout, interval=interval)
