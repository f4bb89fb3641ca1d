"""The example job spark/jobs/tag_counts.py.

- ``tag_counts()`` on an in-memory DataFrame (the shared ``spark`` fixture): counts per tag and
  window, untagged messages under ``""``, and the sink's message shape (``as_messages``).
- The job run for real as ``python spark/jobs/tag_counts.py ... --available-now --master local[2]``
  against a real name server and broker (each run starts its own JVM, so there are only three):
  to Parquet (read back with pyarrow, counts per tag equal what was sent; progress lines on
  stderr), to a topic (read back with a pull consumer), and against a name server that is not
  there (one line on stderr, exit 1, no traceback).
- Watermark semantics the runs rely on: append mode writes a window only once the watermark (the
  newest store time seen minus --watermark) has passed its end. The fixture therefore sends the
  tagged messages, waits past one window, and sends one "closing" message whose later store time
  closes every earlier window; the closing message's own window stays open and must be absent.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.support.topics import create_topic_sync
from tidemq.client.sync import SyncProducer, SyncPullConsumer
from tidemq.message import Message

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "spark" / "jobs" / "tag_counts.py"
SENT = {"red": 7, "green": 4, "blue": 1}
UNTAGGED = 2
CLOSING_TAG = "closing"
WINDOW = "1 second"
JOB_TIMEOUT = 240


def load_job():
    spec = importlib.util.spec_from_file_location("tag_counts_job", JOB)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


job = load_job()


# -- the transformation, in memory ---------------------------------------------------------------

def test_tag_counts_counts_per_tag_and_window(spark) -> None:
    t0 = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
    at = lambda s: t0 + dt.timedelta(seconds=s)  # noqa: E731
    rows = [("a", at(1)), ("a", at(59)), ("b", at(30)), (None, at(10)),  # window 12:00
            ("a", at(61)), ("b", at(119)), ("b", at(90))]               # window 12:01
    df = spark.createDataFrame(rows, "tags string, storeTimestamp timestamp")
    out = job.tag_counts(df, "1 minute", "30 seconds")
    assert out.columns == list(job.OUTPUT_COLUMNS)
    got = {(r.window_start.astimezone(dt.timezone.utc).minute, r.tag): r["count"] for r in out.collect()}
    assert got == {(0, "a"): 2, (0, "b"): 1, (0, ""): 1, (1, "a"): 1, (1, "b"): 2}
    ends = {r.window_end - r.window_start for r in out.collect()}
    assert ends == {dt.timedelta(minutes=1)}

    msgs = {r.key: r for r in job.as_messages(out.where("tag in ('a', '')")).collect()}
    assert set(msgs) == {"a", None}  # the empty tag is sent with no key and no tags
    assert msgs[None].tags is None and msgs["a"].tags == "a"
    value = json.loads(msgs[None].value)
    assert value == {"window_start": "2026-01-01T12:00:00.000Z", "window_end": "2026-01-01T12:01:00.000Z",
                     "tag": "", "count": 1}


def test_bad_flags_fail_before_spark_starts() -> None:
    """argparse rejects malformed values at once (exit 2, one usage error line, no JVM)."""
    cases = [(["--name-servers", "nohost"], "--name-servers"),
             (["--window", "1m"], "--window"),
             (["--starting-offsets", "yesterday"], "--starting-offsets")]
    base = {"--name-servers": "127.0.0.1:9876", "--topic": "t", "--output": "/tmp/x", "--checkpoint": "/tmp/y"}
    for extra, flag in cases:
        argv = dict(base, **dict(zip(extra[::2], extra[1::2])))
        with pytest.raises(SystemExit) as exc:
            job.parser().parse_args([w for kv in argv.items() for w in kv])
        assert exc.value.code == 2, flag
    with pytest.raises(SystemExit):  # --output and --output-topic exclude each other
        job.parser().parse_args([*sum(base.items(), ()), "--output-topic", "counts"])
    args = job.parser().parse_args([*sum(base.items(), ())])
    assert (args.window, args.watermark, args.starting_offsets, args.available_now) == \
        ("1 minute", "30 seconds", "latest", False)


def test_one_line_picks_the_data_source_error() -> None:
    text = ("[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: error from python worker:\n"
            "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
            "tidemq.errors.ConnectError: cannot connect to 127.0.0.1:1: Connection refused\n"
            "\tat org.apache.spark.api.python.BasePythonRunner(PythonRunner.scala:1)\n")
    assert job.one_line(RuntimeError(text)) == "ConnectError: cannot connect to 127.0.0.1:1: Connection refused"
    assert job.one_line(RuntimeError("plain\nsecond")) == "plain"


# -- the job for real -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def topics(cluster) -> dict[str, str]:
    """An input topic holding SENT (+ untagged) and then, a window later, one closing message;
    an empty output topic for the counts."""
    names = {"input": "tag_counts_in", "output": "tag_counts_out"}
    create_topic_sync(cluster, names["input"], 2)
    create_topic_sync(cluster, names["output"], 2)
    with SyncProducer("tag_counts_test_pg", cluster.namesrv_addr) as producer:
        i = 0
        for tag, n in SENT.items():
            for _ in range(n):
                producer.send(Message(names["input"], f"m{i}".encode(), tags=tag))
                i += 1
        for _ in range(UNTAGGED):
            producer.send(Message(names["input"], b"untagged"))
        time.sleep(1.3)  # past the end of the last window above (--window 1 second)
        producer.send(Message(names["input"], b"closes the earlier windows", tags=CLOSING_TAG))
    return names


def run_job(cluster, tmp_path: Path, *extra: str, name_servers: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    cmd = [sys.executable, str(JOB), "--name-servers", name_servers or cluster.namesrv_addr,
           "--topic", "tag_counts_in", "--checkpoint", str(tmp_path / "ckpt"),
           "--window", WINDOW, "--watermark", "0 seconds", "--starting-offsets", "earliest",
           "--shuffle-partitions", "2", "--available-now", "--master", "local[2]", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=JOB_TIMEOUT, env=env, cwd=tmp_path)


def expected_counts() -> dict[str, int]:
    return {**SENT, "": UNTAGGED}


@pytest.mark.slow  # ~15-30 s: the default suite's 15-minute budget
def test_job_writes_parquet_counts(cluster, topics, tmp_path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    out = tmp_path / "out"
    proc = run_job(cluster, tmp_path, "--output", str(out), "--max-offsets-per-trigger", "5")
    assert proc.returncode == 0, proc.stderr[-4000:]
    table = pq.read_table(out)  # files named _* (the sink's _spark_metadata log) are skipped
    assert table.column_names == list(job.OUTPUT_COLUMNS)
    counts: Counter[str] = Counter()
    for row in table.to_pylist():
        counts[row["tag"]] += row["count"]
        assert row["window_end"] - row["window_start"] == dt.timedelta(seconds=1)
    # every tagged and untagged message exactly once; the closing message's window is still open
    assert dict(counts) == expected_counts()
    # the listener logged the micro-batches: 15 messages at most 5 per batch
    rows = [int(m.group(2)) for m in re.finditer(r"tag_counts: batch (\d+): (\d+) input rows", proc.stderr)]
    assert sum(rows) == sum(SENT.values()) + UNTAGGED + 1
    assert max(rows) <= 5


@pytest.mark.slow  # ~15-30 s: the default suite's 15-minute budget
def test_job_writes_counts_to_a_topic(cluster, topics, tmp_path) -> None:
    proc = run_job(cluster, tmp_path, "--output-topic", topics["output"])
    assert proc.returncode == 0, proc.stderr[-4000:]
    counts: Counter[str] = Counter()
    with SyncPullConsumer("tag_counts_test_cg", cluster.namesrv_addr) as consumer:
        for mq in consumer.fetch_queues(topics["output"]):
            offset, end = 0, consumer.max_offset(mq)
            while offset < end:
                result = consumer.pull(mq, offset, max_nums=32)
                for m in result.messages:
                    value = json.loads(m.body)
                    assert set(value) == set(job.OUTPUT_COLUMNS)
                    dt.datetime.fromisoformat(value["window_start"])
                    assert (m.tags or "") == value["tag"] and " ".join(m.keys) == value["tag"]
                    counts[value["tag"]] += value["count"]
                assert result.next_begin_offset > offset
                offset = result.next_begin_offset
    assert dict(counts) == expected_counts()


@pytest.mark.slow  # ~16 s (a spark-submit JVM): the default suite's 15-minute budget
def test_job_without_a_name_server_fails_in_one_line(cluster, tmp_path) -> None:
    from tests.procs import free_port  # noqa: PLC0415

    proc = run_job(cluster, tmp_path, "--output", str(tmp_path / "out"),
                   name_servers=f"127.0.0.1:{free_port()}")
    assert proc.returncode == 1, proc.stderr[-4000:]
    ours = [line for line in proc.stderr.splitlines() if line.startswith("tag_counts: error:")]
    assert len(ours) == 1, proc.stderr[-4000:]
    assert "127.0.0.1" in ours[0] or "name server" in ours[0], ours[0]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
