"""Compiled twins of :mod:`tidemq.message`'s client hot paths (bench/client_decode.py):
``decode_records`` (pull bodies to lazy MessageExt objects), ``encode_batch`` (SEND_BATCH_MESSAGE
bodies), ``encode_properties`` (every send, client and broker) and ``decode_properties`` (a
message's properties when read: tag filters, the broker's send path).

Same signatures, results and errors as the Python functions, which stay the reference and the
fallback: a record that is not on the fast path (IPv6 hosts, anything that fails a check) is handed
to the same Python ``decode_record`` the twin calls, which decodes it or raises its CodecError; a
batch element that is not (int flag, bytes body, str properties) within the wire's ranges makes the
whole batch go through the Python ``encode_batch``, properties that are not a dict of str to str
go through the Python ``encode_properties`` and properties text that is neither str nor bytes
through the Python ``decode_properties``, which handle them or raise their errors. Every read
of a record is bounds-checked against the body before it happens. tidemq.message is imported
lazily (it imports this module while it loads).
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.long cimport PyLong_AsLongLong
from cpython.object cimport PyObject, PyTypeObject, newfunc
from cpython.dict cimport PyDict_Next
from cpython.unicode cimport (
    PyUnicode_AsUTF8AndSize,
    PyUnicode_Concat,
    PyUnicode_DecodeUTF8,
    PyUnicode_GET_LENGTH,
)
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy

cdef uint32_t MESSAGE_MAGIC = 0xDAA320A7
# tidemq.message's stored-record layout with IPv4 hosts (RECORD_FIXED_V4: TOTALSIZE through
# BODYLENGTH); tests/test_message_compiled.py checks these against it.
cdef Py_ssize_t FIXED_SIZE = 88
cdef Py_ssize_t MIN_RECORD_SIZE = 91  # + TOPICLENGTH (i8) + PROPERTIESLENGTH (i16)
cdef Py_ssize_t AT_BODY_CRC = 8, AT_QUEUE_ID = 12, AT_FLAG = 16, AT_QUEUE_OFFSET = 20
cdef Py_ssize_t AT_PHYSICAL_OFFSET = 28, AT_SYS_FLAG = 36, AT_BORN_TIMESTAMP = 40
cdef Py_ssize_t AT_BORN_HOST = 48, AT_BORN_PORT = 52, AT_STORE_TIMESTAMP = 56
cdef Py_ssize_t AT_STORE_HOST = 64, AT_STORE_PORT = 68, AT_RECONSUME_TIMES = 72
cdef Py_ssize_t AT_PREPARED_OFFSET = 76, AT_BODY_LENGTH = 84
cdef int32_t V6_HOSTS = 0x10 | 0x20  # SysFlag.BORNHOST_V6 | STOREHOST_V6
cdef int32_t COMPRESSED = 0x1
# a batch element: totalSize, magic, bodyCRC, flag, bodyLength (i32 each), body, i16 + properties
cdef Py_ssize_t BATCH_HEAD = 20
cdef Py_ssize_t MAX_PROPERTIES_LENGTH = 32767
cdef int64_t INT32_MAX = 2147483647

#: the layout constants above, for tests/test_message_compiled.py to check against tidemq.message
LAYOUT = {"fixed_size": FIXED_SIZE, "min_record_size": MIN_RECORD_SIZE, "body_crc": AT_BODY_CRC,
          "queue_id": AT_QUEUE_ID, "flag": AT_FLAG, "queue_offset": AT_QUEUE_OFFSET,
          "physical_offset": AT_PHYSICAL_OFFSET, "sys_flag": AT_SYS_FLAG,
          "born_timestamp": AT_BORN_TIMESTAMP, "born_host": AT_BORN_HOST, "born_port": AT_BORN_PORT,
          "store_timestamp": AT_STORE_TIMESTAMP, "store_host": AT_STORE_HOST,
          "store_port": AT_STORE_PORT, "reconsume_times": AT_RECONSUME_TIMES,
          "prepared_transaction_offset": AT_PREPARED_OFFSET, "body_length": AT_BODY_LENGTH,
          "message_magic": MESSAGE_MAGIC, "v6_hosts": V6_HOSTS, "compressed": COMPRESSED,
          "max_properties_length": MAX_PROPERTIES_LENGTH}


cdef inline int32_t be32(const uint8_t* p) noexcept nogil:
    return <int32_t>((<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3])


cdef inline int64_t be64(const uint8_t* p) noexcept nogil:
    return <int64_t>((<uint64_t><uint32_t>be32(p) << 32) | <uint32_t>be32(p + 4))


cdef inline void put32(char* p, int32_t v) noexcept nogil:
    cdef uint32_t u = <uint32_t>v
    p[0] = <char>(u >> 24)
    p[1] = <char>(u >> 16)
    p[2] = <char>(u >> 8)
    p[3] = <char>u


cdef object _message = None  # tidemq.message, once it has loaded


cdef object _deps():
    global _message
    if _message is None:
        import tidemq.message
        _message = tidemq.message
    return _message


def decode_records(buf, decompress=True, extra_properties=None):
    """Decode a pull-response body into lazy MessageExt objects: tidemq.message.decode_records'
    twin (same messages, same errors)."""
    m_mod = _deps()
    cdef object cls = m_mod.MessageExt
    cdef object decode_record = m_mod.decode_record
    cdef object inflate = m_mod.inflate
    cdef bytes data = buf if buf.__class__ is bytes else bytes(buf)
    cdef const uint8_t* d = <const uint8_t*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t end = PyBytes_GET_SIZE(data)
    cdef Py_ssize_t pos = 0, rend, b, e, tlen, t1, plen
    cdef int64_t total, blen
    cdef int32_t sys_flag
    cdef const uint8_t* rec
    cdef list out = []
    cdef object msg, topic = None, props, hosts = None, empty = ()
    cdef bytes last_topic = None
    cdef uint64_t born_key = 0, store_key = 0, k1, k2
    cdef newfunc tp_new = (<PyTypeObject*>cls).tp_new
    cdef str extra = "".join([f"\x02{k}\x01{v}" for k, v in extra_properties.items()]) \
        if extra_properties else ""
    while pos < end:
        msg = None
        if end - pos >= MIN_RECORD_SIZE:
            rec = d + pos
            total = be32(rec)
            sys_flag = be32(rec + AT_SYS_FLAG)
            blen = be32(rec + AT_BODY_LENGTH)
            rend = pos + total
            b = pos + FIXED_SIZE
            e = b + blen
            if (<uint32_t>be32(rec + 4) == MESSAGE_MAGIC and total >= MIN_RECORD_SIZE and rend <= end
                    and not sys_flag & V6_HOSTS and blen >= 0 and e + 3 <= rend):
                tlen = d[e]
                t1 = e + 1 + tlen
                if tlen < 128 and t1 + 2 <= rend:
                    plen = (<Py_ssize_t>d[t1] << 8) | d[t1 + 1]
                    if plen < 0x8000 and t1 + 2 + plen == rend:
                        try:
                            if (last_topic is None or PyBytes_GET_SIZE(last_topic) != tlen
                                    or memcmp(PyBytes_AS_STRING(last_topic), d + e + 1, tlen) != 0):
                                topic = PyUnicode_DecodeUTF8(<const char*>d + e + 1, tlen, NULL)
                                last_topic = PyBytes_FromStringAndSize(<const char*>d + e + 1, tlen)
                            props = PyUnicode_DecodeUTF8(<const char*>d + t1 + 2, plen, NULL)
                        except UnicodeDecodeError:
                            pass  # decode_record below words the error
                        else:
                            if extra:
                                props = PyUnicode_Concat(props, extra)
                            # one hosts tuple for every record from the same born and store
                            # addresses (most of a pull's records)
                            memcpy(&k1, rec + AT_BORN_HOST, 8)
                            memcpy(&k2, rec + AT_STORE_HOST, 8)
                            if hosts is None or k1 != born_key or k2 != store_key:
                                born_key, store_key = k1, k2
                                hosts = (PyBytes_FromStringAndSize(<const char*>rec + AT_BORN_HOST, 4),
                                         be32(rec + AT_BORN_PORT),
                                         PyBytes_FromStringAndSize(<const char*>rec + AT_STORE_HOST, 4),
                                         be32(rec + AT_STORE_PORT))
                            msg = tp_new(cls, <PyObject*>empty, NULL)
                            msg.topic = topic
                            msg.body = PyBytes_FromStringAndSize(<const char*>d + b, blen)
                            msg.queue_id = be32(rec + AT_QUEUE_ID)
                            msg.queue_offset = be64(rec + AT_QUEUE_OFFSET)
                            msg.commit_log_offset = be64(rec + AT_PHYSICAL_OFFSET)
                            msg.store_size = total
                            msg.flag = be32(rec + AT_FLAG)
                            msg.sys_flag = sys_flag
                            msg.born_timestamp = be64(rec + AT_BORN_TIMESTAMP)
                            msg.store_timestamp = be64(rec + AT_STORE_TIMESTAMP)
                            msg.reconsume_times = be32(rec + AT_RECONSUME_TIMES)
                            msg.prepared_transaction_offset = be64(rec + AT_PREPARED_OFFSET)
                            msg.body_crc = be32(rec + AT_BODY_CRC)
                            msg._properties = None
                            msg._props_text = props
                            msg._born_host = None
                            msg._store_host = None
                            msg._offset_msg_id = None
                            msg._hosts = hosts
        if msg is None:
            msg = decode_record(data, pos)
            if extra_properties:
                msg.properties.update(extra_properties)
            pos += msg.store_size
        else:
            pos = rend
        if decompress and msg.sys_flag & COMPRESSED:
            msg.body = inflate(msg.body)
        out.append(msg)
    return out


def encode_batch(items):
    """Encode (flag, body, properties string) elements as a SEND_BATCH_MESSAGE body:
    tidemq.message.encode_batch's twin (same bytes; anything unusual goes to it, for its error)."""
    cdef Py_ssize_t size = 0, n = 0, plen, blen, i
    cdef const char* p
    cdef char* w
    cdef list parts
    cdef object flag
    cdef bytes out
    if items.__class__ is not list:
        return _deps()._encode_batch_py(items)
    n = len(<list>items)
    # first pass: check every element and size the body; the second only copies
    for i in range(n):
        item = (<list>items)[i]
        if (item.__class__ is not tuple or len(<tuple>item) != 3
                or (<tuple>item)[0].__class__ is not int or (<tuple>item)[1].__class__ is not bytes
                or (<tuple>item)[2].__class__ is not str):
            return _deps()._encode_batch_py(items)
        flag = (<tuple>item)[0]
        if not -2147483648 <= flag <= 2147483647:
            return _deps()._encode_batch_py(items)
        try:
            PyUnicode_AsUTF8AndSize((<tuple>item)[2], &plen)
        except UnicodeEncodeError:  # a lone surrogate: the Python twin raises the same
            return _deps()._encode_batch_py(items)
        blen = PyBytes_GET_SIZE((<tuple>item)[1])
        if plen > MAX_PROPERTIES_LENGTH or 22 + blen + plen > INT32_MAX:
            return _deps()._encode_batch_py(items)
        size += 22 + blen + plen
    out = PyBytes_FromStringAndSize(NULL, size)
    w = PyBytes_AS_STRING(out)
    for i in range(n):
        item = (<list>items)[i]
        body = (<tuple>item)[1]
        blen = PyBytes_GET_SIZE(body)
        p = PyUnicode_AsUTF8AndSize((<tuple>item)[2], &plen)
        put32(w, <int32_t>(22 + blen + plen))
        put32(w + 4, 0)
        put32(w + 8, 0)
        put32(w + 12, <int32_t>PyLong_AsLongLong((<tuple>item)[0]))
        put32(w + 16, <int32_t>blen)
        memcpy(w + BATCH_HEAD, PyBytes_AS_STRING(body), blen)
        w += BATCH_HEAD + blen
        w[0] = <char>(plen >> 8)
        w[1] = <char>plen
        memcpy(w + 2, p, plen)
        w += 2 + plen
    return out


