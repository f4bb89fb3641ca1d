"""The store checkpoint: how far CommitLog, consume queues and index are known to be durable.

File ``checkpoint`` (4 KiB, written atomically): RocketMQ's three store timestamps first
(``i64 physicMsgTimestamp @0 | i64 logicsMsgTimestamp @8 | i64 indexMsgTimestamp @16``), then a
TideMQ extension: ``u32 magic 'TMCK' @24 | u32 version @28 | i64 physicOffset @32 |
i64 logicsOffset @40 | i64 indexOffset @48 | i64 indexFile @56 | i32 indexCount @64 |
u32 crc32(bytes 0..68) @68``.

Invariants: ``physic_offset`` <= the CommitLog bytes that were fdatasynced before the file was
written; every record below ``logics_offset`` has its consume-queue unit on disk and every
record below ``index_offset`` its index entries (in file ``index_file``, entries below
``index_count``). Offsets are record boundaries. -1 means unknown. A file whose magic or CRC is
wrong is treated as absent: recovery then rebuilds from the start of the CommitLog.
"""

from __future__ import annotations

import logging
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from tidemq.broker.store.jsonfile import write_bytes_atomic

log = logging.getLogger(__name__)

_LAYOUT = struct.Struct(">qqqIIqqqqi")
_CRC = struct.Struct(">I")
_MAGIC = 0x544D434B  # "TMCK"
_VERSION = 1
FILE_SIZE = 4096


@dataclass(frozen=True, slots=True)
class Checkpoint:
    physic_timestamp: int = 0
    logics_timestamp: int = 0
    index_timestamp: int = 0
    physic_offset: int = -1
    logics_offset: int = -1
    index_offset: int = -1
    index_file: int = -1
    index_count: int = 0


def encode_checkpoint(cp: Checkpoint) -> bytes:
    body = _LAYOUT.pack(
        cp.physic_timestamp, cp.logics_timestamp, cp.index_timestamp, _MAGIC, _VERSION,
        cp.physic_offset, cp.logics_offset, cp.index_offset, cp.index_file, cp.index_count,
    )
    return (body + _CRC.pack(zlib.crc32(body))).ljust(FILE_SIZE, b"\0")


def decode_checkpoint(data: bytes) -> Checkpoint | None:
    if len(data) < _LAYOUT.size + _CRC.size:
        return None
    body = data[: _LAYOUT.size]
    (crc,) = _CRC.unpack_from(data, _LAYOUT.size)
    if crc != zlib.crc32(body):
        return None
    pts, lts, its, magic, version, po, lo, io, ifile, icount = _LAYOUT.unpack(body)
    if magic != _MAGIC or version != _VERSION:
        return None
    return Checkpoint(pts, lts, its, po, lo, io, ifile, icount)


def read_checkpoint(path: Path) -> Checkpoint | None:
    """The checkpoint, or None when missing or damaged (logged). Blocking."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    cp = decode_checkpoint(data)
    if cp is None:
        log.warning("checkpoint %s is damaged; recovery will rebuild from the start of the commitlog", path)
    return cp


def write_checkpoint(path: Path, cp: Checkpoint) -> None:
    """Write atomically (temp file + fsync + rename + directory fsync). Blocking."""
    write_bytes_atomic(path, encode_checkpoint(cp))
