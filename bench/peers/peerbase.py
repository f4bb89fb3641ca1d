"""Shared pieces of bench/compare.py: server processes, /proc accounting, results, the client base.

Every server the harness starts is a :class:`Server` (a Popen plus its log); ``stop()`` ends
exactly that pid (SIGTERM, then SIGKILL after a grace period) and is called from ``finally``
blocks. Broker CPU comes from utime + stime in ``/proc/<pid>/stat`` (the kernel sums all threads
of the process there); peak RSS is VmHWM from ``/proc/<pid>/status``, reset before each workload
by writing ``5`` to ``/proc/<pid>/clear_refs`` (Linux >= 4.0; when that fails the figure is the
peak since the server started and the cell says so).

A peer's client (:class:`Client`) is constructed from a plain dict (``spec``) so that the
latency producer, which runs in its own process, can build the same client there.
"""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tidemq.remoting.ports import free_port  # noqa: F401 (re-exported for the peers)

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class BenchError(Exception):
    """A clear, expected failure (missing server, server died): printed without a traceback."""


def wait_port(port: int, proc: subprocess.Popen, log: Path, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"{what} exited with {proc.returncode} before listening on port "
                             f"{port}; last lines of {log}:\n{tail(log)}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise BenchError(f"{what} is not listening on 127.0.0.1:{port} after {timeout:.0f} s; "
                     f"last lines of {log}:\n{tail(log)}")


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class Server:
    """One server process the harness started (never anything else)."""

    name: str
    proc: subprocess.Popen
    log: Path

    @classmethod
    def start(cls, name: str, args: list[str], log: Path, cwd: Path | None = None) -> "Server":
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                                    stdin=subprocess.DEVNULL)
        return cls(name, proc, log)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# /proc accounting ------------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of stat(5)


def memory_kib(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0])
    return out


def reset_peak(pid: int) -> bool:
    """Reset VmHWM of ``pid`` to its current RSS (``echo 5 > /proc/pid/clear_refs``)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@dataclass
class Cell:
    """One system's result for one row (workload x body size x flush)."""

    msgs: int = 0
    seconds: float = 0.0
    cpu: float = 0.0  # broker CPU seconds during the workload
    client_cpu: float = 0.0  # CPU seconds of the harness process (the clients; workload 5: the consumer)
    hwm_mib: float = 0.0  # broker peak RSS during the workload (VmHWM)
    anon_mib: float = 0.0  # broker anonymous RSS at the end of the workload
    peak_reset: bool = True
    lat_ms: dict[str, float] | None = None  # p50 / p99 / p999 (workload 5)
    error: str | None = None
    note: str = ""
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.msgs / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_per_million(self) -> float:
        return self.cpu / self.msgs * 1e6 if self.msgs else 0.0

    @property
    def client_cpu_per_million(self) -> float:
        return self.client_cpu / self.msgs * 1e6 if self.msgs else 0.0


def own_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)  # all threads of this process
    return ru.ru_utime + ru.ru_stime