cdef extern from "Python.h":
    object PyUnicode_New(Py_ssize_t size, Py_UCS4 maxchar)
    Py_UCS4 PyUnicode_MAX_CHAR_VALUE(object o)
    Py_ssize_t PyUnicode_CopyCharacters(object to, Py_ssize_t to_start, object src,
                                        Py_ssize_t src_start, Py_ssize_t how_many) except -1
    int PyUnicode_WriteChar(object u, Py_ssize_t index, Py_UCS4 ch) except -1


def encode_properties(props):
    """Java form: pairs joined by \\x02, no trailing separator; pairs with an empty name or value
    left out. tidemq.message.encode_properties' twin (a dict of anything but str names and
    values goes to it). One pass sizes the text, a second copies into it."""
    cdef Py_ssize_t pos = 0, size = -1, at = 0, kn, vn
    cdef Py_UCS4 maxchar = 127
    cdef PyObject* k
    cdef PyObject* v
    cdef object out
    if props.__class__ is not dict:
        return _deps()._encode_properties_py(props)
    while PyDict_Next(props, &pos, &k, &v):
        if (<object>k).__class__ is not str or (<object>v).__class__ is not str:
            return _deps()._encode_properties_py(props)
        kn, vn = PyUnicode_GET_LENGTH(<object>k), PyUnicode_GET_LENGTH(<object>v)
        if kn and vn:
            size += kn + vn + 2
            maxchar = max(maxchar, PyUnicode_MAX_CHAR_VALUE(<object>k), PyUnicode_MAX_CHAR_VALUE(<object>v))
    if size <= 0:
        return ""
    out = PyUnicode_New(size, maxchar)
    pos = 0
    while PyDict_Next(props, &pos, &k, &v):
        kn, vn = PyUnicode_GET_LENGTH(<object>k), PyUnicode_GET_LENGTH(<object>v)
        if kn and vn:
            if at:
                PyUnicode_WriteChar(out, at, 2)
                at += 1
            PyUnicode_CopyCharacters(out, at, <object>k, 0, kn)
            at += kn
            PyUnicode_WriteChar(out, at, 1)
            PyUnicode_CopyCharacters(out, at + 1, <object>v, 0, vn)
            at += 1 + vn
    return out


