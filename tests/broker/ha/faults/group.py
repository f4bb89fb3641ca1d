"""A replicated broker group on real processes for fault injection (issue 17): a name server and
N `tidemq broker --coordination etcd://... --replica-id I` replicas of one group (on loopback, or
each in a network namespace: :class:`Placement`), and the faults the suite injects into them
(SIGKILL, SIGSTOP/SIGCONT, a lost store directory).

The group learns roles only from outside, as a client does: the master is the replica whose
address the name server routes as brokerId 0. CommitLogs are read straight from the replicas'
store directories (the files are memory-mapped by the broker, so a read sees every write).

Invariants the helpers keep:
- a replica's process is either running, stopped (SIGSTOP) or gone; ``restart`` starts a gone
  one over the same store directory (or an emptied one after ``wipe``), with the same ports;
- every process this group started is ended by ``close`` (a stopped one is continued first, so
  SIGTERM can reach it).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import resource
import shutil
import signal
import struct
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from tests.broker.ha.conftest import wait_for
from tests.procs import ServerProcess, free_port, tidemq_cmd, wait_ready
from tidemq.broker.ha.coordination import GroupRecord, decode_record, group_key
from tidemq.client import ClientConfig
from tidemq.client.admin import Admin
from tidemq.client.sync import SyncAdmin
from tidemq.errors import TideMQError
from tidemq.message import BLANK_MAGIC, MESSAGE_MAGIC

T = TypeVar("T")

SEGMENT_SIZE = 1 << 20  # small segments: a round's messages span a few, so fillers are crossed
# A record starts with TOTALSIZE (int32) and MAGICCODE (uint32), as tidemq.message defines them.
_RECORD_START = struct.Struct(">iI")
# What each replica logs when it takes a role (tidemq.broker.ha.replica): the epoch's master.
MASTER_LINE = re.compile(r"replica (\d+) is MASTER of epoch (\d+)")


def log_end(data: bytes, segment_size: int = SEGMENT_SIZE) -> int:
    """The CommitLog offset after its last whole record (``data``: the segments back to back)."""
    pos = 0
    while pos + _RECORD_START.size <= len(data):
        total, magic = _RECORD_START.unpack_from(data, pos)
        if magic == MESSAGE_MAGIC and total > 0 and pos + total <= len(data):
            pos += total
        elif magic == BLANK_MAGIC:  # a segment's end filler: the next record opens the next segment
            pos = (pos // segment_size + 1) * segment_size
        else:
            break
    return pos


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a group's processes run and listen: all on loopback by default; the partition test puts
    each in its own network namespace (``netns``: process name -> namespace, e.g. "broker-0"), with
    a replica's client address (``hosts``) apart from its replication address (``ha_hosts``)."""

    namesrv_host: str = "127.0.0.1"
    hosts: tuple[str, ...] = ()
    ha_hosts: tuple[str, ...] = ()
    netns: tuple[tuple[str, str], ...] = ()

    def host(self, rid: int) -> str:
        return self.hosts[rid] if self.hosts else "127.0.0.1"

    def ha_host(self, rid: int) -> str:
        return self.ha_hosts[rid] if self.ha_hosts else self.host(rid)

    def command(self, name: str, args: list[str]) -> list[str]:
        ns = dict(self.netns).get(name)
        return ["ip", "netns", "exec", ns, *args] if ns else args


@dataclass
class Replica:
    rid: int
    host: str
    port: int
    ha_port: int
    metrics_port: int
    store: Path
    proc: ServerProcess
    stopped: bool = False  # SIGSTOPped and not continued yet

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def ready_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/readyz"

    @property
    def alive(self) -> bool:
        return self.proc.proc is not None and self.proc.proc.poll() is None

    def commitlog(self) -> bytes:
        directory = self.store / "commitlog"
        if not directory.is_dir():
            return b""
        segments = sorted(directory.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)
        data = bytearray()
        for seg in segments:
            if not seg.name.isdigit():
                continue
            start = int(seg.name)
            if start > len(data):  # a gap (segments deleted or not yet made): nothing there counts
                break
            del data[start:]
            data += seg.read_bytes()
        return bytes(data)


