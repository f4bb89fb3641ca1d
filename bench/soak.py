#!/usr/bin/env python3
"""Soak test (matrix row L1): 8 producers and 8 consumers against real name server + broker
processes on loopback for a configurable time, with the full accounting at the end.

Every body is unique and self-describing: ``p{producer}-{seq} {send time ns}`` padded to ``--size``
bytes, so the consumers check content without extra state. Producers send with retries off (one
attempt per message, 1 in flight each), so a duplicate can only be a broker bug. Each send's outcome
is ``acked`` (SEND_OK), ``indeterminate`` (timeout, connection error, a flush/slave status that is not
SEND_OK) or ``failed`` (an error answer). Each consumer owns one of the topic's 8 queues and pulls it
from offset 0 with long polling (committing its offset every few seconds); after the producers stop,
the consumers drain every queue to its max offset.

Printed: a line per ``--report`` interval (send and consume rate, broker RSS and open fds), then the
throughput, end-to-end latency percentiles (send start to receipt), broker RSS over time, and the
accounting: sent, acknowledged, indeterminate, failed, consumed, lost (acknowledged, never consumed),
duplicated (consumed twice), phantoms (a body nobody sent). Exit status 1 if anything acknowledged
was lost or a phantom appeared; with ``--strict`` also if RSS grew > 10 % from minute 2 to the end
or open fds moved by more than 16 (the L1 pass criteria).

    python bench/soak.py [--minutes 10] [--rate 0] [--size 1024] [--flush async|sync] [--strict]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from tests.procs import Cluster  # noqa: E402
from tidemq import Message, Producer, PullConsumer  # noqa: E402
from tidemq.client.config import ClientConfig  # noqa: E402
from tidemq.errors import BrokerError, TideMQError  # noqa: E402

PRODUCERS = 8
CONSUMERS = 8


class Bits:
    """A growable bitmap of sequence numbers (8 producers x millions of messages stay small)."""

    def __init__(self) -> None:
        self.data = bytearray(1 << 16)

    def add(self, i: int) -> bool:
        """Set bit ``i``; True if it was already set."""
        byte, bit = i >> 3, 1 << (i & 7)
        if byte >= len(self.data):
            self.data.extend(bytes(max(byte + 1 - len(self.data), len(self.data))))
        old = self.data[byte] & bit
        self.data[byte] |= bit
        return bool(old)

    def __contains__(self, i: int) -> bool:
        byte = i >> 3
        return byte < len(self.data) and bool(self.data[byte] & (1 << (i & 7)))


@dataclass
class Stats:
    sent: int = 0
    acked: int = 0
    indeterminate: int = 0
    failed: int = 0
    consumed: int = 0
    duplicated: int = 0
    phantoms: int = 0
    acked_bits: list[Bits] = field(default_factory=lambda: [Bits() for _ in range(PRODUCERS)])
    seen_bits: list[Bits] = field(default_factory=lambda: [Bits() for _ in range(PRODUCERS)])
    next_seq: list[int] = field(default_factory=lambda: [0] * PRODUCERS)
    latencies_ms: array = field(default_factory=lambda: array("f"))
    errors: dict[str, int] = field(default_factory=dict)


def body_of(p: int, seq: int, size: int) -> bytes:
    head = f"p{p}-{seq} {time.monotonic_ns()} ".encode()
    return head + b"x" * max(0, size - len(head))


async def producer(i: int, topic: str, namesrv: str, stats: Stats, stop: asyncio.Event, size: int,
                   interval: float) -> None:
    cfg = ClientConfig(instance_name=f"soak-p{i}", retry_times_when_send_failed=0, request_timeout=5.0)
    async with Producer(f"soak_pg{i}", [namesrv], cfg) as prod:
        next_at = time.monotonic()
        while not stop.is_set():
            seq = stats.next_seq[i]
            stats.next_seq[i] = seq + 1
            stats.sent += 1
            try:
                result = await prod.send(Message(topic, body_of(i, seq, size)))
            except BrokerError as exc:
                stats.failed += 1
                key = f"failed: code {exc.code}"
                stats.errors[key] = stats.errors.get(key, 0) + 1
            except (TideMQError, OSError, asyncio.TimeoutError) as exc:
                stats.indeterminate += 1
                key = f"indeterminate: {type(exc).__name__}"
                stats.errors[key] = stats.errors.get(key, 0) + 1
            else:
                if result.status.name == "SEND_OK":
                    stats.acked += 1
                    stats.acked_bits[i].add(seq)
                else:
                    stats.indeterminate += 1
                    key = f"indeterminate: {result.status.name}"
                    stats.errors[key] = stats.errors.get(key, 0) + 1
            if interval:
                next_at += interval
                delay = next_at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    next_at = time.monotonic()


def account(stats: Stats, body: bytes, now_ns: int) -> None:
    try:
        head = body[:64].split(b" ", 2)
        tag, sent_ns = head[0].decode(), int(head[1])
        p_text, seq_text = tag[1:].split("-", 1)
        p, seq = int(p_text), int(seq_text)
        if not tag.startswith("p") or not 0 <= p < PRODUCERS or seq >= stats.next_seq[p]:
            raise ValueError(tag)
    except (ValueError, IndexError, UnicodeDecodeError):
        stats.phantoms += 1
        return
    stats.consumed += 1
    if stats.seen_bits[p].add(seq):
        stats.duplicated += 1
    stats.latencies_ms.append((now_ns - sent_ns) / 1e6)


async def consumer(i: int, topic: str, namesrv: str, stats: Stats, producing: asyncio.Event,
                   drained: dict[int, bool]) -> None:
    cfg = ClientConfig(instance_name=f"soak-c{i}", request_timeout=5.0)
    async with PullConsumer(f"soak_cg{i}", [namesrv], cfg) as cons:
        queues = sorted(await cons.fetch_queues(topic), key=lambda q: q.queue_id)
        mq = queues[i % len(queues)]
        offset, last_commit = 0, time.monotonic()
        while True:
            try:
                r = await cons.pull(mq, offset, 32, suspend_ms=1000 if producing.is_set() else 0, timeout=5.0)
            except (TideMQError, OSError, asyncio.TimeoutError) as exc:
                key = f"pull error: {type(exc).__name__}"
                stats.errors[key] = stats.errors.get(key, 0) + 1
                await asyncio.sleep(0.2)
                continue
            now = time.monotonic_ns()
            for m in r.messages:
                account(stats, m.body, now)
            offset = r.next_begin_offset
            if time.monotonic() - last_commit > 5:
                await cons.commit(mq, offset)
                last_commit = time.monotonic()
            if not producing.is_set() and not r.messages:
                if offset >= await cons.max_offset(mq):
                    await cons.commit(mq, offset)
                    drained[i] = True
                    return


def rss_anon(pid: int) -> int:
    """Anonymous resident memory (heap, not mapped files) in bytes, from /proc (0 if unavailable)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


