"""Admin request headers and response bodies: pure codecs, no I/O.

GET_BROKER_RUNTIME_INFO answers RocketMQ's KVTable, ``{"table": {key: value}}``: read by
:func:`parse_kv_table` into a dict of strings (a replica's ``ha*`` keys are named in
tidemq.remoting.headers.replica).

Stats bodies (GET_TOPIC_STATS_INFO 202, GET_CONSUME_STATS 208) key their ``offsetTable`` by
MessageQueue in fastjson's inline-object form ``{{"brokerName":..,"queueId":..,"topic":..}:{..}}``;
:func:`tidemq.remoting.fastjson.loads` returns such keys as ObjectKey. A key that arrives as a
JSON string holding that object is accepted too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from tidemq.client.route import MessageQueue, Perm
from tidemq.client.validation import AUTO_CREATE_TOPIC
from tidemq.errors import CodecError, FrameError
from tidemq.remoting import RemotingCommand, RequestCode, fastjson
from tidemq.remoting.headers.admin import encode_attributes

UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"


class TopicOffset(NamedTuple):
    """One queue of GET_TOPIC_STATS_INFO."""

    queue: MessageQueue
    min_offset: int
    max_offset: int
    last_update_ms: int


class QueueProgress(NamedTuple):
    """One queue of GET_CONSUME_STATS. ``lag`` = broker_offset - consumer_offset."""

    queue: MessageQueue
    broker_offset: int
    consumer_offset: int
    last_timestamp: int

    @property
    def lag(self) -> int:
        return max(self.broker_offset - self.consumer_offset, 0)


@dataclass(frozen=True, slots=True)
class ConsumerProgress:
    """A group's progress: one entry per queue, sorted. Iterates over its queues."""

    group: str
    queues: tuple[QueueProgress, ...] = ()
    consume_tps: float = 0.0

    @property
    def total_lag(self) -> int:
        return sum(q.lag for q in self.queues)

    def __iter__(self):
        return iter(self.queues)

    def __len__(self) -> int:
        return len(self.queues)


def create_topic_request(
    topic: str, read_queues: int, write_queues: int, perm: int, order: bool,
    attributes: Mapping[str, str | None] | None = None,
) -> RemotingCommand:
    fields: dict[str, object] = {
        "topic": topic,
        "defaultTopic": AUTO_CREATE_TOPIC,
        "readQueueNums": read_queues,
        "writeQueueNums": write_queues,
        "perm": int(Perm(perm)),
        "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": 0,
        "order": bool(order),
    }
    if attributes:  # RocketMQ 5's modification list; brokers before 5 ignore the field
        fields["attributes"] = encode_attributes(attributes)
    return RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, fields)


def query_message_request(
    topic: str, key: str, max_num: int, begin_ms: int, end_ms: int, unique_key: bool = False
) -> RemotingCommand:
    fields: dict[str, object] = {
        "topic": topic,
        "key": key,
        "maxNum": max_num,
        "beginTimestamp": begin_ms,
        "endTimestamp": end_ms,
    }
    if unique_key:
        fields[UNIQUE_KEY_QUERY] = True
    return RemotingCommand.request(RequestCode.QUERY_MESSAGE, fields)


# ---------------------------------------------------------------------------------------------
# bodies


def _load_obj(body: bytes, what: str) -> dict:
    try:
        obj = fastjson.loads(body)
    except (FrameError, TypeError) as exc:
        # TypeError: fastjson.loads meets an object key holding a nested object/array.
        raise CodecError(f"{what} body is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise CodecError(f"{what} body is not a JSON object")
    return obj


def _queue_key(key: object, what: str) -> MessageQueue:
    if isinstance(key, fastjson.ObjectKey):
        return MessageQueue.from_json(key.as_dict())
    if isinstance(key, str) and key.lstrip().startswith("{"):
        try:
            return MessageQueue.from_json(fastjson.loads(key))
        except (FrameError, TypeError):
            pass
    raise CodecError(f"{what}: offsetTable key {key!r} is not a message queue")


def _num(obj: dict, key: str, what: str) -> int:
    v = obj.get(key, 0)
    try:
        return int(v if v is not None else 0)
    except (TypeError, ValueError):
        raise CodecError(f"{what}: {key} is not a number: {v!r}") from None


def _offset_table(body: bytes, what: str, fields: tuple[str, ...]) -> tuple[dict, list[tuple]]:
    """The body's object and, for each ``offsetTable`` entry, its queue followed by the numbers
    named ``fields``."""
    obj = _load_obj(body, what)
    table = obj.get("offsetTable") or {}
    if not isinstance(table, dict):
        raise CodecError(f"{what}: offsetTable is not an object")
    rows = []
    for key, value in table.items():
        if not isinstance(value, dict):
            raise CodecError(f"{what}: entry for {key!r} is not an object")
        rows.append((_queue_key(key, what), *(_num(value, f, what) for f in fields)))
    return obj, rows


def parse_topic_stats(body: bytes) -> list[TopicOffset]:
    _obj, rows = _offset_table(body, "topic stats",
                               ("minOffset", "maxOffset", "lastUpdateTimestamp"))
    return sorted(TopicOffset(*row) for row in rows)


def parse_consume_stats(body: bytes) -> tuple[list[QueueProgress], float]:
    obj, rows = _offset_table(body, "consume stats",
                              ("brokerOffset", "consumerOffset", "lastTimestamp"))
    try:
        tps = float(obj.get("consumeTps") or 0.0)
    except (TypeError, ValueError):
        tps = 0.0
    return sorted(QueueProgress(*row) for row in rows), tps


def parse_string_list(body: bytes, field_name: str, what: str) -> list[str]:
    """``{"topicList":[...]}`` / ``{"consumerIdList":[...]}``; an empty body is an empty list."""
    if not body:
        return []
    obj = _load_obj(body, what)
    items = obj.get(field_name) or []
    if not isinstance(items, list):
        raise CodecError(f"{what}: {field_name} is not an array")
    return [str(i) for i in items]


def parse_kv_table(body: bytes, what: str) -> dict[str, str]:
    """RocketMQ's KVTable body ``{"table": {...}}`` as strings (a number is read as its text)."""
    obj = _load_obj(body, what)
    table = obj.get("table") or {}
    if not isinstance(table, dict):
        raise CodecError(f"{what}: table is not an object")
    out = {}
    for k, v in table.items():
        if isinstance(v, (dict, list)):
            raise CodecError(f"{what}: the value of {k!r} is not a string")
        out[str(k)] = "" if v is None else str(v)
    return out
