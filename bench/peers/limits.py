"""Local limits measured in the same run as the comparison, so every figure reads as a fraction.

- ``mmap_append``: records of ``size`` bytes + a 20-byte header (length, magic, CRC32 of the body,
  timestamp; ``struct.pack_into``) appended into a preallocated (``posix_fallocate``) and mapped
  1 GiB file on the same disk as the servers' data, one core, until the file is full or the time
  is up: what one Python core can store with no network and no parsing.
- ``echo``: an asyncio echo server in its own process (uvloop when installed) answering
  length-prefixed frames of ``size`` bytes, driven by a hand-rolled asyncio Protocol: one frame
  in flight (round trips/s and their p50/p99, the latency floor of a send) and 256 frames written
  at once then read back (frames/s, the pipelined floor). Unlike produce_consume.py's echo server
  (one write per frame), it walks all complete frames of a ``data_received`` and answers them with
  one write, as a server built for pipelining does; for one frame in flight the two are the same.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

from peerbase import percentiles, wait_port, free_port

ECHO_SERVER = r"""
import asyncio, sys
class Echo(asyncio.Protocol):
    def connection_made(self, t):
        self.t = t
        self.buf = bytearray()
    def data_received(self, d):
        buf = self.buf
        buf += d
        pos, n = 0, len(buf)
        while n - pos >= 4:
            size = int.from_bytes(buf[pos:pos + 4], "big")
            if n - pos < 4 + size:
                break
            pos += 4 + size
        if pos:
            self.t.write(bytes(buf[:pos]))
            del buf[:pos]
async def main():
    srv = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", int(sys.argv[1]))
    await srv.serve_forever()
try:
    import uvloop
    uvloop.run(main())
except ImportError:
    asyncio.run(main())
"""

HEADER = struct.Struct(">iiIq")  # total length, magic, body CRC32, store timestamp
MAGIC = 0x7E4D51


def mmap_append(directory: Path, size: int, seconds: float, file_size: int = 1 << 30) -> tuple[int, float]:
    """(records appended, seconds) into a fresh preallocated mapped file."""
    path = directory / f"mmap-limit-{size}.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.posix_fallocate(fd, 0, file_size)
        mm = mmap.mmap(fd, file_size)
        try:
            body = os.urandom(size)
            rec = HEADER.size + size
            pack, crc, clock = HEADER.pack_into, zlib.crc32, time.time_ns
            pos, n = 0, 0
            t0 = time.perf_counter()
            deadline = t0 + seconds
            while pos + rec <= file_size:
                pack(mm, pos, rec, MAGIC, crc(body), clock())
                mm[pos + HEADER.size:pos + rec] = body
                pos += rec
                n += 1
                if not n & 1023 and time.perf_counter() > deadline:
                    break
            dt = time.perf_counter() - t0
        finally:
            mm.close()
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return n, dt


class _EchoClient(asyncio.Protocol):
    def __init__(self) -> None:
        self.want = 0
        self.got = 0
        self.waiter: asyncio.Future | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.got += len(data)
        if self.waiter is not None and self.got >= self.want and not self.waiter.done():
            self.waiter.set_result(None)

    async def exchange(self, payload: bytes) -> None:
        self.got, self.want = 0, len(payload)
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(payload)  # type: ignore[attr-defined]
        await self.waiter


async def _echo(port: int, size: int, seconds: float) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    transport, proto = await loop.create_connection(_EchoClient, "127.0.0.1", port)
    frame = len(b"x" * size).to_bytes(4, "big") + b"x" * size
    try:
        for _ in range(200):  # warm-up
            await proto.exchange(frame)
        samples: list[int] = []
        t0 = time.perf_counter()
        deadline = t0 + seconds
        while time.perf_counter() < deadline:
            s = time.perf_counter_ns()
            await proto.exchange(frame)
            samples.append(time.perf_counter_ns() - s)
        one = len(samples) / (time.perf_counter() - t0)
        burst = frame * 256
        n = 0
        t0 = time.perf_counter()
        deadline = t0 + seconds
        while time.perf_counter() < deadline:
            await proto.exchange(burst)
            n += 256
        piped = n / (time.perf_counter() - t0)
    finally:
        transport.close()
    p = percentiles(samples)
    return {"one": one, "p50_ms": p["p50"], "p99_ms": p["p99"], "pipelined": piped}


def echo(size: int, seconds: float, run) -> dict[str, float]:  # noqa: ANN001
    """Start the echo server process, measure, end it (by pid)."""
    port = free_port()
    log = Path(os.devnull)
    proc = subprocess.Popen([sys.executable, "-c", ECHO_SERVER, str(port)], stdin=subprocess.DEVNULL)
    try:
        wait_port(port, proc, log, "echo server")
        return run(_echo(port, size, seconds))
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
