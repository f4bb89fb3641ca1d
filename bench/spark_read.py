#!/usr/bin/env python3
"""Spark batch read of a TideMQ topic, against a from-memory Arrow ceiling and Parquet.

Starts a name server and a broker (real `tidemq` processes, ASYNC_FLUSH) on free loopback ports
with a store in a temporary directory, loads N messages of SIZE bytes into a topic of Q queues
(SEND_BATCH_MESSAGE, 256 per batch, a few batches in flight), then times with Spark `local[2]`:

  1. tidemq:  spark.read.format("tidemq").option("nameServers", ..).option("subscribe", ..)
              .load().write.format("noop").mode("overwrite").save()   (startingOffsets earliest)
  2. ceiling: the same query over a Python data source defined here that yields the same rows
              (same schema, same SIZE-byte values, same number of partitions) from memory as
              pyarrow RecordBatches of 8192 rows: the limit of any Python source on this machine;
  3. parquet: the same data written once by Spark to a temporary Parquet folder, read with
              spark.read.parquet(..).write.format("noop") (context only: a JVM reader).

Every query runs once untimed (the first Spark query of a process is 5-10x slower), then --runs
times round-robin; best and median are printed with ratios tidemq/ceiling and tidemq/parquet and
whether tidemq's median reaches the 400,000 rows/s target. The tidemq source's row count is
checked against what was loaded (exit 1 on a mismatch). MB/s counts value bytes only. Each
query's CPU per row is printed by process (Spark's JVM, its Python workers, the broker; psutil):
unlike rows/s, it holds up on a shared machine.

    python bench/spark_read.py [--messages 1000000] [--size 1024] [--queues 8] [--runs 3]
                               [--min-partitions N] [--max-pull-bytes N] [--quick] [--write]

--quick is a smoke run (100,000 messages, one timed run) that finishes in well under 90 s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.procs import Cluster  # noqa: E402 (after the sys.path insert)
from tidemq import Message  # noqa: E402 (after the sys.path insert)
from tidemq.client.route import MessageQueue  # noqa: E402 (after the sys.path insert)
from tidemq.client.sync import SyncAdmin, SyncProducer  # noqa: E402 (after the sys.path insert)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import produce_consume  # noqa: E402 (bench/ is not a package: the shared machine() line)

TARGET = 400_000  # rows/s, issue 6
TARGET_SHARE = 0.5  # of the ceiling measured in the same run, issue 19
BATCH = 256  # messages per SEND_BATCH_MESSAGE while loading
IN_FLIGHT = 4  # loader threads, one batch in flight each
ROWS_PER_BATCH = 8192  # Arrow batch size of the ceiling source (the tidemq source's too)

if TYPE_CHECKING:
    import psutil
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

try:
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
except ImportError:  # reported in main()
    DataSource = DataSourceReader = InputPartition = object  # type: ignore[misc,assignment]


class CeilingSource(DataSource):
    """``format("tidemq_ceiling")``: the tidemq schema's rows from memory, as Arrow batches.

    Options: rows, partitions, size, topic, broker. Each partition builds one template batch of
    up to 8192 rows (values of ``size`` bytes, keys, msg ids, tags, timestamps like the loaded
    messages) and yields it until its share of the rows is out, so producing a row costs nothing
    beyond handing the batch to Spark."""

    @classmethod
    def name(cls) -> str:
        return "tidemq_ceiling"

    def schema(self) -> StructType:
        from tidemq.spark.arrow import spark_schema
        return spark_schema()

    def reader(self, schema: StructType) -> CeilingReader:
        return CeilingReader(dict(self.options))


class CeilingReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.rows = int(options["rows"])
        self.parts = int(options["partitions"])
        self.size = int(options["size"])
        self.topic = options["topic"]
        self.broker = options["broker"]

    def partitions(self) -> list[InputPartition]:
        step, extra = divmod(self.rows, self.parts)
        return [InputPartition((i, step + (1 if i < extra else 0))) for i in range(self.parts)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        from tidemq.spark.arrow import arrow_schema
        qid, rows = partition.value
        n = min(ROWS_PER_BATCH, rows)
        if n == 0:
            return
        value = b"v" * self.size
        now_us = int(time.time() * 1e6)
        ts = pa.array([now_us] * n, pa.int64()).cast(pa.timestamp("us", tz="UTC"))
        template = pa.RecordBatch.from_arrays([
            pa.array([f"order-{i}".encode() for i in range(n)], pa.binary()),
            pa.array([value] * n, pa.binary()),
            pa.array([self.topic] * n, pa.string()),
            pa.array([self.broker] * n, pa.string()),
            pa.array([qid] * n, pa.int32()),
            pa.array(range(n), pa.int64()),
            pa.array([f"{qid:08X}{i:024X}" for i in range(n)], pa.string()),
            pa.array(["TagA"] * n, pa.string()),
            ts,
            ts,
            pa.array([0] * n, pa.int32()),
        ], schema=arrow_schema())
        left = rows
        while left >= n:
            yield template
            left -= n
        if left:
            yield template.slice(0, left)


class PureDecodeSource(DataSource):
    """``format("tidemq_pure")``: the tidemq source with the executor decode's pure-Python twin
    (``tidemq.spark.arrow._collect_py``/``_to_batch_py``) instead of the compiled one, so one run
    times both, alternating (issue 19). Options as for ``tidemq``."""

    @classmethod
    def name(cls) -> str:
        return "tidemq_pure"

    def schema(self) -> StructType:
        from tidemq.spark.source import TideMQDataSource
        return TideMQDataSource(self.options).schema()

    def reader(self, schema: StructType) -> DataSourceReader:
        from tidemq.spark.source import TideMQDataSource
        return PureDecodeReader(TideMQDataSource(self.options).reader(schema))


class PureDecodeReader(DataSourceReader):
    def __init__(self, inner: DataSourceReader) -> None:
        self.inner = inner

    def partitions(self) -> list[InputPartition]:
        return list(self.inner.partitions())

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # read_slice looks the decoder up in tidemq.spark.arrow per partition: point it at the
        # Python twin while this partition is read (a Python worker reads one partition at a time)
        from tidemq.spark import arrow
        chosen = arrow.Columns, arrow.collect, arrow.to_batch
        arrow.Columns, arrow.collect, arrow.to_batch = arrow._ColumnsPy, arrow._collect_py, arrow._to_batch_py
        try:
            yield from self.inner.read(partition)
        finally:
            arrow.Columns, arrow.collect, arrow.to_batch = chosen


# -- loading ----------------------------------------------------------------------------------------

def load(cluster: Cluster, topic: str, queues: int, n: int, size: int) -> float:
    """Send ``n`` messages of ``size`` bytes spread evenly over the queues; returns msg/s."""
    body = os.urandom(size // 2 + 1).hex().encode()[:size]
    broker = cluster.broker_name
    batches: list[tuple[int, int, int]] = []  # (queue, first index, count)
    for start in range(0, n, BATCH):
        batches.append((len(batches) % queues, start, min(BATCH, n - start)))
    lock = threading.Lock()
    state = {"next": 0, "sent": 0, "shown": 0}
    errors: list[BaseException] = []
    t0 = time.perf_counter()
    with SyncProducer("bench-spark-loader", name_servers=[cluster.namesrv_addr]) as producer:
        def worker() -> None:
            try:
                while True:
                    with lock:
                        if state["next"] >= len(batches) or errors:
                            return
                        q, first, count = batches[state["next"]]
                        state["next"] += 1
                    msgs = [Message(topic, body, tags="TagA", keys=f"order-{first + i}")
                            for i in range(count)]
                    producer.send_batch(msgs, queue=MessageQueue(topic, broker, q))
                    with lock:
                        state["sent"] += count
                        while state["sent"] >= state["shown"] + 100_000:
                            state["shown"] += 100_000
                            rate = state["sent"] / (time.perf_counter() - t0)
                            print(f"  loaded {state['shown']:>9,} messages ({rate:,.0f} msg/s)",
                                  file=sys.stderr)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
                errors.append(exc)

        threads = [threading.Thread(target=worker, name=f"loader-{i}") for i in range(IN_FLIGHT)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    return n / (time.perf_counter() - t0)


def queue_counts(cluster: Cluster, topic: str) -> dict[int, int]:
    with SyncAdmin(name_servers=[cluster.namesrv_addr]) as admin:
        return {s.queue.queue_id: s.max_offset - s.min_offset for s in admin.topic_status(topic)}


# -- Spark ------------------------------------------------------------------------------------------

def session(driver_memory: str) -> SparkSession:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master("local[2]").appName("tidemq-bench-spark-read")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", driver_memory)
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.driver.host", "127.0.0.1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def timed(query: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    query()
    return time.perf_counter() - t0


class CpuMeter:
    """CPU seconds of the Spark JVM, its Python workers and the broker, read around each query
    (psutil, the bench extra): per-row figures that, unlike rows/s, hold up on a shared machine."""

    def __init__(self, broker_pid: int) -> None:
        import psutil
        self._psutil = psutil
        self.broker = psutil.Process(broker_pid)
        self.jvm = next(p for p in psutil.Process().children(recursive=True) if p.name() == "java")

    def _cpu(self, proc: psutil.Process, reaped: bool) -> float:
        try:
            t = proc.cpu_times()
        except self._psutil.Error:  # a worker that exited meanwhile
            return 0.0
        # The pyspark daemon reaps the workers it forks: their CPU ends up in its children_* times
        # (a worker exiting mid-query would count whole; Spark reuses them, so none does here).
        return t.user + t.system + ((t.children_user + t.children_system) if reaped else 0.0)

    def snapshot(self) -> tuple[float, dict[int, float], float]:
        """CPU seconds so far: JVM, each Python worker (by pid), broker."""
        workers = {p.pid: self._cpu(p, True) for p in self.jvm.children(recursive=True)}
        return self._cpu(self.jvm, False), workers, self._cpu(self.broker, False)

    @staticmethod
    def spent(before: tuple[float, dict[int, float], float],
              after: tuple[float, dict[int, float], float]) -> dict[str, float]:
        return {"jvm": after[0] - before[0],
                "workers": sum(v - before[1].get(pid, 0.0) for pid, v in after[1].items()),
                "broker": after[2] - before[2]}


def machine() -> str:
    import pyspark
    return f"{produce_consume.machine()}, PySpark {pyspark.__version__}"


def write_doc(table: str, args: argparse.Namespace) -> None:
    """Insert the table at the end of the "Spark batch read" section of docs/benchmarks.md."""
    doc = ROOT / "docs" / "benchmarks.md"
    text = doc.read_text()
    head = "## Spark batch read"
    entry = (f"\n### {time.strftime('%Y-%m-%d')}: `python bench/spark_read.py --messages "
             f"{args.messages} --queues {args.queues} --runs {args.runs}"
             + ("" if args.max_pull_bytes is None else f" --max-pull-bytes {args.max_pull_bytes}")
             + "`\n\n"
             f"Machine: {machine()}.\n\n{table}\n")
    i = text.find(head)
    if i < 0:
        text = text.rstrip("\n") + f"\n\n{head}\n" + entry
    else:
        j = text.find("\n## ", i + len(head))
        j = len(text) if j < 0 else j
        text = text[:j].rstrip("\n") + "\n" + entry + text[j:]
    doc.write_text(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--runs", type=int, default=None,
                    help="timed runs of each query (default 3; 1 with --quick)")
    ap.add_argument("--partitions", "--min-partitions", dest="min_partitions", type=int,
                    default=None, help="the tidemq source's minPartitions option")
    ap.add_argument("--driver-memory", default="4g")
    ap.add_argument("--max-pull-bytes", type=int, default=None,
                    help="the broker's --max-pull-bytes (default: the broker's, 256 KiB as RocketMQ's "
                         "maxTransferBytesOnMessageInMemory); 1048576 makes ~4x fewer pulls")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run (< 90 s): 100,000 messages, 1 timed run; fixed per-query "
                         "costs dominate at that size, so its rates are not the benchmark's")
    ap.add_argument("--write", action="store_true",
                    help="append the table to the 'Spark batch read' section of docs/benchmarks.md")
    args = ap.parse_args()
    if args.quick:
        args.messages = 100_000
    if args.runs is None:
        args.runs = 1 if args.quick else 3
    if DataSource is object:
        print("pyspark is not installed: pip install -e '.[spark]'", file=sys.stderr)
        return 2
    try:
        import psutil  # noqa: F401 (the CPU columns; checked before minutes of loading)
    except ImportError:
        print("psutil is not installed: pip install -e '.[bench]'", file=sys.stderr)
        return 2

    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="tidemq-bench-spark-"))
    broker_args = [] if args.max_pull_bytes is None else ["--max-pull-bytes", str(args.max_pull_bytes)]
    cluster = Cluster(tmp, flush="async", segment_size=1024 * 1024 * 1024, extra_broker_args=broker_args)
    topic = f"bench_spark_{os.getpid()}"
    spark = None
    try:
        print(f"starting name server and broker (async flush) in {tmp} ...", file=sys.stderr)
        cluster.start()
        cluster.create_topic(topic, queues=args.queues)
        print(f"loading {args.messages:,} messages of {args.size} bytes into {topic} "
              f"({args.queues} queues, {BATCH} per batch, {IN_FLIGHT} in flight) ...", file=sys.stderr)
        load_rate = load(cluster, topic, args.queues, args.messages, args.size)
        counts = queue_counts(cluster, topic)
        loaded = sum(counts.values())
        print(f"loaded {loaded:,} messages at {load_rate:,.0f} msg/s; per queue: "
              f"{dict(sorted(counts.items()))}", file=sys.stderr)
        if loaded != args.messages:
            print(f"FAIL: the broker holds {loaded:,} messages, {args.messages:,} were sent",
                  file=sys.stderr)
            return 1

        print("starting Spark (local[2]) ...", file=sys.stderr)
        spark = session(args.driver_memory)
        from tidemq.spark import register
        register(spark)
        if __name__ != "__main__":  # imported (a test, a wrapper): workers cannot import us
            from pyspark import cloudpickle
            cloudpickle.register_pickle_by_value(sys.modules[__name__])
        spark.dataSource.register(CeilingSource)
        from tidemq.spark import arrow
        twin = arrow._c is not None  # time the pure-Python decode too, alternating with the compiled
        if twin:
            spark.dataSource.register(PureDecodeSource)

        def tidemq_df(fmt: str = "tidemq") -> DataFrame:
            r = (spark.read.format(fmt).option("nameServers", cluster.namesrv_addr)
                 .option("subscribe", topic))
            if args.min_partitions:
                r = r.option("minPartitions", str(args.min_partitions))
            return r.load()

        partitions = tidemq_df().rdd.getNumPartitions()

        def ceiling_df() -> DataFrame:
            return (spark.read.format("tidemq_ceiling").option("rows", str(args.messages))
                    .option("partitions", str(partitions)).option("size", str(args.size))
                    .option("topic", topic).option("broker", cluster.broker_name).load())

        parquet_dir = str(tmp / "parquet")
        queries = {
            "tidemq": lambda: tidemq_df().write.format("noop").mode("overwrite").save(),
            **({"pure": lambda: tidemq_df("tidemq_pure").write.format("noop").mode("overwrite").save()}
               if twin else {}),
            "ceiling": lambda: ceiling_df().write.format("noop").mode("overwrite").save(),
            "parquet": lambda: spark.read.parquet(parquet_dir).write.format("noop").mode("overwrite").save(),
        }

        # Correctness (and the first, slow, query of the process): count what the source reads.
        t0 = time.perf_counter()
        read = tidemq_df().count()
        t = time.perf_counter() - t0
        print(f"count() through the tidemq source: {read:,} rows in {t:.1f} s (first query, cold)",
              file=sys.stderr)
        if read != loaded:
            print(f"FAIL: the tidemq source read {read:,} rows, {loaded:,} were loaded",
                  file=sys.stderr)
            return 1
        t = timed(lambda: tidemq_df().write.mode("overwrite").parquet(parquet_dir))
        print(f"wrote the same rows to Parquet in {t:.1f} s ({parquet_dir})", file=sys.stderr)
        checks: list[tuple[str, Callable[[], DataFrame]]] = [
            ("ceiling", ceiling_df), ("parquet", lambda: spark.read.parquet(parquet_dir))]
        if twin:
            checks.append(("tidemq_pure", lambda: tidemq_df("tidemq_pure")))
        for name, check in checks:
            got = check().count()
            if got != loaded:
                print(f"FAIL: the {name} read has {got:,} rows, expected {loaded:,}", file=sys.stderr)
                return 1

        for name, q in queries.items():  # warm-up, untimed
            print(f"warm-up: {name} {timed(q):.2f} s", file=sys.stderr)
        times: dict[str, list[float]] = {name: [] for name in queries}
        meter = CpuMeter(cluster.broker.proc.pid)  # type: ignore[union-attr]
        cpu: dict[str, list[dict[str, float]]] = {name: [] for name in queries}
        for run in range(args.runs):  # round-robin so background load hits all alike
            for name, q in queries.items():
                before = meter.snapshot()
                times[name].append(timed(q))
                cpu[name].append(meter.spent(before, meter.snapshot()))
            print(f"run {run + 1}/{args.runs}: " + ", ".join(
                f"{name} {ts[-1]:.2f} s" for name, ts in times.items()), file=sys.stderr)
    finally:
        if spark is not None:
            spark.stop()
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    n, size = args.messages, args.size
    best = {name: n / min(ts) for name, ts in times.items()}
    median = {name: n / statistics.median(ts) for name, ts in times.items()}
    labels = {
        "tidemq": f'tidemq source, {partitions} partitions ({args.queues} queues)',
        "pure": "the same with the pure-Python decode (the compiled one's twin)",
        "ceiling": f"ceiling: Python source, Arrow batches of {ROWS_PER_BATCH} from memory",
        "parquet": "Parquet (JVM reader), context only",
    }
    lines = [
        (f"| query ({n:,} rows, {size}-byte values, local[2]) | rows/s (median of {args.runs}) | "
         f"rows/s (best) | MB/s (median) | tidemq / this (median) | "
         f"CPU us/row: JVM / Python workers / broker (median) |"),
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in queries:
        per_row = " / ".join(f"{statistics.median(c[part] for c in cpu[name]) / n * 1e6:.2f}"
                             for part in ("jvm", "workers", "broker"))
        lines.append(f"| {labels[name]} | {median[name]:,.0f} | {best[name]:,.0f} | "
                     f"{median[name] * size / 1e6:,.0f} | {median['tidemq'] / median[name]:.2f} | "
                     f"{per_row} |")
    share = median["tidemq"] / median["ceiling"]
    met = median["tidemq"] >= TARGET and share >= TARGET_SHARE
    verdict = (f"target {TARGET:,} rows/s and >= {TARGET_SHARE} of the ceiling: "
               f"{'MET' if met else 'NOT MET'} ({share:.2f} of the ceiling; "
               f"tidemq median {median['tidemq']:,.0f} rows/s, best {best['tidemq']:,.0f}; "
               + (f"compiled / pure-Python decode {median['tidemq'] / median['pure']:.2f}x; " if twin else "")
               + f"loading {load_rate:,.0f} msg/s; whole run {time.perf_counter() - started:.0f} s; "
               f"1-min load average {load_before:.1f} at start, {os.getloadavg()[0]:.1f} at end "
               f"on {os.cpu_count()} vCPU)")
    if args.quick:
        verdict += "\n(--quick smoke run: at 100,000 rows fixed per-query costs dominate; not a measurement)"
    table = "\n".join(lines) + "\n\n" + verdict
    print(table)
    if args.write:
        write_doc(table, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
