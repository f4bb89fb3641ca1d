"""Latency fault avoidance for producers: RocketMQ 4.x's MQFaultStrategy + LatencyFaultTolerance.

Every send attempt reports its broker and latency. The latency falls into a bucket of
:data:`LATENCY_MAX_MS` and makes the broker *not available* for the matching entry of
:data:`NOT_AVAILABLE_MS` (50/100/550/1000/2000/3000/15000 ms -> 0/0/30/60/120/180/600 s). A failed
attempt is *isolation*: it counts as :data:`ISOLATION_LATENCY_MS` (30 s) of latency, which lands in
the last bucket, so the broker is avoided for 600 s, exactly as Java's ``updateFaultItem(...,
isolation=true)`` does.

Queue choice, when enabled: round-robin over the topic's publish queues from a per-topic counter,
skipping queues of the broker that failed last and of brokers not available. When none is left,
the *best* broker of the fault table (available first, then lowest latency, then earliest
recovery; one of the better half, in turn) is used. When disabled: plain round-robin that only
avoids the broker that failed last. Pure state with an injected clock; no I/O.

A send answered SYSTEM_BUSY (broker flow control) is retried after :func:`busy_backoff`, until the
send's deadline, without counting against the retry budget.

Invariants: the fault table holds at most ``max_brokers`` entries (the oldest recovery is evicted
first); per-topic counters at most ``max_topics``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tidemq.client.route import MessageQueue

LATENCY_MAX_MS: tuple[int, ...] = (50, 100, 550, 1000, 2000, 3000, 15000)
NOT_AVAILABLE_MS: tuple[int, ...] = (0, 0, 30_000, 60_000, 120_000, 180_000, 600_000)
ISOLATION_LATENCY_MS = 30_000
MAX_BROKERS = 4096
MAX_TOPICS = 10_000


def not_available_ms(latency_ms: float, latency_max: Sequence[int] = LATENCY_MAX_MS,
                     durations: Sequence[int] = NOT_AVAILABLE_MS) -> int:
    """The not-available duration for a latency: the entry of the largest bucket it reaches."""
    for bound, duration in zip(reversed(latency_max), reversed(durations)):
        if latency_ms >= bound:
            return duration
    return 0


BUSY_BACKOFF_FIRST = 0.05  # s before the first retry of a send answered SYSTEM_BUSY
BUSY_BACKOFF_MAX = 1.0


def busy_backoff(busy_answers: int, rand: Callable[[], float] = random.random) -> float:
    """Seconds to wait before retrying a send refused with SYSTEM_BUSY for the ``busy_answers``-th
    time in a row: exponential from 50 ms, capped at 1 s, with full jitter in its upper half so
    clients refused together do not come back together. (A SYSTEM_BUSY send was not stored, so
    retrying it cannot duplicate it.)"""
    base = min(BUSY_BACKOFF_MAX, BUSY_BACKOFF_FIRST * (2 ** max(0, busy_answers - 1)))
    return base * (0.5 + 0.5 * rand())


@dataclass(slots=True)
class FaultItem:
    broker: str
    latency_ms: float
    available_at_ms: float  # clock time (ms) from which the broker is available again

    def available(self, now_ms: float) -> bool:
        return now_ms >= self.available_at_ms

    def rank(self, now_ms: float) -> tuple[bool, float, float]:
        """Sort key: available first, then lower latency, then earlier recovery."""
        return (not self.available(now_ms), self.latency_ms, self.available_at_ms)


class LatencyFaultTolerance:
    """Broker name -> latest latency and the time it is available again."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 max_brokers: int = MAX_BROKERS) -> None:
        self.clock = clock
        self.max_brokers = max_brokers
        self._items: dict[str, FaultItem] = {}
        self._which = 0

    def _now_ms(self) -> float:
        return self.clock() * 1000.0

    def update(self, broker: str, latency_ms: float, not_available_for_ms: float) -> None:
        until = self._now_ms() + not_available_for_ms
        item = self._items.get(broker)
        if item is None:
            if len(self._items) >= self.max_brokers:
                oldest = min(self._items.values(), key=lambda i: i.available_at_ms)
                del self._items[oldest.broker]
            self._items[broker] = FaultItem(broker, latency_ms, until)
        else:
            item.latency_ms = latency_ms
            item.available_at_ms = until

    def is_available(self, broker: str) -> bool:
        item = self._items.get(broker)
        return item is None or item.available(self._now_ms())

    def remove(self, broker: str) -> None:
        self._items.pop(broker, None)

    def item(self, broker: str) -> FaultItem | None:
        return self._items.get(broker)

    def pick_one_at_least(self) -> str | None:
        """One of the better half of the known brokers, taken in turn (the best if only one)."""
        if not self._items:
            return None
        now = self._now_ms()
        ranked = sorted(self._items.values(), key=lambda i: i.rank(now))
        half = len(ranked) // 2
        if half <= 0:
            return ranked[0].broker
        self._which += 1
        return ranked[self._which % half].broker


