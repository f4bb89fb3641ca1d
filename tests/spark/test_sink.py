"""The tidemq sink: batch and streaming writes against a real name server and broker.

Messages are read back with the pull consumer (every queue from 0 to its max offset) and compared
exactly; driver-side mistakes must fail the write with a sentence saying what to do.
"""

from __future__ import annotations

import json
import socket
import uuid

import pytest
from pyspark.sql import Row

from tests.support.topics import create_topic_sync
from tidemq.client.sync import SyncPullConsumer
from tidemq.message import MessageExt
from tidemq.spark.options import SinkOptions
from tidemq.spark.sink import RESERVED_PROPERTIES, ROWS_PER_CHUNK, SinkError, _Task, write_rows


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def read_all(cluster, topic: str) -> list[MessageExt]:
    """Every message of ``topic``, pulling each queue from 0 to its max offset."""
    out: list[MessageExt] = []
    with SyncPullConsumer("sink-test-reader", cluster.namesrv_addr) as consumer:
        for mq in consumer.fetch_queues(topic):
            end, offset = consumer.max_offset(mq), 0
            while offset < end:
                result = consumer.pull(mq, offset, 256)
                assert result.messages, f"pull of {mq} at {offset} (max {end}) found nothing"
                out.extend(result.messages)
                offset = result.next_begin_offset
    return out


def user_props(msg: MessageExt) -> dict[str, str]:
    return {k: v for k, v in msg.properties.items() if k not in RESERVED_PROPERTIES}


def as_set(msgs: list[MessageExt]) -> set:
    return {(m.properties.get("KEYS"), m.tags, m.body, tuple(sorted(user_props(m).items())))
            for m in msgs}


def writer(df, cluster, **options):
    w = df.write.format("tidemq").mode("append").option("nameServers", cluster.namesrv_addr)
    for k, v in options.items():
        w = w.option(k, v)
    return w


# round trips ------------------------------------------------------------------------------------


def test_batch_write_round_trips_value_key_tags_and_properties(spark, cluster):
    topic = _topic("sink-rt")
    create_topic_sync(cluster, topic, 4)
    rows = [(f"body-{i}", f"key-{i}", f"tag{i % 3}", {"color": f"c{i % 5}", "n": str(i)})
            for i in range(300)]
    rows.append(("no key, no tag, no props", None, None, None))
    df = spark.createDataFrame(rows, "value string, key string, tags string, "
                                     "properties map<string,string>")
    writer(df, cluster, topic=topic, sendBatchSize="50").save()

    got = read_all(cluster, topic)
    expected = {(k, t, v.encode(), tuple(sorted((p or {}).items()))) for v, k, t, p in rows}
    assert len(got) == len(rows)
    assert as_set(got) == expected
    assert len({m.queue_id for m in got}) > 1  # batches spread over the queues


def test_binary_values_and_topic_from_column_or_option(spark, cluster):
    a, b, override = _topic("sink-a"), _topic("sink-b"), _topic("sink-o")
    for t in (a, b, override):
        create_topic_sync(cluster, t, 2)
    rows = [(bytes([i, 0, 255, i]), bytes(f"k{i}", "ascii"), a if i % 2 else b) for i in range(40)]
    df = spark.createDataFrame(rows, "value binary, key binary, topic string")

    writer(df, cluster).save()
    in_a, in_b = read_all(cluster, a), read_all(cluster, b)
    assert {m.body for m in in_a} == {v for v, _, t in rows if t == a}
    assert {m.body for m in in_b} == {v for v, _, t in rows if t == b}
    assert {m.properties["KEYS"] for m in in_a + in_b} == {f"k{i}" for i in range(40)}

    writer(df, cluster, topic=override).save()  # the option wins over the column
    assert {m.body for m in read_all(cluster, override)} == {v for v, _, _ in rows}
    assert len(read_all(cluster, a)) == 20 and len(read_all(cluster, b)) == 20


def test_queue_id_column_picks_the_queue(spark, cluster):
    topic = _topic("sink-q")
    create_topic_sync(cluster, topic, 3)
    df = spark.createDataFrame([(f"m{i}", i % 3) for i in range(30)], "value string, queueId int")
    writer(df, cluster, topic=topic).save()
    got = read_all(cluster, topic)
    assert {(m.body.decode(), m.queue_id) for m in got} == {(f"m{i}", i % 3) for i in range(30)}

    bad = spark.createDataFrame([("x", 7)], "value string, queueId int")
    with pytest.raises(Exception) as info:
        writer(bad, cluster, topic=topic).save()
    assert f"queueId 7 is out of range: topic {topic} has 3 publish queue(s)" in str(info.value)


