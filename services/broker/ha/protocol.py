"""The replication wire codec (issue 17): frames between a master and its followers on the HA port.

RocketMQ's HAService/HAConnection (4.x master/slave) speak almost nothing: the slave connects to
the master's HA port (by convention the broker's listen port + 1) and reports one 8-byte number,
its CommitLog max offset; the master answers with frames of (8-byte CommitLog offset, 4-byte
size, raw CommitLog bytes) from there, and the slave's repeated reports double as acks and
heartbeats. There is no handshake, no group and no epoch: a slave that holds bytes the master
never wrote (it was master once, or a failover lost a tail) keeps them and appends after them, so
two logs that diverged stay diverged. RocketMQ 5's controller mode added epochs and truncation to
a separate AutoSwitchHAConnection protocol for exactly that reason.

Ours keeps the port convention and the shape (offset + CommitLog bytes, acks by offset) and adds
what failover needs: a handshake naming the group (cluster, broker name) and the replica, the
epoch the follower knows (a master refuses a follower from a newer epoch, a follower refuses a
master from an older one: the epoch fences a stale master in the data path), and the master's
answer with the truncation point, where the follower cuts the tail it holds that the master does
not, before streaming starts. Every data frame repeats the epoch, carries whole records only
(never a record cut in two), so a dropped connection can never leave half a record behind, and a
CRC of them all (a record's own BODYCRC does not cover its header).

Frames: FRAME_HEAD (LENGTH of what follows KIND, then KIND), then the kind's fields. This module
is pure (bytes in, values out); the connection code is ha/replication.py. Invariants: a length
read from the wire is checked against MAX_FRAME_BODY before anything is allocated; decoding
anything that is not a frame raises ReplicationCodecError only.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from tidemq.errors import CodecError

from tidemq.broker.store.checksum import crc32

from .epochs import EpochStart, normalized

HA_PORT_OFFSET = 1  # RocketMQ's convention: the HA port is the broker's listen port + 1
PROTOCOL_MAGIC = 0x54484132  # "THA2": a TideMQ replication handshake, version 2 (WELCOME carries the history)
MAX_NAME = 255  # cluster and broker names (RocketMQ caps them far lower)
MAX_REASON = 4096
# A data frame holds whole records from one CommitLog segment; a record is at most a segment
# (1 GiB by default), but masters send at most their window per frame (256 KiB by default).
# Anything longer than this is refused before a buffer is made.
MAX_FRAME_BODY = 64 * 1024 * 1024

FRAME_HEAD = struct.Struct(
    ">i"  # LENGTH: bytes after KIND
    "B"  # KIND: a FrameKind
)
HANDSHAKE = struct.Struct(
    ">I"  # MAGIC: PROTOCOL_MAGIC
    "B"  # REPLICAID: the follower's replica id (0..4)
    "q"  # EPOCH: the epoch of the follower's last record (0: an empty log)
    "q"  # LOGEND: the follower's CommitLog end, followed by CLUSTER and BROKERNAME (u8 length + UTF-8)
)
WELCOME = struct.Struct(
    ">q"  # EPOCH: the master's epoch
    "q"  # TRUNCATEAT: where the follower cuts its CommitLog (-1: nothing to cut)
    "q"  # STREAMFROM: the CommitLog offset the first data frame starts at
    "H"  # EPOCHS: entries of the master's epoch history that follow, each EPOCH_START
)
EPOCH_START = struct.Struct(">qq")  # an epoch and the CommitLog offset it began at
MAX_EPOCHS = 4096  # a history longer than this is refused (an epoch per failover: years of them)
DATA = struct.Struct(
    ">q"  # EPOCH: the master's epoch (a follower refuses a lower one)
    "q"  # OFFSET: CommitLog offset of the first record
    "I"  # RECORDSCRC: CRC-32 (zlib's) of the records (a record's BODYCRC leaves its header uncovered)
    "q"  # HIGHWATER: the master's high-water mark (-1: none), followed by whole records back to back
)
ACK = struct.Struct(
    ">q"  # OFFSET: the follower's CommitLog end that is durable (flushed) on its disk
)
HEARTBEAT = struct.Struct(
    ">q"  # EPOCH: the master's epoch
    "q"  # LOGEND: the master's CommitLog end (the follower's lag is this minus its own end)
    "q"  # HIGHWATER: the master's high-water mark (-1: none): a follower serves reads below it
)
_NAME_LEN = struct.Struct(">B")
_REASON_LEN = struct.Struct(">H")
_RECORD_SIZE = struct.Struct(">i")  # TOTALSIZE, the first field of every record (tidemq.message)


class ReplicationCodecError(CodecError):
    """Bytes that are not a replication frame (the connection is closed: the peer is broken)."""


class FrameKind(IntEnum):
    HANDSHAKE = 1
    WELCOME = 2
    DATA = 3
    ACK = 4
    HEARTBEAT = 5
    REFUSAL = 6


@dataclass(frozen=True, slots=True)
class Handshake:
    """A follower's opening: who it is and how far its log goes."""

    cluster: str
    broker_name: str
    replica_id: int
    epoch: int
    log_end: int


