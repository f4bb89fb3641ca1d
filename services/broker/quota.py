"""Bounds on what clients can make a broker create: topics and subscription groups.

RocketMQ creates a group on a consumer's first heartbeat or pull (``autoCreateSubscriptionGroup``),
a ``%RETRY%``/``%DLQ%`` topic for it, and a topic on a first send when ``autoCreateTopicEnable``
is on, with no bound: a client naming a new group per request grows the broker's metadata, its
open files and its name-server registration until it falls over. Here:

- every creation, explicit (admin) or implicit, is refused once the broker holds ``max_topics``
  topics or ``max_groups`` groups;
- implicit creations (not admin requests) are charged to the requesting principal (its ACL
  access key, else its host) and refused past ``implicit_per_window`` within ``window`` seconds.

A refusal is a sentence saying which limit was reached and how to raise it; nothing is created.
Windows are fixed (reset ``window`` seconds after a principal's first creation) and the table of
principals is pruned, so memory stays bounded whatever the clients send.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

MAX_PRINCIPALS = 100_000  # entries kept in the window table before stale ones are pruned


@dataclass(frozen=True, slots=True)
class CreationLimits:
    max_topics: int = 100_000  # broker.conf maxTopicCount
    max_groups: int = 100_000  # broker.conf maxSubscriptionGroupCount
    implicit_per_window: int = 500  # broker.conf implicitCreateLimit (0 = no implicit creation)
    window: float = 60.0  # broker.conf implicitCreateWindowSeconds


class CreationQuota:
    def __init__(self, limits: CreationLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self.clock = clock
        self._windows: dict[str, list[float]] = {}  # principal -> [window start, creations]
        self.created = {"topic": 0, "group": 0}  # implicit creations admitted
        self.refused = {"total": 0, "rate": 0}

    def check_total(self, kind: str, current: int) -> str | None:
        """The refusal when a broker holding ``current`` of ``kind`` may not create another."""
        if kind == "topic":
            limit, key = self.limits.max_topics, "maxTopicCount / --max-topics"
        else:
            limit, key = self.limits.max_groups, "maxSubscriptionGroupCount / --max-groups"
        if current < limit:
            return None
        self.refused["total"] += 1
        return (f"the broker holds {current} {kind}s, its limit ({key} = {limit}); delete unused "
                f"{kind}s or raise the limit")

    def admit(self, principal: str, kind: str, current: int) -> str | None:
        """Charge one implicit creation of a ``kind`` ("topic" or "group") to ``principal``;
        None when admitted, else the refusal (nothing is charged then)."""
        total = self.check_total(kind, current)
        if total is not None:
            return total
        lim = self.limits
        now = self.clock()
        w = self._windows.get(principal)
        if w is None or now - w[0] >= lim.window:
            if len(self._windows) >= MAX_PRINCIPALS:
                self._prune(now)
            w = self._windows[principal] = [now, 0]
        if w[1] >= lim.implicit_per_window:
            self.refused["rate"] += 1
            return (f"{principal} created {w[1]} topics/groups implicitly in the last {lim.window:g} s, "
                    f"the limit (implicitCreateLimit / --implicit-create-limit = {lim.implicit_per_window}); "
                    f"create them with `tidemq admin updateTopic` / `updateSubGroup`, or retry later")
        w[1] += 1
        self.created[kind] += 1
        return None

    def _prune(self, now: float) -> None:
        window = self.limits.window
        stale = [p for p, (start, _n) in self._windows.items() if now - start >= window]
        for p in stale:
            del self._windows[p]
        if len(self._windows) >= MAX_PRINCIPALS:  # all live: forget the oldest half
            for p in sorted(self._windows, key=lambda k: self._windows[k][0])[: MAX_PRINCIPALS // 2]:
                del self._windows[p]
