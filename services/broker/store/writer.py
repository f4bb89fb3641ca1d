"""Turning put requests into stored records (the store's write hot path).

``prepare`` validates a request and computes everything that does not depend on where the record
lands (sizes, CRC, encoded topic/properties/hosts); ``encode_into`` then writes the record straight
into the mapped CommitLog segment with one ``pack_into`` for the fixed part and two slice
assignments (body, topic + properties); ``encode_run`` writes a whole batch that way (compiled:
``_writer_c.pyx``, its twin ``encode_run_py``), into the mapping or into the buffer the store then
writes with one pwrite. Records use the RocketMQ 4.x V1 layout as
tidemq.message defines it (``RECORD_FIXED_V4``, ``record_fixed``); nothing here restates it (the
compiled twin writes the same fields by hand: tests/broker/store/test_compiled_twins.py proves
the bytes equal).

Invariant: ``prepare`` never touches the CommitLog, so a batch can be validated completely before
anything is written (all-or-nothing).
"""

from __future__ import annotations

import logging
import mmap
import re
import struct
from collections.abc import Callable, Sequence
from functools import partial

from tidemq import compiled

from tidemq.message import (
    MAX_PROPERTIES_LENGTH,
    MAX_TOPIC_LENGTH,
    MESSAGE_MAGIC,
    RECORD_FIXED_V4,
    TRANSACTION_MASK,
    Prop,
    SysFlag,
    encode_properties,
    pack_host,
    record_fixed,
    tags_code,
)

from tidemq.broker.store.checksum import crc32 as body_crc32  # BODYCRC: ISA-L's when installed
from tidemq.broker.store.results import PutRequest, PutResult, PutStatus


log = logging.getLogger(__name__)

# The fixed part and the TOPICLENGTH byte (in a topic tail) and PROPERTIESLENGTH (i16), with
# IPv4 hosts: a record's size is this plus its body, topic, properties and 12 bytes per IPv6 host.
_SIZE_BUT_TEXTS = RECORD_FIXED_V4.size + 2
_FIXED_V4_SIZE = RECORD_FIXED_V4.size
_H = struct.Struct(">h")
_BORN_V6 = int(SysFlag.BORNHOST_V6)  # plain ints: IntFlag arithmetic is slow on the hot path
_STORE_V6 = int(SysFlag.STOREHOST_V6)
_HOST_V6_FLAGS = _BORN_V6 | _STORE_V6
_HALF_FLAGS = (int(SysFlag.TRANSACTION_PREPARED), int(SysFlag.TRANSACTION_ROLLBACK))
# Topic names become directory names: refuse anything that could escape consumequeue/.
_UNSAFE_TOPIC = re.compile(r"[/\\\x00]|^\.\.?$")
_CACHE_LIMIT = 4096
# Where records are encoded: a mapped segment, or the store's buffer for a pwrite (MessageStore._write).
Target = mmap.mmap | bytearray


def illegal(status: PutStatus, remark: str) -> PutResult:
    return PutResult(status, remark=remark)


class Pending:
    """A validated request, ready to be written."""

    __slots__ = ("req", "total", "topic_tail", "props", "crc", "born", "born_port", "store",
                 "store_port", "sys_flag", "tags_code", "keys", "uniq")
    req: PutRequest
    total: int  # the record's size (TOTALSIZE)
    topic_tail: bytes  # TOPICLENGTH byte + topic
    props: bytes
    crc: int
    born: bytes
    born_port: int
    store: bytes
    store_port: int
    sys_flag: int
    tags_code: int
    keys: str | None
    uniq: str | None

    def __init__(self, req: PutRequest) -> None:
        self.req = req


