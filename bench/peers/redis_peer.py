"""Redis Streams in bench/compare.py: ``redis-server`` with an append-only file, driven with
redis-py's asyncio client (``redis.asyncio``).

Durability: ``appendonly yes`` with ``appendfsync everysec`` (async rows) or ``appendfsync always``
(sync rows; Redis fsyncs the AOF before answering, once per event-loop turn). RDB snapshots and
automatic AOF rewrites are off, so no forked child competes during a workload. Messages are XADD
entries with one field ``b`` = the body. "256 in flight" is a pipeline of 256 XADD (redis-py has no
other way to put many commands on one connection); batches are pipelines of 64 XADD
(``transaction=False``). Consumers: XREADGROUP COUNT n, then XACK of the batch's ids. redis-py
parses replies with hiredis when it is installed (the ``bench`` extra installs it: reading a
backlog is ~3x faster with it), as a Redis user who cares about speed would run it.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from peerbase import BenchError, Client, Progress, Server, free_port, wait_port

FIELD = b"b"


def version() -> str:
    try:
        out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, timeout=10).stdout
    except OSError:
        return "?"
    return next((w[2:] for w in out.split() if w.startswith("v=")), out.strip())


class Running:
    name = "redis"

    def __init__(self, root: Path, flush: str) -> None:
        self.root = root
        self.flush = flush
        self.port = free_port()

    def start(self) -> "Running":
        self.root.mkdir(parents=True, exist_ok=True)
        fsync = "everysec" if self.flush == "async" else "always"
        args = [
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--protected-mode", "no",
            "--daemonize", "no", "--dir", str(self.root), "--save", "",
            "--appendonly", "yes", "--appendfsync", fsync, "--auto-aof-rewrite-percentage", "0",
            "--logfile", "",
        ]
        self.server = Server.start("redis-server", args, self.root / "redis.log")
        wait_port(self.port, self.server.proc, self.server.log, "redis-server")
        return self

    @property
    def pid(self) -> int:
        return self.server.pid

    @property
    def spec(self) -> dict:
        return {"port": self.port}

    def durability(self) -> str:
        return f"AOF, appendfsync {'everysec' if self.flush == 'async' else 'always'}"

    def stop(self) -> None:
        if hasattr(self, "server"):
            self.server.stop()


class RedisClient(Client):
    name = "redis"

    async def open(self, topics: list[str]) -> None:
        import redis.asyncio as aioredis  # noqa: PLC0415

        # Blocking pool: concurrent commands beyond max_connections wait for a connection instead
        # of failing (redis-py's default pool raises MaxConnectionsError past 100).
        pool = aioredis.BlockingConnectionPool(host="127.0.0.1", port=self.spec["port"],
                                               max_connections=512, timeout=None)
        # Any: redis-py types every reply as the union of all commands' replies, while this client
        # reads XREADGROUP's by its shape (and with the `bench` extra installed mypy sees them)
        self.r: Any = aioredis.Redis.from_pool(pool)
        if not await self.r.ping():
            raise BenchError("redis-server does not answer PING")

    async def close(self) -> None:
        await self.r.aclose()

    async def send(self, topic: str, body: bytes) -> None:
        await self.r.xadd(topic, {FIELD: body})

    async def pipelined(self, topic: str, body: bytes, inflight: int, deadline: float) -> int:
        n = 0
        while time.perf_counter() < deadline:
            pipe = self.r.pipeline(transaction=False)
            for _ in range(inflight):
                pipe.xadd(topic, {FIELD: body})
            await pipe.execute()
            n += inflight
        return n

    async def send_batch(self, topic: str, bodies: list[bytes]) -> None:
        pipe = self.r.pipeline(transaction=False)
        for b in bodies:
            pipe.xadd(topic, {FIELD: b})
        await pipe.execute()

    async def _group(self, topic: str, group: str, start: str = "0") -> None:
        await self.r.xgroup_create(topic, group, id=start, mkstream=True)

    async def consume(self, topic: str, group: str, total: int, concurrency: int, batch: int,
                      progress: Progress) -> tuple[int, int, float]:
        await self._group(topic, group)
        count = nbytes = 0
        last = 0.0
        t0 = time.perf_counter()

        async def loop(consumer: str) -> None:
            nonlocal count, nbytes, last
            while count < total:
                resp = await self.r.xreadgroup(group, consumer, {topic: ">"}, count=batch)
                entries = resp[0][1] if resp else []
                if not entries:
                    return
                nbytes += sum(len(fields[FIELD]) for _id, fields in entries)
                await self.r.xack(topic, group, *[i for i, _f in entries])
                count += len(entries)
                last = time.perf_counter()
                progress(count)

        await asyncio.gather(*(loop(f"c{i}") for i in range(concurrency)))
        return count, nbytes, last - t0

    async def fanout(self, topic: str, groups: list[str], batch: int, deadline: float) -> int:
        total = 0

        async def loop(group: str) -> None:
            nonlocal total
            await self._group(topic, group)
            while time.perf_counter() < deadline:
                resp = await self.r.xreadgroup(group, "c0", {topic: ">"}, count=batch)
                entries = resp[0][1] if resp else []
                if not entries:
                    return
                await self.r.xack(topic, group, *[i for i, _f in entries])
                total += len(entries)

        await asyncio.gather(*(loop(g) for g in groups))
        return total

    async def latency_consume(self, topic: str, group: str, record: Callable[[bytes], None],
                              stop: asyncio.Event) -> None:
        await self._group(topic, group, "$")
        acks: set[asyncio.Task] = set()

        async def poll() -> None:
            # Not `while True`: redis-py can swallow the cancellation of a blocked XREADGROUP
            # (seen with redis-py 8.1: the loop went on reading after stop, and the run hung).
            while not stop.is_set():  # BLOCK: the server answers as soon as an entry arrives
                resp = await self.r.xreadgroup(group, "c0", {topic: ">"}, count=100, block=1000)
                entries = resp[0][1] if resp else []
                for _id, fields in entries:
                    record(fields[FIELD])
                if entries:  # acknowledged on another pooled connection, not delaying the next read
                    t = asyncio.ensure_future(self.r.xack(topic, group, *[i for i, _f in entries]))
                    acks.add(t)
                    t.add_done_callback(acks.discard)

        task = asyncio.ensure_future(poll())
        try:
            await stop.wait()
        finally:
            task.cancel()
            await asyncio.gather(task, *acks, return_exceptions=True)


CLIENT = RedisClient