async def run(cluster: Cluster, minutes: float, size: int, rate: float, report: float) -> tuple[Stats, list, float]:
    topic = f"soak_{os.getpid()}"
    cluster.create_topic(topic, queues=CONSUMERS)
    from tidemq import Admin  # noqa: PLC0415

    async with Admin([cluster.namesrv_addr]) as admin:  # wait for the route (registration is async)
        deadline = time.monotonic() + 30
        while True:
            try:
                route = await admin.topic_route(topic)
                if len(route.publish_queues(topic)) == CONSUMERS:
                    break
            except TideMQError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the topic never got a route")
            await asyncio.sleep(0.2)
    stats = Stats()
    stop, producing = asyncio.Event(), asyncio.Event()
    producing.set()
    drained: dict[int, bool] = {}
    assert cluster.broker.proc is not None  # the Cluster context started it
    broker = psutil.Process(cluster.broker.proc.pid)
    samples: list[tuple[float, int, int, int]] = []  # (elapsed s, rss bytes, anonymous rss bytes, open fds)
    interval = PRODUCERS / rate if rate > 0 else 0.0
    t0 = time.monotonic()
    consumers = [asyncio.create_task(consumer(i, topic, cluster.namesrv_addr, stats, producing, drained))
                 for i in range(CONSUMERS)]
    producers = [asyncio.create_task(producer(i, topic, cluster.namesrv_addr, stats, stop, size, interval))
                 for i in range(PRODUCERS)]
    end = t0 + minutes * 60
    last_t, last_sent, last_consumed = t0, 0, 0
    print(f"{'elapsed':>8} {'send/s':>8} {'consume/s':>10} {'broker RSS MiB':>15} {'anon MiB':>9} {'fds':>5}",
          flush=True)
    while True:
        now = time.monotonic()
        if now >= end - 0.5:
            break
        await asyncio.sleep(min(report, end - now))
        now = time.monotonic()
        rss, anon, fds = broker.memory_info().rss, rss_anon(broker.pid), broker.num_fds()
        samples.append((now - t0, rss, anon, fds))
        dt = now - last_t
        print(f"{now - t0:8.0f} {(stats.acked - last_sent) / dt:8.0f} {(stats.consumed - last_consumed) / dt:10.0f} "
              f"{rss / 2**20:15.1f} {anon / 2**20:9.1f} {fds:5d}", flush=True)
        last_t, last_sent, last_consumed = now, stats.acked, stats.consumed
        for t in producers + consumers:
            if t.done() and (exc := t.exception()) is not None:
                raise exc
    produce_seconds = time.monotonic() - t0
    stop.set()
    await asyncio.gather(*producers)
    producing.clear()
    try:
        await asyncio.wait_for(asyncio.gather(*consumers), 120)
    except asyncio.TimeoutError:
        print("consumers did not drain within 120 s", flush=True)
    return stats, samples, produce_seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0, help="how long the producers send (default 10)")
    ap.add_argument("--size", type=int, default=1024, help="body bytes (default 1024)")
    ap.add_argument("--rate", type=float, default=0.0, help="total sends/s over all producers (0: as fast as they go)")
    ap.add_argument("--flush", choices=["async", "sync"], default="async")
    ap.add_argument("--report", type=float, default=30.0, help="seconds between progress lines")
    ap.add_argument("--strict", action="store_true", help="also fail on RSS growth > 10%% or fd drift > 16")
    ap.add_argument("--keep", action="store_true", help="keep the store directory")
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="tidemq-soak-"))
    cluster = Cluster(tmp, flush=args.flush, segment_size=256 * 1024 * 1024)
    print(f"soak: {PRODUCERS} producers, {CONSUMERS} consumers, {args.size}-byte bodies, {args.flush} flush, "
          f"{args.minutes:g} min, rate {'unbounded' if not args.rate else f'{args.rate:g}/s'}; store {tmp}", flush=True)
    try:
        cluster.start()
        try:
            import uvloop  # noqa: PLC0415

            stats, samples, seconds = uvloop.run(run(cluster, args.minutes, args.size, args.rate, args.report))
        except ImportError:
            stats, samples, seconds = asyncio.run(run(cluster, args.minutes, args.size, args.rate, args.report))
    finally:
        cluster.stop()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    lost = 0
    for acked, seen in zip(stats.acked_bits, stats.seen_bits):
        a, s = int.from_bytes(acked.data, "little"), int.from_bytes(seen.data, "little")
        lost += (a & ~s).bit_count()
    lat = sorted(stats.latencies_ms)
    print()
    print(f"throughput: {stats.acked / seconds:,.0f} acknowledged sends/s, "
          f"{stats.acked * args.size / seconds / 1e6:,.2f} MB/s over {seconds:,.0f} s")
    print("end-to-end latency ms: " + ", ".join(
        f"p{q:g} {percentile(lat, q):.1f}" for q in (50, 90, 99, 99.9)) + f", max {lat[-1] if lat else float('nan'):.1f}")
    print("broker RSS MiB over time: " + ", ".join(f"{t / 60:.1f}m {rss / 2**20:.0f}" for t, rss, _, _ in samples))
    print("broker anonymous RSS MiB over time: " + ", ".join(f"{t / 60:.1f}m {a / 2**20:.0f}" for t, _, a, _ in samples))
    print("broker open fds over time: " + ", ".join(f"{t / 60:.1f}m {fds}" for t, _, _, fds in samples))
    print(f"latency samples: {len(lat)}; progress and resource samples every {args.report:g} s while producing")
    print(f"accounting: sent {stats.sent}, acknowledged {stats.acked}, indeterminate {stats.indeterminate}, "
          f"failed {stats.failed}, consumed {stats.consumed}, lost {lost}, duplicated {stats.duplicated}, "
          f"phantoms {stats.phantoms}")
    if stats.errors:
        print("errors: " + ", ".join(f"{k} x{v}" for k, v in sorted(stats.errors.items())))
    status = 0
    if lost or stats.phantoms:
        print("FAIL: acknowledged messages lost or phantoms consumed")
        status = 1
    # L1 resource criteria: RSS at the end <= 1.1 x RSS at minute 2; open fds within +-16.
    base = next((s for s in samples if s[0] >= 120), samples[0] if samples else None)
    if base and samples:
        rss_ok = samples[-1][1] <= 1.1 * base[1]
        fds_ok = max(abs(s[3] - samples[0][3]) for s in samples) <= 16
        anon_ratio = samples[-1][2] / base[2] if base[2] else float("nan")
        print(f"RSS end / RSS at {base[0] / 60:.1f} min = {samples[-1][1] / base[1]:.3f} "
              f"({'ok' if rss_ok else 'GREW'}), anonymous {anon_ratio:.3f}; "
              f"fd drift {'ok' if fds_ok else 'TOO LARGE'}")
        if args.strict and not (rss_ok and fds_ok):
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
