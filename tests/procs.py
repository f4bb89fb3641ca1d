"""Start real TideMQ name server and broker processes on loopback for tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tidemq.remoting.ports import free_port  # noqa: F401 (re-exported: the tests pick ports with it)


def wait_port(port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def wait_ready(url: str, timeout: float = 20.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} was ready")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError as exc:
            last = exc
        time.sleep(0.05)
    raise TimeoutError(f"{url} not ready after {timeout} s: {last}")


def tidemq_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "tidemq.cli.main", *args]


@dataclass
class ServerProcess:
    args: list[str]
    log_path: Path
    ready_url: str | None = None
    proc: subprocess.Popen | None = None

    def start(self) -> "ServerProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        if self.ready_url:
            try:
                wait_ready(self.ready_url, proc=self.proc)
            except (RuntimeError, TimeoutError) as exc:  # say why: the last lines the process wrote
                tail = "\n".join(self.log().splitlines()[-15:])
                raise RuntimeError(f"{exc}\n--- last lines of {self.log_path} ---\n{tail}") from None
        return self

    def stop(self, timeout: float = 15.0) -> int | None:
        """Graceful stop (SIGTERM); returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def kill(self) -> None:
        """kill -9."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


@dataclass
class Cluster:
    """A name server and one broker, each a real `tidemq` process on loopback."""

    root: Path
    flush: str = "async"
    broker_expiry: float = 120.0
    segment_size: int = 64 * 1024 * 1024
    extra_broker_args: list[str] = field(default_factory=list)
    cluster_name: str = "DefaultCluster"
    broker_name: str = "broker-a"

    def __post_init__(self) -> None:
        self.namesrv_port = free_port()
        self.broker_port = free_port()
        self.namesrv_metrics_port = free_port()
        self.broker_metrics_port = free_port()
        self.store_dir = self.root / "store"
        self.namesrv = ServerProcess(
            tidemq_cmd(
                "namesrv", "--listen", f"127.0.0.1:{self.namesrv_port}",
                "--metrics-listen", f"127.0.0.1:{self.namesrv_metrics_port}",
                "--broker-expiry", str(self.broker_expiry),
            ),
            self.root / "namesrv.log",
            f"http://127.0.0.1:{self.namesrv_metrics_port}/readyz",
        )
        self.broker = ServerProcess(
            tidemq_cmd(
                "broker", "--namesrv", self.namesrv_addr, "--listen", f"127.0.0.1:{self.broker_port}",
                "--store", str(self.store_dir), "--cluster", self.cluster_name,
                "--broker-name", self.broker_name, "--flush", self.flush,
                "--segment-size", str(self.segment_size),
                "--metrics-listen", f"127.0.0.1:{self.broker_metrics_port}",
                *self.extra_broker_args,
            ),
            self.root / "broker.log",
            f"http://127.0.0.1:{self.broker_metrics_port}/readyz",
        )

    @property
    def namesrv_addr(self) -> str:
        return f"127.0.0.1:{self.namesrv_port}"

    @property
    def broker_addr(self) -> str:
        return f"127.0.0.1:{self.broker_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.broker_metrics_port}/metrics"

    def start(self) -> "Cluster":
        self.namesrv.start()
        self.broker.start()
        return self

    def stop(self) -> None:
        self.broker.stop()
        self.namesrv.stop()

    def restart_broker(self, kill: bool = False) -> None:
        if kill:
            self.broker.kill()
        else:
            self.broker.stop()
        self.broker.start()

    def same_name_broker(self, store_dir: Path, log_name: str = "broker-2.log") -> tuple[ServerProcess, str]:
        """A second broker (not started) registering this cluster's broker name as brokerId 0 at
        another address over ``store_dir``: started after the first is killed, it is the group's
        new master as a failover makes one (issue 17). Returns it and its address."""
        port, metrics_port = free_port(), free_port()
        proc = ServerProcess(
            tidemq_cmd(
                "broker", "--namesrv", self.namesrv_addr, "--listen", f"127.0.0.1:{port}",
                "--store", str(store_dir), "--cluster", self.cluster_name,
                "--broker-name", self.broker_name, "--flush", self.flush,
                "--segment-size", str(self.segment_size),
                "--metrics-listen", f"127.0.0.1:{metrics_port}",
                *self.extra_broker_args,
            ),
            self.root / log_name,
            f"http://127.0.0.1:{metrics_port}/readyz",
        )
        return proc, f"127.0.0.1:{port}"

    def admin(self, *args: str, check: bool = True, input: bytes | None = None) -> subprocess.CompletedProcess:
        """Run `tidemq admin ...` against this cluster."""
        r = subprocess.run(
            tidemq_cmd("admin", *args[:1], "-n", self.namesrv_addr, *args[1:]),
            capture_output=True, timeout=60, input=input,
        )
        if check and r.returncode != 0:
            raise AssertionError(f"tidemq admin {' '.join(args)} failed ({r.returncode}): {r.stderr.decode()}")
        return r

    def create_topic(self, topic: str, queues: int = 4, **kw: str) -> None:
        args = ["updateTopic", "-c", self.cluster_name, "-t", topic, "-r", str(queues), "-w", str(queues)]
        for k, v in kw.items():
            args += [f"-{k}", v]
        self.admin(*args)
