"""Waiting for a topic's route to reach the name server (brokers register asynchronously)."""

from __future__ import annotations

import asyncio
import time

from tidemq.client import Admin
from tidemq.errors import AdminError


async def wait_for_route(admin: Admin, topic: str, queues: int, timeout: float = 10.0,
                         interval: float = 0.1) -> None:
    """Return once the name servers route ``queues`` publish queues of ``topic``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            route = await admin.topic_route(topic)
        except AdminError:
            route = None
        if route is not None and len(route.publish_queues(topic)) == queues:
            return
        assert time.monotonic() < deadline, f"topic {topic} never got {queues} queues in its route"
        await asyncio.sleep(interval)
