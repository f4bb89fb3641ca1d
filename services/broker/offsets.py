"""Committed consumer offsets per (group, topic, queue), persisted in config/consumerOffset.json.

Offsets are the next offset to consume. The table is written every few seconds when it changed
and at shutdown; a crash may lose the last seconds of commits (re-delivery, never loss).

A replicated broker (tidemq.broker.ha.metalog) also collects the commits made since it last
looked (``track_changes`` / ``take_changes``: the latest offset per queue, in a bounded-by-queues
dict) and hears of every removal (``on_drop``), so it can append them to the replicated log.
Changes applied from that log pass ``record=False`` and are neither collected nor heard of.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from tidemq.broker.store.jsonfile import read_json, write_json_atomic

log = logging.getLogger(__name__)


class ConsumerOffsetManager:
    def __init__(self, path: Path) -> None:
        self.path = path
        # "topic@group" -> {queue_id: offset}
        self.table: dict[str, dict[int, int]] = {}
        self.dirty = False
        # (group, topic, queue id) -> offset committed since the last take_changes; None: not tracked.
        self._changed: dict[tuple[str, str, int], int] | None = None
        # (topic or None, group or None) after offsets were removed through drop.
        self.on_drop: Callable[[str | None, str | None], None] | None = None

    def load(self) -> None:
        data = read_json(self.path, None)
        if not data:
            return
        for key, queues in (data.get("offsetTable") or {}).items():
            self.table[key] = {int(q): int(o) for q, o in queues.items()}
        log.info("loaded offsets of %d topic@group pairs from %s", len(self.table), self.path)

    def commit(self, group: str, topic: str, queue_id: int, offset: int, record: bool = True) -> None:
        key = f"{topic}@{group}"
        queues = self.table.get(key)
        if queues is None:
            queues = self.table[key] = {}
        if queues.get(queue_id) != offset:
            queues[queue_id] = offset
            self.dirty = True
            if record and self._changed is not None:
                self._changed[group, topic, queue_id] = offset

    def track_changes(self) -> None:
        """Collect commits from now on, for ``take_changes``."""
        if self._changed is None:
            self._changed = {}

    def take_changes(self) -> list[tuple[str, str, int, int]]:
        """(group, topic, queue id, offset) of every queue committed since the last call."""
        if not self._changed:
            return []
        out = [(g, t, q, o) for (g, t, q), o in self._changed.items()]
        self._changed.clear()
        return out

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
        self.drop(topic, None)

    def delete_group(self, group: str) -> None:
        self.drop(None, group)

    def remove(self, group: str, topic: str, queue_id: int) -> None:
        """Forget one queue's committed offset (a replicated broker undoing a cut commit); not
        recorded."""
        key = f"{topic}@{group}"
        queues = self.table.get(key)
        if queues is not None and queues.pop(queue_id, None) is not None:
            if not queues:
                del self.table[key]
            self.dirty = True
        if self._changed:
            self._changed.pop((group, topic, queue_id), None)

    def drop(self, topic: str | None, group: str | None, record: bool = True) -> None:
        """Remove the offsets of ``topic`` (every group), of ``group`` (every topic), or of the
        group on the topic when both are given; collected commits of them are forgotten too."""
        def hit(t: str, g: str) -> bool:
            return (topic is None or t == topic) and (group is None or g == group)

        for key in [k for k in self.table if hit(*k.rpartition("@")[::2])]:
            del self.table[key]
            self.dirty = True
        if self._changed:
            for ck in [ck for ck in self._changed if hit(ck[1], ck[0])]:
                del self._changed[ck]
        if record and self.on_drop is not None:
            self.on_drop(topic, group)

    def snapshot(self) -> dict[str, object]:
        self.dirty = False
        return {"offsetTable": {k: {str(q): o for q, o in v.items()} for k, v in self.table.items()}}

    @staticmethod
    def write(path: Path, snapshot: dict[str, object]) -> None:
        """Blocking: call from a thread with a snapshot taken on the loop."""
        write_json_atomic(path, snapshot)
