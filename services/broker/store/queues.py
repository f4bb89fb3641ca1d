"""The table of consume queues of a store: topic -> queueId -> ConsumeQueue.

Invariant: a queue exists in the table iff it has (or had, since load) a directory under
``consumequeue/<topic>/<queueId>``; ``delete_topic`` removes a topic's entries before its files go.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

from tidemq.broker.store.consume_queue import ConsumeQueue
from tidemq.broker.store.mapped_file import MappedFile

log = logging.getLogger(__name__)


class QueueTable:
    def __init__(self, root: Path, units_per_file: int, dirty: set[MappedFile], new_dirs: set[Path]) -> None:
        self.root = root
        self.units_per_file = units_per_file
        self.by_topic: dict[str, dict[int, ConsumeQueue]] = {}
        self._dirty = dirty
        self._new_dirs = new_dirs

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        qs = self.by_topic.get(topic)
        return qs.get(queue_id) if qs else None

    # Hot path (bench/produce_consume.py): two dict lookups per put.
    def get_or_create(self, topic: str, queue_id: int, load: bool = False) -> ConsumeQueue:
        qs = self.by_topic.get(topic)
        if qs is None:
            qs = self.by_topic[topic] = {}
        cq = qs.get(queue_id)
        if cq is None:
            cq = ConsumeQueue(self.root, topic, queue_id, self.units_per_file, self._dirty, self._new_dirs)
            if load:
                cq.load()
            qs[queue_id] = cq
        return cq

    def __iter__(self) -> Iterator[ConsumeQueue]:
        for qs in self.by_topic.values():
            yield from qs.values()

    def __len__(self) -> int:
        return sum(len(qs) for qs in self.by_topic.values())

    def load_all(self, has_data: bool) -> bool:
        """Map every consume queue (blocking). True when one must be rebuilt from the start of
        the CommitLog: the whole directory, or a queue's files, were deleted while data exists."""
        rebuild = False
        if not self.root.exists():
            rebuild = has_data
            self.root.mkdir(parents=True)
        for topic_dir in sorted(p for p in self.root.iterdir() if p.is_dir()):
            if topic_dir.name.startswith(".deleted-"):  # a delete interrupted by a crash
                shutil.rmtree(topic_dir, ignore_errors=True)
                continue
            for qdir in sorted(p for p in topic_dir.iterdir() if p.is_dir() and p.name.isdigit()):
                cq = self.get_or_create(topic_dir.name, int(qdir.name), load=True)
                if not cq.files and has_data:
                    log.warning("consume queue %s has no files; rebuilding it from the commitlog", qdir)
                    rebuild = True
        if rebuild:
            log.warning("rebuilding consume queues from the start of the commitlog")
        return rebuild

    def truncate_past(self, end: int) -> list[MappedFile]:
        """Drop units whose record ends beyond CommitLog offset ``end`` (recovery)."""
        gone: list[MappedFile] = []
        for cq in self:
            cut = cq.first_offset_ending_after(end)
            if cut < cq.max_offset:
                log.warning("consume queue %s/%d: dropping offsets %d..%d that point past the "
                            "commitlog end %d", cq.topic, cq.queue_id, cut, cq.max_offset - 1, end)
                gone += cq.truncate_to(cut)
        return gone

    def detach_below(self, phys_min: int) -> list[MappedFile]:
        gone: list[MappedFile] = []
        for cq in self:
            gone += cq.detach_below(phys_min)
        return gone

    def drop_topic(self, topic: str) -> list[MappedFile] | None:
        """Forget a topic's queues; returns their files (None when the topic had none)."""
        qs = self.by_topic.pop(topic, None)
        if not qs:
            return None
        files = [f for cq in qs.values() for f in cq.detach_all()]
        self._dirty.difference_update(files)
        return files

    def close(self) -> None:
        for cq in self:
            for f in cq.files:
                f.close()
