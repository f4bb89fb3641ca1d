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

from tidemq.remoting.command import field_int

_INT32 = 1 << 31
_INT64 = 1 << 63
_MIN32, _MIN64 = -_INT32, -_INT64  # named: a negated global is computed (and a big int made) per use

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
_MAX_DIGITS = 24  # as field_int: a longer value is refused whatever it says


def decode_send_header(fields: Mapping[str, str], v2: bool) -> SendHeader:
    """The header of a send request: one-letter names when ``v2``, long names otherwise."""
    group, topic, default_topic, dqn, qid, sys_flag, born, flag, props, reconsume, unit_mode, max_reconsume, batch = (
        map(fields.get, _SHORT_KEYS if v2 else _LONG_KEYS))
    try:  # hot path: plain int() on the usual short values; anything unusual takes field_int below
        n_qid = int(qid) if qid else -1
        n_sys = int(sys_flag) if sys_flag else 0
        n_born = int(born) if born else 0
        n_flag = int(flag) if flag else 0
        n_reconsume = int(reconsume) if reconsume else 0
        n_dqn = int(dqn) if dqn else 4
        ok = (_MIN32 <= n_qid < _INT32 and _MIN32 <= n_sys < _INT32 and _MIN64 <= n_born < _INT64
              and _MIN32 <= n_flag < _INT32 and _MIN32 <= n_reconsume < _INT32 and _MIN64 <= n_dqn < _INT64
              and len(born or "") <= _MAX_DIGITS and len(dqn or "") <= _MAX_DIGITS)
    except ValueError:
        ok = False
    if not ok:  # the exact error (or value) of field_int, field by field
        n_dqn = field_int(dqn, "defaultTopicQueueNums", 4)
        n_qid = field_int(qid, "queueId", -1, _INT32)
        n_sys = field_int(sys_flag, "sysFlag", 0, _INT32)
        n_born = field_int(born, "bornTimestamp", 0, _INT64)
        n_flag = field_int(flag, "flag", 0, _INT32)
        n_reconsume = field_int(reconsume, "reconsumeTimes", 0, _INT32)
    return SendHeader(
        group or "", topic or "", default_topic or "", n_dqn, n_qid, n_sys, n_born, n_flag, props or "", n_reconsume,
        unit_mode is not None and unit_mode.lower() in ("true", "1"),
        field_int(max_reconsume, "maxReconsumeTimes", 0, _INT32) if max_reconsume else None,
        batch is not None and batch.lower() in ("true", "1"),
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
