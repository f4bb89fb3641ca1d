"""Streaming reads with readStream.format("tidemq") against a real name server + broker."""

from __future__ import annotations

import json
import time

from tests.spark.support import rows, send
from tests.support.topics import create_topic_sync
from tests.support.waiting import wait_until_sync
from tidemq.client.sync import SyncAdmin


def stream(spark, cluster, **options):
    reader = spark.readStream.format("tidemq").option("nameServers", cluster.namesrv_addr)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def run_available_now(df, name: str, tmp_path):
    q = (df.writeStream.format("memory").queryName(name).trigger(availableNow=True)
         .option("checkpointLocation", str(tmp_path / name)).start())
    q.awaitTermination(120)
    assert q.exception() is None, q.exception()
    return q


def test_stream_picks_up_messages_sent_while_it_runs(spark, cluster, tmp_path):
    topic = create_topic_sync(cluster, "spark-stream-live", 4)
    send(cluster, topic, 20)  # before the query: not read (startingOffsets defaults to latest)
    df = stream(spark, cluster, subscribe=topic)
    q = (df.writeStream.format("memory").queryName("live").trigger(processingTime="500 milliseconds")
         .option("checkpointLocation", str(tmp_path / "ck")).start())
    try:
        wait_until_sync(lambda: q.lastProgress is not None, "the first micro-batch", timeout=60, interval=0.3)
        later = send(cluster, topic, 50, start=1000)
        wait_until_sync(lambda: spark.sql("select count(*) c from live").first().c >= 50, "50 live messages",
                        timeout=60, interval=0.3)
        time.sleep(1)  # nothing more arrives
        assert rows(spark.table("live"), "key", "value", "tags") == sorted(later)
        progress = q.lastProgress["sources"][0]
        assert progress["latestOffset"] is not None and topic in json.dumps(progress["latestOffset"])
    finally:
        q.stop()


def test_max_offsets_per_trigger_bounds_each_batch(spark, cluster, tmp_path):
    topic = create_topic_sync(cluster, "spark-stream-limit", 4)
    sent = send(cluster, topic, 100)
    df = stream(spark, cluster, subscribe=topic, startingOffsets="earliest", maxOffsetsPerTrigger="30")
    q = run_available_now(df, "limited", tmp_path)
    sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert sizes and max(sizes) <= 30 and sum(sizes) == 100 and len(sizes) >= 4
    assert rows(spark.table("limited"), "key", "value", "tags") == sorted(sent)


def test_starting_offsets_json_in_a_stream(spark, cluster, tmp_path):
    topic = create_topic_sync(cluster, "spark-stream-json", 2)
    send(cluster, topic, 20, queues=2)
    start = {topic: {"broker-a": {"0": 8, "1": -1}}}
    df = stream(spark, cluster, subscribe=topic, startingOffsets=json.dumps(start))
    run_available_now(df, "fromjson", tmp_path)
    assert rows(spark.table("fromjson"), "queueId", "queueOffset") == [(0, 8), (0, 9)]


def test_topic_growing_from_4_to_8_queues_mid_query(spark, cluster, tmp_path):
    topic = create_topic_sync(cluster, "spark-stream-grow", 4)
    first = send(cluster, topic, 40)
    df = stream(spark, cluster, subscribe=topic, startingOffsets="earliest")
    q = (df.writeStream.format("memory").queryName("grow").trigger(processingTime="500 milliseconds")
         .option("checkpointLocation", str(tmp_path / "ck")).start())
    try:
        wait_until_sync(lambda: spark.sql("select count(*) c from grow").first().c >= 40, "the first 40 messages",
                        timeout=60, interval=0.3)
        create_topic_sync(cluster, topic, 8)  # updateTopic with 8 read/write queues
        second = send(cluster, topic, 40, start=500, queue_ids=[4, 5, 6, 7])
        wait_until_sync(lambda: spark.sql("select count(*) c from grow").first().c >= 80,
                        "messages on the new queues", timeout=60, interval=0.3)
        got = spark.table("grow")
        assert rows(got, "key", "value", "tags") == sorted(first + second)
        assert {r.queueId for r in got.select("queueId").distinct().collect()} == set(range(8))
    finally:
        q.stop()


def test_consumer_group_mirrors_processed_offsets(spark, cluster, tmp_path):
    topic = create_topic_sync(cluster, "spark-stream-group", 2)
    send(cluster, topic, 40, queues=2)
    df = stream(spark, cluster, subscribe=topic, startingOffsets="earliest",
                maxOffsetsPerTrigger="10", consumerGroup="spark-lag-group")
    run_available_now(df, "mirrored", tmp_path)
    with SyncAdmin(cluster.namesrv_addr) as admin:
        progress = admin.consumer_progress("spark-lag-group")
    committed = sum(p.consumer_offset for p in progress.queues if p.queue.topic == topic)
    # Spark commits a batch when planning the next one, so the last batch is never mirrored.
    assert 0 < committed < 40