def test_streaming_write_from_json_files(spark, cluster, tmp_path):
    topic = _topic("sink-stream")
    create_topic_sync(cluster, topic, 2)
    src = tmp_path / "in"
    src.mkdir()
    for f in range(3):
        lines = [json.dumps({"value": f"f{f}-{i}", "key": f"k{f}-{i}", "tags": "s"})
                 for i in range(50)]
        (src / f"part-{f}.json").write_text("\n".join(lines) + "\n")
    stream = spark.readStream.schema("value string, key string, tags string").json(str(src))
    query = (stream.writeStream.format("tidemq")
             .option("nameServers", cluster.namesrv_addr).option("topic", topic)
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(60), "the availableNow query did not finish in 60 s"
    finally:
        query.stop()
    assert query.exception() is None
    got = read_all(cluster, topic)
    assert len(got) == 150
    assert {(m.body.decode(), m.properties["KEYS"], m.tags) for m in got} == {
        (f"f{f}-{i}", f"k{f}-{i}", "s") for f in range(3) for i in range(50)}


# failures ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("ddl", "mode", "options", "sentence"), [
    ("key string", "append", {"topic": "t"}, "the tidemq sink needs a 'value' column"),
    ("value string", "overwrite", {"topic": "t"}, "the tidemq sink only appends"),
    ("value string, vaule string", "append", {"topic": "t"},
     "the tidemq sink does not know the column(s) 'vaule'; it accepts value (string or binary)"),
    ("value string", "append", {}, "the tidemq sink needs a destination topic"),
    ("value int", "append", {"topic": "t"}, "column 'value' of the tidemq sink must be string or "
                                            "binary, not int"),
])
def test_driver_side_mistakes_fail_the_write_with_a_sentence(spark, cluster, ddl, mode, options,
                                                             sentence):
    df = spark.createDataFrame([], ddl)
    w = df.write.format("tidemq").mode(mode).option("nameServers", cluster.namesrv_addr)
    for k, v in options.items():
        w = w.option(k, v)
    with pytest.raises(Exception) as info:
        w.save()
    assert sentence in str(info.value)


def test_unreachable_name_server_fails_the_job(spark):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        addr = f"127.0.0.1:{s.getsockname()[1]}"
    df = spark.createDataFrame([("v",)], "value string").coalesce(1)
    with pytest.raises(Exception) as info:
        (df.write.format("tidemq").mode("append").option("nameServers", addr)
         .option("topic", "nowhere").option("sendTimeoutMs", "2000").save())
    text = str(info.value)
    assert "tidemq sink: sending to topic nowhere failed (this task had sent no message yet)" in text
    assert addr in text


# row checks on the executor side (pure: no Spark job, nothing is sent) -------------------------


@pytest.mark.parametrize(("value", "props", "topic", "sentence"), [
    (None, None, "t", "row 1 of this task has a null value"),
    ("", None, "t", "row 1 of this task cannot be sent: message body is empty"),
    ("v", {"DELAY": "3"}, "t", "row 1 of this task has property 'DELAY', a name RocketMQ reserves"),
    ("v", {"a": "x\x01y"}, "t", "contains a control character \\x01 or \\x02"),
    ("v", [("a", None)], "t", "has property 'a' with a null or empty value"),
    ("v", None, None, "row 1 of this task has a null topic and the option topic is not set"),
    ("v", None, "bad topic!", "row 1 of this task cannot be sent: topic 'bad topic!' contains "
                              "illegal characters"),
])
def test_bad_rows_fail_with_their_position(value, props, topic, sentence):
    task = _Task(SinkOptions(name_servers=("127.0.0.1:1",)),
                 {"value": "value", "properties": "properties", "topic": "topic"})
    with pytest.raises(SinkError) as info:
        task.add_columns({"value": ["ok", value], "properties": [None, props],
                          "topic": ["t", topic]}, 2)
    assert sentence in str(info.value)
    assert "this task had sent no message yet" in str(info.value)


def test_row_path_gathers_rows_into_columns_and_counts_positions_across_chunks():
    rows = [Row(value=f"v{i}", topic="t") for i in range(ROWS_PER_CHUNK + 10)]
    rows[ROWS_PER_CHUNK + 5] = Row(value=None, topic="t")
    opts = SinkOptions(name_servers=("127.0.0.1:1",), send_batch_size=100_000)
    with pytest.raises(SinkError) as info:
        write_rows(opts, {"value": "value", "topic": "topic"}, iter(rows))
    assert f"row {ROWS_PER_CHUNK + 5} of this task has a null value" in str(info.value)
