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
_LONG = {v: v for v in V2_NAMES}
_SHORT = V2_NAMES


@dataclass(frozen=True, slots=True)
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


def decode_send_header(fields: Mapping[str, str], v2: bool) -> SendHeader:
    """The header of a send request: one-letter names when ``v2``, long names otherwise."""
    n = _SHORT if v2 else _LONG
    get = fields.get
    max_reconsume = get(n["maxReconsumeTimes"])
    batch = get(n["batch"])
    unit_mode = get(n["unitMode"])
    return SendHeader(
        get(n["producerGroup"]) or "",
        get(n["topic"]) or "",
        get(n["defaultTopic"]) or "",
        field_int(get(n["defaultTopicQueueNums"]), "defaultTopicQueueNums", 4),
        field_int(get(n["queueId"]), "queueId", -1, _INT32),
        field_int(get(n["sysFlag"]), "sysFlag", 0, _INT32),
        field_int(get(n["bornTimestamp"]), "bornTimestamp", 0, _INT64),
        field_int(get(n["flag"]), "flag", 0, _INT32),
        get(n["properties"]) or "",
        field_int(get(n["reconsumeTimes"]), "reconsumeTimes", 0, _INT32),
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
