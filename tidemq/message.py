"""Messages and their codecs: properties, stored records, batch bodies, message ids.

Pure functions only: bytes in, values out (and back), no sockets, files or clocks (the unique-id
generator takes its clock and counter as arguments). Every decoder raises
:class:`tidemq.errors.CodecError` and nothing else on bad input.

The stored record layout (RocketMQ 4.x CommitLog, also the pull-response body element) is defined
once, field by field, in the "stored records" section (``RECORD_HEAD``, ``record_fixed``); the
store's writer and the Spark decoder use those definitions, never a struct of their own.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import zlib
from dataclasses import dataclass, field
from enum import IntFlag
from typing import Final

from tidemq import compiled
from tidemq.errors import CodecError

MESSAGE_MAGIC = 0xDAA320A7
BLANK_MAGIC = 0xCBD43194
MAX_TOPIC_LENGTH = 127
MAX_PROPERTIES_LENGTH = 32767
DEFAULT_MAX_BODY = 4 * 1024 * 1024

NAME_VALUE_SEP = "\x01"
PROPERTY_SEP = "\x02"


class SysFlag(IntFlag):
    COMPRESSED = 0x1
    MULTI_TAGS = 0x2
    TRANSACTION_PREPARED = 0x4
    TRANSACTION_COMMIT = 0x8
    TRANSACTION_ROLLBACK = 0xC
    BORNHOST_V6 = 0x10
    STOREHOST_V6 = 0x20


TRANSACTION_MASK = 0xC


class Prop:
    """Reserved property keys (RocketMQ MessageConst)."""

    KEYS = "KEYS"
    TAGS = "TAGS"
    WAIT = "WAIT"
    DELAY = "DELAY"
    RETRY_TOPIC = "RETRY_TOPIC"
    REAL_TOPIC = "REAL_TOPIC"
    REAL_QID = "REAL_QID"
    TRAN_MSG = "TRAN_MSG"
    PGROUP = "PGROUP"
    UNIQ_KEY = "UNIQ_KEY"
    ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
    MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
    CLUSTER = "CLUSTER"
    MIN_OFFSET = "MIN_OFFSET"
    MAX_OFFSET = "MAX_OFFSET"
    # request-reply (RocketMQ 4.6+)
    CORRELATION_ID = "CORRELATION_ID"
    REPLY_TO_CLIENT = "REPLY_TO_CLIENT"
    TTL = "TTL"
    MSG_TYPE = "MSG_TYPE"
    ARRIVE_TIME = "ARRIVE_TIME"
    PUSH_REPLY_TIME = "PUSH_REPLY_TIME"


# ---------------------------------------------------------------------------------------------
# properties


def _decode_properties_py(data: str | bytes | memoryview) -> dict[str, str]:
    """Parse ``k\\x01v\\x02k\\x01v`` (Java: no trailing separator; cpp: one after every pair).

    Entries with an empty name or value, or without a separator, are skipped as both clients do.
    ``decode_properties`` is this function or its compiled twin (end of module).
    """
    if not isinstance(data, str):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            raise CodecError("properties are not UTF-8") from None
    out: dict[str, str] = {}
    if not data:
        return out
    for item in data.split(PROPERTY_SEP):
        name, sep, value = item.partition(NAME_VALUE_SEP)
        if sep and name and value:
            out[name] = value
    return out


def _encode_properties_py(props: dict[str, str]) -> str:
    """Java form: pairs joined by \\x02, no trailing separator. ``encode_properties`` is this
    function or its compiled twin (end of module)."""
    # a list, not a generator: join is faster on one (hot path: every send, both ends)
    return PROPERTY_SEP.join([f"{k}{NAME_VALUE_SEP}{v}" for k, v in props.items() if k and v != ""])


# ---------------------------------------------------------------------------------------------
# hashing


def java_hash(s: str) -> int:
    """Java ``String.hashCode`` as a signed 32-bit int (UTF-16 code units)."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


def tags_code(tags: str | None) -> int:
    """The consume-queue tag code of a message: Java hash of TAGS, 0 without a tag."""
    return java_hash(tags) if tags else 0


def body_crc(body: bytes | memoryview) -> int:
    return zlib.crc32(body) & 0x7FFFFFFF


# ---------------------------------------------------------------------------------------------
# hosts and message ids


