"""CommitLog recovery: find the end of valid data, cut a torn tail, refuse real corruption, and
replay records into consume queues and the index.

The walk starts at a record boundary the caller trusts (a segment start or a checkpoint offset)
and validates every record: magic, size within the segment (leaving room for the 8-byte filler),
a full decode of the framing (tidemq.message.decode_record_header), PHYSICALOFFSET equal to the
record's own position, and the body CRC when asked to. At the first position that holds neither a
valid record nor a correct filler:

- nothing valid follows (in the rest of that segment or any later one): a torn tail. Cut there
  (zero the rest, delete later segments) and log it -- unless the position lies below the
  ``durable`` mark (data fdatasynced before the checkpoint was written): then acknowledged data is
  damaged and recovery refuses (StoreCorruptError) rather than drop it silently;
- a valid record follows: corruption in the middle, refuse -- except past the durable mark when a
  page in the damaged stretch ends in zeros (a page of zeros, or >= 32 zero bytes up to a page
  boundary), the signature of pages the kernel had not yet written back when the machine died,
  or wrote back while a record was half written (no fsync covered them). Those unflushed bytes
  are cut like a torn tail, with a warning that counts what was discarded.

Never does recovery leave a record in place that failed validation, so nothing corrupt is served.

Consume queues are checked against the walked records (QueueCheck): a record the checkpoint says
was dispatched must have its exact unit, and no record may land outside a loaded queue's range.
A queue that fails (a zeroed or damaged file) is emptied and rebuilt from the whole CommitLog,
with a warning, so it never serves holes or hands out queue offsets consumers already committed.
An index file the checkpoint names but that is gone makes the whole index rebuild.
"""

from __future__ import annotations

import logging
import mmap
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from tidemq.errors import CodecError, StoreCorruptError, StoreError
from tidemq.message import (
    BLANK_MAGIC,
    MESSAGE_MAGIC,
    MIN_RECORD_SIZE,
    RecordHeader,
    decode_record_header,
)

from tidemq.broker.store.checkpoint import read_checkpoint
from tidemq.broker.store.commitlog import BLANK, FILLER_MIN, CommitLog
from tidemq.broker.store.config import FlushMode, StoreConfig
from tidemq.broker.store.dispatch import Dispatcher, enters_consume_queue
from tidemq.broker.store.index import IndexService
from tidemq.broker.store import deletions
from tidemq.broker.store.mapped_file import LazyMappedFile, MappedFile
from tidemq.broker.store.queues import QueueTable
from tidemq.broker.store.replay import Replayer, ScheduleTagsCode
from tidemq.broker.store.retention import destroy_all

log = logging.getLogger(__name__)

_MAGIC_BYTES = struct.pack(">I", MESSAGE_MAGIC)
PAGE = mmap.PAGESIZE


def validate_record(seg: MappedFile, rel: int, check_crc: bool) -> RecordHeader | str:
    """The header of the valid record at ``rel`` of ``seg``, or why there is none."""
    remaining = seg.size - rel
    if rel < 0 or remaining < MIN_RECORD_SIZE + FILLER_MIN:
        return "no room for a record"
    total, magic = BLANK.unpack_from(seg.mm, rel)
    if magic != MESSAGE_MAGIC:
        return f"bad magic code 0x{magic:08X}" if total or magic else "zero bytes (end of data)"
    if total < MIN_RECORD_SIZE or total + FILLER_MIN > remaining:
        return f"record size {total} does not fit the segment"
    raw = seg.mm[rel : rel + total]
    try:
        h = decode_record_header(raw)
    except CodecError as exc:
        return f"undecodable record ({exc})"
    if h.physical_offset != seg.start + rel:
        return f"record claims offset {h.physical_offset}"
    if check_crc:
        body = memoryview(raw)[h.body_start : h.body_start + h.body_length]
        crc = zlib.crc32(body) & 0x7FFFFFFF
        body.release()
        if crc != h.body_crc:
            return f"body CRC {crc} does not match the stored {h.body_crc}"
    return h


def _find_valid_after(segs: list[MappedFile], i: int, rel: int, check_crc: bool) -> int | None:
    """CommitLog offset of the first valid record after position ``rel`` of ``segs[i]``."""
    for j in range(i, len(segs)):
        seg = segs[j]
        search = rel + 1 + 4 if j == i else 4
        while True:
            f = seg.mm.find(_MAGIC_BYTES, search)
            if f < 0:
                break
            if not isinstance(validate_record(seg, f - 4, check_crc), str):
                return seg.start + f - 4
            search = f + 1
    return None


