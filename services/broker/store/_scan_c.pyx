# cython: language_level=3
"""Compiled twin of tidemq.broker.store.scan (``scan_records``): the same runs, the same errors.

Every read is at a position the same length checks as the Python twin's proved inside ``data``
(so hostile bytes raise StoreCorruptError, never read outside it); reads go through a pointer,
as bounds-checked memoryview helpers cost more than the twin's struct calls.
"""

from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcmp

from tidemq.errors import StoreCorruptError
from tidemq.message import MESSAGE_MAGIC, MIN_RECORD_SIZE, TRANSACTION_MASK

from tidemq.broker.store.checksum import crc32
from tidemq.broker.store.dispatch import Replayed, Run

cdef uint32_t _MAGIC = MESSAGE_MAGIC
cdef Py_ssize_t _MIN = MIN_RECORD_SIZE
cdef int32_t _TX = TRANSACTION_MASK
cdef Py_ssize_t _HEAD = 48  # RECORD_HEAD: TOTALSIZE through BORNTIMESTAMP
_crc32 = crc32  # checksum.py: ISA-L's when installed (a follower checks every body)


cdef inline uint32_t _u32(const unsigned char* b) noexcept:
    return (<uint32_t>b[0] << 24) | (<uint32_t>b[1] << 16) | (<uint32_t>b[2] << 8) | b[3]


cdef inline int64_t _i64(const unsigned char* b) noexcept:
    return <int64_t>((<uint64_t>_u32(b) << 32) | _u32(b + 4))


cdef object _refused(int64_t phys, str why):
    return StoreCorruptError(f"record at commitlog offset {phys} is refused: {why}")


cdef int32_t _java_hash(str s):
    """Java String.hashCode (UTF-16 code units), as tidemq.message.java_hash."""
    cdef uint32_t h = 0
    cdef Py_UCS4 ch
    cdef uint32_t c
    for ch in s:
        c = ch
        if c >= 0x10000:
            c -= 0x10000
            h = h * 31 + (0xD800 + (c >> 10))
            h = h * 31 + (0xDC00 + (c & 0x3FF))
        else:
            h = h * 31 + c
    return <int32_t>h


cdef inline bint _ascii(const unsigned char* b, Py_ssize_t n) noexcept:
    """Whether b[:n] is all ASCII (so valid UTF-8)."""
    cdef Py_ssize_t i
    for i in range(n):
        if b[i] & 0x80:
            return False
    return True


cdef str _text(const unsigned char* b, Py_ssize_t at, Py_ssize_t n):
    if n == 0:
        return ""
    return PyUnicode_DecodeUTF8(<const char*>(b + at), n, NULL)


