# cython: language_level=3
"""Compiled twins of the dispatcher's per-record writes: consume-queue units of a run
(tidemq.broker.store.consume_queue.write_units_py) and index entries of a run
(tidemq.broker.store.index.put_entries_py). Same bytes in the mappings, same results: the
differential tests in tests/broker/store/test_dispatch_twins.py prove it.

Each call checks once that every position it will write lies inside the mapping (IndexError
otherwise, before any write), then writes through a pointer: a bounds-checked memoryview passed
to the per-field helpers cost more than the Python twin's pack_into (300 vs 170 ns per unit).
"""

from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t

# The layouts of consume_queue.UNIT (20 bytes: i64 offset, i32 size, i64 tags code) and of
# index.HEADER (40 bytes) and index.ENTRY (20 bytes: i32 hash, i64 offset, i32 seconds, i32 previous);
# imported from nowhere (those modules load this one), proven equal by the differential tests.
cdef Py_ssize_t HEADER_SIZE = 40
cdef uint32_t _CRC_TABLE[256]
cdef int64_t _I32_MAX = 0x7FFFFFFF


cdef void _crc_init():
    cdef uint32_t c
    cdef int i, k
    for i in range(256):
        c = i
        for k in range(8):
            c = (0xEDB88320 ^ (c >> 1)) if c & 1 else (c >> 1)
        _CRC_TABLE[i] = c


_crc_init()


cdef inline uint32_t _crc(uint32_t crc, const char* p, Py_ssize_t n):
    """zlib.crc32(p[:n], crc): the same standard CRC-32, continued from ``crc``."""
    cdef Py_ssize_t i
    crc = crc ^ 0xFFFFFFFF
    for i in range(n):
        crc = _CRC_TABLE[(crc ^ <unsigned char>p[i]) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


cdef inline void _put32(unsigned char* m, uint32_t v) noexcept:
    m[0] = v >> 24
    m[1] = (v >> 16) & 0xFF
    m[2] = (v >> 8) & 0xFF
    m[3] = v & 0xFF


cdef inline void _put64(unsigned char* m, int64_t v) noexcept:
    _put32(m, <uint32_t>((<uint64_t>v) >> 32))
    _put32(m + 4, <uint32_t>((<uint64_t>v) & 0xFFFFFFFF))


cdef inline int32_t _get32(const unsigned char* m) noexcept:
    return <int32_t>((<uint32_t>m[0] << 24) | (<uint32_t>m[1] << 16) | (<uint32_t>m[2] << 8) | m[3])


def write_units(mm, Py_ssize_t pos, int64_t phys, records, Py_ssize_t start, Py_ssize_t n):
    """Units of ``records[start:start + n]`` (back to back from CommitLog offset ``phys``) at byte
    ``pos`` of a consume-queue mapping; returns the CommitLog offset after them. Units that would
    not fit the mapping raise IndexError before anything is written."""
    cdef unsigned char[::1] m = mm
    if n <= 0:
        return phys
    if pos < 0 or pos + n * 20 > m.shape[0]:
        raise IndexError(f"{n} consume-queue units at byte {pos} do not fit a {m.shape[0]}-byte file")
    cdef unsigned char* o = &m[pos]  # [pos, pos + n * 20) is inside (checked above)
    cdef Py_ssize_t i
    cdef int32_t size
    cdef int64_t code
    for i in range(start, start + n):
        r = records[i]
        size = r.total
        code = r.tags_code
        _put64(o, phys)
        _put32(o + 8, <uint32_t>size)
        _put64(o + 12, code)
        o += 20
        phys += size
    return phys


cdef inline void _entry(unsigned char* m, int64_t slots, Py_ssize_t entries_at, int64_t count,
                        int32_t h, int64_t phys, int64_t diff) noexcept:
    """One entry (IndexFile.put without its header bookkeeping); ``count`` is the new entry's
    index. The caller checked that the file holds every slot and entry position."""
    cdef int64_t ah = h
    if ah < 0:
        ah = -ah
    cdef unsigned char* slot = m + HEADER_SIZE + (ah % slots) * 4
    cdef int64_t prev = _get32(slot)
    if not 0 <= prev < count:
        prev = 0
    cdef unsigned char* e = m + entries_at + count * 20
    _put32(e, <uint32_t>h)
    _put64(e + 4, phys)
    _put32(e + 12, <uint32_t>diff)
    _put32(e + 16, <uint32_t>prev)
    _put32(slot, <uint32_t>count)


cdef inline int32_t _key_hash(uint32_t prefix, str key) except? -1:
    cdef Py_ssize_t n
    cdef const char* p = PyUnicode_AsUTF8AndSize(key, &n)
    return <int32_t>_crc(prefix, p, n)


def put_entries(f, str topic, records, Py_ssize_t start, int64_t phys, int64_t store_ts):
    """Index entries of ``records[start:]`` into IndexFile ``f`` as IndexService.add puts them,
    stopping before the first record whose entries do not all fit ``f``; updates ``f``'s count
    and bounds. Returns (records done, CommitLog offset after them, entries written)."""
    cdef unsigned char[::1] view = f.mf.mm
    cdef int64_t slots = f.slots
    cdef Py_ssize_t entries_at = f._entries_at
    cdef int64_t count = f.count, max_entries = f.max_entries
    if (slots <= 0 or entries_at != HEADER_SIZE + slots * 4 or max_entries < 1
            or entries_at + max_entries * 20 > view.shape[0]):
        raise IndexError(f"index file {f.mf.path} is smaller than its {slots} slots and {max_entries} entries")
    cdef unsigned char* m = &view[0]  # every slot and entry position is inside (checked above)
    cdef int64_t begin_ts = f.begin_ts, begin_phy = f.begin_phy, end_phy = f.end_phy, end_ts = f.end_ts
    cdef Py_ssize_t n = len(records), i = start, need, written = 0
    cdef Py_ssize_t tn
    cdef const char* tp = PyUnicode_AsUTF8AndSize(topic, &tn)
    cdef uint32_t prefix = _crc(_crc(0, tp, tn), "#", 1)  # crc32(f"{topic}#" + key) continues this
    cdef int64_t diff
    cdef list parts
    while i < n:
        r = records[i]
        keys = r.keys
        uniq = r.uniq
        parts = keys.split() if keys else None
        need = (1 if uniq else 0) + (len(parts) if parts is not None else 0)
        if need:
            if count + need > max_entries:
                break
            if count == 1:
                begin_ts = store_ts
                begin_phy = phys
            diff = (store_ts - begin_ts) // 1000 if store_ts >= begin_ts else 0
            if diff > _I32_MAX:
                diff = _I32_MAX
            if uniq:
                _entry(m, slots, entries_at, count, _key_hash(prefix, uniq), phys, diff)
                count += 1
            if parts is not None:
                for k in parts:
                    _entry(m, slots, entries_at, count, _key_hash(prefix, k), phys, diff)
                    count += 1
            written += need
            end_phy = phys
            if store_ts > end_ts:
                end_ts = store_ts
        phys += r.total
        i += 1
    if written:
        f.count = count
        f.begin_ts = begin_ts
        f.begin_phy = begin_phy
        f.end_phy = end_phy
        f.end_ts = end_ts
    return i - start, phys, written
