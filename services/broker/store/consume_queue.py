"""ConsumeQueue: the per-(topic, queueId) list of pointers into the CommitLog.

Layout: ``consumequeue/<topic>/<queueId>/<20-digit start byte offset>``, each file holding
``units_per_file`` units of 20 bytes: ``i64 commitLogOffset | i32 size | i64 tagsCode``.

Invariants:
- The unit of queue offset ``q`` lives at byte ``q * 20`` of the queue's byte space; queue offset =
  unit index. A unit with size 0 is empty (never written).
- Units in ``[min_offset, max_offset)`` have strictly increasing commit-log offsets; ``max_offset`` is
  the next queue offset to write. Only the first file may start with empty units (a queue rebuilt
  after old CommitLog segments were deleted).
- ``min_offset`` advances when the CommitLog's oldest segments go: it is the first unit whose record
  still exists. The last file is never deleted, so ``max_offset`` survives any cleanup.
- Files are mapped lazily, through the store-wide ``MappedFileCache`` (at most
  ``max_mapped_queue_files`` mapped, least recently used unmapped first): ``load`` maps only the
  first and last file to find the offsets, and a file is mapped again when a put or read touches
  it. Every access fetches ``f.mm`` right before using it, so an eviction in between is harmless.
- ``_phys_floor`` is a lower bound of every unit's CommitLog offset in [min_offset, max_offset):
  retention skips a queue it proves untouched without mapping its first file.
"""

from __future__ import annotations

import bisect
import logging
import mmap
import os
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tidemq import compiled

from tidemq.broker.store.config import DEFAULT_MAX_MAPPED_QUEUE_FILES
from tidemq.broker.store.mapped_file import LazyMappedFile, MappedFileCache, StoreFile
from tidemq.broker.store.observer import StoreObserver

if TYPE_CHECKING:
    from tidemq.broker.store.dispatch import Record

log = logging.getLogger(__name__)

UNIT = struct.Struct(">qiq")
UNIT_SIZE = UNIT.size  # 20
_ZERO_UNIT = bytes(UNIT_SIZE)
_SCAN_CHUNK = UNIT_SIZE * 3276  # 65520 bytes, a whole number of units
_ZERO = bytes(_SCAN_CHUNK)


def write_units_py(mm: mmap.mmap, pos: int, phys: int, records: Sequence[Record], start: int, n: int) -> int:
    """Units of ``records[start:start + n]`` (back to back from CommitLog offset ``phys``) at byte
    ``pos`` of a consume-queue file's mapping; returns the CommitLog offset after them.
    ``_dispatch_c.write_units`` is its compiled twin."""
    pack = UNIT.pack_into
    for i in range(start, start + n):
        r = records[i]
        size = r.total
        pack(mm, pos, phys, size, r.tags_code)
        pos += UNIT_SIZE
        phys += size
    return phys


