"""Subscription-group configurations, persisted in config/subscriptionGroup.json.

``on_change`` (set by a replicated broker: tidemq.broker.ha.metalog) hears of every create,
update and delete, after the table changed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from tidemq.bodies import SubscriptionGroupConfig
from tidemq.broker.store.jsonfile import read_json, write_json_atomic

log = logging.getLogger(__name__)

class SubscriptionGroupManager:
    def __init__(self, path: Path, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.clock = clock
        self.groups: dict[str, SubscriptionGroupConfig] = {}
        self.counter = 0
        # (name, config or None when deleted) after each change through put/delete.
        self.on_change: Callable[[str, SubscriptionGroupConfig | None], None] | None = None

    def load(self) -> None:
        data = read_json(self.path, None)
        if not data:
            return
        for name, d in (data.get("subscriptionGroupTable") or {}).items():
            self.groups[name] = SubscriptionGroupConfig.from_json(d)
        self.counter = int((data.get("dataVersion") or {}).get("counter", 0))
        log.info("loaded %d subscription groups from %s", len(self.groups), self.path)

    def get(self, name: str) -> SubscriptionGroupConfig | None:
        return self.groups.get(name)

    def find_or_create(self, name: str, auto_create: bool) -> SubscriptionGroupConfig | None:
        g = self.groups.get(name)
        if g is None and auto_create:
            g = SubscriptionGroupConfig(name)
            self.put(g)
        return g

    def put(self, g: SubscriptionGroupConfig) -> bool:
        if self.groups.get(g.group_name) == g:
            return False
        self.groups[g.group_name] = g
        self.counter += 1
        log.info("subscription group %s set", g.group_name)
        if self.on_change is not None:
            self.on_change(g.group_name, g)
        return True

    def delete(self, name: str) -> bool:
        if self.groups.pop(name, None) is None:
            return False
        self.counter += 1
        log.info("subscription group %s deleted", name)
        if self.on_change is not None:
            self.on_change(name, None)
        return True

    def wrapper(self) -> dict[str, object]:
        return {
            "subscriptionGroupTable": {n: g.to_json() for n, g in self.groups.items()},
            "dataVersion": {"counter": self.counter, "timestamp": int(self.clock() * 1000)},
        }

    def persist(self) -> None:
        """Blocking: call from a thread."""
        write_json_atomic(self.path, self.wrapper())