class RecordEncoder:
    def __init__(self, max_message_size: int) -> None:
        self.max_message_size = max_message_size
        self._topics: dict[str, bytes] = {}  # topic -> topic length byte + utf-8 topic
        self._hosts: dict[str, bytes] = {}
        self._tags: dict[str, int] = {}

    # Hot path (bench/produce_consume.py)
    def prepare(self, req: PutRequest) -> Pending | PutResult:
        common = self._common(req)
        if type(common) is PutResult:
            return common
        return self._prepare(req, *common)

    def _common(self, req: PutRequest) -> tuple[bytes, bytes, bytes, int, int] | PutResult:
        """What a request shares with the rest of its batch: (topic tail, born host, store host,
        sys flag host bits, extra header bytes for IPv6 hosts)."""
        topic_tail = self._topics.get(req.topic)
        if topic_tail is None:
            topic_tail = self._topic_tail(req.topic)
            if topic_tail is None:
                return illegal(PutStatus.MESSAGE_ILLEGAL,
                               f"topic {req.topic!r} is empty, longer than {MAX_TOPIC_LENGTH} bytes "
                               f"or contains '/', '\\\\' or NUL")
        bh = req.born_host[0]
        sh = req.store_host[0]
        try:
            born = self._hosts.get(bh) or self._host(bh)
            store = self._hosts.get(sh) or self._host(sh)
        except ValueError as exc:  # not an IP literal (pack_host): nothing true to store
            return illegal(PutStatus.MESSAGE_ILLEGAL, str(exc))
        host_flags = extra = 0
        if len(born) == 16:
            host_flags |= _BORN_V6
            extra += 12
        if len(store) == 16:
            host_flags |= _STORE_V6
            extra += 12
        return topic_tail, born, store, host_flags, extra

    def _prepare_py(self, req: PutRequest, topic_tail: bytes, born: bytes, store: bytes, host_flags: int,
                    extra: int) -> Pending | PutResult:
        """A request as a Pending record (or why not), its batch's common part given. The
        reference; ``_prepare`` is ``_writer_c.prepare`` when that is built (same results,
        test_compiled_twins.py), which hands anything unusual back to this method."""
        body = req.body
        if len(body) > self.max_message_size:
            return illegal(PutStatus.MESSAGE_ILLEGAL,
                           f"message body is {len(body)} bytes, the broker accepts at most "
                           f"{self.max_message_size}")
        props_dict = req.properties
        props = encode_properties(props_dict).encode("utf-8") if props_dict else b""
        if len(props) > MAX_PROPERTIES_LENGTH:
            return illegal(PutStatus.PROPERTIES_SIZE_EXCEEDED,
                           f"message properties are {len(props)} bytes, at most "
                           f"{MAX_PROPERTIES_LENGTH} allowed")
        p = Pending(req)
        p.topic_tail = topic_tail
        p.props = props
        p.born = born
        p.born_port = req.born_host[1]
        p.store = store
        p.store_port = req.store_host[1]
        p.sys_flag = (req.sys_flag & ~_HOST_V6_FLAGS) | host_flags
        # topic_tail holds TOPICLENGTH's byte, so it is not in _SIZE_BUT_TEXTS
        p.total = _SIZE_BUT_TEXTS + len(body) + len(topic_tail) + len(props) + extra
        p.crc = body_crc32(body) & 0x7FFFFFFF
        if req.tags_code is not None:
            p.tags_code = req.tags_code
        else:
            tags = props_dict.get(Prop.TAGS)
            if tags:
                code = self._tags.get(tags)
                if code is None:
                    code = tags_code(tags)
                    if len(self._tags) >= _CACHE_LIMIT:
                        self._tags.clear()
                    self._tags[tags] = code
                p.tags_code = code
            else:
                p.tags_code = 0
        p.keys = props_dict.get(Prop.KEYS)
        p.uniq = props_dict.get("UNIQ_KEY")
        return p

    _prepare = _prepare_py  # the compiled twin replaces it below when built

    def prepare_batch(self, reqs: list[PutRequest]) -> tuple[list[Pending], int] | PutResult:
        """Validate a whole batch (one topic and queue, no half messages) before any write."""
        if not reqs:
            return illegal(PutStatus.MESSAGE_ILLEGAL, "the batch is empty")
        first = reqs[0]
        common = self._common(first)
        if type(common) is PutResult:
            return common
        topic, queue_id, born_host, store_host = first.topic, first.queue_id, first.born_host, first.store_host
        prepare = self._prepare
        pending: list[Pending] = []
        append = pending.append
        total = 0
        # Hot path (bench/produce_consume.py batch): the topic and hosts are looked up once.
        for r in reqs:
            if r.topic != topic or r.queue_id != queue_id:
                return illegal(PutStatus.MESSAGE_ILLEGAL,
                               "all messages of a batch must go to the same topic and queue")
            if r.sys_flag & TRANSACTION_MASK in _HALF_FLAGS:
                return illegal(PutStatus.MESSAGE_ILLEGAL, "a batch cannot hold transactional half messages")
            if r.born_host is born_host and r.store_host is store_host:
                p = prepare(r, *common)
            else:
                p = self.prepare(r)
            if type(p) is PutResult:
                p.remark = f"message {len(pending)} of the batch: {p.remark}"
                return p
            append(p)
            total += p.total
        return pending, total

    def _topic_tail(self, topic: str) -> bytes | None:
        raw = topic.encode("utf-8")
        if not raw or len(raw) > MAX_TOPIC_LENGTH or _UNSAFE_TOPIC.search(topic):
            return None
        if len(self._topics) >= _CACHE_LIMIT:
            self._topics.clear()
        tail = bytes((len(raw),)) + raw
        self._topics[topic] = tail
        return tail

    def _host(self, host: str) -> bytes:
        addr, _v6 = pack_host(host, 0)
        if len(self._hosts) >= _CACHE_LIMIT:
            self._hosts.clear()
        self._hosts[host] = addr
        return addr


