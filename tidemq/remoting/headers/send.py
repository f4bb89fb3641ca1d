"""The SEND_MESSAGE family's header (SendMessageRequestHeader), decoded once.

SEND_MESSAGE (10) and SEND_REPLY_MESSAGE (324) name the fields in full; SEND_MESSAGE_V2 (310),
SEND_BATCH_MESSAGE (320) and SEND_REPLY_MESSAGE_V2 (325) use RocketMQ's one-letter names
(SendMessageRequestHeaderV2). A V2 header is read by its one-letter names only, as every other
reader of it (the ACL included) does: a second, long name can never point a check and a write at
different fields. Numbers are range-checked as Java ints/longs; a bad one raises ValueError
naming the field (in its long name).

Hot path (guarded by bench/hot_path.py): one dict lookup per field, no renamed copy of the header.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tidemq import compiled
from tidemq.remoting.command import field_int

_INT32 = 1 << 31
_INT64 = 1 << 63

# Long name -> one-letter V2 name (SendMessageRequestHeaderV2).
V2_NAMES = {
    "producerGroup": "a",
    "topic": "b",
    "defaultTopic": "c",
    "defaultTopicQueueNums": "d",
    "queueId": "e",
    "sysFlag": "f",
    "bornTimestamp": "g",
    "flag": "h",
    "properties": "i",
    "reconsumeTimes": "j",
    "unitMode": "k",
    "maxReconsumeTimes": "l",
    "batch": "m",
    "brokerName": "n",
}


# Not frozen: a frozen dataclass's __init__ costs ~1 us more per object, once per message on the
# send path (bench/hot_path.py). Treated as immutable all the same.
@dataclass(slots=True)
class SendHeader:
    """One send's header. ``properties`` is the encoded property string (decoded by the broker,
    which owns the Java property format); ``max_reconsume_times`` is None when absent."""

    producer_group: str
    topic: str
    default_topic: str
    default_topic_queue_nums: int
    queue_id: int  # -1: the broker picks one
    sys_flag: int
    born_timestamp: int
    flag: int
    properties: str
    reconsume_times: int
    unit_mode: bool
    max_reconsume_times: int | None
    batch: bool


_ORDER = ("producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag", "bornTimestamp",
          "flag", "properties", "reconsumeTimes", "unitMode", "maxReconsumeTimes", "batch")
_LONG_KEYS = _ORDER
_SHORT_KEYS = tuple(V2_NAMES[k] for k in _ORDER)

# Hot path (bench/hot_path.py): the small numbers clients send (queue ids, flags, retry counts)
# are looked up, not parsed: one dict lookup each, in range by construction, the field's default
# for an absent or empty value. Anything else (a miss: None) is parsed by field_int below, which
# also gives a bad value's exact error.
_SMALL: dict[str | None, int] = {str(i): i for i in range(-1, 1024)}
_QUEUE_ID: dict[str | None, int] = {**_SMALL, None: -1, "": -1}
_ZERO: dict[str | None, int] = {**_SMALL, None: 0, "": 0}
_QUEUE_NUMS: dict[str | None, int] = {**_SMALL, None: 4, "": 4}
_FLAG: dict[str | None, bool] = {"true": True, "false": False, "1": True, "0": False, None: False}
_BORN_DIGITS = 18  # a decimal of at most 18 digits is a Java long (< 2**63)


def _flag(v: str | None) -> bool:
    b = _FLAG.get(v)
    return b if b is not None else (v is not None and v.lower() in ("true", "1"))


def decode_send_header_py(fields: Mapping[str, str], v2: bool) -> SendHeader:
    """The header of a send request: one-letter names when ``v2``, long names otherwise."""
    group, topic, default_topic, dqn, qid, sys_flag, born, flag, props, reconsume, unit_mode, max_reconsume, batch = (
        map(fields.get, _SHORT_KEYS if v2 else _LONG_KEYS))
    n_qid = _QUEUE_ID.get(qid)
    n_sys = _ZERO.get(sys_flag)
    n_flag = _ZERO.get(flag)
    n_reconsume = _ZERO.get(reconsume)
    n_dqn = _QUEUE_NUMS.get(dqn)
    if (n_qid is None or n_sys is None or n_flag is None or n_reconsume is None or n_dqn is None
            or not born or len(born) > _BORN_DIGITS or not born.isdigit() or not born.isascii()):
        n_dqn = field_int(dqn, "defaultTopicQueueNums", 4)
        n_qid = field_int(qid, "queueId", -1, _INT32)
        n_sys = field_int(sys_flag, "sysFlag", 0, _INT32)
        n_born = field_int(born, "bornTimestamp", 0, _INT64)
        n_flag = field_int(flag, "flag", 0, _INT32)
        n_reconsume = field_int(reconsume, "reconsumeTimes", 0, _INT32)
    else:
        n_born = int(born)
    return SendHeader(
        group or "", topic or "", default_topic or "", n_dqn, n_qid, n_sys, n_born, n_flag, props or "", n_reconsume,
        _flag(unit_mode) if unit_mode is not None else False,
        field_int(max_reconsume, "maxReconsumeTimes", 0, _INT32) if max_reconsume else None,
        _flag(batch) if batch is not None else False,
    )


def reply_push_fields(header: SendHeader, properties: str, born_host: str, store_host: str,
                      store_timestamp: int) -> dict[str, str]:
    """The header of PUSH_REPLY_MESSAGE_TO_CLIENT (RocketMQ's ReplyMessageRequestHeader): the
    reply's send header in long names plus where and when it was born and stored."""
    h = header
    fields = {
        "producerGroup": h.producer_group,
        "topic": h.topic,
        "defaultTopic": h.default_topic,
        "defaultTopicQueueNums": str(h.default_topic_queue_nums),
        "queueId": str(h.queue_id),
        "sysFlag": str(h.sys_flag),
        "bornTimestamp": str(h.born_timestamp),
        "flag": str(h.flag),
        "reconsumeTimes": str(h.reconsume_times),
        "unitMode": "true" if h.unit_mode else "false",
    }
    out = {k: v for k, v in fields.items() if v}
    out["properties"] = properties
    out["bornHost"] = born_host
    out["storeHost"] = store_host
    out["storeTimestamp"] = str(store_timestamp)
    return out


def send_response_fields(msg_id: str, queue_id: int, queue_offset: int, region: str) -> dict[str, str]:
    """The header of every answer to a send (SendMessageResponseHeader, and to a reply send)."""
    return {
        "msgId": msg_id,
        "queueId": str(queue_id),
        "queueOffset": str(queue_offset),
        "MSG_REGION": region,
        "TRACE_ON": "true",
    }


# The compiled twin (tidemq/remoting/headers/_headers_c.pyx) when built: same values and errors
# (tests/remoting/test_headers_compiled.py). Loaded last: it builds this module's header class.
_c = compiled.load("tidemq.remoting.headers._headers_c")
decode_send_header = decode_send_header_py if _c is None else _c.decode_send_header
