"""Route refreshes asked for by faults: a failed send or pull re-reads its topic's route at once,
so a client follows a broker group's failover (issue 17: the new master registers as brokerId 0
at another address) without waiting for the periodic refresh (``route_refresh_interval``, 30 s).

The bound that keeps a storm of failures from hammering the name servers: per topic, at most one
refresh is in flight (every fault during it shares it), and a new one starts no sooner than
``min_interval`` seconds after the previous one started; a fault inside that window asks for
nothing. The refresh itself is the instance's route lookup (the cached route survives a failed
or empty answer), run as a task of the instance so that closing it cancels the refresh; a waiter
that gives up (its send's deadline) leaves the refresh running for the others.

Invariants: at most ``max_topics`` topics are remembered (the least recently refreshed is
forgotten first, which at worst allows it one early refresh); time is the injected monotonic
clock, in seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from tidemq.errors import TideMQError

log = logging.getLogger(__name__)

MIN_INTERVAL = 0.5  # s between two fault-driven refreshes of one topic
MAX_TOPICS = 10_000

Spawn = Callable[[Awaitable[None]], "asyncio.Future[None]"]


class FaultRefresher:
    """Starts, shares and rate-limits the fault-driven route refreshes of one client instance."""

    def __init__(
        self,
        fetch: Callable[[str], Awaitable[object]],
        min_interval: float = MIN_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        spawn: Spawn = asyncio.ensure_future,
        max_topics: int = MAX_TOPICS,
    ) -> None:
        self._fetch = fetch
        self.min_interval = min_interval
        self.clock = clock
        self._spawn = spawn
        self.max_topics = max_topics
        self._in_flight: dict[str, asyncio.Future[None]] = {}
        self._started: dict[str, float] = {}  # topic -> clock time its last refresh started
        self.refreshes = 0  # refreshes started (the name server requests this bound allowed)

    def request(self, topic: str) -> asyncio.Future[None] | None:
        """The refresh of ``topic`` in flight, else one started now; None when the last one
        started less than ``min_interval`` ago (the route it brought is as fresh as allowed)."""
        running = self._in_flight.get(topic)
        if running is not None:
            return running
        now = self.clock()
        last = self._started.pop(topic, None)
        if last is not None and now - last < self.min_interval:
            self._started[topic] = last
            return None
        if len(self._started) >= self.max_topics:
            del self._started[next(iter(self._started))]
        self._started[topic] = now
        self.refreshes += 1
        task = self._spawn(self._run(topic))
        self._in_flight[topic] = task
        task.add_done_callback(lambda _t: self._in_flight.pop(topic, None))
        return task

    async def refresh(self, topic: str, timeout: float) -> bool:
        """Ask for a refresh of ``topic`` and wait up to ``timeout`` s for it; True when one ran
        to its end (whether or not the route changed), False when the bound allowed none or the
        wait ran out."""
        task = self.request(topic)
        if task is None or timeout <= 0:
            return False
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    async def _run(self, topic: str) -> None:
        try:
            await self._fetch(topic)
        except TideMQError as exc:  # the next fault (after min_interval) tries again
            log.warning("route refresh of topic %s after a failed request failed: %s", topic, exc)
