"""Committed consumer offsets per (group, topic, queue), persisted in config/consumerOffset.json.

Offsets are the next offset to consume. The table is written every few seconds when it changed
and at shutdown; a crash may lose the last seconds of commits (re-delivery, never loss).
"""

from __future__ import annotations

import logging
from pathlib import Path

from tidemq.broker.store.jsonfile import read_json, write_json_atomic

log = logging.getLogger(__name__)


class ConsumerOffsetManager:
    def __init__(self, path: Path) -> None:
        self.path = path
        # "topic@group" -> {queue_id: offset}
        self.table: dict[str, dict[int, int]] = {}
        self.dirty = False

    def load(self) -> None:
        data = read_json(self.path, None)
        if not data:
            return
        for key, queues in (data.get("offsetTable") or {}).items():
            self.table[key] = {int(q): int(o) for q, o in queues.items()}
        log.info("loaded offsets of %d topic@group pairs from %s", len(self.table), self.path)

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        key = f"{topic}@{group}"
        queues = self.table.get(key)
        if queues is None:
            queues = self.table[key] = {}
        if queues.get(queue_id) != offset:
            queues[queue_id] = offset
            self.dirty = True

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        queues = self.table.get(f"{topic}@{group}")
        return None if queues is None else queues.get(queue_id)

    def offsets(self, group: str, topic: str) -> dict[int, int]:
        return dict(self.table.get(f"{topic}@{group}", {}))

    def _pairs(self) -> list[tuple[str, str]]:
        """(topic, group) of every table key, in table order."""
        return [(t, g) for t, _, g in (key.rpartition("@") for key in self.table)]

    def topics_of_group(self, group: str) -> list[str]:
        return [t for t, g in self._pairs() if g == group]

    def delete_topic(self, topic: str) -> None:
        for key in [k for k in self.table if k.rpartition("@")[0] == topic]:
            del self.table[key]
            self.dirty = True

    def delete_group(self, group: str) -> None:
        for key in [k for k in self.table if k.rpartition("@")[2] == group]:
            del self.table[key]
            self.dirty = True

    def snapshot(self) -> dict[str, object]:
        self.dirty = False
        return {"offsetTable": {k: {str(q): o for q, o in v.items()} for k, v in self.table.items()}}

    @staticmethod
    def write(path: Path, snapshot: dict[str, object]) -> None:
        """Blocking: call from a thread with a snapshot taken on the loop."""
        write_json_atomic(path, snapshot)
