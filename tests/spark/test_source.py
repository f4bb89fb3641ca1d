"""Batch reads with format("tidemq") against a real name server + broker and local Spark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.spark.support import rows, send
from tests.support.topics import create_topic_sync
from tidemq.client.route import MessageQueue
from tidemq.client.sync import SyncProducer, SyncPullConsumer
from tidemq.message import Message

ROOT = Path(__file__).resolve().parents[2]


def read(spark, cluster, **options):
    reader = spark.read.format("tidemq").option("nameServers", cluster.namesrv_addr)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def test_batch_read_returns_every_message_sent(spark, cluster):
    topic = create_topic_sync(cluster, "spark-batch-all", 4)
    sent = send(cluster, topic, 400)
    df = read(spark, cluster, subscribe=topic)
    assert rows(df, "key", "value", "tags") == sorted(sent)
    got = rows(df, "topic", "broker", "queueId", "queueOffset")
    assert got == sorted((topic, "broker-a", q, o) for q in range(4) for o in range(100))
    first = df.orderBy("queueId", "queueOffset").first()
    assert first.msgId and len(first.msgId) == 32 and first.reconsumeTimes == 0
    assert abs(time.time() - first.storeTimestamp.timestamp()) < 600


def test_message_ids_are_the_producers(spark, cluster):
    topic = create_topic_sync(cluster, "spark-batch-ids", 1)
    with SyncProducer("spark-ids", cluster.namesrv_addr) as p:
        ids = {p.send(Message(topic, b"v%d" % i)).msg_id for i in range(5)}
    assert {r.msgId for r in read(spark, cluster, topic=topic).collect()} == ids


def test_starting_and_ending_offsets_as_json(spark, cluster):
    topic = create_topic_sync(cluster, "spark-batch-json", 2)
    send(cluster, topic, 40, queues=2)  # 20 per queue
    start = {topic: {"broker-a": {"0": 5, "1": -2}}}
    end = {topic: {"broker-a": {"0": 15, "1": -1}}}
    df = read(spark, cluster, subscribe=topic, startingOffsets=json.dumps(start),
              endingOffsets=json.dumps(end))
    got = rows(df, "queueId", "queueOffset")
    assert got == sorted([(0, o) for o in range(5, 15)] + [(1, o) for o in range(20)])


def test_offsets_past_a_queues_end_name_the_end_and_latest(spark, cluster):
    """Issue 15: endingOffsets 1000 on a queue holding 31 messages failed in a task with "the
    broker has no messages at 31 ...; was the topic deleted and recreated?"."""
    topic = create_topic_sync(cluster, "spark-batch-past-end", 1)
    send(cluster, topic, 31, queues=1)
    with pytest.raises(Exception) as info:
        read(spark, cluster, subscribe=topic,
             endingOffsets=json.dumps({topic: {"broker-a": {"0": 1000}}})).collect()
    text = str(info.value)
    assert f"endingOffsets asks for offset 1000 of {topic}/broker-a/0, which ends at 31" in text
    assert 'endingOffsets "latest"' in text and "deleted and recreated" not in text
    with pytest.raises(Exception) as info:
        read(spark, cluster, subscribe=topic,
             startingOffsets=json.dumps({topic: {"broker-a": {"0": 40}}})).collect()
    text = str(info.value)
    assert f"startingOffsets asks for offset 40 of {topic}/broker-a/0, which ends at 31" in text
    assert "lie before" not in text
    at_end = read(spark, cluster, subscribe=topic,
                  endingOffsets=json.dumps({topic: {"broker-a": {"0": 31}}}))
    assert at_end.count() == 31 == read(spark, cluster, subscribe=topic, endingOffsets="latest").count()


def test_starting_offsets_latest_is_refused_for_batch(spark, cluster):
    topic = create_topic_sync(cluster, "spark-batch-latest", 1)
    with pytest.raises(Exception, match="'latest' is not allowed"):
        read(spark, cluster, subscribe=topic, startingOffsets="latest").collect()


def test_starting_timestamp_skips_older_messages(spark, cluster):
    topic = create_topic_sync(cluster, "spark-batch-ts", 2)
    send(cluster, topic, 10, queues=2)
    time.sleep(0.05)
    cut = int(time.time() * 1000)
    time.sleep(0.05)
    later = send(cluster, topic, 10, start=100, queues=2)
    df = read(spark, cluster, subscribe=topic, startingTimestamp=str(cut))
    assert rows(df, "key", "value", "tags") == sorted(later)


def test_assign_pattern_and_tag_expression(spark, cluster):
    a = create_topic_sync(cluster, "spark-pat-a", 2)
    b = create_topic_sync(cluster, "spark-pat-b", 2)
    send(cluster, a, 20, queues=2)
    send(cluster, b, 20, queues=2)
    by_pattern = read(spark, cluster, subscribePattern="spark-pat-.*")
    assert {r.topic for r in by_pattern.select("topic").distinct().collect()} == {a, b}
    assert by_pattern.count() == 40
    assigned = read(spark, cluster, assign=json.dumps({a: {"broker-a": [1]}}))
    assert rows(assigned, "topic", "queueId") == [(a, 1)] * 10
    odd = read(spark, cluster, subscribe=f"{a},{b}", tagExpression="odd")
    assert odd.count() == 20 and {r.tags for r in odd.collect()} == {"odd"}


