"""Reading messages back: pull reads, offset-by-time search, key queries.

Pure functions over a ConsumeQueue / IndexService and the CommitLog; they run on the event loop
and only copy the records they return (slices of the mapping), never whole segments.

``get_messages`` implements PROTOCOL-REFERENCE 6.4 (RocketMQ's DefaultMessageStore.getMessage):
status and nextBeginOffset per the table there; nextBeginOffset after a scan is the requested
offset plus the number of consume-queue units looked at (matched or not); at least one message is
returned whenever one matched, however large.
"""

from __future__ import annotations

from collections.abc import Callable

from tidemq import compiled
from tidemq.errors import CodecError
from tidemq.message import Prop, decode_record_header, decode_properties

from tidemq.broker.store.commitlog import CommitLog
from tidemq.broker.store.consume_queue import UNIT, ConsumeQueue
from tidemq.broker.store.index import IndexService
from tidemq.broker.store.results import GetResult, GetStatus


# Hot path (bench/produce_consume.py)
UNIT_CHUNK = 64
# What collect says about the chunk it was given: all of it looked at; the pull is full (or hit
# the high-water mark after something was read); nothing at all is visible yet.
CHUNK_DONE, PULL_FULL, NOTHING_VISIBLE = 0, 1, 2
_UNIT_STEP = UNIT.size

# (units, records, scanned, total, skip_below, removing, max_msgs, max_bytes, visible_end,
#  tag_codes, commitlog) -> (what happened, scanned, total, skip_below, removing)
Collect = Callable[[bytes, list[bytes], int, int, int, bool, int, int, int, "frozenset[int] | None",
                    CommitLog], tuple[int, int, int, int, bool]]


def collect_py(units: bytes, records: list[bytes], scanned: int, total: int, skip_below: int, removing: bool,
               max_msgs: int, max_bytes: int, visible_end: int, tag_codes: frozenset[int] | None,
               commitlog: CommitLog) -> tuple[int, int, int, int, bool]:
    """Look at raw consume-queue ``units`` in order, appending the records they point at to
    ``records`` (see get_messages for the rules); ``visible_end`` -1 means no high-water mark.
    ``_reader_c.collect`` is its compiled twin."""
    read = commitlog.read
    for phys, size, tags in UNIT.iter_unpack(units):
        if records and (len(records) >= max_msgs or total + size > max_bytes):
            return PULL_FULL, scanned, total, skip_below, removing
        if visible_end >= 0 and phys + size > visible_end:
            if not records and not scanned:
                return NOTHING_VISIBLE, scanned, total, skip_below, removing
            return PULL_FULL, scanned, total, skip_below, removing
        scanned += 1
        if size <= 0 or phys < skip_below:
            continue
        if tag_codes is not None and tags not in tag_codes:
            continue
        rec = read(phys, size)
        if rec is None:
            if not records:
                removing = True
            skip_below = commitlog.next_segment_start(phys)
            continue
        records.append(rec)
        total += size
    return CHUNK_DONE, scanned, total, skip_below, removing