def pack_host(host: str, port: int) -> tuple[bytes, bool]:
    """Return (address bytes, is_ipv6) of an IP literal (an IPv4-mapped IPv6 one counts as IPv4).

    ValueError for anything else: a host name is resolved once, where it enters (the broker's
    advertised host at start, tidemq.broker.advertise), never here, where a lookup would block
    the event loop for every record and a failed one would leave no true address to store."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"{host!r} is not an IP address; a stored record's born and store hosts "
                         f"must be IP literals (resolve a host name once, before storing)") from None
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped.packed, False
        return ip.packed, True
    return ip.packed, False


def format_host(addr: bytes, port: int) -> str:
    if len(addr) == 4:
        return f"{socket.inet_ntop(socket.AF_INET, addr)}:{port}"
    return f"[{socket.inet_ntop(socket.AF_INET6, addr)}]:{port}"


def split_host(addr: str) -> tuple[str, int]:
    """The inverse of :func:`format_host`: ``"1.2.3.4:10911"`` / ``"[::1]:10911"`` -> (host, port);
    ("127.0.0.1", 0) for a string without a numeric port."""
    host, _, port = addr.rpartition(":")
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        return "127.0.0.1", 0


def encode_offset_msg_id(host_bytes: bytes, port: int, commit_log_offset: int) -> str:
    return (host_bytes + struct.pack(">iq", port, commit_log_offset)).hex().upper()


def decode_offset_msg_id(msg_id: str) -> tuple[str, int]:
    """Return (broker address, commit-log offset) of an offset message id."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise CodecError(f"message id {msg_id!r} is not hexadecimal") from None
    if len(raw) == 16:
        host, rest = raw[:4], raw[4:]
    elif len(raw) == 28:
        host, rest = raw[:16], raw[16:]
    else:
        raise CodecError(f"message id {msg_id!r} has {len(raw)} bytes, expected 16 or 28")
    port, offset = struct.unpack(">iq", rest)
    return format_host(host, port), offset


def make_uniq_id(ip: bytes, pid: int, start: bytes, millis_in_month: int, counter: int) -> str:
    """A client unique id (UNIQ_KEY): 16 bytes as 32 upper-case hex characters.

    ``ip`` (4 bytes) + pid (2) + ``start`` (4 random bytes chosen at client start) + milliseconds
    since the month began (4) + counter (2). Callers supply clock and counter.
    """
    return (
        ip[:4].rjust(4, b"\0")
        + struct.pack(">H", pid & 0xFFFF)
        + start[:4].rjust(4, b"\0")
        + struct.pack(">IH", millis_in_month & 0xFFFFFFFF, counter & 0xFFFF)
    ).hex().upper()


# ---------------------------------------------------------------------------------------------
# messages


@dataclass(slots=True)
class Message:
    """A message to send. ``properties`` holds user properties and reserved keys alike."""

    topic: str
    body: bytes = b""
    tags: str | None = None
    keys: str | list[str] | None = None
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0

    def all_properties(self) -> dict[str, str]:
        props = dict(self.properties)
        if self.tags:
            props[Prop.TAGS] = self.tags
        if self.keys:
            props[Prop.KEYS] = self.keys if isinstance(self.keys, str) else " ".join(self.keys)
        return props


_EXT_FIELDS: Final = (  # Final keeps the names literal: mypy checks match statements on them
    "topic", "body", "queue_id", "queue_offset", "commit_log_offset", "store_size", "flag",
    "sys_flag", "born_timestamp", "born_host", "store_timestamp", "store_host", "reconsume_times",
    "prepared_transaction_offset", "properties", "body_crc", "offset_msg_id",
)