# Hot path (bench/produce_consume.py, bench/hot_path.py)
def encode_into(mm: Target, pos: int, p: Pending, queue_offset: int, phys: int, store_ts: int) -> None:
    """Write prepared record ``p`` at ``pos`` of a mapped CommitLog segment, or of the buffer a run
    is encoded into before one pwrite (CommitLog offset ``phys``)."""
    req = p.req
    body = req.body
    if len(p.born) == 4 and len(p.store) == 4:
        fixed = RECORD_FIXED_V4
        b = pos + _FIXED_V4_SIZE
    else:
        fixed = record_fixed(len(p.born) == 16, len(p.store) == 16)
        b = pos + fixed.size
    fixed.pack_into(
        mm, pos, p.total, MESSAGE_MAGIC, p.crc, req.queue_id, req.flag, queue_offset, phys,
        p.sys_flag, req.born_timestamp, p.born, p.born_port, store_ts, p.store, p.store_port,
        req.reconsume_times, req.prepared_transaction_offset, len(body),
    )
    e = b + len(body)
    mm[b:e] = body
    tail = p.topic_tail + _H.pack(len(p.props)) + p.props
    mm[e : e + len(tail)] = tail


def encode_run_py(mm: Target, pos: int, pending: Sequence[Pending], q: int, step: int, phys: int,
                  store_ts: int) -> int:
    """Write ``pending`` back to back from ``pos`` of a mapped segment (CommitLog offset ``phys``),
    at queue offsets ``q``, ``q + step``, ... (step 0: records that enter no consume queue);
    returns the position after them. A header value out of range raises struct.error (or
    OverflowError, TypeError, ValueError) with the records before it written.
    ``_writer_c.encode_run`` is its compiled twin."""
    for p in pending:
        encode_into(mm, pos, p, q, phys, store_ts)
        pos += p.total
        phys += p.total
        q += step
    return pos


_c = compiled.load("tidemq.broker.store._writer_c")
encode_run: Callable[[Target, int, Sequence[Pending], int, int, int, int], int] = (
    partial(_c.encode_run, encode_into) if _c is not None else encode_run_py)
if _c is not None:
    RecordEncoder._prepare = _c.prepare