class Meter:
    """Broker CPU and peak RSS, and this process's CPU, over one workload:
    ``with Meter(pid) as m: ...; m.fill(cell)``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def __enter__(self) -> "Meter":
        self.reset = reset_peak(self.pid)
        self.cpu0 = cpu_seconds(self.pid)
        self.own0 = own_cpu()
        return self

    def __exit__(self, *exc: object) -> None:
        self.own = own_cpu() - self.own0
        try:
            self.cpu = cpu_seconds(self.pid) - self.cpu0
            self.mem = memory_kib(self.pid)
        except OSError:  # the server died: the workload's own error says why
            self.cpu, self.mem = 0.0, {}

    def fill(self, cell: Cell) -> Cell:
        cell.cpu = self.cpu
        cell.client_cpu = self.own
        cell.hwm_mib = self.mem.get("VmHWM", 0) / 1024
        cell.anon_mib = self.mem.get("RssAnon", 0) / 1024
        cell.peak_reset = self.reset
        return cell


def percentiles(samples_ns: list[int]) -> dict[str, float]:
    if not samples_ns:
        return {"p50": float("nan"), "p99": float("nan"), "p999": float("nan")}
    s = sorted(samples_ns)
    n = len(s)

    def pick(q: float) -> float:
        return s[min(n - 1, int(q * n))] / 1e6

    return {"p50": pick(0.50), "p99": pick(0.99), "p999": pick(0.999)}


def rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


# the client side ------------------------------------------------------------------------------
Progress = Callable[[int], None]


class Client:
    """What compare.py drives; one subclass per system. All methods run on one asyncio loop.

    ``spec`` is a plain dict (addresses), so the latency producer process can rebuild the client.
    """

    name = "?"

    def __init__(self, spec: dict) -> None:
        self.spec = spec

    async def open(self, topics: list[str]) -> None:
        """Connect; create ``topics`` (topic / stream names) when given."""
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def send(self, topic: str, body: bytes) -> None:
        """One message, awaited until the server acknowledged it."""
        raise NotImplementedError

    async def pipelined(self, topic: str, body: bytes, inflight: int, deadline: float) -> int:
        """Keep ``inflight`` sends outstanding until ``deadline`` (perf_counter); return count."""
        n = 0

        async def worker() -> None:
            nonlocal n
            while time.perf_counter() < deadline:
                await self.send(topic, body)
                n += 1

        await asyncio.gather(*(worker() for _ in range(inflight)))
        return n

    async def send_batch(self, topic: str, bodies: list[bytes]) -> None:
        raise NotImplementedError

    async def consume(self, topic: str, group: str, total: int, concurrency: int, batch: int,
                      progress: Progress) -> tuple[int, int, float]:
        """Read ``total`` messages of the backlog into the client's message objects with
        ``concurrency`` fetch loops of ``batch`` messages, acknowledging each batch.
        Returns (messages, body bytes, seconds until the last one arrived)."""
        raise NotImplementedError

    async def fanout(self, topic: str, groups: list[str], batch: int, deadline: float) -> int:
        """Each group reads the topic from its start with one fetch loop until ``deadline`` or
        the end of the backlog; returns the messages read by all groups together."""
        raise NotImplementedError

    async def latency_consume(self, topic: str, group: str, record: Callable[[bytes], None],
                              stop: asyncio.Event) -> None:
        """Deliver every new message body of ``topic`` to ``record`` as soon as it arrives,
        until ``stop`` is set."""
        raise NotImplementedError


def latency_body(size: int, measured: bool) -> bytes:
    """A body of ``size`` bytes starting with the send time (CLOCK_MONOTONIC, ns) and a flag."""
    head = time.monotonic_ns().to_bytes(8, "big") + (b"\x01" if measured else b"\x00")
    return head + b"x" * max(0, size - len(head))


def body_latency_ns(body: bytes, now_ns: int) -> tuple[int, bool]:
    return now_ns - int.from_bytes(body[:8], "big"), body[8:9] == b"\x01"


def new_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed (the TideMQ broker uses it too), for every client alike."""
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run(coro):  # noqa: ANN001, ANN201 (any coroutine)
    with asyncio.Runner(loop_factory=new_loop) as runner:
        return runner.run(coro)


def latency_producer(module: str, spec: dict, topic: str, size: int, rate: int, warm: float,
                     seconds: float, out, senders: int = 64) -> None:  # noqa: ANN001 (a multiprocessing queue)
    """Process entry point of workload 5: send at ``rate`` msg/s for ``warm`` + ``seconds``, then
    put ``(measured messages sent, send errors)`` on ``out``.

    Open loop: every millisecond (event-loop timers tick in ms) the messages due by then are
    stamped and queued to ``senders`` coroutines that each send one message at a time, so time
    spent waiting for a free sender counts in the latency (5,000 msg/s arrive as ~5 messages per
    ms). A fixed number of senders keeps every client in a steady state (redis-py: ``senders``
    pooled connections made during the warm-up, instead of connections opened in bursts).
    Pacing each message with a sleeping thread instead cost the producer ~40 % more CPU on this
    2-core machine and did not make any system's latency steadier."""
    import importlib  # noqa: PLC0415
    import signal as _signal  # noqa: PLC0415

    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)  # the parent ends this process
    client: Client = importlib.import_module(module).CLIENT(spec)

    async def main() -> tuple[int, int]:
        await client.open([])
        errors = 0
        queue: asyncio.Queue = asyncio.Queue()

        async def sender() -> None:
            nonlocal errors
            while (body := await queue.get()) is not None:
                try:
                    await client.send(topic, body)
                except Exception:  # noqa: BLE001 (counted; the consumer reports what is missing)
                    errors += 1

        workers = [asyncio.ensure_future(sender()) for _ in range(senders)]
        total = int(rate * (warm + seconds))
        first_measured = int(rate * warm)
        start = time.monotonic()
        i = 0
        while i < total:
            due = min(total, int((time.monotonic() - start) * rate) + 1)
            while i < due:
                queue.put_nowait(latency_body(size, i >= first_measured))
                i += 1
            await asyncio.sleep(0.001)
        for _ in workers:
            queue.put_nowait(None)
        await asyncio.wait(workers, timeout=60)
        await client.close()
        return total - first_measured, errors

    try:
        out.put(run(main()))
    except Exception as exc:  # noqa: BLE001 (reported by the parent as this system's error)
        out.put((0, f"{type(exc).__name__}: {exc}"))
