"""Fixtures of the coordination-store tests: a real etcd on loopback, the Kubernetes emulator.

``replica_group`` starts a name server and the replicas of one broker group (``tidemq broker
--coordination etcd://...``) as real processes, and reads who is master from the name server.

``etcd`` starts Debian's etcd-server binary (``etcd``) on two free loopback ports with its data in
the test's temporary directory and stops it by pid; without the binary the tests that need it skip
and say which package to install (``python3 dev.py`` installs it when run as root).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest

from tests.cli.clirun import tidemq
from tests.procs import ServerProcess, free_port, tidemq_cmd, wait_ready
from tidemq.client import ClientConfig
from tidemq.client.admin import Admin

T = TypeVar("T")

ETCD = shutil.which("etcd")
NO_ETCD = ("etcd not found: install the Debian package etcd-server (`apt-get install etcd-server`; "
           "`python3 dev.py` does it when run as root)")


@dataclass
class Etcd:
    client_port: int
    proc: subprocess.Popen

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"


def start_etcd(root: Path) -> Etcd:
    if ETCD is None:
        pytest.skip(NO_ETCD)
    root.mkdir(parents=True, exist_ok=True)
    client, peer = free_port(), free_port()
    with open(root / "etcd.log", "ab") as log:
        proc = subprocess.Popen(
            [ETCD, "--name", "tidemq-test", "--data-dir", str(root / "data"),
             "--listen-client-urls", f"http://127.0.0.1:{client}",
             "--advertise-client-urls", f"http://127.0.0.1:{client}",
             "--listen-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-cluster", f"tidemq-test=http://127.0.0.1:{peer}"],
            stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(f"http://127.0.0.1:{client}/health", timeout=30, proc=proc)
    except BaseException:
        stop(proc)
        raise
    return Etcd(client, proc)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Etcd]:
    server = start_etcd(tmp_path_factory.mktemp("etcd"))
    yield server
    stop(server.proc)


def wait_for(what: str, check: Callable[[], T | None], timeout: float, step: float = 0.1) -> T:
    """``check()`` once it is truthy; AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(step)


@dataclass
class ReplicaGroup:
    """A name server and the replicas of one broker group, each a real process."""

    namesrv: str
    name: str
    lease: float
    replicas: dict[str, tuple[ServerProcess, Path]] = field(default_factory=dict)  # address -> (process, store)

    def ids(self) -> dict[str, str]:
        """brokerId -> address of the group, as the name server routes it (clusterList)."""
        run = tidemq("admin", "clusterList", "-n", self.namesrv)
        rows = [line.split() for line in run.lines()[1:]] if run.rc == 0 else []
        return {r[2]: r[3] for r in rows if len(r) >= 4 and r[1] == self.name}

    def master(self, timeout: float = 20.0, other_than: str | None = None) -> str:
        """The address registered as brokerId 0 (and not ``other_than``)."""
        def find() -> str | None:
            addr = self.ids().get("0")
            return addr if addr is not None and addr != other_than else None
        return str(wait_for(f"a master of {self.name} registered as brokerId 0", find, timeout))

    def runtime(self, addr: str) -> dict[str, str]:
        """The GET_BROKER_RUNTIME_INFO table of the replica at ``addr`` (its ``ha*`` keys)."""
        async def ask() -> dict[str, str]:
            async with Admin(self.namesrv, ClientConfig(request_timeout=2.0)) as admin:
                return await admin.get_broker_runtime_info(addr)
        return asyncio.run(ask())


@pytest.fixture
def replica_group(etcd: Etcd, tmp_path: Path,
                  monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., ReplicaGroup]]:
    """``replica_group(name, replicas=3, lease=3.0, *extra_args)``: started, stopped at the end."""
    monkeypatch.setenv("TIDEMQ_BROKER_SEGMENT_SIZE", str(1 << 20))
    procs: list[ServerProcess] = []

    def start(name: str = "rg-broker", replicas: int = 3, lease: float = 3.0, *extra: str) -> ReplicaGroup:
        ns_port, ns_metrics = free_port(), free_port()
        procs.append(ServerProcess(
            tidemq_cmd("namesrv", "--listen", f"127.0.0.1:{ns_port}", "--metrics-listen",
                       f"127.0.0.1:{ns_metrics}"),
            tmp_path / "namesrv.log", f"http://127.0.0.1:{ns_metrics}/readyz").start())
        group = ReplicaGroup(f"127.0.0.1:{ns_port}", name, lease)
        for rid in range(replicas):
            port, ha, metrics = free_port(), free_port(), free_port()
            store = tmp_path / f"store-{rid}"
            proc = ServerProcess(tidemq_cmd(
                "broker", "-n", group.namesrv, "--listen", f"127.0.0.1:{port}", "--store", str(store),
                "--cluster", "RC", "--broker-name", name, "--coordination", f"etcd://{etcd.endpoint}",
                "--replica-id", str(rid), "--ha-listen", f"127.0.0.1:{ha}", "--lease-seconds", str(lease),
                "--metrics-listen", f"127.0.0.1:{metrics}", *extra),
                tmp_path / f"broker-{rid}.log", f"http://127.0.0.1:{metrics}/readyz")
            procs.append(proc)
            group.replicas[f"127.0.0.1:{port}"] = (proc, store)
        for _addr, (proc, _store) in group.replicas.items():
            proc.start()
        return group

    try:
        yield start
    finally:
        for p in reversed(procs):
            p.stop()
