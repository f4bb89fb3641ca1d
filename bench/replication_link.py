"""The replication connection alone, with real sockets and processes: CPU per replicated message.

A master MessageStore in this process serves its CommitLog (ha/replication.py's ReplicationMaster,
on a free loopback port) to ``--followers`` follower processes (this script again, ``--follower``:
a MessageStore and a ReplicationFollower each, as in a broker), while this process stores
``--messages`` messages of ``--size`` bytes in batches of ``--batch`` (64) with at most
``--in-flight`` batches not yet acked by every follower (sync replication's wait, as
bench/compare.py --replicated row 3 loads them; ``--batch 1 --in-flight 1`` is row 1's lone send,
the round trip to the followers and back without the client's). No name server, election, client or request handling: what is left is the master's
put and streaming, and each follower's receive, check, append and ack.

Reported per round: messages per second, the master process's CPU per message (its put included),
each follower's CPU per message (from its first frame to the last ack), and frames/acks per batch.

    .venv/bin/python bench/replication_link.py [--messages 128000] [--rounds 3] [--followers 2]
        [--batch 64] [--in-flight 4]

Alternate it with a scratch copy of the older modules on the same machine to compare them (the
follower processes import whatever this process would). ASYNC_FLUSH everywhere, as the compare
rows run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tidemq.cli.common import run_async  # noqa: E402 (uvloop when installed, as the broker runs)
from tidemq.broker.ha.replication import ReplicationConfig, ReplicationFollower, ReplicationMaster  # noqa: E402
from tidemq.broker.store.config import FlushMode, StoreConfig  # noqa: E402
from tidemq.broker.store.store import MessageStore, PutRequest  # noqa: E402

TOPIC = "ReplicationLink"
CFG = ReplicationConfig("bench", "bench-link")


def _store(root: Path) -> MessageStore:
    cfg = StoreConfig(root=root, commitlog_segment_size=1 << 30, flush_mode=FlushMode.ASYNC,
                      logics_flush_interval=3600.0, cleanup_interval=3600.0)
    store = MessageStore(cfg)
    store.load()
    return store


def _cpu() -> float:
    return time.process_time()


async def follower(port: int, root: Path, replica: int) -> int:
    """Follow the master on ``port``; on stdin: ``start`` answers the CPU so far, ``until N``
    answers the CPU once the log reaches N, EOF ends."""
    store = _store(root)
    await store.start()
    # ASYNC_FLUSH: a follower acks what it appended, as a broker's does (ha/replica.py)
    f = ReplicationFollower(store, CFG, replica, 1, ("127.0.0.1", port), ack_flushed=False)
    f.start()
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[str] = asyncio.Queue()
    threading.Thread(target=lambda: [loop.call_soon_threadsafe(lines.put_nowait, line) for line in sys.stdin]
                     + [loop.call_soon_threadsafe(lines.put_nowait, "")], daemon=True).start()
    try:
        while line := (await lines.get()).strip():
            if line.startswith("until "):
                target = int(line.split()[1])
                while store.commitlog_max_offset < target:
                    await asyncio.sleep(0.001)
            print(json.dumps({"cpu": _cpu(), "end": store.commitlog_max_offset}), flush=True)
    finally:
        await f.close()
        await store.shutdown()
    return 0


def _ask(proc: subprocess.Popen, line: str) -> dict:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    answer: dict = json.loads(proc.stdout.readline())
    return answer


async def one_round(args: argparse.Namespace, tmp: Path) -> dict:
    master = _store(tmp / "m")
    await master.start()
    gate = asyncio.Event()
    m = ReplicationMaster(master, CFG, 1, (), on_change=gate.set)
    port = await m.start("127.0.0.1", 0)
    procs = [subprocess.Popen([sys.executable, __file__, "--follower", str(port), str(tmp / f"f{i}"), str(i + 1)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for i in range(args.followers)]
    try:
        deadline = time.monotonic() + 30
        while len(m.followers()) < args.followers:
            if time.monotonic() > deadline:
                raise RuntimeError("the followers did not connect within 30 s")
            await asyncio.sleep(0.05)
        body = os.urandom(args.size // 2 + 1).hex().encode()[: args.size]
        n_batches = args.messages // args.batch
        starts = [_ask(p, "start")["cpu"] for p in procs]
        c0, t0 = _cpu(), time.perf_counter()
        ends: list[int] = []  # each batch's end offset, in order
        acked = 0
        for b in range(n_batches):
            while len(ends) - acked >= args.in_flight:  # wait until every follower holds the oldest
                gate.clear()
                low = min(st.acked for st in m.followers().values())
                while acked < len(ends) and ends[acked] <= low:
                    acked += 1
                if len(ends) - acked >= args.in_flight:
                    async with asyncio.timeout(10):
                        await gate.wait()
            r = master.put_batch([PutRequest(TOPIC, b % 4, body, {"UNIQ_KEY": f"{b:016X}{j:08X}", "TAGS": "TagA"},
                                             born_host=("127.0.0.1", 40000), store_host=("127.0.0.1", 10911))
                                  for j in range(args.batch)])
            if r.status.name != "PUT_OK":
                raise RuntimeError(f"put_batch failed: {r.status.name} {r.remark}")
            ends.append(master.commitlog_max_offset)
            m.wake()
        end = master.commitlog_max_offset
        async with asyncio.timeout(30):
            while min(st.acked for st in m.followers().values()) < end:
                gate.clear()
                await gate.wait()
        dt, mcpu = time.perf_counter() - t0, _cpu() - c0
        fcpu = [_ask(p, f"until {end}")["cpu"] - s for p, s in zip(procs, starts)]
        n = n_batches * args.batch
        return {"rate": n / dt, "master": mcpu / n * 1e6, "followers": [c / n * 1e6 for c in fcpu]}
    finally:
        for p in procs:
            assert p.stdin is not None
            p.stdin.close()
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
        async with asyncio.timeout(5):  # their sessions end on their own: nothing left to cancel
            while m.followers():
                await asyncio.sleep(0.01)
        await m.close()
        await master.shutdown()


async def run(args: argparse.Namespace) -> int:
    print(f"{'round':<6} {'msg/s':>9} {'master us/msg':>14} {'followers us/msg':>18}")
    for rnd in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            r = await one_round(args, Path(tmp))
        print(f"{rnd:<6} {r['rate']:>9,.0f} {r['master']:>14.2f} {' '.join(f'{c:.2f}' for c in r['followers']):>18}",
              flush=True)
    return 0


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--follower":
        return run_async(lambda: follower(int(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=128_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--followers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64, help="messages per put (1: lone sends)")
    ap.add_argument("--in-flight", type=int, default=4, help="batches not yet acked by every follower")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if args.batch < 1 or args.in_flight < 1:
        ap.error("--batch and --in-flight must be at least 1")
    if args.messages < args.batch:
        ap.error(f"--messages must be at least --batch ({args.batch})")
    return run_async(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
