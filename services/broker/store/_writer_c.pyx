# cython: language_level=3
"""Compiled twin of tidemq.broker.store.writer.encode_run_py: a prepared batch written into the
mapped CommitLog segment, the same bytes field by field (tidemq.message's layout, written by hand
here; tests/broker/store/test_compiled_twins.py proves them equal).

A record with anything unusual (a header value out of its field's range, a type other than int or
bytes, sizes that do not add up, no room left in the mapping) is handed to the Python twin's
``encode_into`` (the ``fallback`` argument), so errors are the twin's own (struct.error, ...).
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from libc.stdint cimport int16_t, int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcpy


from tidemq.message import MESSAGE_MAGIC

cdef uint32_t _MAGIC = MESSAGE_MAGIC
cdef Py_ssize_t _FIXED_V4 = 88  # TOTALSIZE through BODYLENGTH with IPv4 hosts (RECORD_FIXED_V4.size)


cdef inline void _put32(unsigned char* m, uint32_t v) noexcept:
    m[0] = v >> 24
    m[1] = (v >> 16) & 0xFF
    m[2] = (v >> 8) & 0xFF
    m[3] = v & 0xFF


cdef inline void _put64(unsigned char* m, int64_t v) noexcept:
    _put32(m, <uint32_t>((<uint64_t>v) >> 32))
    _put32(m + 4, <uint32_t>((<uint64_t>v) & 0xFFFFFFFF))


cdef inline bint _i64(object v, int64_t* out):
    """``v`` as an i64 when it is a plain int in range (else the twin decides)."""
    if type(v) is not int:
        return False
    try:
        out[0] = v
    except OverflowError:
        return False
    return True


cdef inline bint _i32(object v, int32_t* out):
    cdef int64_t x = 0
    if not _i64(v, &x) or x < -0x80000000 or x > 0x7FFFFFFF:
        return False
    out[0] = <int32_t>x
    return True


cdef bint _encode(unsigned char[::1] m, Py_ssize_t pos, p, int64_t q, int64_t phys, int64_t store_ts) except -1:
    """Write record ``p`` at ``pos``; False (nothing written) when the twin must do it."""
    cdef int32_t total = 0, crc = 0, queue_id = 0, flag = 0, sys_flag = 0, born_port = 0, store_port = 0
    cdef int32_t reconsume = 0
    cdef int64_t born_ts = 0, prepared = 0
    req = p.req
    body = req.body
    born = p.born
    store = p.store
    tail = p.topic_tail
    props = p.props
    if (type(body) is not bytes or type(born) is not bytes or type(store) is not bytes
            or type(tail) is not bytes or type(props) is not bytes):
        return False
    cdef Py_ssize_t nb = len(born), ns = len(store), nbody = len(body), ntail = len(tail), nprops = len(props)
    if (nb != 4 and nb != 16) or (ns != 4 and ns != 16) or nbody > 0x7FFFFFFF or nprops > 0x7FFF:
        return False
    if not (_i32(p.total, &total) and _i32(p.crc, &crc) and _i32(req.queue_id, &queue_id)
            and _i32(req.flag, &flag) and _i32(p.sys_flag, &sys_flag) and _i64(req.born_timestamp, &born_ts)
            and _i32(p.born_port, &born_port) and _i32(p.store_port, &store_port)
            and _i32(req.reconsume_times, &reconsume) and _i64(req.prepared_transaction_offset, &prepared)):
        return False
    cdef Py_ssize_t fixed = _FIXED_V4 + (nb - 4) + (ns - 4)
    if fixed + nbody + ntail + 2 + nprops != total or pos < 0 or pos + total > m.shape[0]:
        return False
    cdef unsigned char* o = &m[pos]  # [pos, pos + total) is inside the mapping (checked above)
    _put32(o, <uint32_t>total)
    _put32(o + 4, _MAGIC)
    _put32(o + 8, <uint32_t>crc)
    _put32(o + 12, <uint32_t>queue_id)
    _put32(o + 16, <uint32_t>flag)
    _put64(o + 20, q)
    _put64(o + 28, phys)
    _put32(o + 36, <uint32_t>sys_flag)
    _put64(o + 40, born_ts)
    cdef Py_ssize_t k = 48
    memcpy(o + k, <const char*>born, nb)
    k += nb
    _put32(o + k, <uint32_t>born_port)
    _put64(o + k + 4, store_ts)
    k += 12
    memcpy(o + k, <const char*>store, ns)
    k += ns
    _put32(o + k, <uint32_t>store_port)
    _put32(o + k + 4, <uint32_t>reconsume)
    _put64(o + k + 8, prepared)
    _put32(o + k + 16, <uint32_t>nbody)
    k += 20
    memcpy(o + k, <const char*>body, nbody)
    k += nbody
    memcpy(o + k, <const char*>tail, ntail)
    k += ntail
    o[k] = (nprops >> 8) & 0xFF
    o[k + 1] = nprops & 0xFF
    memcpy(o + k + 2, <const char*>props, nprops)
    return True


def encode_run(fallback, mm, Py_ssize_t pos, pending, int64_t q, int64_t step, int64_t phys, int64_t store_ts):
    """``pending`` back to back from ``pos`` (see the twin, encode_run_py); ``fallback`` is the
    twin's encode_into, for a record this function leaves to it."""
    cdef unsigned char[::1] m = mm
    cdef int64_t total
    for p in pending:
        if not _encode(m, pos, p, q, phys, store_ts):
            fallback(mm, pos, p, q, phys, store_ts)
        total = p.total
        pos += total
        phys += total
        q += step
    return pos