class MessageExt:
    """A stored message as read back from the CommitLog or a pull response.

    Same fields, constructor, equality and repr as the dataclass it replaces. Messages decoded
    from records (:func:`decode_record`, :func:`decode_records`) are lazy: ``properties`` is
    parsed, and ``born_host``/``store_host``/``offset_msg_id`` are formatted, on first access
    (hot path: bench/produce_consume.py pull; most consumers read body and offsets only). The
    properties text is still checked for UTF-8 while decoding, so bad records fail there.
    """

    __slots__ = (
        "topic", "body", "queue_id", "queue_offset", "commit_log_offset", "store_size", "flag",
        "sys_flag", "born_timestamp", "store_timestamp", "reconsume_times",
        "prepared_transaction_offset", "body_crc",
        "_properties", "_props_text", "_born_host", "_store_host", "_offset_msg_id", "_hosts",
    )
    __match_args__ = _EXT_FIELDS
    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value (as the dataclass)
    # The lazy parts: a None host, id or properties is computed on first access from ``_hosts``
    # (born address and port, store address and port) or ``_props_text``, which a lazy message
    # always carries; an eager one carries placeholders that are never read.
    _properties: dict[str, str] | None
    _props_text: str
    _born_host: str | None
    _store_host: str | None
    _offset_msg_id: str | None
    _hosts: tuple[bytes, int, bytes, int]

    def __init__(
        self, topic: str, body: bytes, queue_id: int, queue_offset: int, commit_log_offset: int,
        store_size: int, flag: int, sys_flag: int, born_timestamp: int, born_host: str,
        store_timestamp: int, store_host: str, reconsume_times: int,
        prepared_transaction_offset: int, properties: dict[str, str], body_crc: int,
        offset_msg_id: str,
    ) -> None:
        self.topic = topic
        self.body = body
        self.queue_id = queue_id
        self.queue_offset = queue_offset
        self.commit_log_offset = commit_log_offset
        self.store_size = store_size
        self.flag = flag
        self.sys_flag = sys_flag
        self.born_timestamp = born_timestamp
        self._born_host = born_host
        self.store_timestamp = store_timestamp
        self._store_host = store_host
        self.reconsume_times = reconsume_times
        self.prepared_transaction_offset = prepared_transaction_offset
        self._properties = properties
        self._props_text = ""
        self.body_crc = body_crc
        self._offset_msg_id = offset_msg_id
        self._hosts = _NO_HOSTS

    # lazy parts (hot path: bench/produce_consume.py pull) --------------------------------------
    @property
    def properties(self) -> dict[str, str]:
        props = self._properties
        if props is None:
            props = self._properties = decode_properties(self._props_text)
            self._props_text = ""
        return props

    @properties.setter
    def properties(self, value: dict[str, str]) -> None:
        self._properties = value
        self._props_text = ""

    @property
    def born_host(self) -> str:
        host = self._born_host
        if host is None:
            born, port = self._hosts[0], self._hosts[1]
            host = self._born_host = format_host(born, port)
        return host

    @born_host.setter
    def born_host(self, value: str) -> None:
        self._born_host = value

    @property
    def store_host(self) -> str:
        host = self._store_host
        if host is None:
            store, port = self._hosts[2], self._hosts[3]
            host = self._store_host = format_host(store, port)
        return host

    @store_host.setter
    def store_host(self, value: str) -> None:
        self._store_host = value

    @property
    def offset_msg_id(self) -> str:
        mid = self._offset_msg_id
        if mid is None:
            mid = self._offset_msg_id = encode_offset_msg_id(
                self._hosts[2], self._hosts[3], self.commit_log_offset)
        return mid

    @offset_msg_id.setter
    def offset_msg_id(self, value: str) -> None:
        self._offset_msg_id = value

    # dataclass-like behaviour -------------------------------------------------------------------
    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in _EXT_FIELDS)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in _EXT_FIELDS)
        return f"{self.__class__.__qualname__}({inner})"

    def __getstate__(self) -> tuple[object, ...]:
        return self._values()

    def __setstate__(self, state: tuple[object, ...]) -> None:
        self.__init__(*state)  # type: ignore[misc]

    @property
    def tags(self) -> str | None:
        return self.properties.get(Prop.TAGS)

    @property
    def keys(self) -> list[str]:
        k = self.properties.get(Prop.KEYS)
        return k.split() if k else []

    @property
    def msg_id(self) -> str:
        """The client-visible id: UNIQ_KEY when the producer set one, else the offset id."""
        return self.properties.get(Prop.UNIQ_KEY) or self.offset_msg_id