cdef extern from "Python.h":
    Py_ssize_t PyUnicode_FindChar(object s, Py_UCS4 ch, Py_ssize_t start, Py_ssize_t end,
                                  int direction) except -2
    object PyUnicode_Substring(object s, Py_ssize_t start, Py_ssize_t end)


def decode_properties(data):
    """Parse ``k\\x01v\\x02k\\x01v`` into a dict, pairs without a name, value or separator left
    out: tidemq.message.decode_properties' twin (anything but str or bytes goes to it)."""
    cdef Py_ssize_t n, i = 0, j, sep
    cdef dict out = {}
    if data.__class__ is bytes:
        try:
            data = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), NULL)
        except UnicodeDecodeError:
            raise _deps().CodecError("properties are not UTF-8") from None
    elif data.__class__ is not str:
        return _deps()._decode_properties_py(data)
    n = PyUnicode_GET_LENGTH(data)
    if not n:
        return out
    while True:
        j = PyUnicode_FindChar(data, 2, i, n, 1)
        if j < 0:
            j = n
        sep = PyUnicode_FindChar(data, 1, i, j, 1)
        if sep > i and j > sep + 1:  # a name, a separator and a value
            out[PyUnicode_Substring(data, i, sep)] = PyUnicode_Substring(data, sep + 1, j)
        if j == n:
            return out
        i = j + 1
