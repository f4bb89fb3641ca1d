#!/usr/bin/env python3
"""Where the end-to-end tail of bench/compare.py's row 5 goes (issue 19): TideMQ only.

Runs workload 5 as compare.py does (a producer process sending open-loop at ``--rate`` msg/s with
64 senders, one message each at a time, through ``tidemq_peer``'s client; the consumer here,
long-polling pulls of the 4 queues through ``TideMQClient.latency_consume``) against a fresh name
server and broker, and stamps every message at four points, all CLOCK_MONOTONIC (one clock for
every process of the machine):

  due      the producer's stamp (the time the message was due; compare.py's latency starts here)
  start    a sender took it and called ``send``        (due -> start: waiting for a free sender)
  acked    ``send`` returned                           (start -> acked: the send round trip)
  arrived  the consumer's ``record`` saw it            (due -> arrived: the row's latency)

It prints, per run, p50 / p99 / p99.9 of due -> arrived, the CPU per message of broker, producer
and consumer, and the broker loop thread's minor page faults per message; for the messages at or
above the run's p99, the median of each leg, the share whose leg was the larger, and what the
three processes went through while those messages were in flight: run-queue wait of each main
thread (``/proc/<pid>/schedstat``, sampled every 0.5 ms by a fourth process), major faults,
event-loop stalls (a 1 ms ticker late by more than ``--stall-ms``) and GC passes
(``gc.callbacks``) of producer and consumer. With ``--py-spy`` it also
records the broker's CPU with py-spy (250 Hz, without pausing it, native frames; raw collapsed
stacks for flamegraph.pl) into ``--out``.

    .venv/bin/python bench/latency_probe.py [--runs 5] [--seconds 2] [--rate 5000] [--size 1024]
                                            [--flush async|sync] [--py-spy] [--out DIR]

This is a measuring tool, not a benchmark of record: compare.py's row 5 is. On a shared machine
the run queue is most of the tail; ``chrt -f 1`` in front gives the whole process tree priority
(docs/benchmarks.md, "End-to-end tail at 5,000 msg/s").
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import gc
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH / "peers"))

from peerbase import BenchError, cpu_seconds, own_cpu, run  # noqa: E402
from tidemq_peer import CLIENT, Running  # noqa: E402

TOPIC = "probe_lat"
WARM = 1.0
SENDERS = 64


def body(size: int, seq: int, measured: bool) -> bytes:
    """due stamp (8 bytes, ns) + measured flag + sequence number (4 bytes) + padding."""
    head = time.monotonic_ns().to_bytes(8, "big") + (b"\x01" if measured else b"\x00") + seq.to_bytes(4, "big")
    return head + b"x" * max(0, size - len(head))


class Watch:
    """Event-loop stalls (a 1 ms ticker's lateness) and GC passes of this process, as
    (start ns, duration ns) pairs."""

    def __init__(self, stall_ms: float) -> None:
        self.stall_ns = int(stall_ms * 1e6)
        self.stalls: list[tuple[int, int]] = []
        self.gcs: list[tuple[int, int, int]] = []  # (start, duration, generation)
        self._gc_t0 = 0

    def _on_gc(self, phase: str, info: dict) -> None:
        now = time.monotonic_ns()
        if phase == "start":
            self._gc_t0 = now
        else:
            self.gcs.append((self._gc_t0, now - self._gc_t0, info["generation"]))

    async def tick(self) -> None:
        gc.callbacks.append(self._on_gc)
        try:
            while True:
                t = time.monotonic_ns()
                await asyncio.sleep(0.001)
                late = time.monotonic_ns() - t - 1_000_000
                if late > self.stall_ns:
                    self.stalls.append((t + 1_000_000, late))
        finally:
            gc.callbacks.remove(self._on_gc)


def producer(spec: dict, size: int, rate: int, seconds: float, stall_ms: float, out) -> None:  # noqa: ANN001
    """Process entry: compare.py's latency producer plus per-message start / acked stamps."""
    import signal  # noqa: PLC0415

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    client = CLIENT(spec)
    watch = Watch(stall_ms)

    async def main() -> tuple[list[tuple[int, int, int]], Watch]:
        await client.open([])
        ticker = asyncio.ensure_future(watch.tick())
        stamps: list[tuple[int, int, int]] = []  # (seq, start, acked)
        queue: asyncio.Queue = asyncio.Queue()

        async def sender() -> None:
            while (item := await queue.get()) is not None:
                seq, b = item
                t1 = time.monotonic_ns()
                await client.send(TOPIC, b)
                stamps.append((seq, t1, time.monotonic_ns()))

        workers = [asyncio.ensure_future(sender()) for _ in range(SENDERS)]
        total = int(rate * (WARM + seconds))
        first = int(rate * WARM)
        start = time.monotonic()
        i = 0
        while i < total:
            due = min(total, int((time.monotonic() - start) * rate) + 1)
            while i < due:
                queue.put_nowait((i, body(size, i, i >= first)))
                i += 1
            await asyncio.sleep(0.001)
        for _ in workers:
            queue.put_nowait(None)
        await asyncio.wait(workers, timeout=60)
        ticker.cancel()
        await client.close()
        return stamps, watch

    cpu0 = own_cpu()
    try:
        stamps, w = run(main())
        out.put((stamps, w.stalls, w.gcs, own_cpu() - cpu0))
    except Exception as exc:  # noqa: BLE001 (reported by the parent)
        out.put(f"{type(exc).__name__}: {exc}")


def sampler(pids: dict[str, int], seconds: float, out) -> None:  # noqa: ANN001
    """Process entry: every 0.5 ms, each process's main-thread time spent runnable but waiting for
    a CPU (``/proc/<pid>/schedstat``, field 2, ns) and the process's major page faults
    (``/proc/<pid>/stat``, field 12); puts {name: [(t, cumulative wait ns, major faults)]}."""
    files = {name: (open(f"/proc/{pid}/schedstat"), open(f"/proc/{pid}/stat"))  # noqa: SIM115
             for name, pid in pids.items()}
    series: dict[str, list[tuple[int, int, int]]] = {name: [] for name in pids}
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            for name, (f, g) in files.items():
                f.seek(0)
                g.seek(0)
                stat = g.read()
                majflt = int(stat[stat.rindex(")") + 2:].split()[9])
                series[name].append((time.monotonic_ns(), int(f.read().split()[1]), majflt))
            time.sleep(0.0005)
    except (OSError, ValueError, IndexError):
        pass  # a process ended
    for f, g in files.values():
        f.close()
        g.close()
    out.put(series)


def waited(series: list[tuple[int, int, int]], ts: list[int], t0: int, t1: int, field: int = 1) -> int:
    """Growth of ``field`` (1: run-queue wait ns, 2: major faults) between t0 and t1 (nearest
    samples); ``ts``: the series' sample times."""
    i = max(0, bisect.bisect_left(ts, t0) - 1)
    j = min(len(series) - 1, bisect.bisect_left(ts, t1))
    return series[j][field] - series[i][field] if series else 0


def minor_faults(pid: int) -> int:
    """Minor page faults taken by the process's main thread (the event loop)."""
    with open(f"/proc/{pid}/task/{pid}/stat") as f:
        stat = f.read()
    return int(stat[stat.rindex(")") + 2:].split()[7])


def overlapping(events: list, t0: int, t1: int) -> int:
    return sum(1 for e in events if e[0] < t1 and e[0] + e[1] > t0)


async def one_run(client, spec: dict, broker_pid: int, k: int, args) -> dict:  # noqa: ANN001
    arrived: dict[int, tuple[int, int]] = {}  # seq -> (due, arrived)

    def record(b: bytes) -> None:
        if b[8:9] == b"\x01":
            arrived[int.from_bytes(b[9:13], "big")] = (int.from_bytes(b[:8], "big"), time.monotonic_ns())

    watch = Watch(args.stall_ms)
    ticker = asyncio.ensure_future(watch.tick())
    stop = asyncio.Event()
    consumer = asyncio.ensure_future(client.latency_consume(TOPIC, f"probe{k}", record, stop))
    await asyncio.sleep(0.5)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=producer, daemon=True, args=(spec, args.size, args.rate, args.seconds,
                                                           args.stall_ms, out))
    loop = asyncio.get_running_loop()
    sq = ctx.Queue()
    samp = None
    c_cpu0, b_cpu0, b_flt0 = own_cpu(), cpu_seconds(broker_pid), minor_faults(broker_pid)
    try:
        proc.start()
        samp = ctx.Process(target=sampler, daemon=True, args=(
            {"broker": broker_pid, "producer": proc.pid, "consumer": os.getpid()}, WARM + args.seconds + 1.5, sq))
        samp.start()
        got = await loop.run_in_executor(None, out.get, True, WARM + args.seconds + 120)
        if isinstance(got, str):
            raise BenchError(f"producer failed: {got}")
        stamps, p_stalls, p_gcs, p_cpu = got
        c_cpu, b_cpu = own_cpu() - c_cpu0, cpu_seconds(broker_pid) - b_cpu0
        b_flt = minor_faults(broker_pid) - b_flt0
        expected = int(args.rate * args.seconds)
        deadline = time.monotonic() + 5
        while len(arrived) < expected and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        series = await loop.run_in_executor(None, sq.get, True, 30)
    finally:
        if samp is not None:
            samp.join(5)
        stop.set()
        ticker.cancel()
        await asyncio.gather(consumer, ticker, return_exceptions=True)
        proc.join(10)
        if proc.is_alive():
            proc.terminate()
            proc.join()
    legs = {seq: (s, a) for seq, s, a in stamps}
    rows = sorted((arr - due, seq, due, arr) for seq, (due, arr) in arrived.items() if seq in legs)
    if not rows:
        raise BenchError("no message arrived")
    n = len(rows)
    lat = [r[0] for r in rows]
    total = len(stamps)
    res: dict[str, Any] = {"cpu_us_per_msg": {"broker": round(b_cpu / total * 1e6, 1), "producer": round(p_cpu / total * 1e6, 1),
                              "consumer": round(c_cpu / total * 1e6, 1)},
           "loop_minor_faults_per_msg": round(b_flt / total, 3),
           "n": n, "missing": expected - len(arrived), "p50": lat[n // 2] / 1e6, "p99": lat[int(0.99 * n)] / 1e6,
           "p999": lat[min(n - 1, int(0.999 * n))] / 1e6}
    tail = rows[int(0.99 * n):]
    wait = [legs[s][0] - d for _l, s, d, _a in tail]
    send = [legs[s][1] - legs[s][0] for _l, s, d, _a in tail]
    deliver = [a - legs[s][0] for _l, s, d, a in tail]  # send start -> arrival
    after_ack = [a - legs[s][1] for _l, s, d, a in tail]  # >0: arrived after its ack
    res["tail"] = {
        "count": len(tail),
        "wait_ms": statistics.median(wait) / 1e6,
        "send_rtt_ms": statistics.median(send) / 1e6,
        "start_to_arrival_ms": statistics.median(deliver) / 1e6,
        "ack_to_arrival_ms": statistics.median(after_ack) / 1e6,
        "wait_dominant": sum(1 for w, d in zip(wait, deliver) if w > d) / len(tail),
        "arrived_after_ack": sum(1 for x in after_ack if x > 0) / len(tail),
        "producer_stall": sum(1 for _l, s, d, a in tail if overlapping(p_stalls, d, a)) / len(tail),
        "consumer_stall": sum(1 for _l, s, d, a in tail if overlapping(watch.stalls, d, a)) / len(tail),
        "producer_gc2": sum(1 for _l, s, d, a in tail if overlapping([g for g in p_gcs if g[2] == 2], d, a)) / len(tail),
        "consumer_gc2": sum(1 for _l, s, d, a in tail if overlapping([g for g in watch.gcs if g[2] == 2], d, a)) / len(tail),
    }
    res["stalls"] = {"producer": len(p_stalls), "producer_max_ms": max((s[1] for s in p_stalls), default=0) / 1e6,
                     "consumer": len(watch.stalls), "consumer_max_ms": max((s[1] for s in watch.stalls), default=0) / 1e6,
                     "producer_gc2": sum(1 for g in p_gcs if g[2] == 2), "consumer_gc2": sum(1 for g in watch.gcs if g[2] == 2)}
    times = {name: [x[0] for x in ser] for name, ser in series.items()}
    for name, ser in series.items():  # median run-queue wait of each process during a tail message
        ts = times[name]
        res["tail"][f"runq_{name}_ms"] = statistics.median(waited(ser, ts, d, a) for _l, _s, d, a in tail) / 1e6
        res["tail"][f"majflt_{name}"] = sum(1 for _l, _s, d, a in tail if waited(ser, ts, d, a, 2)) / len(tail)
        res["stalls"][f"majflt_{name}"] = ser[-1][2] - ser[0][2] if ser else 0
    res["tail"]["runq_sum_ms"] = statistics.median(
        sum(waited(ser, times[name], d, a) for name, ser in series.items()) for _l, _s, d, a in tail) / 1e6
    res["tail"]["lat_ms"] = statistics.median(x[0] for x in tail) / 1e6
    all_send = sorted(a - s for s, a in legs.values())
    res["send_rtt_p50_p99_ms"] = (all_send[len(all_send) // 2] / 1e6, all_send[int(0.99 * len(all_send))] / 1e6)
    # tail messages clustered in time: how many separate bursts (gaps > 5 ms between due stamps)
    dues = sorted(d for _l, _s, d, _a in tail)
    res["tail"]["bursts"] = 1 + sum(1 for x, y in zip(dues, dues[1:]) if y - x > 5_000_000) if dues else 0
    return res


async def probe(args, running) -> None:  # noqa: ANN001
    client = CLIENT(running.spec)
    await client.open([TOPIC])
    try:
        for _ in range(200):
            await client.send(TOPIC, b"w" * args.size)
        for k in range(args.runs):
            r = await one_run(client, running.spec, running.pid, k, args)
            t = r.pop("tail")
            print(f"run {k}: p50 {r['p50']:.3f} p99 {r['p99']:.3f} p99.9 {r['p999']:.3f} ms "
                  f"(n {r['n']}, missing {r['missing']}); send rtt p50/p99 "
                  f"{r['send_rtt_p50_p99_ms'][0]:.3f}/{r['send_rtt_p50_p99_ms'][1]:.3f} ms; CPU us/msg {r['cpu_us_per_msg']}; "
                  f"broker loop-thread minor faults/msg {r['loop_minor_faults_per_msg']}; "
                  f"stalls {r['stalls']}",
                  flush=True)
            print("   tail (>= p99): " + ", ".join(f"{k2} {v:.3f}" if isinstance(v, float) else f"{k2} {v}"
                                                   for k2, v in t.items()), flush=True)
    finally:
        await client.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rate", type=int, default=5000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--flush", choices=["async", "sync"], default="async")
    ap.add_argument("--stall-ms", type=float, default=2.0, help="ticker lateness counted as a stall")
    ap.add_argument("--py-spy", action="store_true", help="record the broker with py-spy into --out")
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()))
    args = ap.parse_args()
    if args.runs < 1 or args.seconds <= 0 or args.rate < 1 or args.size < 16:
        print("latency_probe: --runs >= 1, --seconds > 0, --rate >= 1 and --size >= 16 please", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="tidemq-probe-"))
    running = Running(root, args.flush)
    spy = None
    try:
        running.start()
        print(f"broker pid {running.pid}", flush=True)
        if args.py_spy:
            exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
            prof = args.out / f"probe-broker-{os.getpid()}.txt"
            spy = subprocess.Popen([exe, "record", "--pid", str(running.pid), "--nonblocking", "--native",
                                    "--format", "raw", "--rate", "250", "--output", str(prof)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            print(f"py-spy -> {prof}", flush=True)
        run(probe(args, running))
    except BenchError as exc:
        print(f"latency_probe: {exc}", file=sys.stderr)
        return 1
    finally:
        if spy is not None:
            spy.send_signal(2)
            spy.wait(30)
        running.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