def _lazy_ext(topic: str, body: bytes, queue_id: int, queue_offset: int, phys: int, size: int,
              flag: int, sys_flag: int, born_ts: int, store_ts: int, reconsume: int,
              prepared: int, props_text: str, crc: int, hosts: tuple[bytes, int, bytes, int]) -> MessageExt:
    """A MessageExt whose properties, hosts and offset id are computed on first access."""
    m = _new_ext(MessageExt)
    m.topic = topic
    m.body = body
    m.queue_id = queue_id
    m.queue_offset = queue_offset
    m.commit_log_offset = phys
    m.store_size = size
    m.flag = flag
    m.sys_flag = sys_flag
    m.born_timestamp = born_ts
    m.store_timestamp = store_ts
    m.reconsume_times = reconsume
    m.prepared_transaction_offset = prepared
    m.body_crc = crc
    m._properties = None
    m._props_text = props_text
    m._born_host = m._store_host = m._offset_msg_id = None
    m._hosts = hosts
    return m


_new_ext = object.__new__
_NO_HOSTS = (b"", 0, b"", 0)  # an eager MessageExt's ``_hosts``: its hosts and offset id are set


# ---------------------------------------------------------------------------------------------
# stored records

# The layout, field by field (RocketMQ's CommitLog names), big-endian. Every reader and writer of
# stored records (this module, the store's writer, spark/arrow.py, the CommitLog's checks) uses
# these definitions. The hosts are 4 bytes (IPv4) or 16 (IPv6: SysFlag.BORNHOST_V6 and
# STOREHOST_V6), so the fields after a host move with it; ``record_fixed`` gives each variant.
_HEAD_FORMAT = (
    ">i"  # TOTALSIZE: the whole record, this field included
    "I"  # MAGICCODE: MESSAGE_MAGIC (BLANK_MAGIC starts a segment's end filler instead)
    "i"  # BODYCRC: zlib.crc32(body) & 0x7FFFFFFF
    "i"  # QUEUEID
    "i"  # FLAG: the producer's flag
    "q"  # QUEUEOFFSET: position in the consume queue (a ConsumeQueue unit index)
    "q"  # PHYSICALOFFSET: the record's own position in the CommitLog
    "i"  # SYSFLAG: SysFlag bits (compression, transaction state, IPv6 hosts)
    "q"  # BORNTIMESTAMP: ms, set by the producer
)
_HOST_V4, _HOST_V6 = "4s", "16s"  # BORNHOST / STOREHOST: the address bytes
_BORN_TAIL_FORMAT = (
    "i"  # BORNPORT
    "q"  # STORETIMESTAMP: ms, set by the broker
)
_STORE_TAIL_FORMAT = (
    "i"  # STOREPORT
    "i"  # RECONSUMETIMES
    "q"  # PREPAREDTRANSACTIONOFFSET
    "i"  # BODYLENGTH, followed by BODY, TOPICLENGTH (i8) + TOPIC, PROPERTIESLENGTH (i16) + PROPERTIES
)
RECORD_HEAD = struct.Struct(_HEAD_FORMAT)  # through BORNTIMESTAMP (48 bytes), the same in every variant
_BORN_TAIL = struct.Struct(">" + _BORN_TAIL_FORMAT)
_STORE_TAIL = struct.Struct(">" + _STORE_TAIL_FORMAT)
_FIXED = {
    (born_v6, store_v6): struct.Struct(
        _HEAD_FORMAT + (_HOST_V6 if born_v6 else _HOST_V4) + _BORN_TAIL_FORMAT
        + (_HOST_V6 if store_v6 else _HOST_V4) + _STORE_TAIL_FORMAT)
    for born_v6 in (False, True) for store_v6 in (False, True)
}
# The fixed part with IPv4 hosts, TOTALSIZE through BODYLENGTH (88 bytes): one unpack_from per
# record on the decoding hot paths (bench/produce_consume.py pull, bench/spark_read.py).
RECORD_FIXED_V4 = _FIXED[False, False]
_TEXT_LENGTHS = 1 + 2  # TOPICLENGTH (i8) + PROPERTIESLENGTH (i16)
MIN_RECORD_SIZE = RECORD_FIXED_V4.size + _TEXT_LENGTHS  # 91: IPv4 hosts, empty body, topic, properties
QUEUE_OFFSET_POS = struct.calcsize(">iIiii")  # 20
PHYSICAL_OFFSET_POS = QUEUE_OFFSET_POS + 8  # 28
SYS_FLAG_POS = PHYSICAL_OFFSET_POS + 8  # 36
STORE_TIMESTAMP_POS = RECORD_HEAD.size + 4 + 4  # 56 with an IPv4 born host, 12 more with IPv6


