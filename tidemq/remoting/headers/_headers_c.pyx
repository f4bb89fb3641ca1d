# cython: language_level=3
"""Compiled twins of the hot request headers' decoders: :func:`decode_send_header` (SEND_MESSAGE,
V2's one-letter names, batches) and :func:`decode_pull_header` (PULL_MESSAGE, LITE_PULL_MESSAGE).

Same values and the same errors as the Python twins in send.py and pull.py, which stay the
reference (tests/remoting/test_headers_compiled.py proves it). Hot path (bench/hot_path.py,
bench/compare.py rows 1-4): one header per send request and per pull.

Invariant: a number is parsed here only when it is plain ASCII (an optional '-' and at most 18
digits, so it fits a C long long); anything else (spaces, '+', underscores, other digits, longer
strings, non-str values) goes to :func:`tidemq.remoting.command.field_int`, which both twins use
for those, so Python's ``int()`` alone decides what such a value means and how it fails.
"""

from cpython.unicode cimport PyUnicode_GET_LENGTH


cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object s)
    const unsigned char* PyUnicode_1BYTE_DATA(object s)

from tidemq.remoting.command import field_int

cdef long long _INT32 = 1 << 31
cdef object _SendHeader = None
cdef object _PullHeader = None
cdef object _send_py = None
cdef int _MAX_MSG_NUMS = 1024

_LONG_KEYS = ("producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
              "bornTimestamp", "flag", "properties", "reconsumeTimes", "unitMode", "maxReconsumeTimes", "batch")
_SHORT_KEYS = ("a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m")


cdef inline bint _digits(str s, long long* out) noexcept:
    """``s`` as an integer when it is an optional '-' and 1-18 ASCII digits."""
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(s)
    cdef Py_ssize_t i = 0
    cdef const unsigned char* p
    cdef long long v = 0
    cdef bint neg
    if n == 0 or n > 19 or not PyUnicode_IS_ASCII(s):
        return False
    p = PyUnicode_1BYTE_DATA(s)
    neg = p[0] == 45  # '-'
    if neg:
        i = 1
        if n == 1:
            return False
    if n - i > 18:
        return False
    while i < n:
        if p[i] < 48 or p[i] > 57:
            return False
        v = v * 10 + (p[i] - 48)
        i += 1
    out[0] = -v if neg else v
    return True


cdef object _int(object v, str name, object default, long long limit, bint bounded):
    """field_int(v, name, default, limit) (limit 2**63 when not ``bounded``)."""
    cdef long long n
    if v is None or (type(v) is str and PyUnicode_GET_LENGTH(v) == 0):
        if default is not None:
            return default
    elif type(v) is str and _digits(<str>v, &n) and (not bounded or -limit <= n < limit):
        return n
    return field_int(v, name, default, limit if bounded else 1 << 63)


cdef object _flag(object v):
    """send.py's _flag for a present value: 'true'/'1' (any case) is true."""
    if v == "true" or v == "1":
        return True
    if v == "false" or v == "0":
        return False
    return v.lower() in ("true", "1")


def decode_send_header(fields, v2):
    """The header of a send request: one-letter names when ``v2``, long names otherwise."""
    global _SendHeader, _send_py
    if _SendHeader is None:
        from tidemq.remoting.headers import send
        _SendHeader = send.SendHeader
        _send_py = send.decode_send_header_py
    if type(fields) is not dict:
        return _send_py(fields, v2)
    cdef dict d = <dict>fields
    values = [d.get(k) for k in (_SHORT_KEYS if v2 else _LONG_KEYS)]
    for v in values:
        if v is not None and type(v) is not str:  # not a wire header: the twin decides
            return _send_py(fields, v2)
    group, topic, default_topic, dqn, qid, sys_flag, born, flag, props, reconsume, unit_mode, max_reconsume, batch = (
        values)
    n_dqn = _int(dqn, "defaultTopicQueueNums", 4, 0, False)
    n_qid = _int(qid, "queueId", -1, _INT32, True)
    n_sys = _int(sys_flag, "sysFlag", 0, _INT32, True)
    n_born = _int(born, "bornTimestamp", 0, 0, False)
    n_flag = _int(flag, "flag", 0, _INT32, True)
    n_reconsume = _int(reconsume, "reconsumeTimes", 0, _INT32, True)
    return _SendHeader(
        group or "", topic or "", default_topic or "", n_dqn, n_qid, n_sys, n_born, n_flag, props or "", n_reconsume,
        _flag(unit_mode) if unit_mode is not None else False,
        _int(max_reconsume, "maxReconsumeTimes", 0, _INT32, True) if max_reconsume else None,
        _flag(batch) if batch is not None else False,
    )


def decode_pull_header(fields):
    global _PullHeader
    if _PullHeader is None:
        from tidemq.remoting.headers import pull
        _PullHeader = pull.PullHeader
    get = fields.get
    group = get("consumerGroup") or ""
    topic = get("topic") or ""
    queue_id = _int(get("queueId"), "queueId", None, _INT32, True)
    offset = _int(get("queueOffset"), "queueOffset", None, 0, False)
    max_nums = max(1, min(_int(get("maxMsgNums"), "maxMsgNums", 32, _INT32, True), _MAX_MSG_NUMS))
    sys_flag = _int(get("sysFlag"), "sysFlag", 0, _INT32, True)
    if not group:
        raise ValueError("missing header field 'consumerGroup'")
    return _PullHeader(
        group, topic, queue_id, offset, max_nums, sys_flag,
        _int(get("commitOffset"), "commitOffset", -1, 0, False),
        _int(get("suspendTimeoutMillis"), "suspendTimeoutMillis", 15000, 0, False),
        get("subscription") or "",
        get("expressionType") or "",
        _int(get("subVersion"), "subVersion", 0, 0, False),
    )
