# cython: freethreading_compatible = False
"""Compiled twin of :mod:`tidemq.spark.arrow`'s decoder: pull-response bodies straight into Arrow
column buffers (hot path: bench/spark_read.py).

:class:`Columns` here holds, instead of one Python object per value, growable byte buffers laid out
as Arrow wants them: offsets + data (+ a validity bitmap for keys and tags) for the binary and
string columns, little-endian int64/int32 words for the fixed-width ones (timestamps already in
microseconds). :func:`collect` has the Python twin's signature, checks, errors and results;
:meth:`Columns.export` hands the buffers to ``tidemq.spark.arrow`` which wraps them with
``pa.Array.from_buffers`` (no copy). Invariants: every column holds exactly ``len(cols)`` rows;
an exported buffer is never written again (the next append copies it first); every read of the
body is bounds-checked against its length before it happens, so hostile bytes raise CodecError
as the Python twin does, never read past the buffer. Records with IPv6 hosts (rare) go through the
Python twin's own helper, as in Python.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport INT64_MAX, INT64_MIN, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, memset

from tidemq.errors import CodecError

cdef uint32_t MESSAGE_MAGIC = 0xDAA320A7
# tidemq.message's stored-record layout with IPv4 hosts (RECORD_FIXED_V4); tests/spark check these
# against the struct definitions there, which stay the one source of the layout.
cdef Py_ssize_t FIXED_SIZE = 88  # TOTALSIZE through BODYLENGTH
cdef Py_ssize_t MIN_RECORD_SIZE = 91  # + TOPICLENGTH (i8) + PROPERTIESLENGTH (i16)
cdef Py_ssize_t AT_MAGIC = 4, AT_QUEUE_OFFSET = 20, AT_PHYSICAL_OFFSET = 28, AT_SYS_FLAG = 36
cdef Py_ssize_t AT_BORN_TIMESTAMP = 40, AT_STORE_TIMESTAMP = 56, AT_STORE_HOST = 64
cdef Py_ssize_t AT_RECONSUME_TIMES = 72, AT_BODY_LENGTH = 84
cdef int32_t V6_HOSTS = 0x10 | 0x20  # SysFlag.BORNHOST_V6 | STOREHOST_V6
cdef int32_t COMPRESSED = 0x1
cdef int64_t MAX_OFFSET = 2147483647  # Arrow binary/string offsets are int32

cdef const char* HEX = b"0123456789ABCDEF"

#: the layout constants above, for tests/spark/test_arrow_compiled.py to check against tidemq.message
LAYOUT = {"fixed_size": FIXED_SIZE, "min_record_size": MIN_RECORD_SIZE, "magic": AT_MAGIC,
          "queue_offset": AT_QUEUE_OFFSET, "physical_offset": AT_PHYSICAL_OFFSET,
          "sys_flag": AT_SYS_FLAG, "born_timestamp": AT_BORN_TIMESTAMP,
          "store_timestamp": AT_STORE_TIMESTAMP, "store_host": AT_STORE_HOST,
          "reconsume_times": AT_RECONSUME_TIMES, "body_length": AT_BODY_LENGTH,
          "message_magic": MESSAGE_MAGIC, "v6_hosts": V6_HOSTS, "compressed": COMPRESSED}


cdef inline int32_t be32(const uint8_t* p) noexcept nogil:
    return <int32_t>((<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3])


cdef inline int64_t be64(const uint8_t* p) noexcept nogil:
    return <int64_t>((<uint64_t><uint32_t>be32(p) << 32) | <uint32_t>be32(p + 4))


cdef class _Buf:
    """A growable byte buffer backed by a bytearray, exported to Arrow without a copy."""

    cdef bytearray data
    cdef Py_ssize_t used
    cdef bint exported

    def __cinit__(self):
        self.data = bytearray()
        self.used = 0
        self.exported = False

    cdef char* reserve(self, Py_ssize_t n) except NULL:
        cdef Py_ssize_t need = self.used + n
        cdef Py_ssize_t cap
        if self.exported:
            # an Arrow array still shares these bytes: keep them as they are, write to a copy
            self.data = bytearray(self.data[:self.used])
            self.exported = False
        if need > PyByteArray_GET_SIZE(self.data):
            cap = max(need, 2 * PyByteArray_GET_SIZE(self.data), 1024)
            PyByteArray_Resize(self.data, cap)
        return PyByteArray_AS_STRING(self.data) + self.used

    cdef inline int add(self, const void* p, Py_ssize_t n) except -1:
        memcpy(self.reserve(n), p, n)
        self.used += n
        return 0

    cdef inline int add_i32(self, int32_t v) except -1:
        (<int32_t*>self.reserve(4))[0] = v
        self.used += 4
        return 0

    cdef inline int add_i64(self, int64_t v) except -1:
        (<int64_t*>self.reserve(8))[0] = v
        self.used += 8
        return 0

    cdef bytearray export(self):
        """The bytes written so far, trimmed; they are never written again."""
        if not self.exported:
            PyByteArray_Resize(self.data, self.used)
            self.exported = True
        return self.data


cdef class _Binary:
    """One binary/string column: int32 offsets, data, and (for nullable columns) a validity bitmap."""

    cdef _Buf offsets
    cdef _Buf data
    cdef _Buf valid
    cdef Py_ssize_t nulls
    cdef Py_ssize_t n
    cdef bint overflow

    def __cinit__(self):
        self.offsets = _Buf()
        self.data = _Buf()
        self.valid = _Buf()
        self.offsets.add_i32(0)

    cdef int _next(self, bint present) except -1:
        cdef char* bits
        if self.n % 8 == 0:
            self.valid.reserve(1)[0] = 0
            self.valid.used += 1
        if present:
            bits = self.valid.reserve(0) - 1  # the current row's byte, written last
            bits[0] = bits[0] | <char>(1 << (self.n % 8))
        else:
            self.nulls += 1
        self.n += 1
        return 0

    cdef int add(self, const void* p, Py_ssize_t length) except -1:
        self.data.add(p, length)
        if self.data.used > MAX_OFFSET:
            self.overflow = True  # reported by export, where the Python twin reports it
        self.offsets.add_i32(<int32_t>self.data.used)
        return self._next(True)

    cdef int add_null(self) except -1:
        self.offsets.add_i32(<int32_t>self.data.used)
        return self._next(False)

    cdef tuple export(self):
        return (self.valid.export() if self.nulls else None, self.nulls, self.offsets.export(),
                self.data.export(), self.overflow)


cdef class Columns:
    """Column buffers of the rows collected from one or more pull responses of one queue.

    ``props``: None leaves the properties out; any other value (the Python twin's list) keeps
    each row's raw property bytes for the ``properties`` map column."""

    cdef Py_ssize_t n
    cdef _Binary keys, values, ids, tags, props
    cdef _Buf offsets, born, stored, reconsume
    cdef bint with_props

    def __cinit__(self, props=None):
        self.keys, self.values, self.ids, self.tags = _Binary(), _Binary(), _Binary(), _Binary()
        self.offsets, self.born, self.stored, self.reconsume = _Buf(), _Buf(), _Buf(), _Buf()
        self.with_props = props is not None
        self.props = _Binary() if self.with_props else None

    def __len__(self):
        return self.n

    @property
    def include_properties(self):
        return self.with_props

    def export(self):
        """(rows, keys, values, ids, tags, queue offsets, born us, stored us, reconsume times,
        properties): each binary column as (validity or None, null count, offsets, data,
        overflowed), each fixed one as its bytearray; properties None or the raw-blob column."""
        return (self.n, self.keys.export(), self.values.export(), self.ids.export(),
                self.tags.export(), self.offsets.export(), self.born.export(),
                self.stored.export(), self.reconsume.export(),
                self.props.export() if self.with_props else None)


cdef Py_ssize_t find_prop(const uint8_t* p, Py_ssize_t n, const char* key, Py_ssize_t klen,
                          Py_ssize_t* vlen) noexcept:
    """Where the value of ``key`` (b"NAME\\x01") starts in a property blob, or -1: at the start,
    else after the first \\x02 followed by the key (the Python twin's ``_prop``)."""
    cdef Py_ssize_t i = -1, j
    if n >= klen and memcmp(p, key, klen) == 0:
        i = klen
    else:
        j = 0
        while j + 1 + klen <= n:
            if p[j] == 2 and memcmp(p + j + 1, key, klen) == 0:
                i = j + 1 + klen
                break
            j += 1
    if i < 0:
        return -1
    j = i
    while j < n and p[j] != 2:
        j += 1
    vlen[0] = j - i
    return i


cdef int add_offset_id(_Binary ids, const uint8_t* rec) except -1:
    """The offset message id (tidemq.message.encode_offset_msg_id) of an IPv4 record: store host,
    store port and physical offset as 32 upper-case hex digits, straight from the record bytes."""
    cdef char out[32]
    cdef int k
    cdef const uint8_t* src
    for k in range(8):
        out[2 * k] = HEX[rec[AT_STORE_HOST + k] >> 4]
        out[2 * k + 1] = HEX[rec[AT_STORE_HOST + k] & 15]
    src = rec + AT_PHYSICAL_OFFSET
    for k in range(8):
        out[16 + 2 * k] = HEX[src[k] >> 4]
        out[16 + 2 * k + 1] = HEX[src[k] & 15]
    return ids.add(out, 32)


def collect(bytes body, Columns cols, end_offset, tags_filter):
    """Append the records of a pull-response ``body`` with queue offset < ``end_offset`` (and a
    tag in ``tags_filter``, when given) to ``cols``; the offset after the last record looked at,
    or -1. Same checks, errors and results as the Python twin (tidemq.spark.arrow)."""
    cdef const uint8_t* data = <const uint8_t*>PyBytes_AS_STRING(body)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(body)
    cdef Py_ssize_t pos = 0, p, rend, vlen, tlen, plen
    cdef Py_ssize_t key_at, tag_at, uniq_at, key_len = 0, tag_len = 0, uniq_len = 0
    cdef int64_t total, blen, qoff, last_seen = 0, born_ts, store_ts
    cdef bint seen = False, no_end = end_offset > INT64_MAX
    cdef int64_t end = INT64_MAX if no_end else max(end_offset, INT64_MIN)
    cdef int32_t sys_flag, reconsume
    cdef const uint8_t* rec
    cdef const uint8_t* props
    cdef const uint8_t* payload
    cdef object wanted = None
    cdef object inflated, v6, tag
    if tags_filter is not None:
        wanted = {t.encode("utf-8") for t in tags_filter}
    while pos < n:
        if pos + FIXED_SIZE > n:
            raise CodecError(f"pull response truncated at byte {pos}")
        rec = data + pos
        total = be32(rec)
        if (<uint32_t>be32(rec + AT_MAGIC) != MESSAGE_MAGIC or total < MIN_RECORD_SIZE
                or pos + total > n):
            raise CodecError(f"bad record at byte {pos} of a pull response")
        qoff = be64(rec + AT_QUEUE_OFFSET)
        if qoff >= end and not no_end:
            break
        sys_flag = be32(rec + AT_SYS_FLAG)
        v6 = None
        if sys_flag & V6_HOSTS:
            from tidemq.spark.arrow import _v6_record  # rare: IPv6 hosts shift every field
            v6 = _v6_record(body, pos)
            payload_obj, props_obj = v6[0], v6[1]
            reconsume, store_ts, born_ts = v6[2], v6[3], v6[4]
            payload = <const uint8_t*>PyBytes_AS_STRING(payload_obj)
            blen = PyBytes_GET_SIZE(payload_obj)
            props = <const uint8_t*>PyBytes_AS_STRING(props_obj)
            plen = PyBytes_GET_SIZE(props_obj)
        else:
            blen = be32(rec + AT_BODY_LENGTH)
            if not 0 <= blen <= total - MIN_RECORD_SIZE:
                raise CodecError(f"bad body length {blen} at byte {pos} of a pull response")
            payload = rec + FIXED_SIZE
            p = FIXED_SIZE + blen
            tlen = rec[p]
            p += 1 + tlen
            if p + 2 > total:
                raise CodecError(f"record at byte {pos} of a pull response: lengths do not add up")
            plen = (<Py_ssize_t>rec[p] << 8) | rec[p + 1]
            if p + 2 + plen != total:
                raise CodecError(f"record at byte {pos} of a pull response: lengths do not add up")
            props = rec + p + 2
            reconsume = be32(rec + AT_RECONSUME_TIMES)
            store_ts = be64(rec + AT_STORE_TIMESTAMP)
            born_ts = be64(rec + AT_BORN_TIMESTAMP)
        pos += total
        seen, last_seen = True, qoff
        tag_at = find_prop(props, plen, b"TAGS\x01", 5, &tag_len)
        if wanted is not None:
            tag = None if tag_at < 0 else PyBytes_FromStringAndSize(<const char*>props + tag_at, tag_len)
            if tag not in wanted:
                continue
        if sys_flag & COMPRESSED:
            from tidemq.message import inflate
            inflated = inflate(PyBytes_FromStringAndSize(<const char*>payload, blen))
            cols.values.add(PyBytes_AS_STRING(inflated), PyBytes_GET_SIZE(inflated))
        else:
            cols.values.add(payload, blen)
        cols.offsets.add_i64(qoff)
        key_at = find_prop(props, plen, b"KEYS\x01", 5, &key_len)
        if key_at < 0:
            cols.keys.add_null()
        else:
            cols.keys.add(props + key_at, key_len)
        if tag_at < 0:
            cols.tags.add_null()
        else:
            cols.tags.add(props + tag_at, tag_len)
        uniq_at = find_prop(props, plen, b"UNIQ_KEY\x01", 9, &uniq_len)
        if uniq_at >= 0:
            cols.ids.add(props + uniq_at, uniq_len)
        elif v6 is not None:
            store_id = v6[5].encode("ascii")
            cols.ids.add(PyBytes_AS_STRING(store_id), PyBytes_GET_SIZE(store_id))
        else:
            add_offset_id(cols.ids, rec)
        # milliseconds to microseconds, wrapping on overflow as pyarrow.compute.multiply does
        cols.born.add_i64(<int64_t>(<uint64_t>born_ts * 1000u))
        cols.stored.add_i64(<int64_t>(<uint64_t>store_ts * 1000u))
        cols.reconsume.add_i32(reconsume)
        if cols.with_props:
            cols.props.add(props, plen)
        cols.n += 1
    return (<object>last_seen) + 1 if seen else -1  # a Python int: may pass int64 with no end


# -- the properties map --------------------------------------------------------------------------

cdef Py_ssize_t utf8_valid_prefix(const uint8_t* s, Py_ssize_t n) noexcept:
    """Length of the longest well-formed UTF-8 prefix (Unicode Table 3-7: no overlong forms, no
    surrogates, nothing past U+10FFFF), as strict ``bytes.decode("utf-8")`` accepts."""
    cdef Py_ssize_t i = 0
    cdef uint8_t c, c1
    while i < n:
        c = s[i]
        if c < 0x80:
            i += 1
            continue
        if 0xC2 <= c <= 0xDF:
            if i + 1 >= n or (s[i + 1] & 0xC0) != 0x80:
                return i
            i += 2
        elif 0xE0 <= c <= 0xEF:
            if i + 2 >= n:
                return i
            c1 = s[i + 1]
            if ((c == 0xE0 and not 0xA0 <= c1 <= 0xBF) or (c == 0xED and not 0x80 <= c1 <= 0x9F)
                    or (c1 & 0xC0) != 0x80 or (s[i + 2] & 0xC0) != 0x80):
                return i
            i += 3
        elif 0xF0 <= c <= 0xF4:
            if i + 3 >= n:
                return i
            c1 = s[i + 1]
            if ((c == 0xF0 and not 0x90 <= c1 <= 0xBF) or (c == 0xF4 and not 0x80 <= c1 <= 0x8F)
                    or (c1 & 0xC0) != 0x80 or (s[i + 2] & 0xC0) != 0x80
                    or (s[i + 3] & 0xC0) != 0x80):
                return i
            i += 4
        else:
            return i
    return n


def properties_map(bytearray offsets, bytearray data, Py_ssize_t rows):
    """The ``properties`` map column's buffers from the raw property blobs of ``rows`` rows:
    (map offsets, key offsets, key data, value offsets, value data), with
    tidemq.message.decode_properties' rules: UTF-8 or CodecError, pairs split at \\x02 and \\x01,
    pairs without a name, value or separator skipped, a repeated name keeping its first place and
    its last value."""
    cdef const int32_t* offs = <const int32_t*>PyByteArray_AS_STRING(offsets)
    cdef const uint8_t* blobs = <const uint8_t*>PyByteArray_AS_STRING(data)
    cdef _Buf map_offsets = _Buf(), key_offsets = _Buf(), key_data = _Buf()
    cdef _Buf value_offsets = _Buf(), value_data = _Buf()
    cdef _Buf pairs = _Buf()  # this row's (name start, name length, value start, value length)
    cdef Py_ssize_t r, i, j, k, sep, start, stop, count, total = 0, npairs
    cdef Py_ssize_t* pr
    cdef const uint8_t* s
    if PyByteArray_GET_SIZE(offsets) < 4 * (rows + 1):
        raise ValueError("property offsets do not cover every row")
    map_offsets.add_i32(0)
    key_offsets.add_i32(0)
    value_offsets.add_i32(0)
    for r in range(rows):
        start, stop = offs[r], offs[r + 1]
        if not 0 <= start <= stop <= PyByteArray_GET_SIZE(data):
            raise ValueError("property offsets out of range")
        s = blobs + start
        count = stop - start
        if utf8_valid_prefix(s, count) != count:
            raise CodecError("properties are not UTF-8")
        pairs.used = 0
        npairs = 0
        i = 0
        while i <= count and count:
            j = i
            while j < count and s[j] != 2:
                j += 1
            sep = i
            while sep < j and s[sep] != 1:
                sep += 1
            if sep < j and sep > i and j > sep + 1:  # a name, a separator and a value
                pr = <Py_ssize_t*>PyByteArray_AS_STRING(pairs.data)
                for k in range(npairs):
                    if pr[4 * k + 1] == sep - i and memcmp(s + pr[4 * k], s + i, sep - i) == 0:
                        pr[4 * k + 2], pr[4 * k + 3] = sep + 1, j - sep - 1
                        break
                else:
                    pr = <Py_ssize_t*>pairs.reserve(4 * sizeof(Py_ssize_t))
                    pr[0], pr[1], pr[2], pr[3] = i, sep - i, sep + 1, j - sep - 1
                    pairs.used += 4 * sizeof(Py_ssize_t)
                    npairs += 1
            i = j + 1
        pr = <Py_ssize_t*>PyByteArray_AS_STRING(pairs.data)
        for k in range(npairs):
            key_data.add(s + pr[4 * k], pr[4 * k + 1])
            key_offsets.add_i32(<int32_t>key_data.used)
            value_data.add(s + pr[4 * k + 2], pr[4 * k + 3])
            value_offsets.add_i32(<int32_t>value_data.used)
        total += npairs
        map_offsets.add_i32(<int32_t>total)
    return (map_offsets.export(), key_offsets.export(), key_data.export(),
            value_offsets.export(), value_data.export())