@dataclass(frozen=True, slots=True)
class Welcome:
    """The master's answer: cut at ``truncate_at`` (-1: nothing), then expect ``stream_from``;
    ``history`` is the master's epoch history, oldest first."""

    epoch: int
    truncate_at: int
    stream_from: int
    history: tuple[EpochStart, ...] = ()


@dataclass(frozen=True, slots=True)
class Data:
    """Whole records, back to back, starting at CommitLog offset ``offset``."""

    epoch: int
    offset: int
    # bytes, or (decoded) a read-only view of the frame's own buffer: no copy of the records
    records: bytes | memoryview
    high_water: int = -1  # the master's, when sent: what a follower lets consumers read

    @property
    def end(self) -> int:
        return self.offset + len(self.records)


@dataclass(frozen=True, slots=True)
class Ack:
    offset: int


@dataclass(frozen=True, slots=True)
class Heartbeat:
    epoch: int
    log_end: int
    high_water: int = -1


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why the peer will not replicate with us (a sentence saying what to check)."""

    reason: str


Frame = Handshake | Welcome | Data | Ack | Heartbeat | Refusal


def default_ha_port(listen_port: int) -> int:
    return listen_port + HA_PORT_OFFSET


def _name(text: str, what: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) > MAX_NAME:
        raise ValueError(f"{what} {text[:40]!r}... is longer than {MAX_NAME} bytes; use a shorter name")
    return _NAME_LEN.pack(len(raw)) + raw


def _frame(kind: FrameKind, body: bytes) -> bytes:
    if len(body) > MAX_FRAME_BODY:
        raise ValueError(f"a {kind.name} frame of {len(body)} bytes exceeds {MAX_FRAME_BODY}; send less per frame")
    return FRAME_HEAD.pack(len(body), kind) + body


def data_head(frame: Data) -> bytes:
    """A data frame's bytes before its records (FRAME_HEAD and DATA's fields): a master writes
    these and the records as two buffers, without joining them (bench/compare.py row 3)."""
    n = DATA.size + len(frame.records)
    if n > MAX_FRAME_BODY:
        raise ValueError(f"a DATA frame of {n} bytes exceeds {MAX_FRAME_BODY}; send less per frame")
    return FRAME_HEAD.pack(n, FrameKind.DATA) + DATA.pack(frame.epoch, frame.offset, crc32(frame.records),
                                                          frame.high_water)


def encode(frame: Frame) -> bytes:
    """The frame's bytes, FRAME_HEAD included."""
    if isinstance(frame, Data):
        return data_head(frame) + frame.records
    if isinstance(frame, Ack):
        return _frame(FrameKind.ACK, ACK.pack(frame.offset))
    if isinstance(frame, Heartbeat):
        return _frame(FrameKind.HEARTBEAT, HEARTBEAT.pack(frame.epoch, frame.log_end, frame.high_water))
    if isinstance(frame, Welcome):
        if len(frame.history) > MAX_EPOCHS:
            raise ValueError(f"an epoch history of {len(frame.history)} entries exceeds {MAX_EPOCHS}")
        return _frame(FrameKind.WELCOME, WELCOME.pack(frame.epoch, frame.truncate_at, frame.stream_from,
                                                      len(frame.history))
                      + b"".join(EPOCH_START.pack(e.epoch, e.start) for e in frame.history))
    if isinstance(frame, Handshake):
        body = (HANDSHAKE.pack(PROTOCOL_MAGIC, frame.replica_id, frame.epoch, frame.log_end)
                + _name(frame.cluster, "cluster name") + _name(frame.broker_name, "broker name"))
        return _frame(FrameKind.HANDSHAKE, body)
    raw = frame.reason.encode("utf-8")[:MAX_REASON]
    return _frame(FrameKind.REFUSAL, _REASON_LEN.pack(len(raw)) + raw)


def decode_head(head: bytes | bytearray) -> tuple[FrameKind, int]:
    """KIND and LENGTH of a FRAME_HEAD, LENGTH checked against MAX_FRAME_BODY."""
    if len(head) != FRAME_HEAD.size:
        raise ReplicationCodecError(f"a frame head is {FRAME_HEAD.size} bytes, got {len(head)}")
    length, kind = FRAME_HEAD.unpack(head)
    if not 0 <= length <= MAX_FRAME_BODY:
        raise ReplicationCodecError(f"frame length {length} is outside 0..{MAX_FRAME_BODY}")
    try:
        return FrameKind(kind), length
    except ValueError:
        raise ReplicationCodecError(f"unknown frame kind {kind}") from None