def record_fixed(born_v6: bool, store_v6: bool) -> struct.Struct:
    """The fixed part, TOTALSIZE through BODYLENGTH, for the given host address families."""
    return _FIXED[born_v6, store_v6]


def record_size(body_len: int, topic_len: int, props_len: int, v6_hosts: int = 0) -> int:
    return MIN_RECORD_SIZE + body_len + topic_len + props_len + 12 * v6_hosts


def encode_record(
    *,
    topic: bytes,
    body: bytes | memoryview,
    properties: bytes,
    queue_id: int,
    flag: int,
    queue_offset: int,
    physical_offset: int,
    sys_flag: int,
    born_timestamp: int,
    born_host: bytes,
    born_port: int,
    store_timestamp: int,
    store_host: bytes,
    store_port: int,
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
    crc: int | None = None,
) -> bytes:
    """Encode one stored record. ``born_host``/``store_host`` are 4 (IPv4) or 16 (IPv6) bytes."""
    if len(topic) > MAX_TOPIC_LENGTH:
        raise CodecError(f"topic is {len(topic)} bytes, at most {MAX_TOPIC_LENGTH} allowed")
    if len(properties) > MAX_PROPERTIES_LENGTH:
        raise CodecError(f"properties are {len(properties)} bytes, at most {MAX_PROPERTIES_LENGTH}")
    sys_flag &= ~(SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6)
    if len(born_host) == 16:
        sys_flag |= SysFlag.BORNHOST_V6
    if len(store_host) == 16:
        sys_flag |= SysFlag.STOREHOST_V6
    v6 = (len(born_host) == 16) + (len(store_host) == 16)
    total = record_size(len(body), len(topic), len(properties), v6)
    if crc is None:
        crc = body_crc(body)
    parts = [
        record_fixed(len(born_host) == 16, len(store_host) == 16).pack(
            total, MESSAGE_MAGIC, crc, queue_id, flag, queue_offset, physical_offset, sys_flag,
            born_timestamp, born_host, born_port, store_timestamp, store_host, store_port,
            reconsume_times, prepared_transaction_offset, len(body),
        ),
        body,
        struct.pack(">b", len(topic)),
        topic,
        struct.pack(">h", len(properties)),
        properties,
    ]
    return b"".join(parts)


@dataclass(slots=True, frozen=True)
class RecordHeader:
    """The parts of a stored record the store needs without decoding the body."""

    total_size: int
    magic: int
    body_crc: int
    queue_id: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    store_timestamp: int
    body_start: int  # relative to the record start
    body_length: int
    topic: str
    properties: str


def _need(buf: memoryview | bytes, pos: int, n: int, end: int) -> None:
    if n < 0 or pos + n > end:
        raise CodecError(f"record truncated at byte {pos}: need {n} more bytes")


_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")


def _read_text(
    mv: memoryview, p: int, length: struct.Struct, end: int, not_utf8: str, start: int
) -> tuple[str, int]:
    """Read a UTF-8 string prefixed by its ``length`` at ``p``; return it and the position after it.
    ``not_utf8`` is the error text, formatted with ``start`` (the enclosing element's offset)."""
    _need(mv, p, length.size, end)
    (n,) = length.unpack_from(mv, p)
    p += length.size
    _need(mv, p, n, end)
    try:
        return bytes(mv[p : p + n]).decode("utf-8"), p + n
    except UnicodeDecodeError:
        raise CodecError(not_utf8.format(start)) from None


