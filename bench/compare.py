#!/usr/bin/env python3
"""TideMQ side by side with Redis Streams and NATS JetStream, in one run on one machine (issue 8).

For each body size and durability level it starts each system on free 127.0.0.1 ports with its
data in one temporary directory (same disk for all), runs the workloads through the system's own
Python asyncio client, then ends the processes it started (by pid, also on Ctrl-C):

  durability  TideMQ        Redis                                 NATS JetStream
  async       ASYNC_FLUSH   appendonly yes, appendfsync everysec  file storage (default)
  sync        SYNC_FLUSH    appendonly yes, appendfsync always    file storage, sync_interval: always
                                                                  (nats-server >= 2.10; older: default
                                                                  storage, marked * = weaker)

  1. sync send, one in flight, for --seconds;
  2. 256 sends in flight for --seconds (TideMQ / NATS: 256 concurrent sends over one connection;
     Redis: pipelines of 256 XADD);
  3. batches of 64 (TideMQ SEND_BATCH_MESSAGE; Redis pipeline of 64 XADD; JetStream 64
     publish_async then wait), 4 batches in flight, until the backlog (--backlog) is loaded;
  4. consume that backlog into the client's message objects: 4 fetch loops of up to 1024 messages
     (TideMQ PullConsumer.pull + offset commit; XREADGROUP COUNT 1024 + XACK; JetStream pull
     consumer fetch(1024) + ack of the batch);
  5. end-to-end latency p50/p99/p99.9 at 5,000 msg/s: a producer process sending open-loop (the
     send time in the body; 64 senders, one message each at a time) and a consumer (TideMQ
     long-polling pulls; XREADGROUP BLOCK; JetStream push subscription); median of
     --latency-runs runs; measured before the backlog is loaded;
  6. fan-out: 4 consumer groups each reading the backlog from its start for --seconds (total msg/s).

Per workload it records the server's CPU seconds (/proc/<pid>/stat) per million messages and its
peak RSS (VmHWM, reset before each workload), and in the same run the local limits: a raw mmap
append loop and an asyncio echo over loopback (1 in flight and 256 pipelined). It prints one
table with the ratio TideMQ / best peer and the issue's target per row (met / NOT MET).

    .venv/bin/python bench/compare.py [--quick] [--flush async|sync|both] [--sizes 1024,100]
                                      [--systems tidemq,redis,nats] [--seconds S] [--backlog N]
                                      [--latency-runs K] [--data-dir DIR] [--write]
                                      [--replicated no|also|only|failover] [--lease-seconds L]
                                      [--failover-rounds N] [--tidemq-replication sync|async]

--replicated (issue 17) adds replicated rows (bench/peers/replicated.py): workloads 1-3 and 5 on
TideMQ as 3 replicas of one group (sync replication, min-in-sync 2, etcd), NATS JetStream as a
3-server cluster with R3 streams and Redis with one replica and WAIT 1 after each write, all at the
async flush level, then a failover row (SIGKILL of the master during a send loop, time to the first
new acknowledgement). Each replicated figure is divided by the same run's unreplicated TideMQ
(ASYNC_FLUSH) figure; `only` runs just those baseline rows and the replicated ones, `failover`
just the failover row (e.g. once per --lease-seconds). Needs etcd (Debian's etcd-server).

--quick: 100,000-message backlog, 2-second phases, one latency run (a smoke run). --write replaces the results
block of docs/benchmarks.md and writes docs/benchmarks-compare.png. Needs redis-server and
nats-server (Debian: `apt-get install redis-server nats-server`; installed by this script when it
runs as root with apt-get and they are missing) and `pip install -e '.[bench]'`.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.metadata
import importlib.util
import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))  # bench/ is not a package: produce_consume (machine())
sys.path.insert(0, str(BENCH / "peers"))  # nor is bench/peers

import limits  # noqa: E402
import produce_consume  # noqa: E402
import replicated  # noqa: E402
import report  # noqa: E402
from peerbase import (  # noqa: E402
    BenchError,
    Cell,
    Meter,
    body_latency_ns,
    latency_producer,
    memory_kib,
    percentiles,
    rmtree,
    run,
)

PEERS = {"tidemq": "tidemq_peer", "redis": "redis_peer", "nats": "nats_peer"}
BINARIES = {"redis": ("redis-server", "redis-server"), "nats": ("nats-server", "nats-server")}
PY_DEPS = {"redis": "redis", "nats": "nats"}
INFLIGHT = 256
BATCH = 64
BATCHES_IN_FLIGHT = 4
FETCH = 1024
CONSUME_LOOPS = 4
GROUPS = 4
RATE = 5000
WARM = 1.0  # seconds of latency-producer traffic left out of the percentiles
TOPICS = {"prod": "cmp_prod", "backlog": "cmp_backlog", "lat": "cmp_lat"}
ALL_WORKLOADS = ("w1", "w2", "w3", "w4", "w5", "w6")


def say(msg: str) -> None:
    print(f"compare: {msg}", file=sys.stderr, flush=True)


# prerequisites --------------------------------------------------------------------------------
def ensure_servers(systems: list[str]) -> None:
    """Install missing redis-server / nats-server with apt-get when root (saying so), else explain."""
    missing = {s: BINARIES[s] for s in systems if s in BINARIES and shutil.which(BINARIES[s][0]) is None}
    if not missing:
        return
    bins = ", ".join(b for b, _p in missing.values())
    pkgs = " ".join(sorted({p for _b, p in missing.values()}))
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        why = "apt-get is not available" if apt is None else "not running as root"
        raise BenchError(f"{bins} not found and {why}: install them (Debian/Ubuntu: "
                         f"`apt-get install {pkgs}`) or leave them out with --systems")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    say(f"{bins} not found: running `apt-get update` and `apt-get install -y --no-install-recommends "
        f"{pkgs}` (as root)")
    for cmd in ([apt, "update", "-q"], [apt, "install", "-y", "-q", "--no-install-recommends", *pkgs.split()]):
        r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            raise BenchError(f"`{' '.join(cmd)}` failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    still = [b for b, _p in missing.values() if shutil.which(b) is None]
    if still:
        raise BenchError(f"apt-get succeeded but {', '.join(still)} is still not on PATH")
    say(f"installed {pkgs}")


def ensure_python_deps(systems: list[str], write: bool) -> None:
    need = [PY_DEPS[s] for s in systems if s in PY_DEPS] + (["matplotlib"] if write else [])
    absent = [m for m in need if importlib.util.find_spec(m) is None]
    if absent:
        raise BenchError(f"Python package(s) {', '.join(absent)} missing: run "
                         f"`{sys.executable} -m pip install -e '{ROOT}[bench]'`")


# workloads ------------------------------------------------------------------------------------
class Runner:
    """Runs the six workloads against one started system and records its cells."""

    def __init__(self, system: str, mod, running, size: int, flush: str, args,  # noqa: ANN001
                 results: dict, rss: dict, workloads: tuple[str, ...] = ALL_WORKLOADS,
                 label: str | None = None) -> None:
        self.system, self.mod, self.running = system, mod, running
        self.size, self.flush, self.args = size, flush, args
        self.results, self.rss = results, rss
        self.workloads = workloads
        self.tag = f"[{system} {label or flush} {report.size_label(size)}]"
        self.pid = running.pid
        self.body = os.urandom(size)

    def meter(self) -> Meter:
        """The server's CPU: one process, or every process of a replica set (``running.pids``)."""
        pids = getattr(self.running, "pids", None)
        return Meter(self.pid) if pids is None else replicated.GroupMeter(pids, self.pid)

    def record(self, w: str, cell: Cell) -> None:
        self.results.setdefault((w, self.size, self.flush), {})[self.system] = cell
        if cell.error:
            say(f"{self.tag} {report.WORKLOADS[w]}: ERROR {cell.error}")
        elif w == replicated.FAILOVER:
            fo = cell.extra.get("failover_s")
            say(f"{self.tag} failover: " + ("-" if fo is None else f"{fo:.2f} s from SIGKILL to the first new "
                                              "acknowledgement") + f" ({cell.note})")
        elif w == "w5":
            lat = cell.lat_ms or {}
            say(f"{self.tag} {report.WORKLOADS[w]}: p50 {lat['p50']:.3f} ms, p99 {lat['p99']:.3f} ms, "
                f"p99.9 {lat['p999']:.3f} ms {cell.note}")
        else:
            say(f"{self.tag} {report.WORKLOADS[w]}: {cell.rate:,.0f} msg/s (broker {cell.cpu_per_million:.1f} / "
                f"client {cell.client_cpu_per_million:.1f} CPU s/M, broker peak RSS {cell.hwm_mib:,.0f} MiB)")

    async def guarded(self, w: str, coro) -> bool:  # noqa: ANN001
        try:
            self.record(w, await coro)
            return True
        except (KeyboardInterrupt, asyncio.CancelledError):
            raise
        except Exception as exc:  # noqa: BLE001 (one system's failure must not end the comparison)
            self.record(w, Cell(error=f"{type(exc).__name__}: {exc}"))
            return False

    async def all(self) -> None:
        client = self.mod.CLIENT(self.running.spec)
        await client.open(list(TOPICS.values()))
        try:
            for _ in range(200):  # warm-up: routes, connections
                await client.send(TOPICS["prod"], self.body)
            # w5 before the backlog: same small store for all; w4 and w6 read w3's backlog
            for w in ("w1", "w2", "w5"):
                if w in self.workloads:
                    await self.guarded(w, getattr(self, w)(client))
            if "w3" in self.workloads and await self.guarded("w3", self.w3(client)):
                for w in ("w4", "w6"):
                    if w in self.workloads:
                        await self.guarded(w, getattr(self, w)(client))
            if replicated.FAILOVER in self.workloads:  # last: it kills the master
                await self.guarded(replicated.FAILOVER, replicated.failover(
                    self.running, client, TOPICS["prod"], self.body, self.args.failover_rounds))
        finally:
            await client.close()

    async def w1(self, client) -> Cell:  # noqa: ANN001
        with self.meter() as m:
            n = 0
            t0 = time.perf_counter()
            end = t0 + self.args.seconds
            while time.perf_counter() < end:
                await client.send(TOPICS["prod"], self.body)
                n += 1
            dt = time.perf_counter() - t0
        return m.fill(Cell(n, dt))

    async def w2(self, client) -> Cell:  # noqa: ANN001
        with self.meter() as m:
            t0 = time.perf_counter()
            n = await client.pipelined(TOPICS["prod"], self.body, INFLIGHT, t0 + self.args.seconds)
            dt = time.perf_counter() - t0
        return m.fill(Cell(n, dt))

    async def w3(self, client) -> Cell:  # noqa: ANN001
        total = self.args.backlog
        step = max(total // 10, 10_000)
        bodies = [self.body] * BATCH
        claimed = sent = 0
        half: float | None = None
        next_report = step
        topic = TOPICS["backlog"]
        say(f"{self.tag} loading a backlog of {total:,} messages ({BATCH} per batch, "
            f"{BATCHES_IN_FLIGHT} batches in flight) ...")

        async def worker() -> None:
            nonlocal claimed, sent, half, next_report
            while claimed < total:
                k = min(BATCH, total - claimed)
                claimed += k
                await client.send_batch(topic, bodies[:k])
                sent += k
                if half is None and sent >= total // 2:
                    half = memory_kib(self.pid).get("RssAnon", 0) / 1024
                if sent >= next_report:
                    next_report += step
                    say(f"{self.tag}   loaded {sent:,} / {total:,} ({sent / (time.perf_counter() - t0):,.0f} msg/s)")

        with self.meter() as m:
            t0 = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(BATCHES_IN_FLIGHT)))
            dt = time.perf_counter() - t0
        full = memory_kib(self.pid).get("RssAnon", 0) / 1024
        self.rss[(self.size, self.flush, self.system)] = (half or 0.0, full, (total - total // 2) * self.size)
        return m.fill(Cell(sent, dt))

    async def w4(self, client) -> Cell:  # noqa: ANN001
        total = self.args.backlog
        step = max(total // 5, 10_000)
        nxt = step

        def progress(n: int) -> None:
            nonlocal nxt
            if n >= nxt:
                nxt += step
                say(f"{self.tag}   consumed {n:,} / {total:,}")

        with self.meter() as m:
            n, nbytes, dt = await client.consume(TOPICS["backlog"], "cmp_backlog", total, CONSUME_LOOPS,
                                                 FETCH, progress)
        if n < total or nbytes < total * self.size:
            raise BenchError(f"read {n:,} messages / {nbytes:,} body bytes, expected {total:,} / "
                             f"{total * self.size:,}")
        return m.fill(Cell(n, dt))

    async def w6(self, client) -> Cell:  # noqa: ANN001
        groups = [f"cmp_fan{i}" for i in range(GROUPS)]
        with self.meter() as m:
            t0 = time.perf_counter()
            n = await client.fanout(TOPICS["backlog"], groups, FETCH, t0 + self.args.seconds)
            dt = time.perf_counter() - t0
        return m.fill(Cell(n, dt))

    async def w5(self, client) -> Cell:  # noqa: ANN001
        """Median over --latency-runs runs of each percentile (one noisy second on a shared
        2-core machine moves a single run's p99 by several ms)."""
        runs = [await self.w5_once(client, k) for k in range(self.args.latency_runs)]
        cell = Cell(sum(c.msgs for c in runs), sum(c.seconds for c in runs), cpu=sum(c.cpu for c in runs),
                    client_cpu=sum(c.client_cpu for c in runs), hwm_mib=max(c.hwm_mib for c in runs), anon_mib=runs[-1].anon_mib,
                    peak_reset=all(c.peak_reset for c in runs))
        cell.lat_ms = {q: statistics.median(c.lat_ms[q] for c in runs)  # type: ignore[index]  # w5 measures latency
                       for q in ("p50", "p99", "p999")}
        notes = [c.note for c in runs if c.note]
        if len(runs) > 1:
            notes.insert(0, "p99 per run: " + ", ".join(f"{c.lat_ms['p99']:.2f}" for c in runs) + " ms")  # type: ignore[index]
        cell.note = "; ".join(notes)
        return cell

    async def w5_once(self, client, k: int) -> Cell:  # noqa: ANN001
        samples: list[int] = []
        received = 0

        def record(body: bytes) -> None:
            nonlocal received
            lat, measured = body_latency_ns(body, time.monotonic_ns())
            received += 1
            if measured:
                samples.append(lat)

        stop = asyncio.Event()
        consumer = asyncio.ensure_future(client.latency_consume(TOPICS["lat"], f"cmp_lat{k}", record, stop))
        await asyncio.sleep(0.5)  # subscribed / first long poll parked
        if consumer.done():
            await consumer  # raises its error
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        proc = ctx.Process(target=latency_producer, daemon=True, args=(
            self.mod.__name__, self.running.spec, TOPICS["lat"], self.size, RATE, WARM, self.args.seconds, out))
        loop = asyncio.get_running_loop()
        try:
            with self.meter() as m:
                t0 = time.perf_counter()
                proc.start()
                sent, errors = await loop.run_in_executor(None, out.get, True, WARM + self.args.seconds + 120)
                if isinstance(errors, str):
                    raise BenchError(f"latency producer failed: {errors}")
                deadline = time.monotonic() + 5
                while len(samples) < sent and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                dt = time.perf_counter() - t0
        finally:
            stop.set()
            await asyncio.gather(consumer, return_exceptions=True)
            proc.join(10)
            if proc.is_alive():
                proc.terminate()
                proc.join()
        if not samples:
            raise BenchError(f"no message arrived ({sent:,} sent)")
        cell = m.fill(Cell(received, dt, lat_ms=percentiles(samples)))
        if len(samples) < sent or errors:
            cell.note = f"{sent - len(samples):,} of {sent:,} measured messages missing, {errors} send errors"
        return cell


def run_system(system: str, size: int, flush: str, args, tmp: Path, results: dict, rss: dict,  # noqa: ANN001
               weaker: dict[str, set[str]], durability: dict,
               workloads: tuple[str, ...] = ALL_WORKLOADS) -> None:
    mod = importlib.import_module(PEERS[system])
    root = tmp / f"{system}-{flush}-{size}"
    running = mod.Running(root, flush)
    durability[(system, flush)] = running.durability()
    if getattr(running, "weaker", False):
        weaker.setdefault(flush, set()).add(system)
    say(f"[{system} {flush} {report.size_label(size)}] starting ({running.durability()}) in {root}")
    try:
        running.start()
        run(Runner(system, mod, running, size, flush, args, results, rss, workloads).all())
    finally:
        running.stop()
        rmtree(root)
        os.sync()  # the next system must not pay for this one's writeback


def run_replicated(system: str, size: int, args, tmp: Path, rresults: dict,  # noqa: ANN001
                   durability: dict, workloads: tuple[str, ...]) -> None:
    """``workloads`` (1-3 and 5, then the failover row) on ``system``'s replicated form (async flush)."""
    mod = importlib.import_module(replicated.MODULES[system])
    root = tmp / f"{system}-replicated-{size}"
    running = (mod.Running(root, "async", lease_seconds=args.lease_seconds, replication=args.tidemq_replication)
               if system == "tidemq" else mod.Running(root, "async"))
    durability[system] = running.durability()
    say(f"[{system} replicated {report.size_label(size)}] starting ({running.durability()}) in {root}")
    try:
        running.start()
        run(Runner(system, mod, running, size, "async", args, rresults, {}, workloads, "replicated").all())
    except Exception as exc:  # noqa: BLE001 (a replica set that does not start must not end the run)
        say(f"[{system} replicated {report.size_label(size)}] ERROR {type(exc).__name__}: {exc}")
        for w in workloads:
            rresults.setdefault((w, size, "async"), {}).setdefault(system, Cell(error=f"{exc}"))
    finally:
        running.stop()
        rmtree(root)
        os.sync()


# the report -----------------------------------------------------------------------------------
def git(*a: str) -> str:
    try:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, timeout=20).stdout.strip()
    except OSError:
        return "?"


def machine(tmp: Path) -> str:
    mem = "?"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.0f} GiB"
    except OSError:
        pass
    try:
        df = subprocess.run(["df", "--output=source,fstype", str(tmp)], capture_output=True, text=True,
                            timeout=10).stdout.split()[-2:]
        disk = f"{df[0]} ({df[1]})"
    except (OSError, IndexError):
        disk = "?"
    return f"{produce_consume.machine()}, {mem} RAM, kernel {os.uname().release}, data on {disk}"


def versions(systems: list[str]) -> str:
    out = []
    for dist, label in (("redis", "redis-py"), ("hiredis", "hiredis"), ("nats-py", "nats-py"),
                        ("uvloop", "uvloop")):
        try:
            out.append(f"{label} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    if "redis" in systems:
        out.insert(0, f"redis-server {importlib.import_module('redis_peer').version()}")
    if "nats" in systems:
        out.insert(1, f"nats-server {importlib.import_module('nats_peer').version()}")
    return ", ".join(out)


def interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="100,000-message backlog, 2-second phases")
    ap.add_argument("--flush", choices=["async", "sync", "both"], default="both")
    ap.add_argument("--sizes", default="1024,100", help="body sizes in bytes, comma-separated")
    ap.add_argument("--systems", default="tidemq,redis,nats")
    ap.add_argument("--seconds", type=float, help="length of the timed phases (default 5, --quick 2)")
    ap.add_argument("--backlog", type=int, help="messages loaded and consumed (default 1,000,000; --quick 100,000)")
    ap.add_argument("--latency-runs", type=int, help="runs of workload 5, median reported (default 3, --quick 1)")
    ap.add_argument("--data-dir", type=Path, help="parent of the temporary data directory (default: $TMPDIR)")
    ap.add_argument("--write", action="store_true", help="write the results into docs/benchmarks.md + PNG")
    ap.add_argument("--replicated", choices=["no", "also", "only", "failover"], default="no",
                    help="also: add the replicated rows (issue 17) to the full comparison; only: run just "
                         "them and, as their baseline, unreplicated TideMQ (ASYNC_FLUSH, workloads 1-3, 5); "
                         "failover: only the replicated systems' failover row")
    ap.add_argument("--failover-rounds", type=int, default=1,
                    help="kills per replicated system and size (the killed process restarts in between); "
                         "the failover row shows the median")
    ap.add_argument("--tidemq-replication", choices=["sync", "async"], default="sync",
                    help="the TideMQ replicas' --replication (async: acknowledged after the master's write, "
                         "weaker than the peers; to see what the wait for followers costs)")
    ap.add_argument("--lease-seconds", type=float, default=10.0,
                    help="the TideMQ replicas' --lease-seconds (bounds the failover row; default 10, the broker's)")
    args = ap.parse_args()
    args.seconds = args.seconds or (2.0 if args.quick else 5.0)
    args.backlog = args.backlog or (100_000 if args.quick else 1_000_000)
    args.latency_runs = args.latency_runs or (1 if args.quick else 3)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    flushes = ["async", "sync"] if args.flush == "both" else [args.flush]
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in PEERS]
    if unknown or "tidemq" not in systems:
        print(f"compare: --systems must include tidemq and name only {', '.join(PEERS)}", file=sys.stderr)
        return 2
    if args.replicated != "no" and "async" not in flushes:
        print("compare: the replicated rows are divided by unreplicated ASYNC_FLUSH figures: use "
              "--flush async or both with --replicated", file=sys.stderr)
        return 2
    if not 1 <= args.failover_rounds <= 20:
        print("compare: --failover-rounds must be 1..20", file=sys.stderr)
        return 2
    if args.lease_seconds < 2:
        print("compare: --lease-seconds must be >= 2 (the broker's minimum)", file=sys.stderr)
        return 2
    only = args.replicated in ("only", "failover")
    # --replicated only: unreplicated TideMQ is the baseline, measured on the same rows
    plain_systems, plain_flushes = (["tidemq"], ["async"]) if only else (systems, flushes)
    plain_workloads = replicated.ROWS if only else ALL_WORKLOADS
    if args.replicated == "failover":
        plain_systems = []
    replicated_workloads = ((replicated.FAILOVER,) if args.replicated == "failover"
                            else (*replicated.ROWS, replicated.FAILOVER))
    replicated_systems = systems if args.replicated != "no" else []
    # Ctrl-C and SIGTERM raise KeyboardInterrupt wherever the run is, so the finally blocks end
    # the servers. (A handler of our own also keeps asyncio.Runner from installing its own, which
    # only cancels the main task: client code that swallows a cancellation would lose the Ctrl-C.)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, interrupt)

    results: dict = {}
    rresults: dict = {}
    rdurability: dict = {}
    rss: dict = {}
    weaker: dict[str, set[str]] = {}
    durability: dict = {}
    lims: dict[int, dict[str, float]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="tidemq-compare-", dir=args.data_dir))
    started = time.time()
    load0 = os.getloadavg()
    desc = machine(tmp)
    head = git("rev-parse", "HEAD")
    dirty_files = [ln[3:] for ln in git("status", "--porcelain", "--", "tidemq", "services").splitlines() if ln]
    dirty = len(dirty_files)
    try:
        ensure_python_deps(systems, args.write and not only)
        ensure_servers(systems)
        if replicated_systems and "tidemq" in replicated_systems and shutil.which("etcd") is None:
            raise BenchError("the replicated TideMQ rows need etcd: install Debian's etcd-server "
                             "(`apt-get install etcd-server`; `python3 dev.py` does it as root)")
        if ("nats" in plain_systems and "sync" in plain_flushes
                and not importlib.import_module("nats_peer").sync_supported()):
            say("this nats-server does not accept `sync_interval: always` (added in 2.10): its sync rows "
                "run default file storage, marked * and left out of the ratios")
        for size in [] if only else sizes:
            say(f"local limits, {report.size_label(size)} ...")
            n, dt = limits.mmap_append(tmp, size, 0.5 if args.quick else 1.0)
            lims[size] = {"mmap": n / dt, **limits.echo(size, args.seconds, run)}
            say(f"  mmap append {lims[size]['mmap']:,.0f}/s; echo 1 in flight {lims[size]['one']:,.0f}/s "
                f"(p50 {lims[size]['p50_ms']:.3f} ms); echo 256 pipelined {lims[size]['pipelined']:,.0f}/s")
        for size in sizes:
            for flush in plain_flushes:
                for system in plain_systems:
                    run_system(system, size, flush, args, tmp, results, rss, weaker, durability,
                               plain_workloads)
            for system in replicated_systems:  # next to the same size's unreplicated rows
                run_replicated(system, size, args, tmp, rresults, rdurability, replicated_workloads)
    except BenchError as exc:
        print(f"compare: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("compare: interrupted; every process this run started has been ended", file=sys.stderr)
        return 130
    finally:
        rmtree(tmp)
    wall = time.time() - started
    load1 = os.getloadavg()

    text = rtext = ""
    if not only:
        main_table = report.table(results, sizes, flushes, systems, weaker, lims)
        text = "\n\n".join(t for t in [report.limits_table(lims), main_table,
                                         report.latency_notes(results, sizes, flushes, systems),
                                         report.rss_table(rss, systems)] if t)
        print(text)
    if replicated_systems:
        rtext = "\n\n".join(t for t in [
            replicated.table(rresults, results, sizes, replicated_systems, args.lease_seconds),
            replicated.notes(rresults, sizes, replicated_systems)] if t)
        print(("\n" if text else "") + rtext)
    print(f"\nwall time {wall / 60:.1f} min, load average {load0[0]:.1f} -> {load1[0]:.1f}")
    if args.write:
        if not only:
            write(args, sizes, flushes, systems, results, weaker, durability, text, desc, head, dirty,
                  wall, load0, load1)
        if replicated_systems:
            write_replicated(args, replicated_systems, rdurability, rtext, desc, head, dirty_files, wall,
                             load0, load1)
    return 0


def write(args, sizes, flushes, systems, results, weaker, durability, text, desc, head, dirty,  # noqa: ANN001
          wall, load0, load1) -> None:  # noqa: ANN001
    cmd = "bench/compare.py " + " ".join(a for a in sys.argv[1:])
    png = ROOT / "docs" / "benchmarks-compare.png"
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    report.chart(results, sizes, flushes, systems, png,
                 f"{stamp}: {' and '.join(report.size_label(z) for z in sizes)} bodies; "
                 f"backlog {args.backlog:,}; commit {head[:10]}")
    dur = "\n".join(f"| {report.SYSTEMS[s]} | " + " | ".join(durability.get((s, f), "-") for f in flushes) + " |"
                    for s in systems)
    star = ""
    if any(weaker.values()):
        star = ("\n\n\\* weaker durability than the row's flush level (nats-server < 2.10 has no "
                "`sync_interval`): shown for context, left out of \"best peer\".")
    block = f"""### {stamp}: `.venv/bin/python {cmd.strip()}`

Machine: {desc}. {versions(systems)}. Load average {load0[0]:.1f} at the start, {load1[0]:.1f} at
the end; wall time {wall / 60:.1f} min. TideMQ at commit `{head}`{f' plus uncommitted changes in {dirty} file(s) under tidemq/ and services/ (hot-path work in progress during this run)' if dirty else ''}.
Backlog {args.backlog:,} messages; timed phases {args.seconds:g} s; fetch batches of {FETCH}; latency at {RATE:,} msg/s after {WARM:g} s of warm-up.

| system | {' | '.join(f'{f} rows' for f in flushes)} |
|---|{'---|' * len(flushes)}
{dur}

{text}{star}

![TideMQ, Redis and NATS msg/s per workload (log scale) and e2e p99](benchmarks-compare.png)
"""
    report.write_doc(ROOT / "docs" / "benchmarks.md", block)
    say(f"wrote docs/benchmarks.md and {png.relative_to(ROOT)}")


def write_replicated(args, systems, durability, text, desc, head, dirty_files, wall, load0, load1) -> None:  # noqa: ANN001
    cmd = "bench/compare.py " + " ".join(a for a in sys.argv[1:])
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    dur = "\n".join(f"| {report.SYSTEMS[s]} | {durability.get(s, '-')} |" for s in systems)
    busy = " (the machine was busy: figures are noisy)" if max(load0[0], load1[0]) >= 1.5 else ""
    dirty_note = (" plus uncommitted changes (other work in progress) in " + ", ".join(f"`{f}`" for f in dirty_files)
                  if dirty_files else "")
    block = f"""### {stamp}: `.venv/bin/python {cmd.strip()}`

Machine: {desc}. {versions(systems)}. Load average {load0[0]:.1f} at the start, {load1[0]:.1f} at
the end{busy}; wall time {wall / 60:.1f} min. TideMQ at commit `{head}`{dirty_note}.
Backlog {args.backlog:,} messages; timed phases {args.seconds:g} s; latency at {RATE:,} msg/s after {WARM:g} s of warm-up; TideMQ lease {args.lease_seconds:g} s.

| system | replicated as |
|---|---|
{dur}

{text}
"""
    replicated.write_doc(ROOT / "docs" / "benchmarks.md", block)
    say("wrote the replicated results into docs/benchmarks.md")


if __name__ == "__main__":
    sys.exit(main())
