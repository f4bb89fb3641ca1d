"""IndexFile: hash index from ``topic#key`` (each KEYS item, and UNIQ_KEY) to CommitLog offsets.

Layout (modelled on RocketMQ 4.x's IndexFile), big-endian:
``header (40): i64 beginTimestamp | i64 endTimestamp | i64 beginPhyOffset | i64 endPhyOffset |
i32 hashSlotCount | i32 indexCount``, then ``slots x i32`` (newest entry index per slot, 0 = none),
then ``max_entries x 20 bytes``: ``i32 keyHash | i64 commitLogOffset | i32 seconds since
beginTimestamp | i32 previous entry index in the same slot``. Entry 0 is never used.

Differences from RocketMQ: the key hash is ``crc32(utf-8 key)`` as a signed i32 (Java's
String.hashCode costs ~6 us per key in Python, crc32 ~0.2 us); files are named by the CommitLog
offset of their first entry (20 digits) instead of a creation time, so names sort, never collide
and need no clock.

Invariants:
- Entries are appended; an entry's ``previous`` index is smaller than its own, so chain walks end.
- The header in the file is rewritten at every flush and at close; ``count`` in memory is the truth
  while running. After a crash the active file is cut back to the entry count the checkpoint
  recorded (flushed, consistent) and its slot table is rebuilt from those entries.
- Lookups return candidate offsets only; the caller re-reads the records and re-checks the keys.
"""

from __future__ import annotations

import logging
import os
import struct
import sys
import zlib
from array import array
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tidemq import compiled

from tidemq.broker.store.mapped_file import MappedFile, StoreFile
from tidemq.broker.store.observer import StoreObserver

if TYPE_CHECKING:
    from tidemq.broker.store.dispatch import Record

log = logging.getLogger(__name__)

HEADER = struct.Struct(">qqqqii")
ENTRY = struct.Struct(">iqii")
SLOT = struct.Struct(">i")
HEADER_SIZE = HEADER.size  # 40
ENTRY_SIZE = ENTRY.size  # 20
_I32_MAX = 0x7FFFFFFF


def key_hash(key: str) -> int:
    h = zlib.crc32(key.encode("utf-8"))
    return h - 0x100000000 if h & 0x80000000 else h


def index_file_size(slots: int, max_entries: int) -> int:
    return HEADER_SIZE + slots * 4 + max_entries * ENTRY_SIZE


class IndexFile:
    __slots__ = ("mf", "slots", "max_entries", "begin_ts", "end_ts", "begin_phy", "end_phy", "count",
                 "_entries_at")

    def __init__(self, mf: MappedFile, slots: int, max_entries: int) -> None:
        self.mf = mf
        self.slots = slots
        self.max_entries = max_entries
        self._entries_at = HEADER_SIZE + slots * 4
        header = HEADER.unpack_from(mf.mm, 0)
        (self.begin_ts, self.end_ts, self.begin_phy, self.end_phy, slot_count, count) = header
        if count == 0:  # a new file
            self.begin_ts = self.end_ts = self.begin_phy = self.end_phy = 0
            count = 1
        if slot_count not in (0, slots) or not 1 <= count <= max_entries:
            raise ValueError(
                f"index file {mf.path} has an invalid header (slots {slot_count}, count {count})")
        self.count: int = count

    @property
    def start(self) -> int:
        return self.mf.start

    @property
    def full(self) -> bool:
        return self.count >= self.max_entries

    # Hot path (bench/produce_consume.py): two pack_into per key.
    def put(self, h: int, phys: int, store_ts: int) -> None:
        mm = self.mf.mm
        slot_pos = HEADER_SIZE + (abs(h) % self.slots) * 4
        (prev,) = SLOT.unpack_from(mm, slot_pos)
        count = self.count
        if not 0 <= prev < count:
            prev = 0
        if count == 1:
            self.begin_ts = store_ts
            self.begin_phy = phys
        diff = (store_ts - self.begin_ts) // 1000
        diff = 0 if diff < 0 else (diff if diff <= _I32_MAX else _I32_MAX)
        ENTRY.pack_into(mm, self._entries_at + count * ENTRY_SIZE, h, phys, diff, prev)
        SLOT.pack_into(mm, slot_pos, count)
        self.count = count + 1
        self.end_phy = phys
        if store_ts > self.end_ts:
            self.end_ts = store_ts
        self.mf.dirty = True

    def write_header(self) -> None:
        HEADER.pack_into(self.mf.mm, 0, self.begin_ts, self.end_ts, self.begin_phy, self.end_phy,
                         self.slots, self.count)

    def lookup(self, h: int, begin_ms: int, end_ms: int, limit: int, out: list[int]) -> None:
        """Append offsets of entries with hash ``h`` stored in [begin_ms, end_ms], newest first."""
        if self.count <= 1 or self.end_ts < begin_ms - 1000 or self.begin_ts > end_ms + 1000:
            return
        mm = self.mf.mm
        (i,) = SLOT.unpack_from(mm, HEADER_SIZE + (abs(h) % self.slots) * 4)
        guard = self.count
        while 0 < i < guard and len(out) < limit:
            eh, phys, diff, prev = ENTRY.unpack_from(mm, self._entries_at + i * ENTRY_SIZE)
            ts = self.begin_ts + diff * 1000
            if eh == h and begin_ms - 1000 <= ts <= end_ms + 1000:
                out.append(phys)
            guard = i  # previous must be older: stops loops in damaged chains
            i = prev

    def truncate(self, count: int) -> None:
        """Keep entries [1, count) and rebuild slots and header from them (crash recovery)."""
        count = max(1, min(count, self.max_entries))
        mm = self.mf.mm
        self.mf.zero_from(self._entries_at + count * ENTRY_SIZE)
        slot_table = array("i", bytes(self.slots * 4))
        assert slot_table.itemsize == 4
        end_ts = self.begin_ts
        end_phy = self.begin_phy
        base = self._entries_at
        for i in range(1, count):
            h, phys, diff, _prev = ENTRY.unpack_from(mm, base + i * ENTRY_SIZE)
            slot_table[abs(h) % self.slots] = i
            end_phy = phys
            end_ts = max(end_ts, self.begin_ts + diff * 1000)
        if sys.byteorder == "little":
            slot_table.byteswap()
        mm[HEADER_SIZE : HEADER_SIZE + self.slots * 4] = slot_table.tobytes()
        self.count = count
        if count == 1:
            self.begin_ts = self.end_ts = self.begin_phy = self.end_phy = 0
        else:
            self.end_ts, self.end_phy = end_ts, end_phy
        self.write_header()
        self.mf.dirty = True


