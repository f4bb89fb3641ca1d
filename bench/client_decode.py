#!/usr/bin/env python3
"""The client's codecs, compiled twin against pure-Python twin, in one process (issue 19).

Builds pull bodies as a broker sends them (stored records back to back: SIZE-byte bodies, TAGS,
KEYS, UNIQ_KEY and WAIT properties, IPv4 hosts) and times, per message, CPU time
(``time.process_time``) of:

  decode   tidemq.message.decode_records with a pull's MIN_OFFSET/MAX_OFFSET extra properties
           (what every PullConsumer/PushConsumer pull pays), then reading body and queue offset;
           and the same followed by a tag subscription's filter (every message's properties parsed);
  encode   tidemq.message.encode_batch of 64 elements (a SEND_BATCH_MESSAGE body), and
           encode_properties of a sent message's four properties (every send);
  spark    tidemq.spark.arrow collect + to_batch into Arrow batches of 8192 rows (the Spark
           executor's decode; skipped without pyarrow).

Each workload alternates the two twins round by round (``--rounds``, default 15), so background
load hits both alike, and prints the median of each and their ratio. The compiled twins must be
built (``python setup.py build_ext --inplace``) and not disabled (TIDEMQ_NO_EXTENSIONS).

    python bench/client_decode.py [--size 1024] [--per-pull 215] [--rounds 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tidemq import message  # noqa: E402 (after the sys.path insert)
from tidemq.client.pull import filter_by_tags  # noqa: E402
from tidemq.message import encode_properties, encode_record  # noqa: E402

TARGET_DECODE_US = 1.0  # issue 19: client decode <= 1 us per message


def pull_body(n: int, size: int, first: int = 0) -> bytes:
    body = os.urandom(size // 2 + 1).hex().encode()[:size]
    out = []
    for i in range(first, first + n):
        props = encode_properties({"TAGS": "TagA", "KEYS": f"order-{i}",
                                   "UNIQ_KEY": f"7F00000100002A9F{i:016X}", "WAIT": "true"})
        out.append(encode_record(
            topic=b"bench_topic", body=body, properties=props.encode(), queue_id=3, flag=0,
            queue_offset=i, physical_offset=10**9 + i * (size + 200), sys_flag=0,
            born_timestamp=1_700_000_000_000 + i, born_host=b"\x7f\x00\x00\x01", born_port=50123,
            store_timestamp=1_700_000_000_100 + i, store_host=b"\x7f\x00\x00\x01", store_port=10911))
    return b"".join(out)


def per_message(fn: Callable[[], object], messages: int, min_seconds: float = 0.2) -> float:
    """CPU microseconds per message of ``fn`` (which handles ``messages``), repeated to at least
    ``min_seconds``."""
    loops = 0
    t0 = time.process_time()
    while True:
        fn()
        loops += 1
        spent = time.process_time() - t0
        if spent >= min_seconds:
            return spent / (loops * messages) * 1e6


def compare(name: str, py: Callable[[], object], c: Callable[[], object], messages: int,
            rounds: int) -> tuple[float, float]:
    py_us: list[float] = []
    c_us: list[float] = []
    for _ in range(rounds):  # alternate, so load hits both alike
        py_us.append(per_message(py, messages))
        c_us.append(per_message(c, messages))
    p, k = statistics.median(py_us), statistics.median(c_us)
    print(f"| {name} | {p:.3f} ({min(py_us):.3f}-{max(py_us):.3f}) | {k:.3f} ({min(c_us):.3f}-{max(c_us):.3f}) "
          f"| {p / k:.1f}x |")
    return p, k


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=1024, help="body bytes per message")
    ap.add_argument("--per-pull", type=int, default=215,
                    help="messages per pull body (a broker's 256 KiB pull holds ~215 of 1 KiB)")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    compiled = message._c
    if compiled is None:
        print("the compiled codecs are not loaded (TIDEMQ_NO_EXTENSIONS set, or not built: "
              "`python setup.py build_ext --inplace`): nothing to compare", file=sys.stderr)
        return 2
    body = pull_body(args.per_pull, args.size)
    extra = {"MIN_OFFSET": "0", "MAX_OFFSET": "125000"}

    def decoding(decode: Callable[..., list[message.MessageExt]]) -> Callable[[], object]:
        def run() -> object:
            return [(m.body, m.queue_offset) for m in decode(body, extra_properties=extra)]
        return run

    load = os.getloadavg()[0]
    print(f"{args.per_pull} messages of {args.size} bytes per pull body; CPU us per message, "
          f"median (range) of {args.rounds} alternating rounds; 1-min load {load:.1f} at start\n")
    print("| workload | pure Python | compiled | speed-up |")
    print("|---|---:|---:|---:|")
    _, dec = compare("decode_records (pull body -> MessageExt)", decoding(message._decode_records_py),
                     decoding(compiled.decode_records), args.per_pull, args.rounds)
    tags = frozenset({"TagA"})

    def filtering(decode: Callable[..., list[message.MessageExt]],
                  properties: Callable[[str | bytes | memoryview], dict[str, str]]) -> Callable[[], object]:
        def run() -> object:
            # MessageExt parses its properties with tidemq.message.decode_properties: point it at
            # the twin being timed for the run
            chosen = message.decode_properties
            message.decode_properties = properties  # type: ignore[assignment]
            try:
                return filter_by_tags(decode(body, extra_properties=extra), tags)
            finally:
                message.decode_properties = chosen
        return run

    compare("decode_records + tag filter (a TagA subscription)",
            filtering(message._decode_records_py, message._decode_properties_py),
            filtering(compiled.decode_records, compiled.decode_properties), args.per_pull, args.rounds)
    items = [(0, m.body, encode_properties(m.properties))
             for m in message._decode_records_py(pull_body(64, args.size))]
    compare("encode_batch (64 elements)", lambda: message._encode_batch_py(items),
            lambda: compiled.encode_batch(items), 64, args.rounds)
    props = {"TAGS": "TagA", "KEYS": "order-1", "UNIQ_KEY": "7F00000100002A9F0000000000000001",
             "WAIT": "true"}
    calls = range(1000)
    compare("encode_properties (4 properties, per call)",
            lambda: [message._encode_properties_py(props) for _ in calls],
            lambda: [compiled.encode_properties(props) for _ in calls], len(calls), args.rounds)
    try:
        from tidemq.spark import arrow  # noqa: PLC0415 (optional: needs pyarrow and pyspark)
    except ImportError:
        print("(spark row skipped: pyarrow/pyspark not installed)")
    else:
        if arrow._c is not None:
            pulls = 8192 // args.per_pull + 1

            def spark(columns: Callable[..., object], collect: Callable[..., int],
                      to_batch: Callable[..., object]) -> Callable[[], object]:
                def run() -> object:
                    cols = columns(props=None)
                    for _ in range(pulls):
                        collect(body, cols, 2**62, None)
                    return to_batch(cols, "bench_topic", "broker-a", 3)
                return run
            compare("Spark collect + to_batch (Arrow)",
                    spark(arrow._ColumnsPy, arrow._collect_py, arrow._to_batch_py),
                    spark(arrow._c.Columns, arrow._c.collect, arrow._to_batch_c),
                    pulls * args.per_pull, args.rounds)
    print(f"\nclient decode target <= {TARGET_DECODE_US} us per message: "
          f"{'met' if dec <= TARGET_DECODE_US else 'NOT MET'} ({dec:.3f} us compiled); "
          f"1-min load {os.getloadavg()[0]:.1f} at end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
