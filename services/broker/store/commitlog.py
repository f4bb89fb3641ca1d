"""The CommitLog: every stored record, back to back, in fixed-size mapped segments.

Invariants:
- Segment files are named by their start offset, 20 digits zero-padded, all ``segment_size``
  bytes, contiguous: segment k+1 starts where segment k ends.
- A record never spans segments. A record is written into a segment only if ``size + 8`` still fits;
  otherwise an 8-byte filler ``(i32 remaining, u32 BLANK_MAGIC)`` claims the rest of the segment and
  the record goes to the start of the next one. So every full segment ends with a filler.
- ``write_pos`` (the max offset) always lies inside the active (last) segment.
- The next segment is created (and preallocated) by a worker thread as soon as a segment becomes
  active, so a rollover on the event loop normally only swaps objects.
- Once started (``start_preallocation``), a prefault thread keeps the pages up to
  ``PREFAULT_AHEAD`` bytes past the write position faulted in and writable
  (``MappedFile.prefault``), asked again each time the writer moved ``PREFAULT_CHUNK`` bytes, so
  the loop's writes land on present pages instead of taking the first-touch faults itself.
  Pre-faulting changes no byte; when the kernel cannot do it, it stops and the writes fault as
  before. ``prefault`` off (the store's choice under SYNC_FLUSH, whose next round would write
  each dirtied page's zeros before its data: twice the page writes, one slower round per chunk)
  starts no thread.
- Reads verify size, magic and the record's own PHYSICALOFFSET field before returning bytes, so a
  stale or wrong pointer yields None, never foreign bytes.
- Replication (issue 17) reads whole records of one segment from a record boundary (``read_from``)
  and a follower places them at exactly the offset the master had them (``place``): its write
  position, or the start of the next segment after a filler, as the master's rollover left it.
"""

from __future__ import annotations

import concurrent.futures
import logging
import mmap
import os
import struct
from pathlib import Path

from tidemq.errors import CodecError, StoreCorruptError, StoreError
from tidemq.message import (
    BLANK_MAGIC,
    MESSAGE_MAGIC,
    MIN_RECORD_SIZE,
    PHYSICAL_OFFSET_POS,
    STORE_TIMESTAMP_POS,
    SYS_FLAG_POS,
    SysFlag,
    decode_record_header,
)

from tidemq.broker.store.mapped_file import MappedFile
from tidemq.broker.store.observer import StoreObserver

log = logging.getLogger(__name__)

BLANK = struct.Struct(">iI")
# Fields of a record's header at their positions in tidemq.message's layout: TOTALSIZE, MAGICCODE
# and PHYSICALOFFSET; SYSFLAG and STORETIMESTAMP (IPv4 born host; 12 bytes later with IPv6).
CHECK = struct.Struct(f">iI{PHYSICAL_OFFSET_POS - 8}xq")
SYSFLAG_STORE_TS = struct.Struct(f">{SYS_FLAG_POS}xi{STORE_TIMESTAMP_POS - SYS_FLAG_POS - 4}xq")
_Q = struct.Struct(">q")
FILLER_MIN = 8
# bench/latency_probe.py (compare.py row 5): a first write into a fresh page of the preallocated
# segment faulted on the loop (page allocation, zeroing, ext4's block mapping) and, while a flush
# wrote the file back, sometimes waited milliseconds in the fault. 512 KiB is 0.1 s of row 5's
# 5 MB/s; the pages it dirties early (zeros) cost at most one extra write-back each.
PREFAULT_AHEAD = 512 * 1024
PREFAULT_CHUNK = 128 * 1024
_NEVER = 1 << 62  # no commitlog offset reaches it


def segment_name(offset: int) -> str:
    return f"{offset:020d}"


def store_timestamp_in(buf: mmap.mmap, pos: int) -> int:
    """The STORETIMESTAMP of the record at ``pos`` of ``buf`` (handles an IPv6 born host)."""
    ts: int
    sys_flag, ts = SYSFLAG_STORE_TS.unpack_from(buf, pos)
    if sys_flag & SysFlag.BORNHOST_V6:
        (ts,) = _Q.unpack_from(buf, pos + STORE_TIMESTAMP_POS + 12)
    return ts


