"""TideMQ replicated, for bench/compare.py's replicated rows (issue 17): a name server, etcd and
three replicas of one broker group, each a `tidemq broker --coordination etcd://... --replica-id N
--ha-listen ... --replication sync --min-in-sync 2` process on loopback, driven with the same
asyncio client as the unreplicated rows (tidemq_peer.TideMQClient).

Durability: every replica ASYNC_FLUSH (page cache, flushed in the background); a send is answered
once the group's acknowledgement rule holds (`--replication sync`: every in-sync replica has it and
at least 2 are in sync), like JetStream R3 (quorum of 3) and Redis' `WAIT 1`, none of which waits
for an fsync either.

Invariants: every process here is one this module started and is ended by its pid (etcd last, so
no replica loses its coordination store while it shuts down); the topic is created on the master
and offered to every follower (the replica that wins a failover must serve it; a follower that
takes topic configs from the master's log refuses with SERVICE_NOT_AVAILABLE, which is fine);
the group counts as formed once the name server routes a master (brokerId 0) and two followers.
"""

from __future__ import annotations

import asyncio
import sys
import time
import urllib.request
from pathlib import Path

from peerbase import BenchError, Server, free_port, run, tail
from tidemq_peer import QUEUES, SEGMENT, TideMQClient
from tidemq import Admin
from tidemq.errors import BrokerError, TideMQError
from tidemq.remoting.codes import ResponseCode
from tidemq.remoting.headers.replica import HA_IN_SYNC, HA_LAST_FAILOVER_SECONDS, parse_id_list

CLUSTER = "BenchRC"
GROUP = "bench-group"
REPLICAS = 3
MIN_IN_SYNC = 2
FORM_TIMEOUT = 60.0  # s: three Python brokers starting on a busy 2-core machine


def ready(url: str, server: Server, timeout: float = 30.0) -> None:
    """Wait until ``url`` answers 200 (a /readyz or etcd's /health), or fail saying why."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise BenchError(f"{server.name} exited with {server.proc.returncode} while starting; "
                             f"last lines of {server.log}:\n{tail(server.log)}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise BenchError(f"{server.name} not ready at {url} after {timeout:g} s; last lines of "
                     f"{server.log}:\n{tail(server.log)}")


def tidemq(*args: str) -> list[str]:
    return [sys.executable, "-m", "tidemq.cli.main", *args]


async def group_addrs(namesrv: str) -> dict[int, str]:
    """brokerId -> address of the bench group, as the name server routes it ({} before any)."""
    async with Admin(namesrv) as admin:
        info = await admin.cluster_info()
    bd = info.broker_addr_table.get(GROUP)
    return dict(bd.broker_addrs) if bd is not None else {}


async def wait_formed(namesrv: str, timeout: float = FORM_TIMEOUT) -> dict[int, str]:
    """brokerId -> address once a master and REPLICAS - 1 followers are registered."""
    deadline = time.monotonic() + timeout
    ids: dict[int, str] = {}
    while time.monotonic() < deadline:
        try:
            ids = await group_addrs(namesrv)
        except TideMQError:
            ids = {}
        if 0 in ids and len(set(ids.values())) == REPLICAS:
            return ids
        await asyncio.sleep(0.2)
    raise BenchError(f"the replica group did not form within {timeout:g} s (registered: {ids}); "
                     "see the broker logs in the run's data directory")


class Running:
    """etcd + name server + three replicas; ``pid`` is the current master's (for peak RSS),
    ``pids`` every replica's (broker CPU is the group's)."""

    name = "tidemq"

    def __init__(self, root: Path, flush: str, lease_seconds: float = 10.0, replication: str = "sync") -> None:
        self.root, self.flush, self.lease, self.replication = root, flush, lease_seconds, replication
        self.servers: list[Server] = []
        self.brokers: dict[str, Server] = {}  # client address -> replica process
        self.commands: dict[str, tuple[list[str], str]] = {}  # process name -> (argv, ready URL)
        self.namesrv = f"127.0.0.1:{free_port()}"

    def _start(self, name: str, args: list[str], ready_url: str) -> Server:
        server = Server.start(name, args, self.root / f"{name}.log")
        self.servers.append(server)
        self.commands[server.name] = (args, ready_url)
        ready(ready_url, server)
        return server

    def start(self) -> "Running":
        self.root.mkdir(parents=True, exist_ok=True)
        client, peer = free_port(), free_port()
        self._start("etcd", [
            "etcd", "--name", "bench", "--data-dir", str(self.root / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{client}",
            "--advertise-client-urls", f"http://127.0.0.1:{client}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"bench=http://127.0.0.1:{peer}"], f"http://127.0.0.1:{client}/health")
        metrics = free_port()
        self._start("namesrv", tidemq("namesrv", "--listen", self.namesrv,
                                      "--metrics-listen", f"127.0.0.1:{metrics}"),
                    f"http://127.0.0.1:{metrics}/readyz")
        for rid in range(REPLICAS):
            port, ha, metrics = free_port(), free_port(), free_port()
            addr = f"127.0.0.1:{port}"
            self.brokers[addr] = self._start(f"broker-{rid}", tidemq(
                "broker", "-n", self.namesrv, "--listen", addr, "--store", str(self.root / f"store-{rid}"),
                "--cluster", CLUSTER, "--broker-name", GROUP, "--flush", self.flush,
                "--segment-size", str(SEGMENT), "--cleanup-interval", "86400",
                "--metrics-listen", f"127.0.0.1:{metrics}",
                "--coordination", f"etcd://127.0.0.1:{client}", "--replica-id", str(rid),
                "--ha-listen", f"127.0.0.1:{ha}", "--replication", self.replication,
                "--min-in-sync", str(MIN_IN_SYNC), "--lease-seconds", f"{self.lease:g}",
            ), f"http://127.0.0.1:{metrics}/readyz")
        run(wait_formed(self.namesrv))
        run(wait_in_sync(self.namesrv))
        return self

    @property
    def pid(self) -> int:
        return self.master().pid

    @property
    def pids(self) -> list[int]:
        return [s.pid for s in self.brokers.values() if s.proc.poll() is None]

    def master(self) -> Server:
        ids = run(group_addrs(self.namesrv))
        if 0 not in ids or ids[0] not in self.brokers:
            raise BenchError(f"the name server routes no master of {GROUP} (registered: {ids})")
        return self.brokers[ids[0]]

    async def master_process(self, _client: object, _topic: str) -> tuple[str, int]:
        """The current master's address and pid (one group serves every topic)."""
        ids = await group_addrs(self.namesrv)
        addr = ids.get(0)
        if addr is None or addr not in self.brokers:
            raise BenchError(f"the name server routes no master of {GROUP} (registered: {ids})")
        return addr, self.brokers[addr].pid

    async def restart_killed(self, _client: object, _topic: str) -> None:
        """Start every replica that is not running again (same store and options) and wait until
        the master counts all of them in sync: the group as it was before the failover."""
        for addr, server in list(self.brokers.items()):
            if server.proc.poll() is None:
                continue
            args, ready_url = self.commands[server.name]
            self.servers.remove(server)
            self.brokers[addr] = await asyncio.to_thread(self._start, server.name, args, ready_url)
        await wait_formed(self.namesrv)
        await wait_in_sync(self.namesrv)

    async def failover_seconds(self) -> float | None:
        """The new master's own account of its last failover (``haLastFailoverSeconds``: from the
        old master's lease lapsing, as it saw it, to becoming master)."""
        ids = await group_addrs(self.namesrv)
        if 0 not in ids:
            return None
        async with Admin(self.namesrv) as admin:
            info = await admin.get_broker_runtime_info(ids[0])
        value = info.get(HA_LAST_FAILOVER_SECONDS, "")
        return float(value) if value else None

    @property
    def spec(self) -> dict:
        return {"namesrv": self.namesrv}

    def durability(self) -> str:
        return (f"3 replicas, --replication {self.replication} --min-in-sync {MIN_IN_SYNC}, "
                f"{'ASYNC_FLUSH' if self.flush == 'async' else 'SYNC_FLUSH'} on each, lease {self.lease:g} s")

    def stop(self) -> None:
        for server in reversed(self.servers):  # replicas, name server, then etcd
            server.stop()