def decode_record_header(buf: bytes | memoryview, pos: int = 0, end: int | None = None) -> RecordHeader:
    """Decode a record's framing, topic and properties (not the body) at ``pos``."""
    mv = memoryview(buf)
    if end is None:
        end = len(mv)
    _need(mv, pos, 8, end)
    total, magic = struct.unpack_from(">iI", mv, pos)
    if magic != MESSAGE_MAGIC:
        raise CodecError(f"bad magic code 0x{magic:08X} at byte {pos}")
    if total < MIN_RECORD_SIZE or pos + total > end:
        raise CodecError(f"record at byte {pos} claims {total} bytes, {end - pos} available")
    rend = pos + total
    (_total, _magic, crc, queue_id, _flag, queue_offset, physical_offset, sys_flag,
     _born_ts) = RECORD_HEAD.unpack_from(mv, pos)
    p = pos + RECORD_HEAD.size + (16 if sys_flag & SysFlag.BORNHOST_V6 else 4)
    _need(mv, p, _BORN_TAIL.size, rend)
    (_born_port, store_ts) = _BORN_TAIL.unpack_from(mv, p)
    p += _BORN_TAIL.size + (16 if sys_flag & SysFlag.STOREHOST_V6 else 4)
    _need(mv, p, _STORE_TAIL.size, rend)
    (_store_port, _reconsume, _prepared, body_len) = _STORE_TAIL.unpack_from(mv, p)
    p += _STORE_TAIL.size
    _need(mv, p, body_len, rend)
    body_start = p
    p += body_len
    topic, p = _read_text(mv, p, _I8, rend, "topic of record at byte {} is not UTF-8", pos)
    props, p = _read_text(mv, p, _I16, rend, "properties of record at byte {} are not UTF-8", pos)
    if p != rend:
        raise CodecError(f"record at byte {pos} has {rend - p} bytes past its properties")
    return RecordHeader(
        total, magic, crc, queue_id, queue_offset, physical_offset, sys_flag, store_ts,
        body_start - pos, body_len, topic, props,
    )


def decode_record(buf: bytes | memoryview, pos: int = 0, end: int | None = None) -> MessageExt:
    mv = memoryview(buf)
    if end is None:
        end = len(mv)
    h = decode_record_header(mv, pos, end)
    (_t, _m, crc, queue_id, flag, queue_offset, phys, sys_flag, born_ts) = RECORD_HEAD.unpack_from(mv, pos)
    fixed = record_fixed(bool(sys_flag & SysFlag.BORNHOST_V6), bool(sys_flag & SysFlag.STOREHOST_V6))
    (*_, born, born_port, store_ts, store, store_port, reconsume, prepared, _blen) = fixed.unpack_from(mv, pos)
    body = bytes(mv[pos + h.body_start : pos + h.body_start + h.body_length])
    return _lazy_ext(h.topic, body, queue_id, queue_offset, phys, h.total_size, flag, sys_flag,
                     born_ts, store_ts, reconsume, prepared, h.properties, crc,
                     (born, born_port, store, store_port))


_V6_HOSTS = int(SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6)
_COMPRESSED = int(SysFlag.COMPRESSED)


def _decode_records_py(buf: bytes | memoryview, decompress: bool = True,
                       extra_properties: dict[str, str] | None = None) -> list[MessageExt]:
    """Decode a pull-response body: records back to back. With ``decompress``, compressed bodies
    are inflated while ``sys_flag`` stays as stored (COMPRESSED still set, as RocketMQ's
    MessageDecoder keeps it), so the flag no longer tells whether ``body`` is compressed: code
    that stores or sends such a body again computes its own flag (tidemq.client.send does); the
    broker re-stores records decoded by :func:`decode_record`, which never inflates.
    ``extra_properties`` are added to every message (a pull's MIN_OFFSET/MAX_OFFSET), still
    without parsing the stored properties.

    Hot path (bench/produce_consume.py pull, bench/client_decode.py): a well-formed record with
    IPv4 hosts is decoded with one unpack_from and a few slices into a lazy MessageExt; anything
    else (IPv6 hosts, or a record that fails a check) goes through :func:`decode_record`, which
    raises the error. ``decode_records`` is this function or its compiled twin (end of module).
    """
    data = buf if buf.__class__ is bytes else bytes(buf)
    end = len(data)
    out: list[MessageExt] = []
    append = out.append
    unpack = RECORD_FIXED_V4.unpack_from
    fixed_size = RECORD_FIXED_V4.size
    topics: dict[bytes, str] = {}
    extra = "".join(f"{PROPERTY_SEP}{k}{NAME_VALUE_SEP}{v}" for k, v in extra_properties.items()) \
        if extra_properties else ""
    pos = 0
    while pos < end:
        msg = None
        if end - pos >= MIN_RECORD_SIZE:
            (total, magic, crc, queue_id, flag, queue_offset, phys, sys_flag, born_ts, born,
             born_port, store_ts, store, store_port, reconsume, prepared, blen) = unpack(data, pos)
            rend = pos + total
            b = pos + fixed_size
            e = b + blen
            if (magic == MESSAGE_MAGIC and total >= MIN_RECORD_SIZE and rend <= end
                    and not sys_flag & _V6_HOSTS and blen >= 0 and e + 3 <= rend):
                tlen = data[e]
                t1 = e + 1 + tlen
                if tlen < 128 and t1 + 2 <= rend:
                    plen = (data[t1] << 8) | data[t1 + 1]
                    if plen < 0x8000 and t1 + 2 + plen == rend:
                        traw = data[e + 1 : t1]
                        topic = topics.get(traw)
                        try:
                            if topic is None:
                                topic = topics[traw] = traw.decode("utf-8")
                            props = data[t1 + 2 : rend].decode("utf-8") + extra
                        except UnicodeDecodeError:
                            pass  # decode_record below words the error
                        else:
                            msg = _lazy_ext(topic, data[b:e], queue_id, queue_offset, phys, total,
                                            flag, sys_flag, born_ts, store_ts, reconsume, prepared,
                                            props, crc, (born, born_port, store, store_port))
        if msg is None:
            msg = decode_record(data, pos)
            if extra_properties:
                msg.properties.update(extra_properties)
        pos += msg.store_size
        if decompress and msg.sys_flag & _COMPRESSED:
            msg.body = inflate(msg.body)
        append(msg)
    return out


