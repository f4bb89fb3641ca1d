#!/usr/bin/env python3
"""Produce/consume throughput of TideMQ with 1 KiB messages, against a loopback baseline.

Starts a name server and a broker (real `tidemq` processes) on free loopback ports with a store in
a temporary directory, then measures with TideMQ's asyncio client:

  1. sync send, one message in flight;
  2. SEND_BATCH_MESSAGE batches of 32, one batch in flight;
  3. pipelined sends: 256 coroutines, one send each in flight (256 requests on one connection);
  4. batches of 64, four batches in flight;
  5. pull throughput over everything sent, 32 and 256 messages per pull.

The baseline, measured in the same run, is an asyncio echo server in its own process answering
1 KiB frames one at a time: the round-trip limit of this machine's loopback + event loop. Ratios
are TideMQ's rate over the baseline's.

    python bench/produce_consume.py [--messages 20000] [--size 1024] [--flush async|sync] [--uvloop] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.procs import Cluster, free_port, wait_port  # noqa: E402
from tidemq import Message, Producer, PullConsumer  # noqa: E402

ECHO_SERVER = r"""
import asyncio, struct, sys
class Echo(asyncio.Protocol):
    def connection_made(self, t): self.t = t; self.buf = bytearray()
    def data_received(self, d):
        self.buf += d
        while len(self.buf) >= 4:
            n = struct.unpack_from(">i", self.buf)[0]
            if len(self.buf) < 4 + n: break
            self.t.write(bytes(self.buf[:4 + n])); del self.buf[:4 + n]
async def main():
    srv = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", int(sys.argv[1]))
    await srv.serve_forever()
try:
    import uvloop; uvloop.run(main())
except ImportError:
    asyncio.run(main())
"""


async def echo_baseline(port: int, size: int, n: int) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    frame = len(b"x" * size).to_bytes(4, "big") + b"x" * size
    t0 = time.perf_counter()
    for _ in range(n):
        writer.write(frame)
        await reader.readexactly(len(frame))
    dt = time.perf_counter() - t0
    writer.close()
    return n / dt


async def bench(cluster: Cluster, n: int, size: int) -> dict[str, float]:
    topic = f"bench_{os.getpid()}"
    cluster.create_topic(topic, queues=4)
    body = os.urandom(size // 2).hex().encode()[:size]
    results: dict[str, float] = {}
    async with Producer("bench-producer", name_servers=[cluster.namesrv_addr]) as p:
        for _ in range(200):  # warm up routes and connections
            await p.send(Message(topic, body))
        t0 = time.perf_counter()
        for _ in range(n):
            await p.send(Message(topic, body))
        results["sync send, 1 in flight"] = n / (time.perf_counter() - t0)
        batches = max(1, n // 32)
        t0 = time.perf_counter()
        for _ in range(batches):
            await p.send_batch([Message(topic, body) for _ in range(32)])
        results["batch send, 32 per batch"] = batches * 32 / (time.perf_counter() - t0)

        async def sender(count: int) -> None:
            for _ in range(count):
                await p.send(Message(topic, body))

        # 256 coroutines each with one send in flight: 256 requests pipelined on one connection.
        per_worker = max(1, n // 256)
        t0 = time.perf_counter()
        await asyncio.gather(*(sender(per_worker) for _ in range(256)))
        results["pipelined send, 256 in flight"] = 256 * per_worker / (time.perf_counter() - t0)

        async def batcher(count: int) -> None:
            for _ in range(count):
                await p.send_batch([Message(topic, body) for _ in range(64)])

        # Batches of 64, 4 in flight, so the client encodes while the broker stores.
        per_batcher = max(1, n // (64 * 4))
        t0 = time.perf_counter()
        await asyncio.gather(*(batcher(per_batcher) for _ in range(4)))
        results["batch send, 64 per batch, 4 in flight"] = 4 * per_batcher * 64 / (time.perf_counter() - t0)
    total = 0
    async with PullConsumer("bench-consumer", name_servers=[cluster.namesrv_addr]) as c:
        queues = await c.fetch_queues(topic)
        t0 = time.perf_counter()
        for mq in queues:
            offset = 0
            while True:
                r = await c.pull(mq, offset, 32)
                if not r.messages:
                    break
                total += len(r.messages)
                offset = r.next_begin_offset
        results["pull, 32 per request"] = total / (time.perf_counter() - t0)
        total = 0
        t0 = time.perf_counter()
        for mq in queues:
            offset = 0
            while True:  # the broker caps a pull at 256 KiB, about 230 messages of 1 KiB
                r = await c.pull(mq, offset, 256)
                if not r.messages:
                    break
                total += len(r.messages)
                offset = r.next_begin_offset
        results["pull, 256 per request"] = total / (time.perf_counter() - t0)
    return results


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores ({cpu}), Python {platform.python_version()}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--flush", choices=["async", "sync"], default="async")
    ap.add_argument("--write", action="store_true", help="append the table to docs/benchmarks.md")
    ap.add_argument("--uvloop", action="store_true", help="run TideMQ's asyncio client on uvloop")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="tidemq-bench-"))
    echo_port = free_port()
    echo = subprocess.Popen([sys.executable, "-c", ECHO_SERVER, str(echo_port)])
    cluster = Cluster(tmp, flush=args.flush, segment_size=256 * 1024 * 1024)
    try:
        wait_port(echo_port)
        print(f"starting name server and broker ({args.flush} flush) in {tmp} ...", file=sys.stderr)
        cluster.start()
        baseline = asyncio.run(echo_baseline(echo_port, args.size, args.messages))
        print(f"baseline: asyncio echo of {args.size}-byte frames, 1 in flight: {baseline:,.0f} round trips/s", file=sys.stderr)
        if args.uvloop:
            import uvloop  # noqa: PLC0415 (only with --uvloop)

            results = uvloop.run(bench(cluster, args.messages, args.size))
        else:
            results = asyncio.run(bench(cluster, args.messages, args.size))
    finally:
        cluster.stop()
        echo.terminate()
        echo.wait()
        shutil.rmtree(tmp, ignore_errors=True)

    lines = [
        f"| workload ({args.size}-byte bodies, {args.flush} flush{', client on uvloop' if args.uvloop else ''}) "
        "| msg/s | MB/s | ratio to echo baseline |",
        "|---|---:|---:|---:|",
        f"| baseline: asyncio echo, 1 in flight | {baseline:,.0f} | {baseline * args.size / 1e6:,.1f} | 1.00 |",
    ]
    for name, rate in results.items():
        lines.append(f"| {name} | {rate:,.0f} | {rate * args.size / 1e6:,.1f} | {rate / baseline:.2f} |")
    table = "\n".join(lines)
    print(table)
    if args.write:
        doc = ROOT / "docs" / "benchmarks.md"
        stamp = time.strftime("%Y-%m-%d")
        with doc.open("a") as f:
            f.write(f"\n### {stamp}: `python bench/produce_consume.py --messages {args.messages} --flush {args.flush}{' --uvloop' if args.uvloop else ''}`\n\n")
            f.write(f"Machine: {machine()}.\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
