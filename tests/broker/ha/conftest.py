"""Fixtures of the coordination-store tests: a real etcd on loopback, the Kubernetes emulator.

``etcd`` starts Debian's etcd-server binary (``etcd``) on two free loopback ports with its data in
the test's temporary directory and stops it by pid; without the binary the tests that need it skip
and say which package to install (``python3 dev.py`` installs it when run as root).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.procs import free_port, wait_ready

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
