"""Queue locks for orderly consumers (LOCK_BATCH_MQ / UNLOCK_BATCH_MQ).

A queue is held by one client of a group; the holder may renew it, anyone may take it once the
holder has not renewed for ``lock_ttl`` seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable

MQKey = tuple[str, str, int]  # topic, brokerName, queueId


class RebalanceLockManager:
    def __init__(self, lock_ttl: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.lock_ttl = lock_ttl
        self.clock = clock
        self._locks: dict[str, dict[MQKey, tuple[str, float]]] = {}

    def try_lock(self, group: str, client_id: str, mqs: list[MQKey]) -> list[MQKey]:
        now = self.clock()
        table = self._locks.setdefault(group, {})
        locked = []
        for mq in mqs:
            holder = table.get(mq)
            if holder is None or holder[0] == client_id or now - holder[1] > self.lock_ttl:
                table[mq] = (client_id, now)
                locked.append(mq)
        return locked

    def unlock(self, group: str, client_id: str, mqs: list[MQKey]) -> None:
        table = self._locks.get(group)
        if not table:
            return
        for mq in mqs:
            holder = table.get(mq)
            if holder is not None and holder[0] == client_id:
                del table[mq]