def scan_records(data, int64_t base, bint check_crc):
    """The records of ``data`` (CommitLog offset ``base`` on) as dispatch runs (see the twin)."""
    cdef const unsigned char[::1] view = data
    mv = memoryview(data)
    cdef Py_ssize_t end = view.shape[0]
    if end == 0:
        return []
    # Every read below is at a position the length checks before it proved inside [0, end)
    # (the same checks as the twin's), so it goes through a pointer.
    cdef const unsigned char* b = &view[0]
    cdef Py_ssize_t p = 0, left, rend, q, body_at, topic_at, item, sep, stop, k
    cdef Py_ssize_t tags_at = -1, tags_n = 0, keys_at = -1, keys_n = 0, uniq_at = -1, uniq_n = 0
    cdef int32_t total, crc, queue_id, sys_flag, body_len, cur_qid = 0, cur_flag = 0
    cdef int32_t actual, code
    cdef uint32_t magic
    cdef int64_t phys, queue_offset, own, store_ts, cur_q = 0, cur_ts = 0, cur_phys = 0
    cdef int8_t topic_len
    cdef int16_t props_len
    cdef str topic, cur_topic = None, last_topic = None
    cdef Py_ssize_t last_topic_at = 0, last_topic_n = -1, last_tags_at = -1, last_tags_n = 0
    cdef int32_t last_code = 0
    cdef list runs = []
    cdef list records = None
    while p < end:
        phys = base + p
        left = end - p
        if left < _MIN:
            raise _refused(phys, f"only {left} bytes are left, less than a record")
        total = <int32_t>_u32(b + p)
        magic = _u32(b + p + 4)
        if magic != _MAGIC:
            raise _refused(phys, f"bad magic code 0x{magic:08X}")
        if total < _MIN or total > left:
            raise _refused(phys, f"its size {total} does not fit the {left} bytes left")
        crc = <int32_t>_u32(b + p + 8)
        queue_id = <int32_t>_u32(b + p + 12)
        queue_offset = _i64(b + p + 20)
        own = _i64(b + p + 28)
        sys_flag = <int32_t>_u32(b + p + 36)
        rend = p + total
        q = p + _HEAD + (16 if sys_flag & 0x10 else 4) + 4
        store_ts = _i64(b + q)
        q += 8 + (16 if sys_flag & 0x20 else 4) + 4 + 4 + 8
        if q + 4 + 3 > rend:
            raise _refused(phys, f"its size {total} is too small for its hosts")
        body_len = <int32_t>_u32(b + q)
        q += 4
        if body_len < 0 or q + body_len + 3 > rend:
            raise _refused(phys, f"its body length {body_len} runs past the record")
        body_at = q
        q += body_len
        topic_len = <int8_t>b[q]
        q += 1
        if topic_len < 0 or q + topic_len + 2 > rend:
            raise _refused(phys, f"its topic length {topic_len} runs past the record")
        topic_at = q
        q += topic_len
        props_len = <int16_t>((<uint32_t>b[q] << 8) | b[q + 1])
        q += 2
        if props_len < 0 or q + props_len > rend:
            raise _refused(phys, f"its properties length {props_len} runs past the record")
        if q + props_len != rend:
            raise _refused(phys, f"it has {rend - q - props_len} bytes past its properties")
        # The previous record's topic and tags, when their bytes are the same, are not decoded
        # again, and ASCII properties need no decoding to be UTF-8: a follower scans every
        # replicated record (bench/compare.py --replicated, row 3), these were a str each.
        if (last_topic is not None and topic_len == last_topic_n
                and memcmp(b + topic_at, b + last_topic_at, topic_len) == 0):
            topic = last_topic
        else:
            try:
                topic = _text(b, topic_at, topic_len)
            except UnicodeDecodeError:
                raise _refused(phys, "its topic is not UTF-8") from None
            last_topic = topic
        last_topic_at, last_topic_n = topic_at, topic_len
        if not _ascii(b + q, props_len):
            try:
                _text(b, q, props_len)  # UTF-8 as a whole, as the twin's decode_properties needs
            except UnicodeDecodeError:
                raise _refused(phys, "its properties are not UTF-8") from None
        if own != phys:
            raise _refused(phys, f"it claims commitlog offset {own}")
        if check_crc:
            actual = <int32_t>(<uint32_t>_crc32(mv[body_at : body_at + body_len]) & 0x7FFFFFFF)
            if actual != crc:
                raise _refused(phys, f"body CRC {actual} does not match the stored {crc}")
        # TAGS, KEYS and UNIQ_KEY as decode_properties finds them: items split by \x02, each split
        # at its first \x01, an item with an empty name or value skipped, the last one winning
        tags_at = keys_at = uniq_at = -1
        item = q
        stop = rend
        while item < stop:
            k = item
            while k < stop and b[k] != 2:
                k += 1
            sep = item
            while sep < k and b[sep] != 1:
                sep += 1
            if sep < k and sep > item and k > sep + 1:
                if sep - item == 4 and b[item] == 84 and b[item + 1] == 65 and b[item + 2] == 71 and b[item + 3] == 83:
                    tags_at, tags_n = sep + 1, k - sep - 1  # TAGS
                elif sep - item == 4 and b[item] == 75 and b[item + 1] == 69 and b[item + 2] == 89 and b[item + 3] == 83:
                    keys_at, keys_n = sep + 1, k - sep - 1  # KEYS
                elif (sep - item == 8 and b[item] == 85 and b[item + 1] == 78 and b[item + 2] == 73
                        and b[item + 3] == 81 and b[item + 4] == 95 and b[item + 5] == 75
                        and b[item + 6] == 69 and b[item + 7] == 89):
                    uniq_at, uniq_n = sep + 1, k - sep - 1  # UNIQ_KEY
            item = k + 1
        if tags_at < 0:
            code = 0
        elif (last_tags_at >= 0 and tags_n == last_tags_n
                and memcmp(b + tags_at, b + last_tags_at, tags_n) == 0):
            code = last_code
        else:
            code = _java_hash(_text(b, tags_at, tags_n))
            last_tags_at, last_tags_n, last_code = tags_at, tags_n, code
        rec = tuple.__new__(Replayed, (total, code, _text(b, keys_at, keys_n) if keys_at >= 0 else None,
                                       _text(b, uniq_at, uniq_n) if uniq_at >= 0 else None))
        if (records is not None and cur_qid == queue_id and (cur_flag & _TX) == (sys_flag & _TX)
                and cur_q + len(records) == queue_offset and cur_ts == store_ts and cur_topic == topic):
            records.append(rec)
        else:
            if records is not None:
                runs.append(tuple.__new__(Run, (cur_topic, cur_qid, cur_flag, cur_q, cur_phys, cur_ts, records)))
            records = [rec]
            cur_topic, cur_qid, cur_flag, cur_q, cur_phys, cur_ts = topic, queue_id, sys_flag, queue_offset, phys, store_ts
        p = rend
    if records is not None:
        runs.append(tuple.__new__(Run, (cur_topic, cur_qid, cur_flag, cur_q, cur_phys, cur_ts, records)))
    return runs