class CommitLog:
    def __init__(self, directory: Path, segment_size: int,
                 observer: StoreObserver | None = None) -> None:  # used for testing
        self.dir = directory
        self.observer = observer
        self.segment_size = segment_size
        self.segments: list[MappedFile] = []
        self.write_pos = 0
        self.executor: concurrent.futures.Executor | None = None
        self._pending: concurrent.futures.Future[MappedFile] | None = None
        self._pending_start = -1
        self.created_segments = 0
        self.sync_creations = 0
        self.warm = False  # pre-fault segments created off the loop (StoreConfig.warm_segments)
        self.prefault = True  # pre-fault pages ahead of the writer once started (ASYNC_FLUSH)
        self._prefaulter: concurrent.futures.Executor | None = None
        self._own_prefaulter = False
        self._prefault_job: concurrent.futures.Future[None] | None = None
        self._prefaulted = 0  # pre-faulting was asked for up to this offset
        self._prefault_at = _NEVER  # ask again once the write position reaches this offset
        self._prefault_errno = 0  # set by the prefault thread when the kernel cannot pre-fault

    # ------------------------------------------------------------------------------ opening
    def open_segments(self) -> None:
        """Map every segment file (blocking). Raises StoreCorruptError on size mismatch or gaps."""
        self.dir.mkdir(parents=True, exist_ok=True)
        names = []
        for entry in os.scandir(self.dir):
            if entry.name.endswith(".tmp"):
                log.info("removing %s left by an interrupted segment creation", entry.path)
                os.unlink(entry.path)
            elif len(entry.name) == 20 and entry.name.isdigit():
                names.append(entry.name)
            else:
                log.warning("ignoring unexpected file %s in the commitlog directory", entry.path)
        names.sort()
        expected = None
        for name in names:
            path = self.dir / name
            start = int(name)
            size = path.stat().st_size
            if size != self.segment_size:
                raise StoreCorruptError(
                    f"commitlog segment {path} is {size} bytes but commitlog_segment_size is "
                    f"{self.segment_size}; start the broker with the segment size the store was "
                    f"written with, or restore the file from a backup"
                )
            if start % self.segment_size:
                raise StoreCorruptError(
                    f"commitlog segment {path} does not start at a multiple of the segment size "
                    f"{self.segment_size}; remove the stray file or fix commitlog_segment_size"
                )
            if expected is not None and start != expected:
                raise StoreCorruptError(
                    f"commitlog segment {self.dir / segment_name(expected)} is missing (found {path} "
                    f"after it); restore the missing segment from a backup"
                )
            self.segments.append(MappedFile(path, size, start, keep_fd=True, observer=self.observer))
            expected = start + size

    def ensure_active(self, write_pos: int) -> None:
        """Set the write position after recovery, creating the segment that must hold it."""
        self.write_pos = write_pos
        if not self.segments or self.segments[-1].end <= write_pos:
            start = (write_pos // self.segment_size) * self.segment_size
            if self.segments and self.segments[-1].end != start:
                raise StoreCorruptError(
                    f"commitlog ends at {self.segments[-1].end} but data continues at {start}")
            self.segments.append(self._create(start, populate=self.warm))  # at load, before serving

    # ------------------------------------------------------------------------------ geometry
    @property
    def min_offset(self) -> int:
        return self.segments[0].start if self.segments else 0

    @property
    def active(self) -> MappedFile:
        return self.segments[-1]

    def segment_for(self, offset: int) -> MappedFile | None:
        segs = self.segments
        if not segs:
            return None
        i = (offset - segs[0].start) // self.segment_size
        if 0 <= i < len(segs):
            return segs[i]
        return None

    def next_segment_start(self, offset: int) -> int:
        return (offset // self.segment_size + 1) * self.segment_size

    # ------------------------------------------------------------------------------ writing
    # Hot path (bench/produce_consume.py): reserve + the caller's pack_into + commit.
    def reserve(self, total: int) -> tuple[MappedFile, int]:
        """Where a run of ``total`` bytes goes: (segment, position in it). Rolls over (filler +
        next segment) when it does not fit. The caller writes there, then calls ``commit``."""
        seg = self.segments[-1]
        rel = self.write_pos - seg.start
        remaining = seg.size - rel
        if total + FILLER_MIN <= remaining:
            return seg, rel
        nxt = self._next_segment(seg.end)  # may raise OSError: nothing written yet
        BLANK.pack_into(seg.mm, rel, remaining, BLANK_MAGIC)
        self.segments.append(nxt)
        self.write_pos = nxt.start
        self._prepare_next()
        return nxt, 0

    def commit(self, total: int) -> None:
        self.write_pos += total
        if self.write_pos >= self._prefault_at:
            self._prefault_ahead()

    def _prefault_ahead(self) -> None:
        """Ask the prefault thread for the pages up to PREFAULT_AHEAD past the write position."""
        if self._prefault_errno or self._prefaulter is None or not self.segments:
            self._prefault_at = _NEVER
            return
        job = self._prefault_job
        if job is not None and not job.done():  # the thread is behind (a flush holds the file)
            self._prefault_at = self.write_pos + PREFAULT_CHUNK
            return
        seg = self.segments[-1]
        start = max(self._prefaulted, self.write_pos)
        end = min(seg.end, self.write_pos + PREFAULT_AHEAD)
        if start < end:
            self._prefault_job = self._prefaulter.submit(self._prefault, seg, start - seg.start, end - start)
            self._prefaulted = end
        # the segment's last pages: the next ask is the first commit into the next segment
        self._prefault_at = end - PREFAULT_AHEAD + PREFAULT_CHUNK if end < seg.end else seg.end

    def _prefault(self, seg: MappedFile, pos: int, length: int) -> None:
        """Prefault thread."""
        err = seg.prefault(pos, length)
        if err and not self._prefault_errno:
            self._prefault_errno = err
            log.info("pre-faulting commitlog pages is not available here (%s); writes fault pages in "
                     "themselves (Linux >= 5.14 can pre-fault)", os.strerror(err))

    def fits_one_segment(self, total: int) -> bool:
        return total + FILLER_MIN <= self.segment_size

    def _create(self, start: int, populate: bool = False) -> MappedFile:
        path = self.dir / segment_name(start)
        mf = MappedFile.create(path, self.segment_size, start, keep_fd=True, preallocate=True,
                               populate=populate, observer=self.observer)
        self.created_segments += 1
        log.info("created commitlog segment %s", path)
        return mf

    def _next_segment(self, start: int) -> MappedFile:
        fut = self._pending
        if fut is not None and self._pending_start == start:
            self._pending = None
            if fut.cancel():
                self.sync_creations += 1
                return self._create(start)
            return fut.result()  # done, or finishing right now in the worker
        self.sync_creations += 1
        return self._create(start)

    def _prepare_next(self) -> None:
        if self.executor is None or not self.segments:
            return
        start = self.segments[-1].end
        if self._pending is not None and self._pending_start == start:
            return
        self._pending_start = start
        # Pre-faulted off the loop (populate): the loop's writes into it take no page faults.
        self._pending = self.executor.submit(self._create, start, self.warm)

    def start_preallocation(self, executor: concurrent.futures.Executor,
                            prefaulter: concurrent.futures.Executor | None = None) -> None:
        """Pre-create each next segment on ``executor`` and pre-fault pages ahead of the writer
        on ``prefaulter`` (one thread; by default the commitlog's own, ended by ``close``)."""
        self.executor = executor
        self._prepare_next()
        if not self.prefault:
            return
        if prefaulter is None:
            prefaulter = concurrent.futures.ThreadPoolExecutor(1, "tidemq-commitlog-prefault")
            self._own_prefaulter = True
        self._prefaulter = prefaulter
        self._prefault_ahead()

    def drop_pending(self) -> None:
        """Forget a pre-created segment (at shutdown); its zeroed file is harmless on disk."""
        fut, self._pending = self._pending, None
        if fut is not None and not fut.cancel():
            try:
                fut.result().close()
            except OSError as exc:
                log.warning("pre-creating the next commitlog segment failed: %s", exc)

    # ------------------------------------------------------------------------------ reading
    def read(self, offset: int, size: int) -> bytes | None:
        """The record at ``offset`` if it is whole, ``size`` bytes long and really starts there."""
        seg = self.segment_for(offset)
        if seg is None or size < MIN_RECORD_SIZE or offset + size > self.write_pos:
            return None
        rel = offset - seg.start
        if rel + size > seg.size:
            return None
        total, magic, phys = CHECK.unpack_from(seg.mm, rel)
        if total != size or magic != MESSAGE_MAGIC or phys != offset:
            log.warning("commitlog offset %d does not hold a %d-byte record; not served", offset, size)
            return None
        return seg.mm[rel : rel + size]

    def read_record(self, offset: int) -> bytes | None:
        seg = self.segment_for(offset)
        if seg is None or offset + 8 > self.write_pos:
            return None
        rel = offset - seg.start
        if rel + CHECK.size > seg.size:
            return None
        total, magic, _phys = CHECK.unpack_from(seg.mm, rel)
        if magic != MESSAGE_MAGIC:
            return None
        return self.read(offset, total)

    def claim_at(self, phys: int) -> tuple[str, int, int, int] | None:
        """(topic, queue id, queue offset, size) of the record whose header is at ``phys`` and
        names ``phys`` as its own offset, or None (zeros, garbage, a record elsewhere)."""
        seg = self.segment_for(phys)
        if seg is None:
            return None
        try:
            with memoryview(seg.mm) as mv:  # released at once: the mapping may be closed later
                h = decode_record_header(mv, phys - seg.start, seg.size)
        except (CodecError, ValueError, struct.error):
            return None
        if h.magic != MESSAGE_MAGIC or h.physical_offset != phys:
            return None
        return h.topic, h.queue_id, h.queue_offset, h.total_size

    def store_timestamp(self, offset: int, size: int) -> int:
        """STORETIMESTAMP of the record at ``offset``, or -1 if it cannot be read."""
        seg = self.segment_for(offset)
        if seg is None or offset + size > self.write_pos:
            return -1
        rel = offset - seg.start
        if rel + size > seg.size or size < MIN_RECORD_SIZE:
            return -1
        total, magic, phys = CHECK.unpack_from(seg.mm, rel)
        if total != size or magic != MESSAGE_MAGIC or phys != offset:
            return -1
        return store_timestamp_in(seg.mm, rel)

    def first_store_timestamp(self, seg: MappedFile) -> int | None:
        """Store time of the first record of ``seg`` (None when it starts with no record)."""
        if seg.start >= self.write_pos:
            return None
        total, magic, _phys = CHECK.unpack_from(seg.mm, 0)
        if magic != MESSAGE_MAGIC or total < MIN_RECORD_SIZE:
            return None
        return store_timestamp_in(seg.mm, 0)

    # ------------------------------------------------------------------------------ replication
    def read_from(self, offset: int, max_bytes: int) -> tuple[int, bytes]:
        """Whole records from ``offset`` (a record boundary) on, of one segment: as many as fit
        ``max_bytes``, but at least one. A filler at ``offset`` is stepped over (the records then
        start at the next segment). Returns (their offset, their bytes); no bytes when none are
        written there yet. Raises StoreError when ``offset`` holds neither a record nor a filler."""
        seg = self.segment_for(offset)
        if seg is not None and offset < self.write_pos:
            total, magic = BLANK.unpack_from(seg.mm, offset - seg.start)
            if magic == BLANK_MAGIC and total == seg.end - offset:
                offset = seg.end
                seg = self.segment_for(offset)
        if seg is None or offset >= self.write_pos:
            if offset < self.min_offset:
                raise StoreError(f"commitlog offset {offset} was deleted by retention (the log now "
                                 f"starts at {self.min_offset}); the follower must start from a copy")
            return offset, b""
        rel = offset - seg.start
        limit = min(self.write_pos, seg.end) - seg.start
        if self.write_pos < seg.end and limit - rel <= max_bytes:
            # Hot path (bench/compare.py --replicated, row 3: a master streams the last few
            # batches): the rest of the active segment is whole records up to the write position
            # (a put commits whole records; a filler ends only a segment the writer left), so
            # only the first is checked, not each one walked.
            total, magic = BLANK.unpack_from(seg.mm, rel)
            if magic == MESSAGE_MAGIC and MIN_RECORD_SIZE <= total <= limit - rel:
                return offset, bytes(seg.mm[rel:limit])
        p = rel
        while p < limit:
            total, magic = BLANK.unpack_from(seg.mm, p)
            if magic != MESSAGE_MAGIC or total < MIN_RECORD_SIZE or (p > rel and p + total - rel > max_bytes):
                break
            p += total
        if p == rel:
            raise StoreError(f"commitlog offset {offset} is not the start of a record; replicate from a "
                             f"record boundary")
        return offset, bytes(seg.mm[rel:p])

    def is_boundary(self, offset: int) -> bool:
        """Whether ``offset`` is the end of the log, a record's start or a filler's."""
        if offset == self.write_pos:
            return True
        seg = self.segment_for(offset)
        if seg is None or offset > self.write_pos:
            return False
        total: int
        total, magic = BLANK.unpack_from(seg.mm, offset - seg.start)
        if magic == BLANK_MAGIC:
            return total == seg.end - offset
        return self.claim_at(offset) is not None

    def place(self, offset: int, total: int) -> tuple[MappedFile, int]:
        """Where ``total`` replicated bytes that the master has at ``offset`` go: the write position,
        or the next segment's start (the filler the master's rollover wrote is written here too,
        so the logs stay byte-identical). The caller writes, checks, then calls ``commit``."""
        seg = self.segments[-1]
        if offset == self.write_pos and total + FILLER_MIN <= seg.end - offset:
            return seg, offset - seg.start
        if offset == seg.end and total + FILLER_MIN <= self.segment_size:
            nxt = self._next_segment(seg.end)  # may raise OSError: nothing written yet
            BLANK.pack_into(seg.mm, self.write_pos - seg.start, seg.end - self.write_pos, BLANK_MAGIC)
            self.segments.append(nxt)
            self.write_pos = nxt.start
            self._prepare_next()
            return nxt, 0
        raise StoreError(
            f"{total} replicated bytes at commitlog offset {offset} do not continue this log, which ends "
            f"at {self.write_pos}: a gap or an overlap; reconnect so the handshake finds the right offset")

    def forget_pending(self) -> None:
        """Drop and delete a pre-created next segment (blocking: a truncation makes its start wrong,
        and left on disk it would be a gap at the next load)."""
        fut, self._pending = self._pending, None
        if fut is not None and not fut.cancel():
            try:
                fut.result().destroy()
            except OSError as exc:
                log.warning("pre-creating the next commitlog segment failed: %s", exc)

    def rewound(self, offset: int) -> None:
        """After recovery's cut at ``offset`` (a truncation): the write position moves back there
        and the next segment is pre-created again."""
        self.write_pos = offset
        self._prepare_next()

    # ------------------------------------------------------------------------------ flushing
    def segments_between(self, lo: int, hi: int) -> list[MappedFile]:
        """Segments holding bytes of [lo, hi) (snapshot taken on the loop thread)."""
        return [s for s in self.segments if s.start < hi and s.end > lo]

    # ------------------------------------------------------------------------------ retention
    def detach_head(self, count: int) -> list[MappedFile]:
        """Remove the ``count`` oldest segments from lookups (never the active one)."""
        count = min(count, len(self.segments) - 1)
        if count <= 0:
            return []
        gone = self.segments[:count]
        del self.segments[:count]
        return gone

    def close(self) -> None:
        self.drop_pending()
        self._prefault_at = _NEVER
        prefaulter, self._prefaulter = self._prefaulter, None
        if prefaulter is not None and self._own_prefaulter:
            prefaulter.shutdown(wait=True, cancel_futures=True)
        for seg in self.segments:
            seg.close()
        self.segments = []