_TORN_ZEROS = 32  # a page written back mid-write ends in at least this many zeros (headers hold < 16)
_TORN_ZERO_BYTES = bytes(_TORN_ZEROS)


def _unwritten_between(seg: MappedFile, rel: int, limit: int, half_written: bool) -> bool:
    """Whether [rel, limit) of ``seg`` shows a page the kernel never wrote back, or wrote back in
    the middle of a record's write: a page of ``seg`` (4 KiB, written back whole or not at all)
    whose part inside the stretch ends in a run of zeros (>= 32 bytes, or the whole part when
    it is shorter). A single writer appends into zeroed space, so a page captured mid-write holds
    zeros from the write head to its end, while a bit flip or garbage leaves no such run."""
    first_end = min(limit, (rel // PAGE + 1) * PAGE)
    if first_end - rel >= FILLER_MIN and seg.mm[rel:first_end] == bytes(first_end - rel):
        return True
    zero_page = bytes(PAGE)
    b = (rel // PAGE + 1) * PAGE
    while b <= limit:
        if half_written:
            if b - _TORN_ZEROS >= rel and seg.mm[b - _TORN_ZEROS : b] == _TORN_ZERO_BYTES:
                return True
        elif b - PAGE >= rel and seg.mm[b - PAGE : b] == zero_page:
            return True
        b += PAGE
    return False


def walk_records(commitlog: CommitLog, start: int, end: int) -> Iterator[tuple[int, RecordHeader]]:
    """Each record of a live CommitLog in [``start``, ``end``) with its offset (``start`` a
    record boundary; read only, no CRC check: the records were validated when written or
    replicated). StoreError at bytes that are not a record."""
    segs = commitlog.segments
    if not segs:
        return
    pos = max(start, segs[0].start)
    while pos < end:
        seg = segs[(pos - segs[0].start) // commitlog.segment_size]
        rel = pos - seg.start
        total, magic = BLANK.unpack_from(seg.mm, rel) if seg.size - rel >= 8 else (0, 0)
        if seg.size - rel < 8 or (magic == BLANK_MAGIC and total == seg.size - rel):
            pos = seg.end
            continue
        res = validate_record(seg, rel, False)
        if isinstance(res, str):
            raise StoreError(f"commitlog offset {pos} (segment {seg.path}): {res}")
        yield pos, res
        pos += res.total_size


def scan_commitlog(
    commitlog: CommitLog,
    walk_from: int,
    durable: int,
    check_crc: bool,
    search_past_end: bool,
    on_record: Callable[[int, RecordHeader], None],
    half_written_pages: bool = False,
) -> int:
    """Validate records from ``walk_from`` (a record boundary) on, calling ``on_record(offset,
    header)`` for each; cut a torn tail; return the end of valid data. Blocking.

    ``search_past_end=False`` (after a clean shutdown) trusts zeros at the end of data and skips
    looking for valid records beyond them."""
    segs = commitlog.segments
    if not segs:
        return max(walk_from, 0)
    pos = min(max(walk_from, segs[0].start), segs[-1].end)
    i = (pos - segs[0].start) // commitlog.segment_size
    reason = ""
    while i < len(segs):
        seg = segs[i]
        rel = pos - seg.start
        total, magic = BLANK.unpack_from(seg.mm, rel) if seg.size - rel >= 8 else (0, 0)
        if magic == BLANK_MAGIC and total == seg.size - rel:
            pos = seg.end
            i += 1
            continue
        res = validate_record(seg, rel, check_crc)
        if isinstance(res, str):
            reason = res
            break
        on_record(pos, res)
        pos += res.total_size
    else:
        if pos < durable:
            raise StoreCorruptError(
                f"the commitlog ends at offset {pos} (segment {segment_name_of(commitlog, pos)} is missing) "
                f"but the checkpoint says data up to offset {durable} was flushed; restore the missing "
                f"segment(s), or delete the whole store directory to start empty"
            )
        return pos
    seg = segs[i]
    rel = pos - seg.start
    at_end = reason.startswith("zero bytes")
    if at_end and not search_past_end and pos >= durable and _later_segments_empty(segs, i):
        # Clean shutdown: the data ends here. Drop segments pre-created beyond it.
        _drop_later(commitlog, i)
        return pos
    nxt = _find_valid_after(segs, i, rel, check_crc)
    where = f"commitlog segment {seg.path} at offset {pos} (file position {rel})"
    if nxt is None:
        if pos < durable:
            raise StoreCorruptError(
                f"{where}: {reason}, but the checkpoint says data up to offset {durable} was flushed "
                f"to disk. Acknowledged messages are damaged, so the store refuses to start. Restore "
                f"the segment from a backup or replica; to accept the loss, truncate the file at "
                f"position {rel} (zero the rest), delete later segments and the checkpoint, and start again."
            )
        _cut(commitlog, i, rel, f"{where}: {reason}" if not at_end else "")
        return pos
    if pos >= durable and _unwritten_between(seg, rel, min(nxt, seg.end) - seg.start, half_written_pages):
        log.warning(
            "%s: %s; data up to offset %d was never flushed and pages of it are missing, so "
            "everything from here on (including valid-looking records from offset %d) is discarded",
            where, reason, max(durable, 0), nxt,
        )
        _cut(commitlog, i, rel, "")
        return pos
    raise StoreCorruptError(
        f"{where}: {reason}, and a valid record follows at offset {nxt}: the commitlog is "
        f"corrupt in the middle, so the store refuses to start rather than drop or serve damaged "
        f"messages. Restore {seg.path.name} from a backup or replica; to give up the messages "
        f"from offset {pos} on, truncate the file at position {rel} (zero the rest), delete the "
        f"later segments and the checkpoint, and start again."
    )


def segment_name_of(commitlog: CommitLog, offset: int) -> str:
    return str(commitlog.dir / f"{offset // commitlog.segment_size * commitlog.segment_size:020d}")


def _later_segments_empty(segs: list[MappedFile], i: int) -> bool:
    return all(s.mm[0:8] == bytes(8) for s in segs[i + 1 :])


def _drop_later(commitlog: CommitLog, i: int) -> list[MappedFile]:
    later = commitlog.segments[i + 1 :]
    del commitlog.segments[i + 1 :]
    for s in later:
        log.info("removing commitlog segment %s past the end of data", s.path)
        s.destroy()
    return later


def _cut(commitlog: CommitLog, i: int, rel: int, what: str) -> None:
    seg = commitlog.segments[i]
    chunks = seg.zero_from(rel)
    later = _drop_later(commitlog, i)
    if what or chunks or later:
        log.warning(
            "truncated the commitlog at offset %d (%s, file position %d)%s; %d segment(s) after it removed",
            seg.start + rel, seg.path, rel, f": {what}" if what else "", len(later),
        )
    if chunks:
        seg.flush()


def truncate_commitlog(commitlog: CommitLog, offset: int, why: str) -> None:
    """Cut the CommitLog at ``offset`` (a record boundary at or above its start), as a torn tail
    is cut: zero the rest of its segment (flushed, so the old records never come back at a
    load), delete later segments and the pre-created next one. Blocking (a worker thread);
    the caller moves the write position (``CommitLog.rewound``)."""
    if not commitlog.min_offset <= offset <= commitlog.write_pos:
        raise StoreCorruptError(f"cannot truncate the commitlog at {offset}: it holds "
                                f"[{commitlog.min_offset}, {commitlog.write_pos})")
    commitlog.forget_pending()
    i = (offset - commitlog.min_offset) // commitlog.segment_size
    _cut(commitlog, i, offset - commitlog.segments[i].start, why)


# --------------------------------------------------------------------------- the recovery plan


@dataclass(frozen=True, slots=True)
class Recovered:
    end: int  # CommitLog write position after recovery
    durable: int  # what the checkpoint vouched for as flushed (-1: nothing)
    walk_from: int
    scanned: int
    units_written: int
    indexed: int
    last_store_timestamp: int


def recover(cfg: StoreConfig, crash: bool, commitlog: CommitLog, queues: QueueTable, index: IndexService,
            dispatcher: Dispatcher, schedule_tags_code: ScheduleTagsCode) -> Recovered:
    """Open CommitLog, consume queues and index and bring them in line (blocking).

    Plan: consume queues are replayed from the checkpoint's logics offset and the index from its
    index offset (from the CommitLog's start when the checkpoint is missing or their files were
    deleted); the walk validates from the start of the segment holding the flushed end (or
    earlier, where replay starts), so the last segment is always checked; consume-queue units
    past the recovered end are dropped; units and index files below the CommitLog's start go.
    Records are replayed through ``dispatcher``, the one live puts go through (no listeners hear
    a replay)."""
    ckpt = read_checkpoint(cfg.checkpoint_path)
    commitlog.open_segments()
    if not commitlog.segments and ckpt is not None and ckpt.physic_offset > 0:
        raise StoreCorruptError(
            f"{commitlog.dir} holds no segments but the checkpoint says {ckpt.physic_offset} bytes were "
            f"flushed; restore the commitlog, or delete the whole store directory {cfg.root} to start empty"
        )
    cl_min = commitlog.min_offset
    rebuild_queues = queues.load_all(has_data=bool(commitlog.segments))
    rebuild_index = index.load(crash or ckpt is None, ckpt.index_file if ckpt else -1,
                               ckpt.index_count if ckpt else 0)
    if (not rebuild_index and ckpt is not None and ckpt.index_file >= 0 and ckpt.index_count > 1
            and not any(f.start == ckpt.index_file for f in index.files)):
        log.warning("index file %s named by the checkpoint is missing; rebuilding the index from the "
                    "commitlog", index.dir / f"{ckpt.index_file:020d}")
        destroy_all([f.mf for f in index.files])
        index.files.clear()
        rebuild_index = True
    cq_from = ckpt.logics_offset if ckpt and not rebuild_queues and ckpt.logics_offset >= 0 else cl_min
    idx_from = ckpt.index_offset if ckpt and not rebuild_index and ckpt.index_offset >= 0 else cl_min
    cq_from, idx_from = max(cq_from, cl_min), max(idx_from, cl_min)
    durable = ckpt.physic_offset if ckpt else -1
    if durable > cl_min:
        walk_from = min(cq_from, idx_from, durable - 1 - (durable - 1) % commitlog.segment_size)
    else:
        walk_from = cl_min
    marks = deletions.load(cfg.deleted_topics_path)
    deleted = deletions.latest(marks)
    replayer = Replayer(dispatcher, cq_from, idx_from, schedule_tags_code, deleted)
    units_before, indexed_before = dispatcher.queues.units_written, dispatcher.index.indexed
    check = QueueCheck(queues, cq_from, deleted)
    seen = [0, 0]

    def on_record(phys: int, h: RecordHeader) -> None:
        seen[0] += 1
        seen[1] = h.store_timestamp
        if not check.damaged_by(phys, h):
            replayer(phys, h)

    # Half-written pages past the checkpoint are cut only with ASYNC_FLUSH, whose contract loses
    # unflushed data anyway; with SYNC_FLUSH acknowledged (fsynced) records may lie past the
    # checkpoint, so only a whole page of zeros counts as never written there.
    end = scan_commitlog(commitlog, walk_from, durable, cfg.check_crc_on_recover, crash, on_record,
                         half_written_pages=cfg.flush_mode is FlushMode.ASYNC)
    end = max(end, cl_min)
    units_written = dispatcher.queues.units_written - units_before
    indexed = dispatcher.index.indexed - indexed_before
    rebuild_topics: set[str] = set()
    pending = deletions.load_pending(cfg.pending_cut_path)
    if pending is not None and deletions.owed(pending, end):
        # A follower's cut made before a crash, its marks or rebuild maybe not: finish both. (A
        # stale record's replay above is consistent with the marks as they are, and the next
        # handshake cuts again.)
        fixed = deletions.cut(marks, pending[0], pending[1])
        if fixed != marks:
            deletions.save(cfg.deleted_topics_path, fixed)
            deleted = deletions.latest(fixed)
        rebuild_topics = set(pending[1])
    if check.damaged or rebuild_topics:
        _rebuild_queues(cfg, commitlog, queues, dispatcher, check, schedule_tags_code, deleted, rebuild_topics)
    commitlog.ensure_active(end)
    gone = queues.truncate_past(end)
    if crash:  # after a clean shutdown every unit was flushed whole
        gone += _drop_unclaimed_tails(queues, commitlog.claim_at, cl_min, cq_from)
    destroy_all(gone + queues.detach_below(cl_min))
    return Recovered(end, durable, walk_from, seen[0], units_written, indexed, seen[1])


def _drop_unclaimed_tails(queues: QueueTable, claim_at: Callable[[int], tuple[str, int, int, int] | None],
                          cl_min: int, cq_from: int) -> list[LazyMappedFile]:
    """Drop units at the end of each queue that point at no record claiming them.

    After a power cut the last units of a queue may be torn (a 20-byte unit straddles a page
    boundary and only one page reached the disk) or point at puts that were lost; the walk
    rewrote every unit whose record survived, so from the tail back, a unit whose record (with
    that topic, queue id, queue offset and size) is not there is dropped -- never served. A unit
    in order after its predecessor whose record lies below the checkpoint's ``cq_from`` was
    flushed whole before the checkpoint (or its record is gone with retention): accepted
    without reading the CommitLog, so a start reads it only for queues written since."""
    gone: list[LazyMappedFile] = []
    for cq in queues:
        q = cq.max_offset
        while q > cq.min_offset:
            u = cq.unit(q - 1)
            prev = cq.unit(q - 2) if q - 2 >= cq.min_offset else None
            if u is not None and u[1] > 0 and (prev is None or (prev[1] > 0 and prev[0] < u[0])):  # in order
                if u[0] + u[1] <= cq_from or u[0] < cl_min:
                    break
                if claim_at(u[0]) == (cq.topic, cq.queue_id, q - 1, u[1]):
                    break
            q -= 1
        if q < cq.max_offset:
            log.warning("consume queue %s/%d: dropping offsets %d..%d at its end that point at no record "
                        "claiming them (torn or lost in a crash)", cq.topic, cq.queue_id, q, cq.max_offset - 1)
            gone += cq.truncate_to(q)
    return gone


class QueueCheck:
    """Finds consume queues that lost units the checkpoint vouched for (a zeroed or damaged file).

    A record below ``cq_from`` (dispatched and flushed before the checkpoint) must have its exact
    unit in its queue; a record at or past it must not land beyond the end of a queue that existed
    at load (that would leave a hole, or re-use queue offsets consumers already committed).
    Queues created during the walk (no files at load) are being rebuilt and are not checked."""

    def __init__(self, queues: QueueTable, cq_from: int, deleted: dict[str, int]) -> None:
        self.queues = queues
        self.cq_from = cq_from
        self.deleted = deleted
        self.loaded = {(cq.topic, cq.queue_id) for cq in queues if cq.files}
        self.damaged: dict[tuple[str, int], str] = {}

    def damaged_by(self, phys: int, h: RecordHeader) -> bool:
        key = (h.topic, h.queue_id)
        if key in self.damaged:
            return True
        if key not in self.loaded or phys < self.deleted.get(h.topic, -1) or h.queue_offset < 0:
            return False
        if not enters_consume_queue(h.sys_flag):
            return False
        cq = self.queues.get(*key)
        q = h.queue_offset
        if phys < self.cq_from:
            unit = cq.unit(q) if cq is not None else None
            if unit is not None and unit[0] == phys and unit[1] == h.total_size:
                return False
            why = (f"queue offset {q} of the record at commitlog offset {phys} is "
                   + ("missing" if unit is None or unit[1] == 0 else f"a pointer to {unit[0]}"))
        elif cq is None or cq.min_offset <= q <= cq.max_offset:
            return False
        else:
            why = (f"the record at commitlog offset {phys} has queue offset {q} but the queue holds "
                   f"offsets {cq.min_offset}..{cq.max_offset}")
        self.damaged[key] = why
        log.warning("consume queue %s/%d is damaged (%s); it will be rebuilt from the commitlog", *key, why)
        return True


def _rebuild_queues(cfg: StoreConfig, commitlog: CommitLog, queues: QueueTable, dispatcher: Dispatcher,
                    check: QueueCheck, schedule_tags_code: ScheduleTagsCode,
                    deleted: dict[str, int], topics: frozenset[str] | set[str] = frozenset()) -> None:
    """Empty the damaged queues and every queue of ``topics`` (their deletion was in a cut tail and
    a crash came before their rebuild was done: deletions.py), and re-dispatch their records from the start of the CommitLog (validating
    every record on the way). QueueCheck marks only queues it found, so each damaged queue
    exists: ``get_or_create`` just finds it."""
    for topic, qid in check.damaged:
        destroy_all(queues.get_or_create(topic, qid).reset())  # before the rebuild re-creates the same names
    for topic in topics:
        destroy_all(queues.reset_topic(topic))
    rebuild = Replayer(dispatcher, commitlog.min_offset, 1 << 62, schedule_tags_code, deleted)
    wanted = set(check.damaged)

    def on_record(phys: int, h: RecordHeader) -> None:
        if (h.topic, h.queue_id) in wanted or h.topic in topics:
            rebuild(phys, h)

    scan_commitlog(commitlog, commitlog.min_offset, -1, cfg.check_crc_on_recover, False, on_record)
    for topic, qid in sorted(wanted | {(t, q) for t in topics for q in queues.by_topic.get(t, {})}):
        cq = queues.get_or_create(topic, qid)
        log.warning("consume queue %s/%d rebuilt from the commitlog: offsets %d..%d",
                    topic, qid, cq.min_offset, cq.max_offset)
