"""Redis replicated, for bench/compare.py's replicated rows (issue 17): a primary and one replica
(`redis-server --replicaof`), both with redis_peer's settings (AOF, `appendfsync everysec`, no RDB),
driven with redis_peer's client plus ``WAIT 1 <ms>`` after each write: after each XADD of a single
send, after the whole pipeline of "256 in flight" and of a batch (in the same pipeline, so it costs
no extra round trip).

Durability: the write is acknowledged once the replica has received it (WAIT counts replicas that
acknowledged the replication offset; neither side fsyncs first). WAIT answering fewer than 1
replica means the replica did not have it in time: that write counts as failed.

Redis has no automatic failover without Sentinel, so this peer has no failover figure.

Invariants: the replica has caught up (``master_link_status:up``) before any workload; both
processes are ones this module started, ended by their pids.
"""

from __future__ import annotations

import time
from pathlib import Path

from peerbase import BenchError, Server, free_port, wait_port
from redis_peer import FIELD, RedisClient, version  # noqa: F401 (version: compare.versions())

WAIT_MS = 1000  # a loopback replica answers in well under a millisecond; this only bounds a stall
SYNC_TIMEOUT = 30.0


def server_args(port: int, root: Path) -> list[str]:
    return ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--protected-mode", "no",
            "--daemonize", "no", "--dir", str(root), "--save", "", "--appendonly", "yes",
            "--appendfsync", "everysec", "--auto-aof-rewrite-percentage", "0", "--logfile", ""]


class Running:
    name = "redis"

    def __init__(self, root: Path, flush: str) -> None:
        if flush != "async":
            raise BenchError("replicated Redis rows run with appendfsync everysec only (--flush async)")
        self.root = root
        self.port, self.replica_port = free_port(), free_port()

    def start(self) -> "Running":
        (self.root / "primary").mkdir(parents=True, exist_ok=True)
        (self.root / "replica").mkdir(parents=True, exist_ok=True)
        self.primary = Server.start("redis primary", server_args(self.port, self.root / "primary"),
                                    self.root / "primary.log")
        wait_port(self.port, self.primary.proc, self.primary.log, "redis-server (primary)")
        self.replica = Server.start("redis replica", [
            *server_args(self.replica_port, self.root / "replica"), "--replicaof", "127.0.0.1", str(self.port)],
            self.root / "replica.log")
        wait_port(self.replica_port, self.replica.proc, self.replica.log, "redis-server (replica)")
        self._wait_link()
        return self

    def _wait_link(self) -> None:
        import redis  # noqa: PLC0415

        r = redis.Redis(host="127.0.0.1", port=self.replica_port)
        deadline = time.monotonic() + SYNC_TIMEOUT
        try:
            while r.info("replication").get("master_link_status") != "up":
                if time.monotonic() > deadline:
                    raise BenchError(f"the Redis replica did not link to its primary within {SYNC_TIMEOUT:g} s")
                time.sleep(0.1)
        finally:
            r.close()

    @property
    def pid(self) -> int:
        return self.primary.pid

    @property
    def pids(self) -> list[int]:
        return [s.pid for s in (self.primary, self.replica) if s.proc.poll() is None]

    @property
    def spec(self) -> dict:
        return {"port": self.port}

    def durability(self) -> str:
        return f"primary + 1 replica, WAIT 1 {WAIT_MS} after each write / pipeline, AOF everysec on each"

    def stop(self) -> None:
        for name in ("replica", "primary"):
            if hasattr(self, name):
                getattr(self, name).stop()


def _check(acked: int) -> None:
    if acked < 1:
        raise BenchError(f"WAIT 1 {WAIT_MS}: the replica did not acknowledge the write within {WAIT_MS} ms")


class RedisReplicaClient(RedisClient):
    """redis_peer's client with WAIT 1 after each write (or pipeline of writes)."""

    name = "redis"

    async def send(self, topic: str, body: bytes) -> None:
        pipe = self.r.pipeline(transaction=False)
        pipe.xadd(topic, {FIELD: body})
        pipe.wait(1, WAIT_MS)
        _check((await pipe.execute())[-1])

    async def pipelined(self, topic: str, body: bytes, inflight: int, deadline: float) -> int:
        n = 0
        while time.perf_counter() < deadline:
            pipe = self.r.pipeline(transaction=False)
            for _ in range(inflight):
                pipe.xadd(topic, {FIELD: body})
            pipe.wait(1, WAIT_MS)
            _check((await pipe.execute())[-1])
            n += inflight
        return n

    async def send_batch(self, topic: str, bodies: list[bytes]) -> None:
        pipe = self.r.pipeline(transaction=False)
        for b in bodies:
            pipe.xadd(topic, {FIELD: b})
        pipe.wait(1, WAIT_MS)
        _check((await pipe.execute())[-1])


CLIENT = RedisReplicaClient
