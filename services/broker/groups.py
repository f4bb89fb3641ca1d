"""Subscription-group configurations, persisted in config/subscriptionGroup.json."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from tidemq.broker.store.jsonfile import read_json, write_json_atomic

log = logging.getLogger(__name__)

_WIRE = {
    "group_name": "groupName",
    "consume_enable": "consumeEnable",
    "consume_from_min_enable": "consumeFromMinEnable",
    "consume_broadcast_enable": "consumeBroadcastEnable",
    "retry_queue_nums": "retryQueueNums",
    "retry_max_times": "retryMaxTimes",
    "broker_id": "brokerId",
    "which_broker_when_consume_slowly": "whichBrokerWhenConsumeSlowly",
    "notify_consumer_ids_changed_enable": "notifyConsumerIdsChangedEnable",
}


@dataclass(frozen=True, slots=True)
class SubscriptionGroupConfig:
    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True

    def to_json(self) -> dict[str, object]:
        return {_WIRE[k]: v for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, d: dict) -> "SubscriptionGroupConfig":
        kwargs: dict[str, object] = {}
        defaults = {f.name: f.default for f in fields(cls)}
        for py, wire in _WIRE.items():
            if wire in d and d[wire] is not None:
                default = defaults[py]
                v = d[wire]
                if isinstance(default, bool):
                    v = v if isinstance(v, bool) else str(v).lower() in ("true", "1")
                elif isinstance(default, int):
                    v = int(v)
                else:
                    v = str(v)
                kwargs[py] = v
        if "group_name" not in kwargs:
            raise ValueError("subscription group config has no groupName")
        return cls(**kwargs)  # type: ignore[arg-type]


class SubscriptionGroupManager:
    def __init__(self, path: Path, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.clock = clock
        self.groups: dict[str, SubscriptionGroupConfig] = {}
        self.counter = 0

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
        return True

    def delete(self, name: str) -> bool:
        if self.groups.pop(name, None) is None:
            return False
        self.counter += 1
        return True

    def wrapper(self) -> dict[str, object]:
        return {
            "subscriptionGroupTable": {n: g.to_json() for n, g in self.groups.items()},
            "dataVersion": {"counter": self.counter, "timestamp": int(self.clock() * 1000)},
        }

    def persist(self) -> None:
        """Blocking: call from a thread."""
        write_json_atomic(self.path, self.wrapper())
