# cython: language_level=3
"""Compiled twin of :mod:`tidemq.remoting.frame`: frame splitting and the header codecs.

Same functions, same results and the same errors (type and message) as the pure-Python twins in
frame.py, which stay the reference (tests/remoting/test_frame_compiled.py proves it, hostile input
included). Hot path (bench/hot_path.py, bench/compare.py row 1): every frame a broker or client
reads or writes goes through :func:`iter_frames` and :func:`encode_frame_parts`.

Invariants: every length read from the wire is checked against the bytes actually present before
anything is read or allocated (no read past a buffer, whatever the input); anything unusual (an
odd type, a non-integer header number, a value orjson must render) is handed to the Python twin,
so the compiled code only ever takes the common path and the twin alone decides the rare ones.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_DecodeUTF8
from libc.stdint cimport int16_t, int32_t, uint32_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy

import orjson

from tidemq.errors import FrameError
from tidemq.remoting.codes import LanguageCode, SerializeType
from tidemq.remoting.command import RemotingCommand

DEFAULT_MAX_FRAME = 16 * 1024 * 1024

cdef object _JSON = SerializeType.JSON
cdef object _ROCKETMQ = SerializeType.ROCKETMQ
cdef dict _LANG_INT_BY_NAME = {c.name: int(c) for c in LanguageCode}
cdef dict _LANG_NAME_BY_INT = {int(c): c.name for c in LanguageCode}
cdef int _OTHER = int(LanguageCode.OTHER)
cdef object _JSONDecodeError = orjson.JSONDecodeError
cdef object _loads = orjson.loads
cdef object _twin_module = None


cdef object _twin():
    """tidemq.remoting.frame, imported on first need (it imports this module at its end)."""
    global _twin_module
    if _twin_module is None:
        from tidemq.remoting import frame
        _twin_module = frame
    return _twin_module


cdef inline int32_t _i32(const unsigned char* p) noexcept:
    return <int32_t>((<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3])


cdef inline uint32_t _u32(const unsigned char* p) noexcept:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3]


cdef inline int16_t _i16(const unsigned char* p) noexcept:
    return <int16_t>((<uint32_t>p[0] << 8) | <uint32_t>p[1])


# ---- decoding ---------------------------------------------------------------------------------

cdef object _decode_json(bytes data):
    try:
        obj = _loads(data)
    except _JSONDecodeError as exc:
        raise FrameError(f"header is not valid JSON: {exc}") from None
    if type(obj) is not dict:
        raise FrameError("header is not a JSON object")
    cdef dict d = <dict>obj
    lang = d.get("language", "JAVA")
    if isinstance(lang, int):
        language = lang
    elif type(lang) is str:
        language = _LANG_INT_BY_NAME.get(lang, _OTHER)
    else:  # no other JSON value's str() is a language name
        language = _OTHER
    code = d.get("code")
    opaque = d.get("opaque")
    flag = d.get("flag")
    version = d.get("version")
    if type(code) is not int or type(opaque) is not int or type(flag) is not int or type(version) is not int:
        twin = _twin()
        code = twin._as_int(code, "code")
        opaque = twin._as_int(opaque, "opaque")
        flag = twin._as_int(flag, "flag")
        version = twin._as_int(version, "version")
    remark = d.get("remark")
    if remark is not None and type(remark) is not str:
        remark = str(remark)
    raw = d.get("extFields")
    if raw is None:
        ext = {}
    elif type(raw) is dict:
        ext = raw
        for v in (<dict>raw).values():
            if type(v) is not str:
                ext = _twin().coerce_ext_fields(raw)
                break
    else:
        raise FrameError("extFields is not a JSON object")
    return RemotingCommand(code, opaque, flag, language, version, remark, ext, None, _JSON)


cdef str _read_str(const unsigned char* p, Py_ssize_t n, Py_ssize_t pos, Py_ssize_t length, str what):
    if length < 0 or pos + length > n:
        raise FrameError(f"binary header: {what} length {length} exceeds the header")
    try:
        return PyUnicode_DecodeUTF8(<const char*>p + pos, length, NULL)
    except UnicodeDecodeError:
        raise FrameError(f"binary header: {what} is not UTF-8") from None


cdef object _decode_rocketmq(const unsigned char* p, Py_ssize_t n):
    # int16 code | uint8 language | int16 version | int32 opaque | int32 flag | int32 remark length
    # | remark | int32 extFields length | (int16 key length | key | int32 value length | value)*
    if n < 21:
        raise FrameError("binary header shorter than its fixed part")
    cdef int code = _i16(p)
    cdef int language = p[2]
    cdef int version = _i16(p + 3)
    cdef int32_t opaque = _i32(p + 5)
    cdef int32_t flag = _i32(p + 9)
    cdef Py_ssize_t length = _i32(p + 13)
    remark = _read_str(p, n, 17, length, "remark")
    cdef Py_ssize_t pos = 17 + length
    if pos + 4 > n:
        raise FrameError("binary header: missing extFields length")
    cdef Py_ssize_t ext_len = _i32(p + pos)
    pos += 4
    cdef Py_ssize_t end = pos + ext_len
    if ext_len < 0 or end > n:
        raise FrameError(f"binary header: extFields length {ext_len} exceeds the header")
    cdef dict fields = {}
    while pos < end:
        if pos + 2 > end:
            raise FrameError("binary header: truncated extFields key length")
        length = _i16(p + pos)
        key = _read_str(p, n, pos + 2, length, "extFields key")
        pos += 2 + length
        if pos + 4 > end:
            raise FrameError("binary header: truncated extFields value length")
        length = _i32(p + pos)
        value = _read_str(p, n, pos + 4, length, "extFields value")
        pos += 4 + length
        if pos > end:
            raise FrameError("binary header: extFields entry exceeds its length")
        fields[key] = value
    return RemotingCommand(code, opaque, flag, language, version, remark or None, fields, None, _ROCKETMQ)


cdef object _decode_header(uint32_t serialize_type, const unsigned char* p, Py_ssize_t n):
    # Both decoders read a private copy of the header: the caller's buffer may be a bytearray, and
    # the allocations below could in principle run code that resizes it (no pointer into it is
    # kept past this copy).
    cdef bytes header = PyBytes_FromStringAndSize(<const char*>p, n)
    if serialize_type == 0:
        return _decode_json(header)
    if serialize_type == 1:
        return _decode_rocketmq(<const unsigned char*>PyBytes_AS_STRING(header), n)
    raise FrameError(f"unknown serialize type {serialize_type}")


cdef object _decode_body(const unsigned char* p, Py_ssize_t n, uint32_t type_and_len):
    """A frame after its length word: ``p`` holds ``n`` bytes (type and header length first)."""
    cdef Py_ssize_t header_len = type_and_len & 0xFFFFFF
    if header_len + 4 > n:
        raise FrameError(f"header length {header_len} exceeds the frame")
    # the body is copied before the header is decoded: nothing below may move the buffer under p
    body = PyBytes_FromStringAndSize(<const char*>p + 4 + header_len, n - 4 - header_len)
    cmd = _decode_header((type_and_len >> 24) & 0xFF, p + 4, header_len)
    cmd.body = body
    return cmd


def decode_json_header(data):
    if type(data) is bytes:
        return _decode_json(<bytes>data)
    return _twin().decode_json_header_py(data)


def decode_rocketmq_header(data):
    if type(data) is not bytes:
        return _twin().decode_rocketmq_header_py(data)
    return _decode_rocketmq(<const unsigned char*>PyBytes_AS_STRING(data), len(<bytes>data))


def decode_header(serialize_type, data):
    if type(serialize_type) is not int or not 0 <= serialize_type <= 1:
        return _twin().decode_header_py(serialize_type, data)
    if serialize_type == 0:
        return decode_json_header(data)
    return decode_rocketmq_header(data)


cdef object _clamp(object max_frame):
    """max_frame as a C-comparable bound: frame lengths are int32, so any bound >= 2**31 acts alike."""
    if max_frame > 0x7FFFFFFF:
        return 0x7FFFFFFF
    if max_frame < 0:
        return -1
    return max_frame


def decode_frame(frame, max_frame=DEFAULT_MAX_FRAME):
    """Decode one whole frame (including its length word)."""
    cdef long long limit
    cdef Py_buffer view
    cdef const unsigned char* p
    cdef int32_t length
    if type(max_frame) is not int or (type(frame) is not bytes and type(frame) is not bytearray):
        return _twin().decode_frame_py(frame, max_frame)
    limit = _clamp(max_frame)
    PyObject_GetBuffer(frame, &view, PyBUF_SIMPLE)
    try:
        p = <const unsigned char*>view.buf
        if view.len < 8:
            raise FrameError("frame shorter than 8 bytes")
        length = _i32(p)
        if length < 4 or length > limit:
            raise FrameError(f"frame length {length} outside 4..{max_frame}")
        if length + 4 != view.len:
            raise FrameError(f"frame length {length} does not match the {view.len - 4} bytes given")
        return _decode_body(p + 4, length, _u32(p + 4))
    finally:
        PyBuffer_Release(&view)


def iter_frames(buffer, max_frame=DEFAULT_MAX_FRAME):
    """Yield every complete frame at the start of ``buffer`` and remove it from the buffer.

    A frame whose announced length is negative, shorter than the prefix or larger than
    ``max_frame`` raises FrameError before anything is allocated for it.
    """
    if type(buffer) is not bytearray or type(max_frame) is not int:
        yield from _twin().iter_frames_py(buffer, max_frame)
        return
    cdef long long limit = _clamp(max_frame)
    cdef Py_ssize_t pos = 0
    cdef Py_ssize_t n = PyByteArray_GET_SIZE(buffer)
    cdef Py_ssize_t start
    cdef int32_t length
    cdef const unsigned char* p
    try:
        while n - pos >= 4:
            if PyByteArray_GET_SIZE(buffer) < n:
                break  # the consumer shrank the buffer while iterating: the rest is no longer there
            p = <const unsigned char*>PyByteArray_AS_STRING(buffer)  # again after each yield
            length = _i32(p + pos)
            if length < 4 or length > limit:
                raise FrameError(f"frame length {length} outside 4..{max_frame}")
            if n - pos - 4 < length:
                break
            start = pos + 4
            pos = start + length
            yield _decode_body(p + start, length, _u32(p + start))
    finally:
        if pos:
            del buffer[:pos]


# ---- encoding ---------------------------------------------------------------------------------

cdef struct _Out:
    char* data
    Py_ssize_t len
    Py_ssize_t cap


cdef int _grow(_Out* out, Py_ssize_t more) except -1:
    cdef Py_ssize_t cap = out.cap
    cdef char* data
    if out.len + more <= cap:
        return 0
    while cap < out.len + more:
        cap *= 2
    data = <char*>realloc(out.data, cap)
    if data == NULL:
        raise MemoryError()
    out.data = data
    out.cap = cap
    return 0


cdef int _put(_Out* out, const char* s, Py_ssize_t n) except -1:
    _grow(out, n)
    memcpy(out.data + out.len, s, n)
    out.len += n
    return 0


cdef int _put_int(_Out* out, long long v) except -1:
    cdef char tmp[24]
    cdef int i = 24
    cdef unsigned long long u = <unsigned long long>(-(v + 1)) + 1 if v < 0 else <unsigned long long>v
    while True:
        i -= 1
        tmp[i] = <char>(48 + u % 10)
        u //= 10
        if u == 0:
            break
    if v < 0:
        i -= 1
        tmp[i] = 45  # '-'
    return _put(out, tmp + i, 24 - i)


cdef const char* _HEX = b"0123456789abcdef"
cdef const char* _ESC = b"btn?fr"  # the short escapes of bytes 8-13 (11 has none)


cdef int _put_str(_Out* out, str s) except -1:
    """``s`` as a JSON string exactly as orjson writes it (UTF-8, only '"', '\\' and controls
    escaped). Raises UnicodeEncodeError for lone surrogates (the caller hands those to orjson)."""
    cdef Py_ssize_t n, i
    cdef const unsigned char* p = <const unsigned char*>PyUnicode_AsUTF8AndSize(s, &n)
    cdef unsigned char c
    _grow(out, n * 6 + 2)  # the most an escape can make of a byte (\u00XX)
    cdef char* w = out.data + out.len
    w[0] = 34
    w += 1
    for i in range(n):
        c = p[i]
        if c >= 0x20 and c != 34 and c != 92:
            w[0] = c
            w += 1
        elif c == 34 or c == 92:
            w[0] = 92
            w[1] = c
            w += 2
        elif c == 8 or c == 9 or c == 10 or c == 12 or c == 13:
            w[0] = 92
            w[1] = _ESC[c - 8]
            w += 2
        else:
            w[0] = 92
            w[1] = 117  # u
            w[2] = 48
            w[3] = 48
            w[4] = _HEX[c >> 4]
            w[5] = _HEX[c & 15]
            w += 6
    w[0] = 34
    w += 1
    out.len = w - out.data
    return 0


cdef inline bint _plain_int(object v):
    """An int orjson writes as its decimal value and that fits a C long long (not a bool)."""
    return isinstance(v, int) and type(v) is not bool and -0x8000000000000000 <= v <= 0x7FFFFFFFFFFFFFFF


cdef bint _json_header_into(_Out* out, object cmd) except -1:
    """Write cmd's JSON header as frame.encode_json_header does; False: not the common case (a
    non-str extFields key or value, a non-int number, a remark that is not a str), nothing usable
    written, the caller asks the twin."""
    code, flag, opaque, version = cmd.code, cmd.flag, cmd.opaque, cmd.version
    ext = cmd.ext_fields
    remark = cmd.remark
    if not (_plain_int(code) and _plain_int(flag) and _plain_int(opaque) and _plain_int(version)):
        return False
    if type(ext) is not dict or (remark and type(remark) is not str):
        return False
    lang = _LANG_NAME_BY_INT.get(cmd.language, "OTHER")
    try:
        _put(out, b'{"code":', 8)
        _put_int(out, code)
        _put(out, b',"extFields":{', 14)
        first = True
        for k, v in (<dict>ext).items():
            if type(k) is not str or type(v) is not str:
                return False
            if not first:
                _put(out, b",", 1)
            first = False
            _put_str(out, <str>k)
            _put(out, b":", 1)
            _put_str(out, <str>v)
        _put(out, b'},"flag":', 9)
        _put_int(out, flag)
        _put(out, b',"language":', 12)
        _put_str(out, <str>lang)
        _put(out, b',"opaque":', 10)
        _put_int(out, opaque)
        _put(out, b',"serializeTypeCurrentRPC":"JSON","version":', 44)
        _put_int(out, version)
        if remark:
            _put(out, b',"remark":', 10)
            _put_str(out, <str>remark)
        _put(out, b"}", 1)
    except UnicodeEncodeError:  # a lone surrogate: orjson's own error, from the twin
        return False
    return True


def encode_json_header(cmd):
    cdef _Out out
    out.data = <char*>malloc(256)
    if out.data == NULL:
        raise MemoryError()
    out.len = 0
    out.cap = 256
    try:
        if _json_header_into(&out, cmd):
            return PyBytes_FromStringAndSize(out.data, out.len)
    finally:
        free(out.data)
    return _twin().encode_json_header_py(cmd)


def encode_frame_parts(cmd):
    """Encode ``cmd`` as frame pieces (prefix + header, then the body pieces), without joining."""
    cdef _Out out
    cdef Py_ssize_t header_len, body_len
    cdef bytes head
    cdef char* w
    if cmd.serialize_type != 0:  # the binary header (rare) or an odd type: the twin writes it
        return _twin().encode_frame_parts_py(cmd)
    out.data = <char*>malloc(512)
    if out.data == NULL:
        raise MemoryError()
    out.len = 8  # the prefix, written once the header's length is known
    out.cap = 512
    try:
        if not _json_header_into(&out, cmd):
            return _twin().encode_frame_parts_py(cmd)
        header_len = out.len - 8
        body = cmd.body
        if body is None:
            body_len = 0
            pieces = []
        elif isinstance(body, (list, tuple)):
            pieces = list(body)
            body_len = 0
            for piece in pieces:
                body_len += len(piece)
        else:
            pieces = [body]
            body_len = len(body)
        if 4 + header_len + body_len > 0x7FFFFFFF or header_len > 0xFFFFFF:
            return _twin().encode_frame_parts_py(cmd)  # struct.error, as the twin raises it
        head = PyBytes_FromStringAndSize(NULL, out.len)
        w = PyBytes_AS_STRING(head)
        memcpy(w + 8, out.data + 8, header_len)
    finally:
        free(out.data)
    _store_u32(w, <uint32_t>(4 + header_len + body_len))
    _store_u32(w + 4, <uint32_t>header_len)  # serialize type 0 (JSON) in the top byte
    pieces.insert(0, head)
    return pieces


cdef inline void _store_u32(char* w, uint32_t v) noexcept:
    w[0] = <char>(v >> 24)
    w[1] = <char>(v >> 16)
    w[2] = <char>(v >> 8)
    w[3] = <char>v


def encode_frame(cmd):
    return b"".join(encode_frame_parts(cmd))
