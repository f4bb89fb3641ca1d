"""Checking and summarising a stretch of stored records in one pass (a follower's replicated frame).

``scan_records(data, base, check_crc)`` walks records laid back to back in ``data`` (which a
CommitLog holds from offset ``base`` on), checks each as recovery does (magic code, size within
the stretch, header lengths within the record, UTF-8 topic and properties, its own PHYSICALOFFSET,
and with ``check_crc`` its BODYCRC) and returns them as dispatch runs: consecutive records of one
topic, queue, transactional state and store time at consecutive queue offsets, each record
summarised as the dispatcher reads it (size, tags code of its TAGS, KEYS, UNIQ_KEY). A record
that fails raises StoreCorruptError naming its CommitLog offset and why; nothing is returned.

This module is the reference; ``_scan_c.pyx`` is its compiled twin (the same results and errors,
byte for byte: tests/broker/store/test_scan.py), picked at import through tidemq.compiled.
Pure: bytes in, values out.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from tidemq import compiled
from tidemq.errors import StoreCorruptError
from tidemq.message import (
    MESSAGE_MAGIC,
    MIN_RECORD_SIZE,
    RECORD_HEAD,
    TRANSACTION_MASK,
    Prop,
    SysFlag,
    decode_properties,
    tags_code,
)

from tidemq.broker.store.checksum import crc32
from tidemq.broker.store.dispatch import Replayed, Run

__all__ = ["Run", "scan_records", "scan_records_py"]

_HEAD = struct.Struct(">iI")  # TOTALSIZE, MAGICCODE
_BORN_V6 = int(SysFlag.BORNHOST_V6)
_STORE_V6 = int(SysFlag.STOREHOST_V6)
# Past RECORD_HEAD: BORNHOST, BORNPORT (i32), STORETIMESTAMP (i64), STOREHOST, STOREPORT (i32),
# RECONSUMETIMES (i32), PREPAREDTRANSACTIONOFFSET (i64), BODYLENGTH (i32) (tidemq.message's layout)
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")


def _refused(phys: int, why: str) -> StoreCorruptError:
    return StoreCorruptError(f"record at commitlog offset {phys} is refused: {why}")


def scan_records_py(data: bytes | memoryview, base: int, check_crc: bool) -> list[Run]:
    """The records of ``data`` (CommitLog offset ``base`` on) as dispatch runs; see the module."""
    mv = memoryview(data)
    end = len(data)
    runs: list[Run] = []
    cur: Run | None = None
    p = 0
    while p < end:
        phys = base + p
        left = end - p
        if left < MIN_RECORD_SIZE:
            raise _refused(phys, f"only {left} bytes are left, less than a record")
        total, magic = _HEAD.unpack_from(mv, p)
        if magic != MESSAGE_MAGIC:
            raise _refused(phys, f"bad magic code 0x{magic:08X}")
        if total < MIN_RECORD_SIZE or total > left:
            raise _refused(phys, f"its size {total} does not fit the {left} bytes left")
        (_t, _m, crc, queue_id, _flag, queue_offset, own, sys_flag, _born_ts) = RECORD_HEAD.unpack_from(mv, p)
        rend = p + total
        q = p + RECORD_HEAD.size + (16 if sys_flag & _BORN_V6 else 4) + 4  # past BORNHOST, BORNPORT
        (store_ts,) = _I64.unpack_from(mv, q)
        q += 8 + (16 if sys_flag & _STORE_V6 else 4) + 4 + 4 + 8  # to BODYLENGTH
        if q + 4 + 3 > rend:
            raise _refused(phys, f"its size {total} is too small for its hosts")
        (body_len,) = _I32.unpack_from(mv, q)
        q += 4
        if body_len < 0 or q + body_len + 3 > rend:
            raise _refused(phys, f"its body length {body_len} runs past the record")
        body_at = q
        q += body_len
        (topic_len,) = _I8.unpack_from(mv, q)
        q += 1
        if topic_len < 0 or q + topic_len + 2 > rend:
            raise _refused(phys, f"its topic length {topic_len} runs past the record")
        topic_at = q
        q += topic_len
        (props_len,) = _I16.unpack_from(mv, q)
        q += 2
        if props_len < 0 or q + props_len > rend:
            raise _refused(phys, f"its properties length {props_len} runs past the record")
        if q + props_len != rend:
            raise _refused(phys, f"it has {rend - q - props_len} bytes past its properties")
        try:
            topic = str(mv[topic_at : topic_at + topic_len], "utf-8")
        except UnicodeDecodeError:
            raise _refused(phys, "its topic is not UTF-8") from None
        try:
            props = decode_properties(str(mv[q : q + props_len], "utf-8"))
        except UnicodeDecodeError:
            raise _refused(phys, "its properties are not UTF-8") from None
        if own != phys:
            raise _refused(phys, f"it claims commitlog offset {own}")
        if check_crc:
            actual = crc32(mv[body_at : body_at + body_len]) & 0x7FFFFFFF
            if actual != crc:
                raise _refused(phys, f"body CRC {actual} does not match the stored {crc}")
        rec = Replayed(total, tags_code(props.get(Prop.TAGS)), props.get(Prop.KEYS), props.get(Prop.UNIQ_KEY))
        if (cur is not None and cur.topic == topic and cur.queue_id == queue_id
                and (cur.sys_flag & TRANSACTION_MASK) == (sys_flag & TRANSACTION_MASK)
                and cur.queue_offset + len(cur.records) == queue_offset and cur.store_timestamp == store_ts):
            cur.records.append(rec)
        else:
            cur = Run(topic, queue_id, sys_flag, queue_offset, phys, store_ts, [rec])
            runs.append(cur)
        p = rend
    return runs


_c = compiled.load("tidemq.broker.store._scan_c")
scan_records: Callable[[bytes | memoryview, int, bool], list[Run]] = _c.scan_records if _c is not None else scan_records_py