def _fixed(body: bytes | bytearray, layout: struct.Struct, kind: FrameKind, exact: bool = True) -> tuple[int, ...]:
    if len(body) < layout.size or (exact and len(body) != layout.size):
        raise ReplicationCodecError(f"a {kind.name} frame of {len(body)} bytes (expected {layout.size})")
    return layout.unpack_from(body)


def _read_name(body: bytes | bytearray, p: int, what: str) -> tuple[str, int]:
    if p >= len(body):
        raise ReplicationCodecError(f"handshake ends before its {what}")
    n = body[p]
    p += 1
    if p + n > len(body):
        raise ReplicationCodecError(f"handshake {what} runs past the frame")
    try:
        return body[p : p + n].decode("utf-8"), p + n
    except UnicodeDecodeError:
        raise ReplicationCodecError(f"handshake {what} is not UTF-8") from None


def check_whole_records(records: bytes | memoryview) -> None:
    """Raise unless ``records`` is whole records back to back by their TOTALSIZE fields (the
    store verifies magic, offsets and CRCs when it appends them)."""
    p, n = 0, len(records)
    while p < n:
        if n - p < _RECORD_SIZE.size:
            raise ReplicationCodecError(f"data frame ends in a partial record at byte {p}")
        (size,) = _RECORD_SIZE.unpack_from(records, p)
        if size < _RECORD_SIZE.size or p + size > n:
            raise ReplicationCodecError(f"data frame holds a record of size {size} at byte {p} "
                                        f"that does not fit its {n} bytes")
        p += size


def decode_body(kind: FrameKind, body: bytes | bytearray) -> Frame:
    """The frame of ``kind`` whose fields (after FRAME_HEAD) are ``body`` (a DATA frame's records
    are a read-only view of ``body``: the caller hands over a buffer it no longer writes)."""
    if kind is FrameKind.DATA:
        epoch, offset, crc, high_water = _fixed(body, DATA, kind, exact=False)
        records = memoryview(body).toreadonly()[DATA.size :]
        if offset < 0 or not records:
            raise ReplicationCodecError(f"data frame at offset {offset} with {len(records)} bytes of records")
        if crc32(records) != crc:
            raise ReplicationCodecError(f"data frame at offset {offset}: its records do not match their CRC")
        check_whole_records(records)
        return Data(epoch, offset, records, high_water)
    if kind is FrameKind.ACK:
        (offset,) = _fixed(body, ACK, kind)
        return Ack(offset)
    if kind is FrameKind.HEARTBEAT:
        epoch, end, high_water = _fixed(body, HEARTBEAT, kind)
        return Heartbeat(epoch, end, high_water)
    if kind is FrameKind.WELCOME:
        epoch, cut, start, n = _fixed(body, WELCOME, kind, exact=False)
        if n > MAX_EPOCHS or len(body) != WELCOME.size + n * EPOCH_START.size:
            raise ReplicationCodecError(f"a WELCOME frame of {len(body)} bytes cannot hold {n} epochs")
        entries = [EpochStart(*EPOCH_START.unpack_from(body, WELCOME.size + i * EPOCH_START.size))
                   for i in range(n)]
        try:
            history = normalized(entries)
        except ValueError as exc:
            raise ReplicationCodecError(f"a WELCOME frame with a bad epoch history: {exc}") from None
        return Welcome(epoch, cut, start, history)
    if kind is FrameKind.HANDSHAKE:
        magic, replica, epoch, end = _fixed(body, HANDSHAKE, kind, exact=False)
        if magic != PROTOCOL_MAGIC:
            raise ReplicationCodecError(f"handshake magic 0x{magic:08X} is not TideMQ replication "
                                        f"(0x{PROTOCOL_MAGIC:08X}): is the peer a TideMQ broker of this version?")
        cluster, p = _read_name(body, HANDSHAKE.size, "cluster name")
        name, p = _read_name(body, p, "broker name")
        if p != len(body):
            raise ReplicationCodecError(f"handshake has {len(body) - p} extra bytes")
        return Handshake(cluster, name, replica, epoch, end)
    if len(body) < _REASON_LEN.size:
        raise ReplicationCodecError("refusal frame without its reason length")
    (n,) = _REASON_LEN.unpack_from(body)
    if n > MAX_REASON or _REASON_LEN.size + n != len(body):
        raise ReplicationCodecError(f"refusal reason of {n} bytes in a {len(body)}-byte frame")
    return Refusal(body[_REASON_LEN.size :].decode("utf-8", errors="replace"))


def decode(buf: bytes) -> Frame:
    """One whole frame, FRAME_HEAD included (tests and fuzzers; connections read head and body)."""
    kind, length = decode_head(buf[: FRAME_HEAD.size])
    if len(buf) != FRAME_HEAD.size + length:
        raise ReplicationCodecError(f"frame says {length} bytes follow, {len(buf) - FRAME_HEAD.size} do")
    return decode_body(kind, buf[FRAME_HEAD.size :])