# ---------------------------------------------------------------------------------------------
# RecordEncoder._prepare (the twin: writer.RecordEncoder._prepare_py)

cdef object _w = None  # tidemq.broker.store.writer, imported at the first call (it imports this module)
cdef Py_ssize_t _SIZE_BUT_TEXTS = 0, _MAX_PROPS = 0, _CACHE_LIMIT = 0
cdef object _HOST_V6_FLAGS = None
cdef object _crc32 = None  # writer.body_crc32: ISA-L's CRC-32 when installed, else zlib's


cdef _bind():
    global _w, _SIZE_BUT_TEXTS, _MAX_PROPS, _CACHE_LIMIT, _HOST_V6_FLAGS, _crc32
    from tidemq.broker.store import writer
    _SIZE_BUT_TEXTS = writer._SIZE_BUT_TEXTS
    _MAX_PROPS = writer.MAX_PROPERTIES_LENGTH
    _CACHE_LIMIT = writer._CACHE_LIMIT
    _HOST_V6_FLAGS = writer._HOST_V6_FLAGS
    _crc32 = writer.body_crc32
    _w = writer


def prepare(self, req, topic_tail, born, store, host_flags, extra):
    """RecordEncoder._prepare, compiled: the properties encoded straight to UTF-8 bytes, the
    Pending filled without Python frames. Anything unusual (a body that is not bytes or is too
    big, properties that are not a dict of str, that do not encode or are too long) goes to the
    twin, which gives the same Pending or the same refusal."""
    if _w is None:
        _bind()
    body = req.body
    props_dict = req.properties
    if type(body) is not bytes or type(props_dict) is not dict or len(body) > self.max_message_size:
        return self._prepare_py(req, topic_tail, born, store, host_flags, extra)
    cdef Py_ssize_t n = 0, kn = 0, vn = 0
    cdef const char* kp
    cdef const char* vp
    cdef char* out
    if props_dict:
        # Hot path (bench/hot_path.py batch): two passes over the dict, no object per property.
        # The first checks every name and value and sizes the text (UTF-8 straight from the str:
        # no copy for ASCII), the second copies it into one bytes object. Nothing runs Python code
        # between the passes, so the dict cannot change.
        for k, v in (<dict>props_dict).items():
            if type(k) is not str or type(v) is not str:
                return self._prepare_py(req, topic_tail, born, store, host_flags, extra)
            if not k or not v:  # encode_properties leaves out empty names and values
                continue
            try:
                PyUnicode_AsUTF8AndSize(k, &kn)
                PyUnicode_AsUTF8AndSize(v, &vn)
            except UnicodeEncodeError:  # lone surrogates: the twin raises its own error
                return self._prepare_py(req, topic_tail, born, store, host_flags, extra)
            n += kn + 1 + vn + (1 if n else 0)  # NAME \x01 VALUE, \x02 between properties
        if n > _MAX_PROPS:
            return self._prepare_py(req, topic_tail, born, store, host_flags, extra)
        props = PyBytes_FromStringAndSize(NULL, n)
        out = PyBytes_AS_STRING(props)
        for k, v in (<dict>props_dict).items():
            if not k or not v:
                continue
            kp = PyUnicode_AsUTF8AndSize(k, &kn)
            vp = PyUnicode_AsUTF8AndSize(v, &vn)
            if out != PyBytes_AS_STRING(props):
                out[0] = 2
                out += 1
            memcpy(out, kp, kn)
            out[kn] = 1
            memcpy(out + kn + 1, vp, vn)
            out += kn + 1 + vn
    else:
        props = b""
    Pending = _w.Pending
    p = Pending.__new__(Pending)
    p.req = req
    p.topic_tail = topic_tail
    p.props = props
    p.born = born
    p.born_port = req.born_host[1]
    p.store = store
    p.store_port = req.store_host[1]
    p.sys_flag = (req.sys_flag & ~_HOST_V6_FLAGS) | host_flags
    p.total = _SIZE_BUT_TEXTS + len(body) + len(topic_tail) + len(props) + extra
    p.crc = _crc32(body) & 0x7FFFFFFF
    code = req.tags_code
    if code is None:
        tags = (<dict>props_dict).get("TAGS")
        if tags:
            cache = self._tags
            code = cache.get(tags)
            if code is None:
                code = _w.tags_code(tags)
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                cache[tags] = code
        else:
            code = 0
    p.tags_code = code
    p.keys = (<dict>props_dict).get("KEYS")
    p.uniq = (<dict>props_dict).get("UNIQ_KEY")
    return p
