"""The table of consume queues of a store: topic -> queueId -> ConsumeQueue.

Invariant: a queue exists in the table iff it has (or had, since load) a directory under
``consumequeue/<topic>/<queueId>``; ``delete_topic`` removes a topic's entries before its files go.

Every queue maps its files through the table's one ``MappedFileCache``, so the number of mapped
consume-queue files (and, on Python < 3.13, the descriptors they hold) is bounded by
``max_mapped`` whatever the number of topics: a queue costs memory for its bookkeeping only.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

from tidemq.broker.store.config import DEFAULT_MAX_MAPPED_QUEUE_FILES
from tidemq.broker.store.consume_queue import ConsumeQueue
from tidemq.broker.store.mapped_file import LazyMappedFile, MAPPING_HOLDS_FD, MappedFileCache, StoreFile
from tidemq.broker.store.observer import StoreObserver

log = logging.getLogger(__name__)


def fd_fitted_limit(requested: int, soft_nofile: int | None) -> tuple[int, str | None]:
    """The mapped-file bound that fits the open-file limit, and a warning when it had to shrink.

    Where a mapping holds a descriptor (Python < 3.13), at most a quarter of the soft limit goes
    to consume-queue mappings: the rest stays for client connections (remoting keeps 512 for the
    store), CommitLog segments and index files. ``soft_nofile`` None means no limit."""
    if not MAPPING_HOLDS_FD or soft_nofile is None:
        return requested, None
    room = max(16, soft_nofile // 4)
    if requested <= room:
        return requested, None
    return room, (f"at most {room} consume-queue files are mapped at once, not {requested} "
                  f"(max_mapped_queue_files): each mapping holds a descriptor on this Python and the "
                  f"open-file limit is {soft_nofile}. Raise the limit (ulimit -n, LimitNOFILE) for more")


def soft_nofile_limit() -> int | None:
    """The soft RLIMIT_NOFILE now (None: unlimited, or not POSIX)."""
    try:
        import resource  # noqa: PLC0415 (POSIX only)
    except ImportError:
        return None
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


class QueueTable:
    def __init__(self, root: Path, units_per_file: int, dirty: set[StoreFile], new_dirs: set[Path],
                 max_mapped: int = DEFAULT_MAX_MAPPED_QUEUE_FILES,
                 observer: StoreObserver | None = None) -> None:  # used for testing
        self.root = root
        self._observer = observer
        self.units_per_file = units_per_file
        self.by_topic: dict[str, dict[int, ConsumeQueue]] = {}
        self._dirty = dirty
        self._new_dirs = new_dirs
        self.mapped = MappedFileCache(max_mapped)  # shared by every queue of the table

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
            cq = ConsumeQueue(self.root, topic, queue_id, self.units_per_file, self._dirty, self._new_dirs,
                              self.mapped, self._observer)
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
        """Load every consume queue (blocking; at most ``mapped.limit`` files stay mapped). True
        when one must be rebuilt from the start of the CommitLog: the whole directory, or a
        queue's files, were deleted while data exists."""
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

    def truncate_past(self, end: int) -> list[LazyMappedFile]:
        """Drop units whose record ends beyond CommitLog offset ``end`` (recovery)."""
        gone: list[LazyMappedFile] = []
        for cq in self:
            cut = cq.first_offset_ending_after(end)
            if cut < cq.max_offset:
                log.warning("consume queue %s/%d: dropping offsets %d..%d that point past the "
                            "commitlog end %d", cq.topic, cq.queue_id, cut, cq.max_offset - 1, end)
                gone += cq.truncate_to(cut)
        return gone

    def detach_below(self, phys_min: int) -> list[LazyMappedFile]:
        gone: list[LazyMappedFile] = []
        for cq in self:
            gone += cq.detach_below(phys_min)
        return gone

    def reset_topic(self, topic: str) -> list[LazyMappedFile]:
        """Empty every queue of ``topic`` (kept, from offset 0, for a rebuild); returns the files
        to destroy."""
        files = [f for cq in list(self.by_topic.get(topic, {}).values()) for f in cq.reset()]
        self._dirty.difference_update(files)
        return files

    def drop_topic(self, topic: str) -> list[LazyMappedFile] | None:
        """Forget a topic's queues; returns their files (None when the topic had none)."""
        qs = self.by_topic.pop(topic, None)
        if not qs:
            return None
        files = [f for cq in qs.values() for f in cq.detach_all()]
        self._dirty.difference_update(files)
        topic_dir = self.root / topic  # its directories are moved aside: none is fsynced any more
        self._new_dirs.difference_update([d for d in self._new_dirs if d == topic_dir or topic_dir in d.parents])
        return files

    def close(self) -> None:
        """Unmap and close every file (blocking: a worker thread at shutdown, or load)."""
        self.mapped.clear()
        for cq in self:
            for f in cq.files:
                f.close()
