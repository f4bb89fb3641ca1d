"""Codecs of the name server's request and response bodies: pure functions, no I/O.

RegisterBrokerBody comes in two forms (RocketMQ 4.x ``RegisterBrokerBody``):

* JSON: ``{"topicConfigSerializeWrapper":{"topicConfigTable":{name: TopicConfig},
  "dataVersion":{"counter":N,"timestamp":T}},"filterServerList":[...]}``, parsed leniently
  (fastjson's unquoted integer keys are accepted);
* compressed (header ``compressed=true``): a zlib stream of big-endian ``i32`` length-prefixed parts:
  the DataVersion JSON, ``i32`` topic count, one ``"name read write perm filterType"`` line per
  topic, then the filter-server list JSON. That form carries no topicSysFlag (it reads back as 0).

Invariants: every length read is checked against what is left before slicing; inflating stops at
MAX_INFLATED bytes; anything malformed raises :class:`tidemq.errors.CodecError` and nothing else.
Bodies we write are standard JSON (string keys only).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tidemq.errors import CodecError, FrameError
from tidemq.remoting import fastjson

# A broker's whole topic table, inflated. RocketMQ brokers with ~10k topics send a few MiB.
MAX_INFLATED = 64 * 1024 * 1024
_I32 = struct.Struct(">i")
EMPTY_DATA_VERSION: dict[str, int] = {"counter": 0, "timestamp": 0}


@dataclass(frozen=True, slots=True)
class RegisterBody:
    """A decoded RegisterBrokerBody: topic name -> TopicConfig dict, data version, filter servers."""

    topic_configs: dict[str, dict] = field(default_factory=dict)
    data_version: dict | None = None
    filter_servers: tuple[str, ...] = ()


def _loads(data: bytes | str, what: str) -> object:
    try:
        return fastjson.loads(data)
    except FrameError as exc:
        raise CodecError(f"{what} is not valid JSON: {exc}") from None


def _topic_table(raw: object) -> dict[str, dict]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise CodecError("topicConfigTable is not a JSON object")
    out: dict[str, dict] = {}
    for key, cfg in raw.items():
        if isinstance(key, (fastjson.ObjectKey, bool)) or not isinstance(key, (str, int)):
            raise CodecError(f"topicConfigTable key {key!r} is not a topic name")
        if not isinstance(cfg, dict):
            raise CodecError(f"topic config of {key!r} is not a JSON object")
        out[str(key)] = cfg
    return out


def _data_version(raw: object) -> dict | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise CodecError("dataVersion is not a JSON object")
    return raw


def _filter_servers(raw: object) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise CodecError("filterServerList is not a JSON array")
    return tuple(str(s) for s in raw)


def parse_register_body(body: bytes, compressed: bool = False) -> RegisterBody:
    """Decode a REGISTER_BROKER body. An empty body means no topics, data version 0/0."""
    if not body:
        return RegisterBody({}, dict(EMPTY_DATA_VERSION), ())
    if compressed:
        return _parse_compressed(body)
    obj = _loads(body, "register body")
    if not isinstance(obj, dict):
        raise CodecError("register body is not a JSON object")
    wrapper = obj.get("topicConfigSerializeWrapper")
    if wrapper is None:
        wrapper = {}
    if not isinstance(wrapper, dict):
        raise CodecError("topicConfigSerializeWrapper is not a JSON object")
    return RegisterBody(
        _topic_table(wrapper.get("topicConfigTable")),
        _data_version(wrapper.get("dataVersion")),
        _filter_servers(obj.get("filterServerList")),
    )


def _inflate(data: bytes) -> bytes:
    d = zlib.decompressobj()
    try:
        out = d.decompress(data, MAX_INFLATED)
    except zlib.error as exc:
        raise CodecError(f"compressed register body cannot be inflated: {exc}") from None
    if d.unconsumed_tail:
        raise CodecError(f"compressed register body inflates to more than {MAX_INFLATED} bytes")
    return out


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def i32(self, what: str) -> int:
        if self.pos + 4 > len(self.data):
            raise CodecError(f"compressed register body ends inside the {what}")
        (v,) = _I32.unpack_from(self.data, self.pos)
        self.pos += 4
        if v < 0:
            raise CodecError(f"compressed register body has a negative {what}: {v}")
        return v

    def chunk(self, what: str) -> bytes:
        n = self.i32(f"length of the {what}")
        if n > len(self.data) - self.pos:
            raise CodecError(f"compressed register body: {what} of {n} bytes exceeds the body")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out


def _topic_line(raw: bytes) -> tuple[str, dict]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise CodecError("compressed register body: topic config is not UTF-8") from None
    parts = text.split(" ")
    if len(parts) < 5 or not parts[0]:
        raise CodecError(f"compressed register body: topic config {text[:80]!r} has fewer than 5 fields")
    try:
        read, write, perm = int(parts[1]), int(parts[2]), int(parts[3])
    except ValueError:
        raise CodecError(
            f"compressed register body: topic config {text[:80]!r} has a non-integer field"
        ) from None
    return parts[0], {
        "topicName": parts[0],
        "readQueueNums": read,
        "writeQueueNums": write,
        "perm": perm,
        "topicFilterType": parts[4],
        "topicSysFlag": 0,
    }


def _parse_compressed(body: bytes) -> RegisterBody:
    r = _Reader(_inflate(bytes(body)))
    version = _data_version(_loads(r.chunk("data version"), "data version"))
    count = r.i32("topic count")
    if count * 4 > len(r.data) - r.pos:
        raise CodecError(f"compressed register body claims {count} topics, more than it holds")
    topics: dict[str, dict] = {}
    for _ in range(count):
        name, cfg = _topic_line(r.chunk("topic config"))
        topics[name] = cfg
    filters: tuple[str, ...] = ()
    if r.pos < len(r.data):
        filters = _filter_servers(_loads(r.chunk("filter server list"), "filter server list"))
    return RegisterBody(topics, version, filters)


def encode_register_body(
    topic_configs: Mapping[str, Mapping[str, object]],
    data_version: Mapping[str, object] | None,
    filter_servers: Iterable[str] = (),
    compressed: bool = False,
) -> bytes:
    """The REGISTER_BROKER body a broker sends (both forms); used by tests and tools."""
    filters = list(filter_servers)
    if not compressed:
        return fastjson.dumps(
            {
                "filterServerList": filters,
                "topicConfigSerializeWrapper": {
                    "dataVersion": dict(data_version or EMPTY_DATA_VERSION),
                    "topicConfigTable": {k: dict(v) for k, v in topic_configs.items()},
                },
            }
        )
    parts: list[bytes] = []

    def put(b: bytes) -> None:
        parts.append(_I32.pack(len(b)))
        parts.append(b)

    put(fastjson.dumps(dict(data_version or EMPTY_DATA_VERSION)))
    parts.append(_I32.pack(len(topic_configs)))
    for name, cfg in topic_configs.items():
        line = " ".join(
            [
                name,
                str(cfg.get("readQueueNums", 16)),
                str(cfg.get("writeQueueNums", 16)),
                str(cfg.get("perm", 6)),
                str(cfg.get("topicFilterType", "SINGLE_TAG")),
            ]
        )
        put(line.encode())
    put(fastjson.dumps(filters))
    return zlib.compress(b"".join(parts), 9)


def parse_data_version(body: bytes | None) -> dict | None:
    """The DataVersion JSON of a QUERY_DATA_VERSION request (None when the body is empty)."""
    if not body:
        return None
    return _data_version(_loads(body, "data version"))


def dumps(value: object) -> bytes:
    """Standard JSON for a response body (string keys only)."""
    return fastjson.dumps(value)
