"""A follower's apply path in one process, without sockets: CPU per replicated record.

A master MessageStore (temporary directory, ASYNC_FLUSH) stores ``--messages`` messages of
``--size`` bytes in batches of 64 (one topic, four queues, a TAGS and a UNIQ_KEY each, as
bench/compare.py's producers send them); its CommitLog is then read back in replication frames
of ``--frame-bytes`` (the master's window, ha/replication.py) and a follower MessageStore appends
them (``append_replicated``: check each record, dispatch it to consume queue and index), which is
what each follower of a replicated group spends per record (docs/benchmarks.md, "Replicated").
Also times the master's own ``put_batch`` per message, for comparison. The loop turns between
batches and frames, so the stores' background flushes (every ``--flush-interval`` s) run as in a
broker; CPU is the whole process's (the flush thread's fdatasync included).

    .venv/bin/python bench/follower_apply.py [--messages 64000] [--size 1024] [--rounds 3] [--profile 20]

``TIDEMQ_NO_EXTENSIONS=1`` in the environment runs the pure-Python twins (tidemq.compiled): run
both alternately in one session to compare the builds on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tidemq import compiled  # noqa: E402
from tidemq.broker.store.config import FlushMode, StoreConfig  # noqa: E402
from tidemq.broker.store.store import MessageStore, PutRequest  # noqa: E402

TOPIC = "FollowerApply"


def _store(root: Path, flush_interval: float) -> MessageStore:
    cfg = StoreConfig(root=root, commitlog_segment_size=256 << 20, flush_mode=FlushMode.ASYNC,
                      async_flush_interval=flush_interval, logics_flush_interval=3600.0, cleanup_interval=3600.0)
    store = MessageStore(cfg)
    store.load()
    return store


def _batches(n: int, size: int) -> list[list[PutRequest]]:
    body = os.urandom(size // 2 + 1).hex().encode()[:size]
    out = []
    for b in range(n // 64):
        out.append([PutRequest(TOPIC, b % 4, body, {"UNIQ_KEY": f"7F000001{b:012X}{j:012X}", "TAGS": "TagA"},
                               born_host=("127.0.0.1", 40000), store_host=("127.0.0.1", 10911))
                    for j in range(64)])
    return out


async def run(args: argparse.Namespace) -> int:
    build = "pure Python" if compiled.DISABLED else compiled.summary()
    print(f"build: {build}")
    print(f"{'round':<6} {'messages':>9} {'master put_batch us/msg':>24} {'follower apply us/msg':>22}")
    for rnd in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            master = _store(Path(tmp) / "m", args.flush_interval)
            follower = _store(Path(tmp) / "f", args.flush_interval)
            await master.start()
            await follower.start()
            try:
                batches = _batches(args.messages, args.size)
                c0 = time.process_time()
                for i, batch in enumerate(batches):
                    r = master.put_batch(batch)
                    if r.status.name != "PUT_OK":
                        print(f"put_batch failed: {r.status.name} {r.remark}", file=sys.stderr)
                        return 1
                    if i % 4 == 3:
                        await asyncio.sleep(0)  # the loop turns, as between requests: flushes run
                put_cpu = time.process_time() - c0
                frames = []
                at = 0
                while at < master.commitlog_max_offset:
                    at, data = master.read_commitlog(at, args.frame_bytes)
                    frames.append((at, data))
                    at += len(data)
                prof = cProfile.Profile() if args.profile and rnd == args.rounds - 1 else None
                c0 = time.process_time()
                if prof:
                    prof.enable()
                for at, data in frames:
                    follower.append_replicated(at, data)
                    await asyncio.sleep(0)  # as between frames: the flusher runs meanwhile
                if prof:
                    prof.disable()
                apply_cpu = time.process_time() - c0
                if follower.commitlog_max_offset != master.commitlog_max_offset:
                    print("the follower did not catch up", file=sys.stderr)
                    return 1
                n = len(batches) * 64
                if follower.max_offset(TOPIC, 0) != master.max_offset(TOPIC, 0):
                    print("the follower's consume queue differs from the master's", file=sys.stderr)
                    return 1
                print(f"{rnd:<6} {n:>9,} {put_cpu / n * 1e6:>24.2f} {apply_cpu / n * 1e6:>22.2f}")
                if prof:
                    out = io.StringIO()
                    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.profile)
                    print("\n".join(line for line in out.getvalue().splitlines()[6:] if line.strip()))
            finally:
                await master.shutdown()
                await follower.shutdown()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=64000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--frame-bytes", type=int, default=256 * 1024)
    ap.add_argument("--flush-interval", type=float, default=0.5,
                    help="ASYNC_FLUSH interval, s (the broker's default: pages re-dirtied after a flush cost more)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="profile the last round's apply and print the N functions with most own time")
    args = ap.parse_args()
    if args.messages < 64:
        ap.error("--messages must be at least 64")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
