"""The streaming reader's driver-side calls, made directly (no Spark query) against a real broker:
what Spark 4.0/4.1 (no read limit) and 4.2+ (admission control, AvailableNow) ask of it."""

from __future__ import annotations

import pickle

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from tests.spark.support import send
from tests.support.topics import create_topic_sync
from tidemq.spark.offsets import from_json
from tidemq.spark.options import parse_source_options
from tidemq.spark.stream import StreamReader


def reader(cluster, **options) -> StreamReader:
    opts = {"nameServers": cluster.namesrv_addr, **options}
    return StreamReader(parse_source_options(opts, streaming=True))


def total(offsets: dict) -> int:
    return sum(from_json(offsets).values())


def test_without_a_limit_latest_offset_reads_everything(cluster):
    topic = create_topic_sync(cluster, "reader-nolimit", 4)
    send(cluster, topic, 40)
    r = reader(cluster, subscribe=topic, startingOffsets="earliest")
    try:
        start = r.initialOffset()
        assert total(start) == 0
        # Spark 4.0/4.1 call latestOffset() with no arguments
        assert total(r.latestOffset()) == 40
        assert isinstance(r.getDefaultReadLimit(), ReadAllAvailable)
        assert r.reportLatestOffset() == r.latestOffset(start, ReadAllAvailable())
    finally:
        r.stop()


def test_read_limit_and_available_now_target(cluster):
    topic = create_topic_sync(cluster, "reader-limit", 2)
    send(cluster, topic, 20, queues=2)
    r = reader(cluster, subscribe=topic, startingOffsets="earliest", maxOffsetsPerTrigger="7")
    try:
        limit = r.getDefaultReadLimit()
        assert isinstance(limit, ReadMaxRows) and limit.max_rows == 7
        r.prepareForTriggerAvailableNow()
        send(cluster, topic, 20, start=100, queues=2)  # after the target: not part of this run
        start = r.initialOffset()
        seen = 0
        while True:
            end = r.latestOffset(start, limit)
            step = total(end) - total(start)
            assert 0 <= step <= 7
            if step == 0:
                break
            seen += step
            assert sum(s.end - s.start for s in (p.value for p in r.partitions(start, end))) == step
            start = end
        assert seen == 20
        assert total(r.reportLatestOffset()) == 20
    finally:
        r.stop()


def test_new_queues_join_from_offset_zero(cluster):
    topic = create_topic_sync(cluster, "reader-grow", 2)
    send(cluster, topic, 4, queues=2)
    r = reader(cluster, subscribe=topic, startingOffsets="earliest")
    try:
        start = r.latestOffset(r.initialOffset(), ReadAllAvailable())
        create_topic_sync(cluster, topic, 4)
        send(cluster, topic, 6, start=10, queue_ids=[2, 3])
        end = r.latestOffset(start, ReadAllAvailable())
        slices = sorted((p.value.queue_id, p.value.start, p.value.end) for p in r.partitions(start, end))
        assert slices == [(2, 0, 3), (3, 0, 3)]
    finally:
        r.stop()


def test_executors_get_only_the_options(cluster):
    topic = create_topic_sync(cluster, "reader-pickle", 1)
    r = reader(cluster, subscribe=topic)
    try:
        r.initialOffset()  # opens the driver-side client
        copy = pickle.loads(pickle.dumps(r))
        assert copy.opts == r.opts and copy._view is None
    finally:
        r.stop()