def test_include_properties_adds_the_property_map(spark, cluster):
    topic = create_topic_sync(cluster, "spark-batch-props", 1)
    send(cluster, topic, 3, queues=1, region="eu", source="test")
    df = read(spark, cluster, subscribe=topic, includeProperties="true")
    assert "properties" in df.columns and "properties" not in read(spark, cluster, subscribe=topic).columns
    for r in df.collect():
        assert r.properties["region"] == "eu" and r.properties["source"] == "test"
        assert r.properties["TAGS"] == r.tags


def test_empty_topic_reads_no_rows(spark, cluster):
    topic = create_topic_sync(cluster, "spark-batch-empty", 2)
    assert read(spark, cluster, subscribe=topic).count() == 0


def test_min_partitions_splits_queues_without_losing_rows(spark, cluster):
    topic = create_topic_sync(cluster, "spark-batch-split", 1)
    sent = send(cluster, topic, 100, queues=1)
    df = read(spark, cluster, subscribe=topic, minPartitions="4")
    assert df.rdd.getNumPartitions() == 4
    assert rows(df, "key", "value", "tags") == sorted(sent)


@pytest.mark.parametrize("options, text", [
    ({}, "exactly one of the options subscribe"),
    ({"subscribe": "x", "bogusOption": "1"}, "unknown option(s) for the tidemq source: bogusoption"),
    ({"subscribe": "spark-no-such-topic"}, "cannot read topic spark-no-such-topic"),
    ({"subscribe": "x", "startingOffsets": "{oops"}, "option startingOffsets is not valid JSON"),
])
def test_bad_options_fail_with_a_clear_message(spark, cluster, options, text):
    with pytest.raises(Exception) as info:
        read(spark, cluster, **options).collect()
    assert text in str(info.value)


def test_user_schema_is_refused(spark, cluster):
    with pytest.raises(Exception, match="fixed schema"):
        (spark.read.format("tidemq").schema("value binary").option("nameServers", cluster.namesrv_addr)
         .option("subscribe", "x").load().collect())


def test_fail_on_data_loss(spark, cluster_factory):
    c = cluster_factory(segment_size=65536, extra_broker_args=[
        "--retention-hours", "0.0003", "--delete-when", "*", "--cleanup-interval", "0.2"])
    topic = create_topic_sync(c, "spark-loss", 1)
    with SyncProducer("spark-loss", c.namesrv_addr) as p:
        for i in range(300):  # ~1 KiB each: several 64 KiB segments, all but the last expire
            p.send(Message(topic, b"%04d" % i + b"x" * 1000))
    deadline = time.monotonic() + 20
    while True:
        first = read(spark, c, subscribe=topic, failOnDataLoss="false")
        kept = first.count()
        if kept < 300:
            break
        assert time.monotonic() < deadline, "retention never removed a segment"
        time.sleep(0.3)
    # Retention may still be deleting expired segments; let it finish (the min offset unchanged
    # over two polls 1 s apart) so the final read does not race a deletion.
    with SyncPullConsumer("spark-loss-probe", c.namesrv_addr) as probe:
        mq = MessageQueue(topic, "broker-a", 0)
        deadline = time.monotonic() + 30
        previous = probe.min_offset(mq)
        while True:
            time.sleep(1.0)
            current = probe.min_offset(mq)
            if current == previous and current > 0:
                break
            assert time.monotonic() < deadline, f"retention never settled: min offset {current}"
            previous = current
    with pytest.raises(Exception) as info:
        read(spark, c, subscribe=topic, startingOffsets=json.dumps({topic: {"broker-a": {"0": 0}}})).count()
    assert "failOnDataLoss" in str(info.value) and "no longer available" in str(info.value)
    skipped = read(spark, c, subscribe=topic, failOnDataLoss="false",
                   startingOffsets=json.dumps({topic: {"broker-a": {"0": 0}}}))
    offsets = [r.queueOffset for r in skipped.collect()]
    assert offsets and min(offsets) > 0 and sorted(offsets) == list(range(min(offsets), 300))


@pytest.mark.slow  # ~15-30 s: the default suite's 15-minute budget
def test_format_resolves_without_register_through_pyspark_tidemq(cluster, tmp_path):
    """Spark finds top-level `pyspark_*` modules on the Python path (a fresh process: the lookup
    runs once per JVM)."""
    topic = create_topic_sync(cluster, "spark-discovery", 1)
    send(cluster, topic, 7, queues=1)
    script = (
        "from pyspark.sql import SparkSession\n"
        "spark = (SparkSession.builder.master('local[1]').config('spark.ui.enabled', 'false')"
        ".config('spark.driver.host', '127.0.0.1').config('spark.driver.bindAddress', '127.0.0.1')"
        ".getOrCreate())\n"
        f"n = spark.read.format('tidemq').option('nameServers', '{cluster.namesrv_addr}')"
        f".option('subscribe', '{topic}').load().count()\n"
        "print('COUNT', n)\n"
        "spark.stop()\n")
    # The wheel installs pyspark_tidemq at the top level; an editable install maps it with an
    # import hook, which Spark's path scan (pkgutil.iter_modules) does not see, so the test puts
    # its folder on the path (as dev.py's .pth does for the venv).
    env = dict(os.environ, PYTHONPATH=str(ROOT / "spark" / "discovery"),
               PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=180)
    assert "COUNT 7" in r.stdout, r.stderr[-3000:]