def get_messages(cq: ConsumeQueue | None, commitlog: CommitLog, offset: int, max_msgs: int,
                 tag_codes: frozenset[int] | None, max_bytes: int, visible_end: int | None = None,
                 collect: Collect | None = None) -> GetResult:  # collect: used for testing (twins)
    """Messages of ``cq`` from ``offset``; with ``visible_end``, only records ending at or below
    that CommitLog offset (a replicated group's high-water mark): a queue whose next record is
    past it reads as caught up (OFFSET_OVERFLOW_ONE), so a consumer long-polls for it."""
    if cq is None or cq.max_offset == 0:
        return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, 0, 0, 0)
    lo, hi = cq.min_offset, cq.max_offset
    if offset < lo:
        return GetResult(GetStatus.OFFSET_TOO_SMALL, lo, lo, hi)
    if offset == hi:
        return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, offset, lo, hi)
    if offset > hi:
        return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, hi, lo, hi)
    max_msgs = max(1, max_msgs)
    # Scan up to 20x as many units as messages wanted (RocketMQ's bound: units that do not match
    # the tag filter or point into a removed segment are skipped), read raw in chunks so a pull
    # that fills up early stops early (bench/spark_read.py guards this: a 1024-message pull used
    # to unpack 20 480 units to return the ~200 that fit in max_bytes).
    scan = max(800, max_msgs * 20)
    units = cq.raw_units(offset, min(scan, UNIT_CHUNK))
    if units is None:
        return GetResult(GetStatus.OFFSET_FOUND_NULL, cq.next_file_offset(offset), lo, hi)
    run = collect if collect is not None else _collect
    records: list[bytes] = []
    total = scanned = 0
    skip_below = -1  # after a unit pointed into a deleted segment: skip the rest of that segment
    removing = False
    visible = -1 if visible_end is None else max(visible_end, 0)  # -1: no mark
    done = 0  # units read from the queue
    while True:
        what, scanned, total, skip_below, removing = run(
            units, records, scanned, total, skip_below, removing, max_msgs, max_bytes, visible, tag_codes,
            commitlog)
        if what == NOTHING_VISIBLE:
            return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, offset, lo, hi)
        n = len(units) // _UNIT_STEP
        done += n
        want = min(UNIT_CHUNK, scan - done)
        if what == PULL_FULL or n < UNIT_CHUNK or want <= 0:
            break
        units = cq.raw_units(offset + done, want) or b""
    if records:
        status = GetStatus.FOUND
    elif removing:
        status = GetStatus.MESSAGE_WAS_REMOVING
    else:
        status = GetStatus.NO_MATCHED_MESSAGE
    return GetResult(status, offset + scanned, lo, hi, records, len(records), total)


_c = compiled.load("tidemq.broker.store._reader_c")
_collect: Collect = _c.collect if _c is not None else collect_py


def store_time_at(cq: ConsumeQueue | None, commitlog: CommitLog, offset: int) -> int:
    if cq is None:
        return 0
    u = cq.unit(offset)
    if u is None or u[1] <= 0:
        return 0
    ts = commitlog.store_timestamp(u[0], u[1])
    return ts if ts > 0 else 0


def offset_by_time(cq: ConsumeQueue | None, commitlog: CommitLog, timestamp_ms: int) -> int:
    """SEARCH_OFFSET_BY_TIMESTAMP: the offset whose store time equals ``timestamp_ms`` (the first
    such), else the nearer of its two neighbours (the earlier on a tie); 0 for an empty queue.
    Units whose record is gone count as older than any time."""
    if cq is None or cq.max_offset <= cq.min_offset:
        return 0
    lo, hi = cq.min_offset, cq.max_offset
    cache: dict[int, int] = {}

    def ts_of(q: int) -> int:
        t = cache.get(q)
        if t is None:
            u = cq.unit(q)
            t = commitlog.store_timestamp(u[0], u[1]) if u is not None and u[1] > 0 else -1
            cache[q] = t
        return t

    a, b = lo, hi  # first offset with store time >= timestamp
    while a < b:
        mid = (a + b) // 2
        if ts_of(mid) < timestamp_ms:
            a = mid + 1
        else:
            b = mid
    if a < hi and ts_of(a) == timestamp_ms:
        return a
    left = a - 1 if a - 1 >= lo and ts_of(a - 1) >= 0 else None
    right = a if a < hi else None
    if left is None:
        return right if right is not None else hi - 1
    if right is None:
        return left
    return right if abs(timestamp_ms - ts_of(left)) > abs(timestamp_ms - ts_of(right)) else left


def query_by_key(index: IndexService, commitlog: CommitLog, topic: str, key: str, max_num: int,
                 begin_ms: int, end_ms: int) -> list[bytes]:
    """Records of ``topic`` whose KEYS contain ``key`` or whose UNIQ_KEY is ``key``, stored in
    [begin_ms, end_ms], newest first, at most ``max_num``. Index hits are re-checked."""
    if max_num <= 0:
        return []
    # Ask for more candidates than needed: hash collisions are filtered out below.
    candidates = index.query(topic, key, max_num * 4 + 16, begin_ms, end_ms)
    out: list[bytes] = []
    for phys in sorted(set(candidates), reverse=True):
        rec = commitlog.read_record(phys)
        if rec is None:
            continue
        try:
            h = decode_record_header(rec)
        except CodecError:
            continue
        if h.topic != topic or not begin_ms <= h.store_timestamp <= end_ms:
            continue
        props = decode_properties(h.properties)
        if props.get(Prop.UNIQ_KEY) != key and key not in (props.get(Prop.KEYS) or "").split():
            continue
        out.append(rec)
        if len(out) >= max_num:
            break
    return out
