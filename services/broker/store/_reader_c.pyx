# cython: language_level=3
"""Compiled twin of tidemq.broker.store.reader.collect_py: a pull's records gathered from raw
consume-queue units, the same records, counts and outcome (tests/broker/store/test_compiled_twins.py).

A unit whose record is not plainly there (outside the log or its segment, too small, or a header
that does not name the unit's size and offset) is handed to ``CommitLog.read`` itself, which
decides (and logs) as for the twin. No buffer of a mapping is held: records are sliced (copied)
out of ``seg.mm`` exactly as the twin's ``read`` does.
"""

from cpython.bytes cimport PyBytes_AS_STRING
from cpython.list cimport PyList_GET_SIZE
from libc.stdint cimport INT64_MAX, int32_t, int64_t, uint32_t, uint64_t

from tidemq.message import MESSAGE_MAGIC, MIN_RECORD_SIZE

cdef uint32_t _MAGIC = MESSAGE_MAGIC
cdef int64_t _MIN = MIN_RECORD_SIZE
# PHYSICALOFFSET's position in a record (tidemq.message.PHYSICAL_OFFSET_POS)
cdef Py_ssize_t _OWN = 28
# reader.CHUNK_DONE, PULL_FULL, NOTHING_VISIBLE
cdef enum:
    CHUNK_DONE = 0
    PULL_FULL = 1
    NOTHING_VISIBLE = 2


cdef inline uint32_t _u32(const unsigned char* b) noexcept:
    return (<uint32_t>b[0] << 24) | (<uint32_t>b[1] << 16) | (<uint32_t>b[2] << 8) | b[3]


cdef inline int64_t _i64(const unsigned char* b) noexcept:
    return <int64_t>((<uint64_t>_u32(b) << 32) | _u32(b + 4))


cdef inline bint _beyond(int64_t phys, int64_t size, int64_t visible_end) noexcept:
    """``phys + size > visible_end`` as the twin's unbounded integers say it, for any unit
    (a hostile one's phys + size can overflow int64; ``visible_end`` >= 0)."""
    if size >= 0:
        return phys > visible_end - size  # >= -2**31: no overflow
    if visible_end > INT64_MAX + size:  # visible_end - size would pass INT64_MAX, and phys cannot
        return False
    return phys > visible_end - size


cdef object _read(commitlog, list segs, int64_t first, int64_t seg_size, int64_t write_pos,
                  int64_t phys, int64_t size):
    """CommitLog.read's answer: the record bytes, or None."""
    cdef Py_ssize_t i
    cdef int64_t rel
    cdef const unsigned char* h
    if size >= _MIN and phys >= first and size <= write_pos - phys:  # first >= 0: no overflow
        i = (phys - first) // seg_size
        if i < PyList_GET_SIZE(segs):
            seg = segs[i]
            rel = phys - <int64_t>seg.start
            if rel + size <= <int64_t>seg.size:
                rec = seg.mm[rel : rel + size]
                if type(rec) is bytes and len(rec) == size:
                    h = <const unsigned char*>PyBytes_AS_STRING(rec)
                    if <int32_t>_u32(h) == size and _u32(h + 4) == _MAGIC and _i64(h + _OWN) == phys:
                        return rec
    return commitlog.read(phys, size)  # anything else: the twin's own answer (and its log line)


def collect(const unsigned char[::1] units, list records, int64_t scanned, int64_t total, int64_t skip_below,
            bint removing, Py_ssize_t max_msgs, int64_t max_bytes, int64_t visible_end, tag_codes, commitlog):
    """See the twin (reader.collect_py)."""
    cdef Py_ssize_t p = 0, n = units.shape[0] - units.shape[0] % 20
    cdef int64_t phys, tags, first, seg_size, write_pos
    cdef int32_t size
    cdef const unsigned char* u
    cdef list segs = commitlog.segments
    seg_size = commitlog.segment_size
    write_pos = commitlog.write_pos
    first = segs[0].start if segs else 0
    while p < n:
        u = &units[p]
        phys = _i64(u)
        size = <int32_t>_u32(u + 8)
        tags = _i64(u + 12)
        p += 20
        if records and (PyList_GET_SIZE(records) >= max_msgs or total + size > max_bytes):
            return PULL_FULL, scanned, total, skip_below, removing
        if visible_end >= 0 and _beyond(phys, size, visible_end):
            if not records and not scanned:
                return NOTHING_VISIBLE, scanned, total, skip_below, removing
            return PULL_FULL, scanned, total, skip_below, removing
        scanned += 1
        if size <= 0 or phys < skip_below:
            continue
        if tag_codes is not None and tags not in tag_codes:
            continue
        rec = _read(commitlog, segs, first, seg_size, write_pos, phys, size) if segs else commitlog.read(phys, size)
        if rec is None:
            if not records:
                removing = True
            skip_below = commitlog.next_segment_start(phys)
            continue
        records.append(rec)
        total += size
    return CHUNK_DONE, scanned, total, skip_below, removing