def put_entries_py(f: IndexFile, topic: str, records: Sequence[Record], start: int, phys: int,
                   store_ts: int) -> tuple[int, int, int]:
    """Index entries of ``records[start:]`` (back to back from CommitLog offset ``phys``) into
    ``f`` exactly as :meth:`IndexService.add` puts them, stopping before the first record whose
    entries do not all fit ``f`` (``add`` then splits it across files). Returns (records done,
    CommitLog offset after them, entries written). ``_dispatch_c.put_entries`` is its compiled twin."""
    i, n, written = start, len(records), 0
    put = f.put
    while i < n:
        r = records[i]
        keys, uniq = r.keys, r.uniq
        parts = keys.split() if keys else None
        need = (1 if uniq else 0) + (len(parts) if parts is not None else 0)
        if need:
            if f.count + need > f.max_entries:
                break
            if uniq:
                put(key_hash(f"{topic}#{uniq}"), phys, store_ts)
            if parts is not None:
                for k in parts:
                    put(key_hash(f"{topic}#{k}"), phys, store_ts)
            written += need
        phys += r.total
        i += 1
    return i - start, phys, written


class IndexService:
    """The index files of a store: the newest one takes entries, lookups walk newest first."""

    def __init__(self, directory: Path, slots: int, max_entries: int, dirty: set[StoreFile],
                 new_dirs: set[Path] | None = None,
                 observer: StoreObserver | None = None) -> None:  # used for testing
        self.dir = directory
        self._observer = observer
        self.slots = slots
        self.max_entries = max_entries
        self.file_size = index_file_size(slots, max_entries)
        self.files: list[IndexFile] = []
        self._dirty = dirty
        self._new_dirs = new_dirs if new_dirs is not None else set()
        self.entries_added = 0

    def load(self, crash: bool, ckpt_file: int, ckpt_count: int) -> bool:
        """Map the index files (blocking). After a crash keep only what the checkpoint vouches
        for. Returns True when the index must be rebuilt from the start of the CommitLog."""
        self.dir.mkdir(parents=True, exist_ok=True)
        for entry in os.scandir(self.dir):
            if entry.name.endswith(".tmp"):
                os.unlink(entry.path)
        names = sorted(n for n in os.listdir(self.dir) if len(n) == 20 and n.isdigit())
        if crash and ckpt_file < 0:  # there was no index file when the checkpoint was taken
            self._remove_paths(names, "written after the last checkpoint before a crash")
            return False
        try:
            for name in names:
                start = int(name)
                path = self.dir / name
                if crash and start > ckpt_file:
                    self._remove_paths([name], "written after the last checkpoint before a crash")
                    continue
                if path.stat().st_size != self.file_size:
                    raise ValueError(f"index file {path} is not {self.file_size} bytes")
                f = IndexFile(MappedFile(path, self.file_size, start, observer=self._observer), self.slots,
                              self.max_entries)
                self.files.append(f)
                if crash and start == ckpt_file:
                    f.truncate(ckpt_count)
        except (ValueError, OSError) as exc:
            log.warning("index unusable (%s); rebuilding it from the commitlog", exc)
            for f in self.files:
                f.mf.destroy()
            self.files = []
            self._remove_paths(sorted(n for n in os.listdir(self.dir) if n.isdigit()), "index rebuild")
            return True
        return False

    def _remove_paths(self, names: list[str], why: str) -> None:
        for name in names:
            log.info("removing index file %s: %s", self.dir / name, why)
            try:
                os.unlink(self.dir / name)
            except FileNotFoundError:
                pass

    def _writable(self, phys: int) -> IndexFile:
        if self.files and not self.files[-1].full:
            return self.files[-1]
        if self.files:
            self.files[-1].write_header()
        # Rare: one new sparse file per index_max_entries entries.
        path = self.dir / f"{phys:020d}"
        mf = MappedFile.create(path, self.file_size, phys, sync_dir=False, observer=self._observer)
        f = IndexFile(mf, self.slots, self.max_entries)
        self._new_dirs.add(self.dir)
        self.files.append(f)
        log.info("created index file %s", path)
        return f

    # Hot path (bench/produce_consume.py)
    def add(self, topic: str, keys: str | None, uniq: str | None, phys: int, store_ts: int) -> None:
        if not keys and not uniq:
            return
        f = self._writable(phys)
        if uniq:
            f.put(key_hash(f"{topic}#{uniq}"), phys, store_ts)
            self.entries_added += 1
        if keys:
            for k in keys.split():
                if f.full:
                    f = self._writable(phys)
                f.put(key_hash(f"{topic}#{k}"), phys, store_ts)
                self.entries_added += 1
        mf = f.mf
        if mf not in self._dirty:
            self._dirty.add(mf)

    # Hot path (bench/follower_apply.py, bench/hot_path.py batch): a run's entries in one call.
    def put_run(self, topic: str, records: Sequence[Record], start: int, phys: int,
                store_ts: int) -> tuple[int, int]:
        """Entries of ``records[start:]`` into the active file while whole records fit it, as
        :meth:`add` would put them; (records done, CommitLog offset after them). Done is 0 when
        there is no active file with room: :meth:`add` then creates one (and may fail)."""
        if not self.files or self.files[-1].full:
            return 0, phys
        f = self.files[-1]
        done, phys, written = put_entries(f, topic, records, start, phys, store_ts)
        if written:
            self.entries_added += written
            mf = f.mf
            mf.dirty = True
            if mf not in self._dirty:
                self._dirty.add(mf)
        return done, phys

    def query(self, topic: str, key: str, limit: int, begin_ms: int, end_ms: int) -> list[int]:
        h = key_hash(f"{topic}#{key}")
        out: list[int] = []
        for f in reversed(self.files):
            if len(out) >= limit:
                break
            f.lookup(h, begin_ms, end_ms, limit, out)
        return out

    def state(self) -> tuple[int, int]:
        """(start of the active file, its entry count) for the checkpoint; (-1, 0) when none.
        Also writes every header into its mapping so the next flush persists it."""
        if not self.files:
            return -1, 0
        f = self.files[-1]
        f.write_header()
        if f.mf not in self._dirty:
            f.mf.dirty = True
            self._dirty.add(f.mf)
        return f.start, f.count

    def detach_below(self, phys_min: int) -> list[MappedFile]:
        """Detach files whose entries all point below ``phys_min`` (never the newest)."""
        gone = []
        while len(self.files) > 1 and self.files[0].end_phy < phys_min:
            gone.append(self.files.pop(0).mf)
        return gone

    def close(self) -> None:
        for f in self.files:
            if not f.mf.closed:
                f.write_header()
            f.mf.close()
        self.files = []


_c = compiled.load("tidemq.broker.store._dispatch_c")
put_entries: Callable[[IndexFile, str, Sequence[Record], int, int, int], tuple[int, int, int]] = (
    _c.put_entries if _c is not None else put_entries_py)
