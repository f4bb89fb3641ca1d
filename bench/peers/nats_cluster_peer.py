"""NATS JetStream replicated, for bench/compare.py's replicated rows (issue 17): three
`nats-server -js` processes clustered on loopback (routes between them, one JetStream domain), one
stream per topic with ``num_replicas=3``, driven with nats_peer's nats-py client.

Durability: file storage with JetStream's default sync on each server (async rows only); a
publish is acknowledged by the stream leader once a quorum of the replicas (2 of 3) stored it,
which is JetStream's rule and not configurable.

Invariants: the client is given every server's URL and reconnects (a failover is measured against
the cluster, not one server); every server is one this module started, ended by its pid.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from nats_peer import NatsClient, stream_name, version  # noqa: F401 (version: compare.versions())
from peerbase import BenchError, Server, free_port, wait_port

SERVERS = 3
READY_TIMEOUT = 30.0  # s: the cluster must elect a JetStream meta leader before streams are made


class Running:
    name = "nats"

    def __init__(self, root: Path, flush: str) -> None:
        if flush != "async":
            raise BenchError("replicated NATS rows run with JetStream's default sync only (--flush async)")
        self.root = root
        self.ports = [free_port() for _ in range(SERVERS)]
        self.routes = [free_port() for _ in range(SERVERS)]
        self.servers: dict[str, Server] = {}  # server_name -> process

    def start(self) -> "Running":
        self.root.mkdir(parents=True, exist_ok=True)
        routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in self.routes)
        for i in range(SERVERS):
            name = f"n{i}"
            (self.root / f"{name}.conf").write_text(
                f"server_name: {name}\nlisten: 127.0.0.1:{self.ports[i]}\n"
                f'jetstream {{ store_dir: "{self.root / name}" }}\n'
                f"cluster {{ name: bench, listen: 127.0.0.1:{self.routes[i]}, routes: [{routes}] }}\n"
            )
            self._start(i)
        return self

    def _start(self, i: int) -> None:
        name = f"n{i}"
        server = Server.start(name, ["nats-server", "-c", str(self.root / f"{name}.conf")], self.root / f"{name}.log")
        self.servers[name] = server
        wait_port(self.ports[i], server.proc, server.log, f"nats-server {name}")

    async def restart_killed(self, client: "NatsClusterClient", topic: str) -> None:
        """Start every server that is not running again (same store) and wait until ``topic``'s
        stream has a leader and both other replicas are current: the cluster as before the kill."""
        for i in range(SERVERS):
            if self.servers[f"n{i}"].proc.poll() is not None:
                await asyncio.to_thread(self._start, i)
        deadline = time.monotonic() + READY_TIMEOUT
        state = "no answer"
        while time.monotonic() < deadline:
            try:
                info = await client.js.stream_info(stream_name(topic))
                replicas = (info.cluster.replicas or []) if info.cluster else []
                state = f"leader {info.cluster.leader if info.cluster else None}, replicas " + \
                    ", ".join(f"{r.name} current={r.current}" for r in replicas)
                if info.cluster and info.cluster.leader and len(replicas) == SERVERS - 1 \
                        and all(r.current for r in replicas):
                    return
            except Exception as exc:  # noqa: BLE001 (JetStream unavailable while it elects: asked again)
                state = f"{type(exc).__name__}: {exc}"
            await asyncio.sleep(0.2)
        raise BenchError(f"stream {stream_name(topic)} did not have all {SERVERS} replicas current "
                         f"{READY_TIMEOUT:g} s after the restart ({state})")

    @property
    def pid(self) -> int:
        return next(iter(self.servers.values())).pid

    @property
    def pids(self) -> list[int]:
        return [s.pid for s in self.servers.values() if s.proc.poll() is None]

    @property
    def spec(self) -> dict:
        return {"ports": self.ports}

    def durability(self) -> str:
        return "3 servers, stream replicas 3 (quorum ack), file storage, default sync"

    async def master_process(self, client: "NatsClusterClient", topic: str) -> tuple[str, int]:
        """The name and pid of the server leading ``topic``'s stream."""
        info = await client.js.stream_info(stream_name(topic))
        leader = info.cluster.leader if info.cluster else None
        if leader not in self.servers:
            raise BenchError(f"stream {stream_name(topic)} names no leader among {sorted(self.servers)}: {leader}")
        return leader, self.servers[leader].pid

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()


async def _expected(_exc: Exception) -> None:
    """nats-py's error callback: a lost connection is what the failover row causes on purpose
    (its failed attempts are counted there); the default prints each one."""


class NatsClusterClient(NatsClient):
    """nats_peer's client on the cluster: all URLs, reconnecting, R3 streams."""

    name = "nats"

    async def open(self, topics: list[str]) -> None:
        import nats  # noqa: PLC0415
        from nats.js.api import StorageType, StreamConfig  # noqa: PLC0415

        urls = [f"nats://127.0.0.1:{p}" for p in self.spec["ports"]]
        self.nc = await nats.connect(servers=urls, reconnect_time_wait=0.1, max_reconnect_attempts=-1,
                                     error_cb=_expected)
        self.js = self.nc.jetstream(timeout=30)
        # Until the cluster has elected its meta leader, a JetStream API request is not answered
        # at all: ask with a short timeout, again until READY_TIMEOUT.
        quick = self.nc.jetstream(timeout=2)
        deadline = time.monotonic() + READY_TIMEOUT
        for t in topics:
            while True:
                try:
                    await quick.add_stream(StreamConfig(name=stream_name(t), subjects=[t],
                                                        storage=StorageType.FILE, num_replicas=SERVERS))
                    break
                except Exception as exc:  # noqa: BLE001 (retried until the deadline, then reported)
                    if time.monotonic() > deadline:
                        raise BenchError(f"JetStream cluster did not create stream {stream_name(t)} "
                                         f"within {READY_TIMEOUT:g} s: {exc}") from None
                    await asyncio.sleep(0.2)


CLIENT = NatsClusterClient
