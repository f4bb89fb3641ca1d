"""Route refreshes asked for by faults: a failed send or pull re-reads its topic's route at once,
so a client follows a broker group's failover (issue 17: the new master registers as brokerId 0
at another address) without waiting for the periodic refresh (``route_refresh_interval``, 30 s).

The bound that keeps a storm of failures from hammering the name servers: per topic, at most one
refresh is in flight (every fault during it shares it), and refreshes are paid for from a bucket
of ``burst`` credits refilled at one per ``min_interval`` seconds: a fault finding less than a
whole credit asks for nothing. With ``burst`` 1 a new refresh starts no sooner than
``min_interval`` after the previous one started; the client instance allows a burst of
``BURST``, so a failover is seen within ~0.1 s of the new master registering (a waiting send
looks again every ``QUICK_LOOK`` s while credit lasts), at the same long-run rate. The refresh itself is the instance's route lookup (the cached route survives a failed
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

MIN_INTERVAL = 0.5  # s: one fault-driven refresh of a topic per this, in the long run
BURST = 3  # refreshes of a topic in quick succession (a failover's first half second)
QUICK_LOOK = 0.1  # s between the looks of a send waiting for a new master while credit lasts
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
        burst: int = 1,
    ) -> None:
        self._fetch = fetch
        self.min_interval = min_interval
        self.burst = burst
        self.clock = clock
        self._spawn = spawn
        self.max_topics = max_topics
        self._in_flight: dict[str, asyncio.Future[None]] = {}
        # topic -> (credit left when its last refresh started, that clock time)
        self._started: dict[str, tuple[float, float]] = {}
        self.refreshes = 0  # refreshes started (the name server requests this bound allowed)

    def request(self, topic: str) -> asyncio.Future[None] | None:
        """The refresh of ``topic`` in flight, else one started now; None when the topic's credit
        is short of a whole refresh (the route it has is as fresh as the bound allows)."""
        running = self._in_flight.get(topic)
        if running is not None:
            return running
        now = self.clock()
        last = self._started.pop(topic, None)
        credit = float(self.burst) if last is None else \
            min(float(self.burst), last[0] + (now - last[1]) / self.min_interval)
        if credit < 1.0:
            assert last is not None
            self._started[topic] = last
            return None
        if len(self._started) >= self.max_topics:
            del self._started[next(iter(self._started))]
        self._started[topic] = (credit - 1.0, now)
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
