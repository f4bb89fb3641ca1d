"""Helpers for hostile-client tests: raw frames, raw connections, a well-behaved client's latency,
the broker's RSS and CommitLog end."""

from __future__ import annotations

import asyncio
import resource
import struct
import time
import urllib.request

import orjson

from tidemq.remoting import RemotingCommand
from tidemq.remoting.frame import decode_frame


def frame(header: bytes, body: bytes = b"", serialize_type: int = 0) -> bytes:
    return struct.pack(">iI", 4 + len(header) + len(body), (serialize_type << 24) | len(header)) + header + body


def json_frame(obj: object, body: bytes = b"") -> bytes:
    return frame(orjson.dumps(obj), body)


def request(code: int, opaque: int = 1, flag: int = 0, **fields: object) -> bytes:
    return json_frame({"code": code, "opaque": opaque, "flag": flag, "language": "JAVA", "version": 399,
                       "extFields": fields})


async def read_frame(reader: asyncio.StreamReader, timeout: float = 1.0) -> RemotingCommand | None:
    """The next frame, or None when the peer closed the connection (EOF or reset) in time."""
    try:
        head = await asyncio.wait_for(reader.readexactly(4), timeout)
        (length,) = struct.unpack(">i", head)
        rest = await asyncio.wait_for(reader.readexactly(length), timeout)
    except (asyncio.IncompleteReadError, ConnectionResetError):
        return None
    return decode_frame(head + rest)


async def closed_within(reader: asyncio.StreamReader, timeout: float) -> bool:
    """True if the peer closes (EOF or reset) within ``timeout`` s; False if it stays open."""
    try:
        data = await asyncio.wait_for(reader.read(1), timeout)
    except ConnectionResetError:
        return True
    except asyncio.TimeoutError:
        return False
    return data == b""


def commitlog_end(metrics_url: str) -> int:
    """The broker's CommitLog end offset, from its /metrics (hostile input must append 0 bytes)."""
    with urllib.request.urlopen(metrics_url, timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("tidemq_broker_commitlog_max_offset_bytes"):
                return int(float(line.rsplit(" ", 1)[1]))
    raise AssertionError("no tidemq_broker_commitlog_max_offset_bytes in /metrics")


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def raise_fd_limit(want: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        soft = min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return soft


def p99(samples: list[float]) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * 0.99))]


async def timed(coro) -> float:
    t = time.perf_counter()
    await coro
    return time.perf_counter() - t