class FaultStrategy:
    """Chooses the queue of each send attempt and learns from its outcome (one per producer)."""

    def __init__(
        self,
        enabled: bool = True,
        clock: Callable[[], float] = time.monotonic,
        latency_max_ms: Sequence[int] = LATENCY_MAX_MS,
        not_available_ms: Sequence[int] = NOT_AVAILABLE_MS,
        seed: int | None = None,
        max_topics: int = MAX_TOPICS,
    ) -> None:
        if len(latency_max_ms) != len(not_available_ms):
            raise ValueError("latency_max_ms and not_available_ms must have the same length")
        self.enabled = enabled
        self.clock = clock
        self.latency_max_ms = tuple(latency_max_ms)
        self.not_available_ms = tuple(not_available_ms)
        self._min_latency_bound = min(self.latency_max_ms, default=float("inf"))
        self.tolerance = LatencyFaultTolerance(clock)
        self.max_topics = max_topics
        self._index: dict[str, int] = {}
        self._rand = random.Random(seed)

    def _next(self, topic: str, n: int) -> int:
        index = self._index.get(topic)
        if index is None:
            if len(self._index) >= self.max_topics:
                del self._index[next(iter(self._index))]
            index = self._rand.randrange(n)
        self._index[topic] = index + 1
        return index

    def select(self, topic: str, queues: Sequence[MessageQueue],
               last_broker: str | None = None) -> MessageQueue | None:
        """The queue for the next attempt of a send to ``topic`` (None: no queue at all)."""
        n = len(queues)
        if n == 0:
            return None
        index = self._next(topic, n)
        if not self.enabled:
            for step in range(n):
                mq = queues[(index + step) % n]
                if mq.broker_name != last_broker:
                    return mq
            return queues[index % n]
        tol = self.tolerance
        for step in range(n):
            mq = queues[(index + step) % n]
            if mq.broker_name != last_broker and tol.is_available(mq.broker_name):
                return mq
        best = tol.pick_one_at_least()
        of_best = [mq for mq in queues if mq.broker_name == best]
        if of_best:
            return of_best[index % len(of_best)]
        if best is not None:
            tol.remove(best)  # no longer serves this topic
        return queues[index % n]

    def report(self, broker: str, latency_ms: float, isolation: bool = False) -> None:
        """Record an attempt's outcome: its latency, or ``isolation`` for a failure."""
        if not self.enabled:
            return
        basis = ISOLATION_LATENCY_MS if isolation else latency_ms
        if basis < self._min_latency_bound:  # hot path: a normal, fast send
            duration = 0
        else:
            duration = not_available_ms(basis, self.latency_max_ms, self.not_available_ms)
        self.tolerance.update(broker, latency_ms, duration)

    def now(self) -> float:
        return self.clock()