@dataclass
class ReplicaGroup:
    """``size`` replicas of broker group ``name`` in cluster ``cluster``, and a name server."""

    root: Path
    etcd_endpoint: str
    name: str
    size: int = 3
    lease: float = 2.5
    replication: str = "sync"
    min_in_sync: int = 2
    extra_args: tuple[str, ...] = ()
    cluster: str = "FaultCluster"
    placement: Placement = Placement()
    replicas: list[Replica] = field(default_factory=list)

    def __post_init__(self) -> None:
        at = self.placement
        ns_port, ns_metrics = free_port(), free_port()
        self.namesrv_addr = f"{at.namesrv_host}:{ns_port}"
        self.namesrv = ServerProcess(
            at.command("namesrv", tidemq_cmd("namesrv", "--listen", self.namesrv_addr,
                                             "--metrics-listen", f"{at.namesrv_host}:{ns_metrics}")),
            self.root / "namesrv.log", f"http://{at.namesrv_host}:{ns_metrics}/readyz")
        for rid in range(self.size):
            host, port, ha, metrics = at.host(rid), free_port(), free_port(), free_port()
            store = self.root / f"store-{rid}"
            args = tidemq_cmd(
                "broker", "-n", self.namesrv_addr, "--listen", f"{host}:{port}", "--store", str(store),
                "--cluster", self.cluster, "--broker-name", self.name,
                "--coordination", f"etcd://{self.etcd_endpoint}", "--replica-id", str(rid),
                "--ha-listen", f"{at.ha_host(rid)}:{ha}", "--lease-seconds", str(self.lease),
                "--replication", self.replication, "--min-in-sync", str(self.min_in_sync),
                "--segment-size", str(SEGMENT_SIZE), "--metrics-listen", f"{host}:{metrics}",
                *self.extra_args)
            # no ready URL here: start() launches every replica first and then waits for all
            self.replicas.append(Replica(rid, host, port, ha, metrics, store,
                                         ServerProcess(at.command(f"broker-{rid}", args),
                                                       self.root / f"broker-{rid}.log")))
        self._admin: SyncAdmin | None = None

    # lifecycle ---------------------------------------------------------------------------------
    def start(self) -> "ReplicaGroup":
        self.namesrv.start()
        self._admin = SyncAdmin(self.namesrv_addr, ClientConfig(request_timeout=2.0))
        self._admin.start()
        for r in self.replicas:
            r.proc.start()
        for r in self.replicas:
            self.wait_ready(r.rid)
        return self

    def close(self) -> None:
        for r in self.replicas:
            if r.stopped and r.alive:
                self.cont(r.rid)
            r.proc.stop()
        if self._admin is not None:
            self._admin.close()
        self.namesrv.stop()

    def wait_ready(self, rid: int) -> None:
        r = self.replicas[rid]
        try:
            wait_ready(r.ready_url, timeout=30, proc=r.proc.proc)
        except (RuntimeError, TimeoutError) as exc:
            tail = "\n".join(r.proc.log().splitlines()[-15:])
            raise RuntimeError(f"replica {r.rid}: {exc}\n--- last lines of {r.proc.log_path} ---\n{tail}") from None

    # faults ------------------------------------------------------------------------------------
    def kill(self, rid: int) -> None:
        r = self.replicas[rid]
        if r.stopped:  # SIGKILL ends a stopped process too; nothing to continue afterwards
            r.stopped = False
        r.proc.kill()

    def stop(self, rid: int) -> None:
        r = self.replicas[rid]
        assert r.proc.proc is not None
        os.kill(r.proc.proc.pid, signal.SIGSTOP)
        r.stopped = True

    def cont(self, rid: int) -> None:
        r = self.replicas[rid]
        assert r.proc.proc is not None
        os.kill(r.proc.proc.pid, signal.SIGCONT)
        r.stopped = False

    def wipe(self, rid: int) -> None:
        """The replica's disk is lost: its store directory is replaced by an empty one."""
        r = self.replicas[rid]
        assert not r.alive, "wipe a replica's store only while it is down"
        shutil.rmtree(r.store, ignore_errors=True)
        r.store.mkdir(parents=True)

    def fill_disk(self, rid: int, full: bool) -> None:
        """The replica's disk is full (``full``) or has space again: RLIMIT_FSIZE on its process
        below a segment's size makes the kernel refuse to grow a file past it (EFBIG, the error
        a full disk gives as ENOSPC; CPython ignores SIGXFSZ), so the next CommitLog segment
        cannot be made while small files (checkpoints, metadata) still can."""
        r = self.replicas[rid]
        assert r.proc.proc is not None and r.alive, f"replica {rid} is not running"
        hard = resource.prlimit(r.proc.proc.pid, resource.RLIMIT_FSIZE)[1]
        resource.prlimit(r.proc.proc.pid, resource.RLIMIT_FSIZE, (SEGMENT_SIZE // 2 if full else hard, hard))

    def restart(self, rid: int, wait: bool = True) -> None:
        r = self.replicas[rid]
        assert not r.alive, f"replica {rid} is still running"
        r.proc.start()
        if wait:
            self.wait_ready(rid)

    # what the name server says -----------------------------------------------------------------
    def routes(self) -> dict[int, str]:
        """brokerId -> address of this group as the name server routes it ({} when unreachable)."""
        assert self._admin is not None, "start() the group first"
        try:
            info = self._admin.cluster_info()
        except TideMQError:
            return {}
        data = info.broker_addr_table.get(self.name)
        return dict(data.broker_addrs) if data is not None else {}

    def by_addr(self, addr: str) -> Replica | None:
        return next((r for r in self.replicas if r.addr == addr), None)

    def current_master(self) -> Replica | None:
        """The replica routed as brokerId 0 if it is running and not stopped."""
        r = self.by_addr(self.routes().get(0, ""))
        return r if r is not None and r.alive and not r.stopped else None

    def wait_master(self, timeout: float, other_than: int | None = None) -> Replica:
        return wait_for(
            "a master registered as brokerId 0" + (f" other than replica {other_than}" if other_than is not None else ""),
            lambda: (m if (m := self.current_master()) is not None and m.rid != other_than else None), timeout)

    def wait_all_registered(self, timeout: float) -> dict[int, str]:
        """Wait until the name server routes every replica (one master, the rest followers)."""
        return wait_for(f"{self.size} replicas registered with one master",
                        lambda: (ids if 0 in (ids := self.routes()) and len(set(ids.values())) == self.size
                                 else None), timeout)

    def record(self) -> GroupRecord | None:
        """The group's election record as etcd holds it now (None while no live master holds it)."""
        key = base64.b64encode(group_key(self.cluster, self.name).encode()).decode()
        req = urllib.request.Request(f"http://{self.etcd_endpoint}/v3/kv/range", json.dumps({"key": key}).encode(),
                                     {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=3) as resp:
                kvs = json.load(resp).get("kvs") or []
        except OSError:  # etcd unreachable for a moment: as good as no record; callers poll
            return None
        return decode_record(base64.b64decode(kvs[0]["value"])) if kvs else None

    def wait_in_sync(self, timeout: float) -> GroupRecord:
        """Wait until a master is routed and the record names every replica in sync."""
        self.wait_master(timeout)
        return wait_for(f"all {self.size} replicas in the group record's in-sync set",
                        lambda: (rec if (rec := self.record()) is not None and len(rec.in_sync) == self.size
                                 else None), timeout, step=0.2)

    # CommitLogs and logs -----------------------------------------------------------------------
    def wait_converged(self, timeout: float) -> int:
        """Wait until the master's high-water mark is its log end (everything acknowledged by the
        group's rule) and every replica's CommitLog is byte-identical to the master's up to it, with
        nothing past it (no producer may be running); returns that offset."""
        master = self.wait_master(timeout)

        def same() -> int | None:
            expected = master.commitlog()
            end = log_end(expected)
            try:
                hw = int(self.runtime(master.rid).get("haHighWater", "-1"))
            except TideMQError:
                return None
            if hw != end:
                return None
            for r in self.replicas:
                data = r.commitlog()
                if log_end(data) != end or data[:end] != expected[:end]:
                    return None
            return end or None

        return wait_for(f"every replica's CommitLog byte-identical to the master's (replica {master.rid}) "
                        "up to its high-water mark", same, timeout, step=0.25)

    def masters_by_epoch(self) -> dict[int, set[int]]:
        """epoch -> the replicas that logged becoming its master (every run of each replica)."""
        out: dict[int, set[int]] = {}
        for r in self.replicas:
            for rid, epoch in MASTER_LINE.findall(r.proc.log()):
                out.setdefault(int(epoch), set()).add(int(rid))
        return out

    def _ask(self, call: Callable[[Admin], Awaitable[T]]) -> T:
        """One admin call straight to a broker (what the blocking SyncAdmin does not expose)."""

        async def run() -> T:
            async with Admin(self.namesrv_addr, ClientConfig(request_timeout=2.0)) as admin:
                return await call(admin)

        return asyncio.run(run())

    def runtime(self, rid: int) -> dict[str, str]:
        """Replica ``rid``'s GET_BROKER_RUNTIME_INFO table (its ``ha*`` keys: role, epoch, high water)."""
        return self._ask(lambda a: a.get_broker_runtime_info(self.replicas[rid].addr))

    def topics(self, rid: int) -> set[str]:
        """The topics replica ``rid`` holds in its own topic table."""
        return set(self._ask(lambda a: a.broker_topic_configs(self.replicas[rid].addr)))

    def switch_to(self, rid: int, timeout: float = 15.0) -> None:
        """Planned hand-over of mastership to replica ``rid`` (in sync), through the master."""
        master = self.wait_master(timeout)
        if master.rid == rid:
            return
        self._ask(lambda a: a.switchover(master.addr, self.name, rid))
        wait_for(f"replica {rid} master after a switchover", lambda: (
            (m := self.current_master()) is not None and m.rid == rid), timeout)

    def create_topic(self, topic: str, queues: int, timeout: float = 15.0) -> None:
        """Create ``topic`` on the group's master and wait until every running replica holds it
        (metadata reaches followers through the replicated CommitLog)."""
        assert self._admin is not None
        master = self.wait_master(timeout)
        self._admin.create_topic(topic, queues, queues, broker_addr=master.addr)
        for r in self.replicas:
            if r.alive and not r.stopped:
                rid = r.rid
                wait_for(f"topic {topic} on replica {rid}", lambda: topic in self.topics(rid), timeout)
