"""Example Structured Streaming job: messages per tag in event-time windows, from a TideMQ topic.

Reads a topic with the ``tidemq`` source, counts messages per tag in tumbling windows of the
broker's store time (``storeTimestamp``) and writes each closed window either

- to Parquet files (``--output DIR``): the file sink and the checkpoint together give
  exactly-once output, a restarted job never writes a window twice; or
- to a topic (``--output-topic T``) through the ``tidemq`` sink: one message per (window, tag) with
  value = JSON ``{"window_start", "window_end", "tag", "count"}``, key = tag and tags = tag. A topic
  sink is at-least-once: a batch interrupted between its sends and its commit is sent again.

Invariants:

- Append mode with a watermark: a window is written once, when the watermark (the latest store time
  seen minus ``--watermark``) passes its end, and never updated; messages later than the watermark
  are dropped. So the newest windows are only written once later messages arrive.
- Messages without a tag are counted under the tag ``""`` (written with no key and no tags to a
  topic).
- The offsets live in the checkpoint (``--checkpoint``), never in a consumer group: restart the job
  with the same checkpoint to resume; ``--starting-offsets`` applies only to a new checkpoint.
- ``--available-now`` processes what the topic holds when the job starts and exits; otherwise the
  job runs until stopped (SIGTERM/SIGINT stop the query cleanly).
- A bad flag or a query that cannot start prints one line to stderr and exits non-zero (2 for
  flags, 1 for the query), never a traceback.

Run it locally (the ``spark`` extra installed)::

    python spark/jobs/tag_counts.py --name-servers 127.0.0.1:9876 --topic orders \
        --output /tmp/counts --checkpoint /tmp/counts-ckpt --window '1 minute' \
        --watermark '30 seconds' --starting-offsets earliest --master 'local[2]'

or with ``spark-submit`` (the master then comes from spark-submit), as the SparkApplication in
spark/manifests/ does.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
from collections.abc import Sequence
from typing import Any

log = logging.getLogger("tidemq.spark.jobs.tag_counts")

PROG = "tag_counts"
QUERY_NAME = "tag_counts"
DEFAULT_SHUFFLE_PARTITIONS = 4  # Spark's 200 makes every small micro-batch run 200 state tasks
JSON_TIMESTAMP_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSXXX"  # ISO 8601 with the zone offset
OUTPUT_COLUMNS = ("window_start", "window_end", "tag", "count")
STOP_POLL_SECONDS = 1.0  # how soon a SIGTERM/SIGINT stops the query

_INTERVAL_UNITS = ("microsecond", "millisecond", "second", "minute", "hour", "day", "week")
_UNIT = "(?:%s)s?" % "|".join(_INTERVAL_UNITS)
_INTERVAL_RE = re.compile(rf"\s*(?:interval\s+)?\d+\s+{_UNIT}(?:\s+\d+\s+{_UNIT})*\s*", re.IGNORECASE)


# -- the transformation (pure: DataFrame in, DataFrame out) -------------------------------------

def tag_counts(df: Any, window: str = "1 minute", watermark: str = "30 seconds") -> Any:
    """Messages per tag in tumbling ``window``s of ``storeTimestamp``, late data bounded by
    ``watermark``.

    ``df`` needs the columns ``storeTimestamp`` (timestamp) and ``tags`` (string), as the
    ``tidemq`` source reads them; it may be a batch DataFrame (the watermark is then ignored).
    Returns ``window_start``, ``window_end`` (timestamps), ``tag`` (string, ``""`` for untagged
    messages) and ``count`` (long).
    """
    from pyspark.sql import functions as F  # noqa: PLC0415 (pyspark is an optional extra)

    return (df.withWatermark("storeTimestamp", watermark)
            .groupBy(F.window("storeTimestamp", window).alias("w"),
                     F.coalesce(F.col("tags"), F.lit("")).alias("tag"))
            .count()
            .select(F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"),
                    F.col("tag"), F.col("count")))


def as_messages(counts: Any) -> Any:
    """The rows of :func:`tag_counts` as messages for the ``tidemq`` sink: value = JSON of the
    row, key = tags = the tag (null for the empty tag)."""
    from pyspark.sql import functions as F  # noqa: PLC0415

    tag = F.when(F.col("tag") != "", F.col("tag"))
    return counts.select(
        F.to_json(F.struct(*[F.col(c) for c in OUTPUT_COLUMNS]),
                  {"timestampFormat": JSON_TIMESTAMP_FORMAT}).alias("value"),
        tag.alias("key"),
        tag.alias("tags"))


# -- command line ---------------------------------------------------------------------------------

def _interval(text: str) -> str:
    if not _INTERVAL_RE.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an interval; use e.g. '1 minute', '30 seconds', '500 milliseconds'")
    return text.strip()


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def _name_servers(text: str) -> str:
    from tidemq.client.config import parse_name_servers  # noqa: PLC0415
    from tidemq.errors import ConfigError  # noqa: PLC0415

    try:
        parse_name_servers(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip()


def _starting_offsets(text: str) -> str:
    from tidemq.spark.options import SparkOptionError, parse_offset_spec  # noqa: PLC0415

    try:
        parse_offset_spec(text, "--starting-offsets")
    except SparkOptionError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Count the messages of a TideMQ topic per tag in event-time windows "
                    "(storeTimestamp) and write the closed windows to Parquet or to a topic.")
    src = p.add_argument_group("source")
    src.add_argument("--name-servers", required=True, type=_name_servers, metavar="ADDR[;ADDR]",
                     help="name server address(es), e.g. 127.0.0.1:9876")
    src.add_argument("--topic", required=True, help="topic to read (comma list for several)")
    src.add_argument("--starting-offsets", default="latest", type=_starting_offsets,
                     help="where a new checkpoint starts: earliest, latest (default) or JSON "
                          "{topic: {broker: {queueId: offset}}}")
    src.add_argument("--max-offsets-per-trigger", type=_positive_int, metavar="N",
                     help="at most N messages per micro-batch")
    src.add_argument("--tag-expression", default="*",
                     help="only messages whose tag matches, e.g. 'a || b' (default *)")
    src.add_argument("--consumer-group",
                     help="mirror processed offsets to this group (lag in metrics; never used to resume)")
    out = p.add_argument_group("output (exactly one)").add_mutually_exclusive_group(required=True)
    out.add_argument("--output", metavar="DIR", help="Parquet directory (exactly-once)")
    out.add_argument("--output-topic", metavar="TOPIC", help="topic for the counts (at-least-once)")
    q = p.add_argument_group("query")
    q.add_argument("--checkpoint", required=True, metavar="DIR",
                   help="checkpoint directory (offsets and window state; keep it to resume)")
    q.add_argument("--window", default="1 minute", type=_interval, help="window length (default 1 minute)")
    q.add_argument("--watermark", default="30 seconds", type=_interval,
                   help="how late a message may arrive and still count (default 30 seconds)")
    q.add_argument("--available-now", action="store_true",
                   help="process what the topic holds now, then exit (default: run until stopped)")
    q.add_argument("--trigger-interval", type=_interval, metavar="INTERVAL",
                   help="start a micro-batch at most this often (default: as soon as the last ends)")
    q.add_argument("--shuffle-partitions", type=_positive_int, metavar="N",
                   help=f"spark.sql.shuffle.partitions for a new checkpoint (default: the Spark "
                        f"config, else {DEFAULT_SHUFFLE_PARTITIONS})")
    q.add_argument("--master", help="Spark master, e.g. local[2] (default: spark-submit's)")
    q.add_argument("--log-level", default="WARN",
                   choices=["ALL", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF"],
                   help="Spark's (JVM) log level (default WARN); the job's own lines are always shown")
    return p


# -- the job ----------------------------------------------------------------------------------

def build_session(args: argparse.Namespace) -> Any:
    from pyspark.sql import SparkSession  # noqa: PLC0415

    import tidemq.spark  # noqa: PLC0415

    builder = SparkSession.builder.appName(PROG)
    if args.master:
        builder = builder.master(args.master)
        if args.master.startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            builder = (builder.config("spark.driver.bindAddress", "127.0.0.1")
                       .config("spark.driver.host", "127.0.0.1")
                       .config("spark.ui.enabled", "false"))
    # adaptive execution does not apply to streaming queries (Spark warns and turns it off); the
    # console progress bars would interleave with the job's log lines
    spark = (builder.config("spark.sql.adaptive.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel(args.log_level)
    if args.log_level not in ("ALL", "DEBUG", "INFO"):
        quiet_query_failure_log(spark)
    if args.shuffle_partitions is not None:
        spark.conf.set("spark.sql.shuffle.partitions", str(args.shuffle_partitions))
    elif not spark.sparkContext.getConf().contains("spark.sql.shuffle.partitions"):
        spark.conf.set("spark.sql.shuffle.partitions", str(DEFAULT_SHUFFLE_PARTITIONS))
    tidemq.spark.register(spark)
    return spark


# The streaming engine logs a failed query at ERROR with the whole Java and Python stack; the job
# reports the failure itself in one line, so that logger is silenced (above INFO log levels).
_QUERY_LOGGERS = ("org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution",  # 4.1+
                  "org.apache.spark.sql.execution.streaming.MicroBatchExecution")  # 4.0


def quiet_query_failure_log(spark: Any) -> None:
    try:
        jvm = spark.sparkContext._jvm
        off = jvm.org.apache.logging.log4j.Level.OFF
        for name in _QUERY_LOGGERS:
            jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, off)
    except Exception:  # noqa: BLE001 (cosmetic: a different logging backend keeps its messages)
        log.debug("could not silence the streaming engine's failure log", exc_info=True)


def source(spark: Any, args: argparse.Namespace) -> Any:
    reader = (spark.readStream.format("tidemq")
              .option("nameServers", args.name_servers)
              .option("subscribe", args.topic)
              .option("startingOffsets", args.starting_offsets)
              .option("tagExpression", args.tag_expression))
    if args.max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(args.max_offsets_per_trigger))
    if args.consumer_group:
        reader = reader.option("consumerGroup", args.consumer_group)
    return reader.load()


def start_query(spark: Any, args: argparse.Namespace) -> Any:
    counts = tag_counts(source(spark, args), args.window, args.watermark)
    if args.output:
        writer = counts.writeStream.format("parquet").option("path", args.output)
    else:
        writer = (as_messages(counts).writeStream.format("tidemq")
                  .option("nameServers", args.name_servers)
                  .option("topic", args.output_topic))
    writer = writer.queryName(QUERY_NAME).outputMode("append").option("checkpointLocation", args.checkpoint)
    if args.available_now:
        writer = writer.trigger(availableNow=True)
    elif args.trigger_interval:
        writer = writer.trigger(processingTime=args.trigger_interval)
    return writer.start()


def progress_listener() -> Any:
    """A StreamingQueryListener logging every micro-batch's input rows (to stderr)."""
    from pyspark.sql.streaming import StreamingQueryListener  # noqa: PLC0415

    class ProgressLogger(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            log.info("query %s started (run %s)", event.name or event.id, event.runId)

        def onQueryProgress(self, event: Any) -> None:
            p = event.progress
            log.info("batch %d: %d input rows (%.0f rows/s), watermark %s", p.batchId,
                     p.numInputRows, p.processedRowsPerSecond or 0.0,
                     (p.eventTime or {}).get("watermark", "-"))

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            if event.exception:
                log.debug("query %s terminated with an error", event.id)
            else:
                log.info("query %s terminated", event.id)

    return ProgressLogger()


# Lines that are a Python exception's last line ("pkg.module.SomeError: text"), as the data source's
# errors appear inside a StreamingQueryException's text, after the traceback of the Python worker.
_PY_ERROR_RE = re.compile(r"^(?:[A-Za-z_][\w]*\.)*([A-Za-z_]\w*(?:Error|Exception)): (.+)$")
_WRAPPERS = ("Py4JJavaError", "StreamingQueryException", "PythonException", "AnalysisException",
             "SparkException", "PySparkException", "IllegalArgumentException")


def one_line(exc: BaseException) -> str:
    """A one-line description of why the query failed: the innermost Python error raised by the
    data source when there is one (Spark wraps it in several layers of Java and Python text),
    else the first line of the exception's message."""
    text = str(exc)
    best = None
    for line in text.splitlines():
        m = _PY_ERROR_RE.match(line.strip())
        if m and m.group(1) not in _WRAPPERS and not line.strip().startswith(("org.", "java.", "scala.")):
            best = f"{m.group(1)}: {m.group(2).strip()}"
    if best is None:
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        best = lines[0] if lines else type(exc).__name__
    best = re.sub(r"\s+", " ", best)
    return best if len(best) <= 500 else best[:497] + "..."


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = build_session(args)
    stopping: list[int] = []

    def stop(signum: int, _frame: Any) -> None:
        # only note it: calling into the JVM from a signal handler could interleave with the
        # main thread's own py4j call; the loop below stops the query
        stopping.append(signum)

    try:
        spark.streams.addListener(progress_listener())
        query = start_query(spark, args)
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        target = args.output or f"topic {args.output_topic}"
        log.info("counting tags of %s in %s windows (watermark %s) into %s", args.topic,
                 args.window, args.watermark, target)
        while not query.awaitTermination(STOP_POLL_SECONDS):
            if stopping:
                log.info("signal %d: stopping the query", stopping[0])
                query.stop()
                break
        log.info("done: %d micro-batches", (query.lastProgress or {}).get("batchId", -1) + 1)
        return 0
    except Exception as exc:  # noqa: BLE001 (reported as one line, below)
        print(f"{PROG}: error: the query failed: {one_line(exc)}", file=sys.stderr)
        log.debug("query failure", exc_info=True)
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        try:
            spark.stop()
        except Exception:  # noqa: BLE001
            log.debug("spark.stop() failed", exc_info=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s " + PROG + ": %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.DEBUG if args.log_level in ("ALL", "DEBUG") else logging.INFO)
    log.propagate = False
    try:
        return run(args)
    except Exception as exc:  # noqa: BLE001 (the session itself could not start)
        print(f"{PROG}: error: {one_line(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