async def wait_in_sync(namesrv: str, timeout: float = FORM_TIMEOUT) -> tuple[int, ...]:
    """The master's in-sync set once it names every replica (``haInSync`` of its runtime info):
    a workload or a failover measured with a follower still catching up would be another one."""
    deadline = time.monotonic() + timeout
    in_sync: tuple[int, ...] = ()
    while time.monotonic() < deadline:
        try:
            ids = await group_addrs(namesrv)
            if 0 in ids:
                async with Admin(namesrv) as admin:
                    info = await admin.get_broker_runtime_info(ids[0])
                in_sync = parse_id_list(info.get(HA_IN_SYNC, ""))
                if len(in_sync) == REPLICAS:
                    return in_sync
        except (TideMQError, ValueError):
            pass  # a master just elected may not answer yet
        await asyncio.sleep(0.2)
    raise BenchError(f"the master of {GROUP} did not count {REPLICAS} replicas in sync within {timeout:g} s "
                     f"(in sync: {in_sync or 'none known'}); see the broker logs in the run's data directory")


class TideMQGroupClient(TideMQClient):
    """The unreplicated rows' client; only topic creation differs (on every replica)."""

    name = "tidemq"

    async def open(self, topics: list[str]) -> None:
        ns = self.spec["namesrv"]
        if topics:
            ids = await wait_formed(ns)
            async with Admin(ns) as admin:
                for t in topics:
                    await admin.create_topic(t, QUEUES, QUEUES, broker_addr=ids[0])
                    for bid, addr in ids.items():
                        if bid == 0:
                            continue
                        try:  # a follower that takes its topics from the master's log refuses
                            await admin.create_topic(t, QUEUES, QUEUES, broker_addr=addr)
                        except BrokerError as exc:
                            if exc.code != ResponseCode.SERVICE_NOT_AVAILABLE:
                                raise
                for t in topics:
                    await wait_routed(admin, t)
        await super().open([])


async def wait_routed(admin: Admin, topic: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if len((await admin.topic_route(topic)).publish_queues(topic)) == QUEUES:
                return
        except TideMQError:
            pass  # TOPIC_NOT_EXIST until the master's registration carries it
        if time.monotonic() > deadline:
            raise BenchError(f"the name server does not route {QUEUES} queues of {topic} after {timeout:g} s")
        await asyncio.sleep(0.1)


CLIENT = TideMQGroupClient