class ConsumeQueue:
    __slots__ = ("dir", "topic", "queue_id", "units_per_file", "file_size", "files", "_starts",
                 "min_offset", "max_offset", "_tail", "_dirty", "_new_dirs", "_mapped", "_lru", "_phys_floor",
                 "_observer")

    def __init__(self, root: Path, topic: str, queue_id: int, units_per_file: int,
                 dirty: set[StoreFile], new_dirs: set[Path] | None = None,
                 mapped: MappedFileCache | None = None,
                 observer: StoreObserver | None = None) -> None:  # used for testing
        self.dir = root / topic / str(queue_id)
        self._observer = observer
        self.topic = topic
        self.queue_id = queue_id
        self.units_per_file = units_per_file
        self.file_size = units_per_file * UNIT_SIZE
        self.files: list[LazyMappedFile] = []
        self._starts: list[int] = []
        self.min_offset = 0
        self.max_offset = 0
        self._tail: LazyMappedFile | None = None
        self._dirty = dirty  # files written since the last logics flush
        self._new_dirs = new_dirs if new_dirs is not None else set()  # dirs to fsync before it
        # The store's cache (QueueTable); a queue made on its own (tests, tools) gets one of its own.
        self._mapped = mapped if mapped is not None else MappedFileCache(DEFAULT_MAX_MAPPED_QUEUE_FILES)
        self._lru = self._mapped.lru  # hot path: f.mm set -> self._lru.move_to_end(f)
        self._phys_floor = 0

    # ------------------------------------------------------------------------------ loading
    def load(self) -> None:
        """Find the queue's files and its min/max offsets (blocking), mapping only the first and
        the last file (through the cache, which may unmap them again as other queues load).
        Wrong-sized files are logged and set aside (renamed ``.bad``): the queue is rebuilt from
        the CommitLog."""
        names = sorted(n for n in os.listdir(self.dir) if len(n) == 20 and n.isdigit())
        for name in names:
            path = self.dir / name
            size = path.stat().st_size
            start = int(name)
            if size != self.file_size or start % self.file_size:
                bad = path.with_name(name + ".bad")
                log.warning("consume queue file %s has %d bytes (expected %d); moved to %s",
                            path, size, self.file_size, bad.name)
                os.replace(path, bad)
                continue
            self._add_file(LazyMappedFile(path, size, start, observer=self._observer))
        if not self.files:
            return
        last = self.files[-1]
        mm = self._map(last)
        first_used = self._first_used(mm, last.size)
        if first_used is None:  # an empty last file: the queue ends where it starts
            self.max_offset = last.start // UNIT_SIZE
        else:
            pos = self._first_empty(mm, last.size, first_used)
            self.max_offset = (last.start + pos) // UNIT_SIZE
            if pos < last.size and last.zero_from(pos):
                self._dirty.add(last)  # zero_from set last.dirty: put() would not register it
                log.warning("consume queue %s: cleared stale units after offset %d",
                            self.dir, self.max_offset)
        first = self.files[0]
        mm = self._map(first)
        first_used = self._first_used(mm, first.size)
        if first_used is None:
            self.min_offset = self.max_offset
        else:
            self.min_offset = (first.start + first_used) // UNIT_SIZE
            self._phys_floor = UNIT.unpack_from(mm, first_used)[0]
        self._tail = last

    @staticmethod
    def _first_used(mm: mmap.mmap, size: int) -> int | None:
        """Byte position of the first non-empty unit (chunks compared in C, then units)."""
        chunk = _SCAN_CHUNK
        pos = 0
        while pos < size:
            n = min(chunk, size - pos)
            if mm[pos : pos + n] != _ZERO[:n]:
                end = pos + n
                while pos < end:
                    if UNIT.unpack_from(mm, pos)[1] > 0:
                        return pos
                    pos += UNIT_SIZE
            else:
                pos += n
        return None

    @staticmethod
    def _first_empty(mm: mmap.mmap, size: int, pos: int) -> int:
        """Byte position of the first empty unit at or after ``pos`` (size when full).

        Valid units never contain 20 consecutive zero bytes (size > 0, and only the record at
        CommitLog offset 0 has an all-zero offset), so the first such run marks the end."""
        while True:
            p = mm.find(_ZERO_UNIT, pos)
            if p < 0:
                return size
            aligned = -(-p // UNIT_SIZE) * UNIT_SIZE
            if aligned >= size:
                return size
            if mm[aligned : aligned + UNIT_SIZE] == _ZERO_UNIT:
                return aligned
            pos = p + 1

    def _map(self, f: LazyMappedFile) -> mmap.mmap:
        """``f``'s mapping, mapped now when the cache had unmapped it; marks it used."""
        mm = f.mm
        if mm is None:
            return self._mapped.open(f)
        self._lru.move_to_end(f)
        return mm

    def _add_file(self, f: LazyMappedFile) -> None:
        i = bisect.bisect(self._starts, f.start)
        self._starts.insert(i, f.start)
        self.files.insert(i, f)

    def _file_for(self, q: int) -> LazyMappedFile | None:
        byte = q * UNIT_SIZE
        i = bisect.bisect(self._starts, byte) - 1
        if i >= 0:
            f = self.files[i]
            if byte < f.end:
                return f
        return None

    # ------------------------------------------------------------------------------ writing
    # Hot path (bench/produce_consume.py): one pack_into per stored message, plus one LRU
    # move_to_end (a dict lookup) while the file is mapped.
    def put(self, q: int, phys: int, size: int, tags_code: int) -> None:
        f = self._tail
        pos = q * UNIT_SIZE - f.start if f is not None else -1
        if f is None or not 0 <= pos < f.size:
            f = self._file_for(q) or self._new_file(q)
            pos = q * UNIT_SIZE - f.start
            if f.start >= self._tail_start():
                self._tail = f
        mm = f.mm
        if mm is None:  # unmapped by the cache since prepare() (only a batch spanning many files)
            mm = self._mapped.open(f)
        else:
            self._lru.move_to_end(f)
        UNIT.pack_into(mm, pos, phys, size, tags_code)
        if not f.dirty:
            f.dirty = True
            self._dirty.add(f)
        if q >= self.max_offset:
            if q > self.max_offset and self.max_offset > self.min_offset:
                log.warning("consume queue %s: gap from offset %d to %d", self.dir, self.max_offset, q)
            if self.max_offset == self.min_offset:  # first unit of an empty queue
                self.min_offset = q
                self._phys_floor = phys
            self.max_offset = q + 1
        elif phys < self._phys_floor:  # a unit rewritten by recovery
            self._phys_floor = phys

    # Hot path (bench/hot_path.py batch, bench/follower_apply.py): a run at the end of the queue.
    def put_run(self, q: int, phys: int, records: Sequence[Record]) -> None:
        """Units of ``records`` (back to back from CommitLog offset ``phys``) at queue offsets
        from ``q`` = ``max_offset`` on: what ``put`` of each would write, one call per file."""
        i, n = 0, len(records)
        while i < n:
            f = self._tail
            pos = q * UNIT_SIZE - f.start if f is not None else -1
            if f is None or not 0 <= pos < f.size:
                f = self._file_for(q) or self._new_file(q)
                pos = q * UNIT_SIZE - f.start
                if f.start >= self._tail_start():
                    self._tail = f
            k = min(n - i, (f.size - pos) // UNIT_SIZE)
            mm = f.mm
            if mm is None:  # unmapped by the cache since prepare() (only a batch spanning many files)
                mm = self._mapped.open(f)
            else:
                self._lru.move_to_end(f)
            end = write_units(mm, pos, phys, records, i, k)
            if not f.dirty:
                f.dirty = True
                self._dirty.add(f)
            if self.max_offset == self.min_offset:  # first unit of an empty queue
                self.min_offset = q
                self._phys_floor = phys
            q += k
            self.max_offset = q
            phys = end
            i += k

    def prepare(self, q: int, n: int) -> None:
        """Create and map the files units q..q+n-1 need, before anything is appended (may raise
        OSError): once the CommitLog holds the records, ``put`` must not fail for want of a file.
        """
        f = self._tail
        if f is not None and f.start <= q * UNIT_SIZE and (q + n) * UNIT_SIZE <= f.end:
            if f.mm is None:
                self._mapped.open(f)
            return
        byte = (q * UNIT_SIZE // self.file_size) * self.file_size
        while byte < (q + n) * UNIT_SIZE:
            f = self._file_for(byte // UNIT_SIZE)
            if f is None:
                self._new_file(byte // UNIT_SIZE)
            elif f.mm is None:
                self._mapped.open(f)
            byte += self.file_size

    def _tail_start(self) -> int:
        return self._tail.start if self._tail is not None else -1

    def _new_file(self, q: int) -> LazyMappedFile:
        # Creating a sparse file is a few metadata syscalls; it happens once per
        # units_per_file messages of a queue (and for a queue's first message).
        start = (q * UNIT_SIZE // self.file_size) * self.file_size
        self.dir.mkdir(parents=True, exist_ok=True)
        f = LazyMappedFile.create(self.dir / f"{start:020d}", self.file_size, start, sync_dir=False,
                              observer=self._observer)
        self._new_dirs.update((self.dir, self.dir.parent, self.dir.parent.parent))
        self._add_file(f)
        self._mapped.open(f)  # a failure leaves the file known and unmapped: the next touch retries
        return f

    def truncate_to(self, q: int) -> list[LazyMappedFile]:
        """Drop units at queue offsets >= q. Returns whole files removed from lookups."""
        if q >= self.max_offset:
            return []
        gone = []
        while self.files and self.files[-1].start >= q * UNIT_SIZE and len(self.files) > 1:
            gone.append(self.files.pop())
            self._starts.pop()
        self._mapped.forget(gone)
        f = self._file_for(q) or (self.files[-1] if self.files else None)
        if f is not None:
            pos = max(0, q * UNIT_SIZE - f.start)
            self._map(f)
            f.zero_from(pos)  # sets f.dirty itself: register the file for the next flush regardless
            f.dirty = True
            self._dirty.add(f)
        self.max_offset = q
        self.min_offset = min(self.min_offset, q)
        self._tail = self.files[-1] if self.files else None
        return gone

    # ------------------------------------------------------------------------------ reading
    def unit(self, q: int) -> tuple[int, int, int] | None:
        if not self.min_offset <= q < self.max_offset:
            return None
        f = self._file_for(q)
        if f is None:
            return None
        return UNIT.unpack_from(self._map(f), q * UNIT_SIZE - f.start)

    def units(self, q: int, limit: int) -> list[tuple[int, int, int]] | None:
        """Up to ``limit`` units from ``q`` within q's file (None when that file is missing)."""
        raw = self.raw_units(q, limit)
        return None if raw is None else list(UNIT.iter_unpack(raw))

    # Hot path (bench/produce_consume.py, pulls): one copy of the units, parsed by the caller.
    def raw_units(self, q: int, limit: int) -> bytes | None:
        """The bytes of up to ``limit`` units from ``q`` within q's file (None when that file is
        missing): what ``units`` unpacks."""
        f = self._file_for(q)
        if f is None:
            return None
        pos = q * UNIT_SIZE - f.start
        n = min(limit, (f.size - pos) // UNIT_SIZE, self.max_offset - q)
        if n <= 0:
            return b""
        mm = f.mm
        if mm is None:
            mm = self._mapped.open(f)
        else:
            self._lru.move_to_end(f)
        return mm[pos : pos + n * UNIT_SIZE]

    def next_file_offset(self, q: int) -> int:
        """Queue offset of the first unit of the file after the one that would hold ``q``."""
        return (q * UNIT_SIZE // self.file_size + 1) * self.units_per_file

    def first_offset_at_or_after(self, phys: int) -> int:
        """Smallest queue offset in [min, max] whose record starts at or after ``phys``."""
        lo, hi = self.min_offset, self.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            u = self.unit(mid)
            if u is None or u[1] <= 0 or u[0] < phys:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def first_offset_ending_after(self, phys_end: int) -> int:
        """Smallest queue offset whose record ends beyond ``phys_end`` (max when none)."""
        lo, hi = self.min_offset, self.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            u = self.unit(mid)
            if u is None or u[1] <= 0 or u[0] + u[1] <= phys_end:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # ------------------------------------------------------------------------------ retention
    def detach_below(self, phys_min: int) -> list[LazyMappedFile]:
        """Detach whole files whose records all precede ``phys_min`` (never the last file) and
        advance ``min_offset`` to the first unit whose record still exists."""
        if self._phys_floor >= phys_min and self.min_offset < self.max_offset:
            return []  # every unit's record still exists: nothing to map, nothing to move
        gone = []
        while len(self.files) > 1:
            f = self.files[0]
            phys, size, _tags = UNIT.unpack_from(self._map(f), f.size - UNIT_SIZE)
            if size > 0 and phys >= phys_min:
                break
            gone.append(self.files.pop(0))
            self._starts.pop(0)
        if gone:
            self._mapped.forget(gone)
            self.min_offset = max(self.min_offset, self.files[0].start // UNIT_SIZE)
        self.min_offset = self.first_offset_at_or_after(phys_min)
        self._phys_floor = phys_min  # units from the new min_offset on start at or after it
        return gone

    def reset(self) -> list[LazyMappedFile]:
        """Forget every unit (recovery rebuilds a damaged queue); returns the files to delete."""
        gone = self.detach_all()
        self._dirty.difference_update(gone)
        self.min_offset = self.max_offset = 0
        self._phys_floor = 0
        return gone

    def detach_all(self) -> list[LazyMappedFile]:
        """Remove every file from lookups and the mapped-file cache; the caller closes them."""
        gone, self.files, self._starts, self._tail = self.files, [], [], None
        self._mapped.forget(gone)
        return gone


_c = compiled.load("tidemq.broker.store._dispatch_c")
write_units: Callable[[mmap.mmap, int, int, Sequence[Record], int, int], int] = (
    _c.write_units if _c is not None else write_units_py)