MAX_INFLATED = 10 * DEFAULT_MAX_BODY  # a compressed body inflating past this is a bomb, refused


def inflate(data: bytes, limit: int = MAX_INFLATED) -> bytes:
    """zlib-inflate with a bound on the output size: CodecError past ``limit`` bytes (never more
    than ``limit`` bytes of output are made)."""
    d = zlib.decompressobj()
    try:
        out = d.decompress(data, limit)
    except zlib.error as exc:
        raise CodecError(f"compressed body is not valid zlib data: {exc}") from None
    if d.unconsumed_tail:
        raise CodecError(f"compressed body inflates beyond {limit} bytes")
    return out


# ---------------------------------------------------------------------------------------------
# batch bodies

_BATCH_HEAD = struct.Struct(">iiiii")  # totalSize, magic, bodyCRC, flag, bodyLength
_BATCH_TOTAL = struct.Struct(">i")  # totalSize alone, for counting elements
_MIN_BATCH_ELEMENT = _BATCH_HEAD.size + 2  # empty body, empty properties

# Most messages one batch may hold. RocketMQ (apache/rocketmq 5.x) has no count setting: a batch is
# bounded by maxMessageSize (4 MiB; the client's Validators and the broker's
# MessageExtEncoder.encode(MessageExtBatch) check the whole batch body), which lets ~56,000 messages
# of a 1-byte body through (each carries WAIT and UNIQ_KEY). But its store counts a batch's messages
# in a Java short: CommitLog.asyncPutMessages advances the queue offset by
# ``(short) putMessageContext.getBatchSize()`` (MessageStore.increaseOffset(msg, short)), and an
# inner batch's count (PROPERTY_INNER_NUM) is read with Short.parseShort. So no RocketMQ 5 broker
# stores more than 32,767 messages of one batch correctly, and we refuse more. RocketMQ's own
# example (SplitBatchProducer, 1,000,000-byte parts) sends ~13,000 messages per batch: a much lower
# cap would refuse what RocketMQ users are shown to do. Java clients never compress a batch
# (DefaultMQProducerImpl.tryToCompressMessage skips MessageBatch); the C++ client 1.2.3 does, which
# is how a 56 KB body carried 65,536 messages. Storing 32,767 small messages still holds the broker's
# event loop for ~0.3 s (2-core VM): a broker may pass a lower ``max_messages``.
MAX_BATCH_MESSAGES = 32_767


@dataclass(slots=True, frozen=True)
class BatchItem:
    flag: int
    body: bytes
    properties: str


