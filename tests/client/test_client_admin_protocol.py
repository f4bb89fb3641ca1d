"""Admin bodies: fastjson object-key stats, lists, subscription group config, ids."""

from __future__ import annotations

import re

import orjson

from tidemq.bodies import SubscriptionGroupConfig
import pytest

from tidemq.client.admin_protocol import (
    ConsumerProgress,
    QueueProgress,
    TopicOffset,
    create_topic_request,
    parse_consume_stats,
    parse_string_list,
    parse_topic_stats,
    query_message_request,
)
from tidemq.client.ids import UniqIdGenerator, make_client_id, month_start_ms
from tidemq.client.route import MessageQueue
from tidemq.errors import CodecError
from tidemq.remoting import RequestCode, fastjson

TOPIC_STATS = (
    b'{"offsetTable":{{"brokerName":"b","queueId":1,"topic":"T"}:{"lastUpdateTimestamp":1700000000000,'
    b'"maxOffset":5,"minOffset":2},{"brokerName":"b","queueId":0,"topic":"T"}:{"minOffset":0,'
    b'"maxOffset":5,"lastUpdateTimestamp":0}}}'
)
CONSUME_STATS = (
    b'{"consumeTps":1.5,"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:{"brokerOffset":10,'
    b'"consumerOffset":4,"lastTimestamp":1700000000000},{"brokerName":"b","queueId":1,"topic":"T"}:'
    b'{"brokerOffset":3,"consumerOffset":3,"lastTimestamp":0}}}'
)


def test_topic_stats_inline_object_keys():
    assert parse_topic_stats(TOPIC_STATS) == [
        TopicOffset(MessageQueue("T", "b", 0), 0, 5, 0),
        TopicOffset(MessageQueue("T", "b", 1), 2, 5, 1700000000000),
    ]


def test_topic_stats_written_by_our_dumps_round_trip():
    key = fastjson.ObjectKey.of(brokerName="b", queueId=3, topic="T")
    body = fastjson.dumps({"offsetTable": {key: {"minOffset": 1, "maxOffset": 2, "lastUpdateTimestamp": 3}}})
    assert parse_topic_stats(body) == [TopicOffset(MessageQueue("T", "b", 3), 1, 2, 3)]


def test_stats_keys_as_json_strings_are_accepted():
    body = orjson.dumps({"offsetTable": {'{"brokerName":"b","queueId":2,"topic":"T"}': {"maxOffset": 4}}})
    assert parse_topic_stats(body) == [TopicOffset(MessageQueue("T", "b", 2), 0, 4, 0)]


def test_consume_stats_and_lag():
    queues, tps = parse_consume_stats(CONSUME_STATS)
    assert tps == 1.5
    assert queues == [
        QueueProgress(MessageQueue("T", "b", 0), 10, 4, 1700000000000),
        QueueProgress(MessageQueue("T", "b", 1), 3, 3, 0),
    ]
    progress = ConsumerProgress("g", tuple(queues), tps)
    assert progress.total_lag == 6 and len(progress) == 2
    assert [(mq.queue_id, b - c) for mq, b, c, _t in progress] == [(0, 6), (1, 0)]


@pytest.mark.parametrize(
    "body",
    [b"nope", b"[]", b'{"offsetTable":[1]}', b'{"offsetTable":{"plain":{"maxOffset":1}}}',
     b'{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:{"maxOffset":"x"}}}',
     b'{"offsetTable":{{"brokerName":"b"}:{"maxOffset":1}}}'],
)
def test_malformed_stats_raise_codec_error(body):
    with pytest.raises(CodecError):
        parse_topic_stats(body)


def test_string_lists():
    assert parse_string_list(b'{"topicList":["a","b"]}', "topicList", "x") == ["a", "b"]
    assert parse_string_list(b"", "consumerIdList", "x") == []
    assert parse_string_list(b"{}", "consumerIdList", "x") == []
    with pytest.raises(CodecError):
        parse_string_list(b'{"topicList":"a"}', "topicList", "x")


def test_subscription_group_config_body():
    body = SubscriptionGroupConfig("g", retry_max_times=3).to_json()
    assert body == {
        "groupName": "g", "consumeEnable": True, "consumeFromMinEnable": True,
        "consumeBroadcastEnable": True, "retryQueueNums": 1, "retryMaxTimes": 3, "brokerId": 0,
        "whichBrokerWhenConsumeSlowly": 1, "notifyConsumerIdsChangedEnable": True,
    }


def test_create_topic_and_query_headers():
    cmd = create_topic_request("T", 8, 4, 6, False)
    assert cmd.code == RequestCode.UPDATE_AND_CREATE_TOPIC
    assert cmd.ext_fields == {
        "topic": "T", "defaultTopic": "TBW102", "readQueueNums": "8", "writeQueueNums": "4",
        "perm": "6", "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false",
    }
    q = query_message_request("T", "k", 32, 0, 99, unique_key=True)
    assert q.code == RequestCode.QUERY_MESSAGE
    assert q.ext_fields == {"topic": "T", "key": "k", "maxNum": "32", "beginTimestamp": "0",
                            "endTimestamp": "99", "_UNIQUE_KEY_QUERY": "true"}
    assert "_UNIQUE_KEY_QUERY" not in query_message_request("T", "k", 1, 0, 1).ext_fields


# --- ids ----------------------------------------------------------------------------------------

def test_uniq_ids_are_32_upper_hex_and_unique():
    now = [1700000000.0]
    gen = UniqIdGenerator(b"\x0a\x00\x00\x05", lambda: now[0], pid=4242, start=b"\x01\x02\x03\x04")
    ids = []
    for i in range(70000):
        if i % 1000 == 0:
            now[0] += 0.001
        ids.append(gen.next_id())
    assert all(re.fullmatch(r"[0-9A-F]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)
    assert ids[0].startswith("0A000005" + "1092" + "01020304")


def test_uniq_ids_of_two_generators_differ():
    a = UniqIdGenerator(b"\x7f\0\0\1", lambda: 1700000000.0, pid=1)
    b = UniqIdGenerator(b"\x7f\0\0\1", lambda: 1700000000.0, pid=1)
    assert a.next_id() != b.next_id()


def test_uniq_id_time_is_millis_since_month_start():
    t = 1700000000.123
    start, nxt = month_start_ms(int(t * 1000))
    assert start <= t * 1000 < nxt
    gen = UniqIdGenerator(b"\0\0\0\0", lambda: t, pid=0, start=b"\0\0\0\0")
    assert int(gen.next_id()[20:28], 16) == int(t * 1000) - start


def test_client_id():
    assert make_client_id("10.0.0.1", "app") == "10.0.0.1@app"
    assert make_client_id("10.0.0.1", "DEFAULT", pid=7, nonce=9) == "10.0.0.1@7#9"