def _encode_batch_py(items: list[tuple[int, bytes, str]]) -> bytes:
    """Encode (flag, body, properties string) elements as a SEND_BATCH_MESSAGE body.
    ``encode_batch`` is this function or its compiled twin (end of module)."""
    parts: list[bytes] = []
    append = parts.append
    head = _BATCH_HEAD.pack
    i16 = _I16.pack
    for flag, body, props in items:  # hot path: bench/produce_consume.py batch
        pb = props.encode("utf-8")
        if len(pb) > MAX_PROPERTIES_LENGTH:
            raise CodecError(f"properties are {len(pb)} bytes, at most {MAX_PROPERTIES_LENGTH}")
        append(head(22 + len(body) + len(pb), 0, 0, flag, len(body)))
        append(body)
        append(i16(len(pb)) + pb)
    return b"".join(parts)


def count_batch(data: bytes | memoryview, limit: int) -> int:
    """How many elements a batch body holds by their size fields, counting no further than
    ``limit + 1``; stops early at a size field that cannot be right (decode_batch reports it)."""
    total_at = _BATCH_TOTAL.unpack_from
    end = len(data)
    pos = n = 0
    while pos + 4 <= end and n <= limit:
        (total,) = total_at(data, pos)
        if total < _MIN_BATCH_ELEMENT:
            break
        n += 1
        pos += total
    return n


def decode_batch(buf: bytes | memoryview, max_messages: int = MAX_BATCH_MESSAGES) -> list[BatchItem]:
    """The elements of a SEND_BATCH_MESSAGE body; CodecError for a malformed body or one holding
    more than ``max_messages`` messages (refused before any element is built)."""
    # Hot path (bench/produce_consume.py batch): checks inline, slices of one bytes object.
    data = buf if buf.__class__ is bytes else bytes(buf)
    end = len(data)
    # Every element takes at least _MIN_BATCH_ELEMENT bytes, so only a longer body can hold too
    # many; that one is counted by its size fields first (about 0.15 us per element).
    if end > max_messages * _MIN_BATCH_ELEMENT and count_batch(data, max_messages) > max_messages:
        raise CodecError(f"batch holds more than {max_messages} messages, the most a broker stores in one "
                         "batch (RocketMQ counts them in a Java short); send it in smaller batches")
    pos = 0
    items: list[BatchItem] = []
    append = items.append
    head = _BATCH_HEAD.unpack_from
    while pos < end:
        if pos + 20 > end:
            raise CodecError(f"record truncated at byte {pos}: need 20 more bytes")
        total, _magic, _crc, flag, body_len = head(data, pos)
        if total < _MIN_BATCH_ELEMENT or pos + total > end:
            raise CodecError(f"batch element at byte {pos} claims {total} bytes")
        rend = pos + total
        p = pos + 20
        if body_len < 0 or p + body_len > rend:
            raise CodecError(f"record truncated at byte {p}: need {body_len} more bytes")
        body = data[p : p + body_len]
        p += body_len
        if p + 2 > rend:
            raise CodecError(f"record truncated at byte {p}: need 2 more bytes")
        (n,) = _I16.unpack_from(data, p)
        p += 2
        if n < 0 or p + n > rend:
            raise CodecError(f"record truncated at byte {p}: need {n} more bytes")
        try:
            props = data[p : p + n].decode("utf-8")
        except UnicodeDecodeError:
            raise CodecError(f"properties of batch element at byte {pos} are not UTF-8") from None
        p += n
        if p != rend:
            raise CodecError(f"batch element at byte {pos} has {rend - p} stray bytes")
        append(BatchItem(flag, body, props))
        pos = rend
    if not items:
        raise CodecError("batch is empty")
    return items


def local_ip_bytes() -> bytes:
    """Best-effort IPv4 of this host for unique ids (no network traffic)."""
    try:
        return socket.inet_aton(socket.gethostbyname(socket.gethostname()))
    except OSError:
        return b"\x7f\x00\x00\x01"


# ---------------------------------------------------------------------------------------------
# compiled twins (tidemq/_message_c.pyx, issue 19): the Python functions above stay the reference
# and the fallback (tests/test_message_compiled.py proves them equal); these names are whichever runs

decode_records = _decode_records_py
encode_batch = _encode_batch_py
encode_properties = _encode_properties_py
decode_properties = _decode_properties_py
_c = compiled.load("tidemq._message_c")
if _c is not None:
    decode_records = _c.decode_records
    encode_batch = _c.encode_batch
    encode_properties = _c.encode_properties
    decode_properties = _c.decode_properties
