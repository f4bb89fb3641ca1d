"""Pure wire builders of the push consumer, retry-message rewrites, allocation by circle,
settings validation."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.client.push.test_push_process_queue import msg
from tidemq.client import LitePullConsumer, PushConsumer
from tidemq.client.allocate import AllocateMessageQueueAveragelyByCircle, allocate_averagely_by_circle
from tidemq.client.push import protocol
from tidemq.client.push.blocking import SyncPushConsumer
from tidemq.client.push.settings import LitePullSettings, PushSettings
from tidemq.client.route import MessageQueue
from tidemq.errors import CodecError, ConfigError
from tidemq.message import Prop
from tidemq.remoting import RequestCode

MQ = MessageQueue("T", "broker-a", 3)


def test_offset_and_list_requests():
    q = protocol.build_query_offset("g", MQ)
    assert q.code == RequestCode.QUERY_CONSUMER_OFFSET
    assert q.ext_fields == {"consumerGroup": "g", "topic": "T", "queueId": "3"}
    u = protocol.build_update_offset("g", MQ, 42, oneway=True)
    assert u.code == RequestCode.UPDATE_CONSUMER_OFFSET and u.is_oneway
    assert u.ext_fields["commitOffset"] == "42"
    s = protocol.build_offset_request(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, MQ, timestamp=7)
    assert s.ext_fields == {"topic": "T", "queueId": "3", "timestamp": "7"}
    assert protocol.build_consumer_list("g").ext_fields == {"consumerGroup": "g"}
    assert protocol.parse_consumer_list(b'{"consumerIdList":["b","a","b"]}') == ["a", "b"]
    with pytest.raises(CodecError):
        protocol.parse_consumer_list(b'{"x":1}')
    with pytest.raises(CodecError):
        protocol.parse_consumer_list(b"{not json")


def test_lock_bodies_round_trip():
    cmd = protocol.build_lock_batch("g", "cid", [MQ, MessageQueue("T", "broker-a", 1)])
    body = orjson.loads(cmd.body_bytes())
    assert cmd.code == RequestCode.LOCK_BATCH_MQ
    assert body["consumerGroup"] == "g" and body["clientId"] == "cid"
    assert [m["queueId"] for m in body["mqSet"]] == [1, 3]
    answer = orjson.dumps({"lockOKMQSet": body["mqSet"][:1]})
    assert protocol.parse_lock_result(answer) == {MessageQueue("T", "broker-a", 1)}
    assert protocol.parse_lock_result(b"{}") == set()
    with pytest.raises(CodecError):
        protocol.parse_lock_result(b'{"lockOKMQSet":[{"topic":"T"}]}')
    unlock = protocol.build_unlock_batch("g", "cid", [MQ], oneway=True)
    assert unlock.code == RequestCode.UNLOCK_BATCH_MQ and unlock.is_oneway


@given(st.binary(max_size=200))
def test_lock_answer_parser_only_raises_codec_errors(data):
    try:
        protocol.parse_lock_result(data)
    except CodecError:
        pass


def test_send_back_header():
    m = msg(5)
    m.properties[Prop.UNIQ_KEY] = "U1"
    cmd = protocol.build_send_back(m, "g", 0, 16)
    assert cmd.code == RequestCode.CONSUMER_SEND_MSG_BACK
    assert cmd.ext_fields == {"offset": "500", "group": "g", "delayLevel": "0", "originMsgId": "U1",
                              "originTopic": "T", "unitMode": "false", "maxReconsumeTimes": "16"}


def test_retry_message_carries_the_retry_bookkeeping():
    m = msg(5)
    m.reconsume_times = 2
    m.properties.update({Prop.UNIQ_KEY: "U1", Prop.TAGS: "A", Prop.MIN_OFFSET: "0", "k": "v"})
    r = protocol.build_retry_message(m, "g", 16)
    assert r.topic == "%RETRY%g" and r.body == m.body
    p = r.properties
    assert p[Prop.RETRY_TOPIC] == "T" and p[Prop.ORIGIN_MESSAGE_ID] == "U1"
    assert p["RECONSUME_TIME"] == "3" and p[Prop.DELAY] == "5" and p[Prop.MAX_RECONSUME_TIMES] == "16"
    assert p[Prop.TAGS] == "A" and p["k"] == "v" and Prop.MIN_OFFSET not in p
    # a message that was already retried keeps its first id and real topic
    m.properties[Prop.ORIGIN_MESSAGE_ID] = "U0"
    m.properties[Prop.RETRY_TOPIC] = "Real"
    r2 = protocol.build_retry_message(m, "g", 16)
    assert r2.properties[Prop.ORIGIN_MESSAGE_ID] == "U0" and r2.properties[Prop.RETRY_TOPIC] == "Real"


def test_reset_retry_topic_only_touches_the_groups_retry_topic():
    a, b, c = msg(1), msg(2), msg(3)
    a.topic, a.properties[Prop.RETRY_TOPIC] = "%RETRY%g", "Real"
    b.topic, b.properties[Prop.RETRY_TOPIC] = "%RETRY%other", "Real"
    protocol.reset_retry_topic([a, b, c], "g")
    assert (a.topic, b.topic, c.topic) == ("Real", "%RETRY%other", "T")


@pytest.mark.parametrize("n", range(0, 12))
@pytest.mark.parametrize("m", range(1, 5))
def test_allocate_by_circle_deals_queues_round_robin(n, m):
    ids = [f"c{i}" for i in range(m)]
    shares = [allocate_averagely_by_circle(list(range(n)), ids, cid) for cid in ids]
    assert sorted(q for s in shares for q in s) == list(range(n))
    for i, share in enumerate(shares):
        assert share == list(range(i, n, m))
    assert allocate_averagely_by_circle([1, 2], ids, "stranger") == []
    assert AllocateMessageQueueAveragelyByCircle is allocate_averagely_by_circle


@pytest.mark.parametrize("kw", [
    {"pull_batch_size": 0}, {"pull_batch_size": 5000}, {"consume_batch_max_size": 0},
    {"pull_threshold_for_queue": 0}, {"consume_concurrency": 0}, {"rebalance_interval": 0},
    {"persist_interval": -1}, {"suspend_ms": -1}, {"message_model": "CLUSTERING"},
    {"consume_from": "LAST"}, {"pull_batch_size": True}, {"consume_timestamp": -5},
    {"lock_interval": 30.0},
])
def test_settings_refuse_nonsense(kw):
    with pytest.raises(ConfigError):
        PushSettings.make(**kw)


@pytest.mark.parametrize("kw", [
    {"pull_batch_size": 0}, {"pull_threshold_for_all": 0}, {"consume_max_span": 0},
    {"auto_commit_interval": 0}, {"poll_timeout": -1}, {"suspend_ms": 70_000},
    {"consume_from": None},
])
def test_lite_pull_settings_refuse_nonsense(kw):
    with pytest.raises(ConfigError):
        LitePullSettings.make(**kw)
    assert LitePullSettings().pull_batch_size == 10


def test_consumers_take_a_settings_object_and_its_fields_by_name():
    c = PushConsumer("g", "127.0.0.1:9876", settings=PushSettings(orderly=True, pull_batch_size=8),
                     pull_batch_size=64, allocate_strategy=allocate_averagely_by_circle)
    assert c.settings == PushSettings(orderly=True, pull_batch_size=64,
                                      allocate_strategy=allocate_averagely_by_circle)
    assert c.orderly and c.message_model.name == "CLUSTERING"
    lp = LitePullConsumer("g", "127.0.0.1:9876", auto_commit=False, offset_store_dir="/tmp/o")
    assert lp.settings == LitePullSettings(auto_commit=False, offset_store_dir="/tmp/o")
    s = SyncPushConsumer("g", "127.0.0.1:9876", max_reconsume_times=3)
    try:
        assert s._client.settings.max_reconsume_times == 3
    finally:
        s.close()


def test_an_unknown_setting_names_the_closest_one():
    # a misspelt keyword is still the TypeError Python raises for one, now naming the closest setting
    with pytest.raises(TypeError, match="unknown consumer setting 'pull_batchsize' .did you mean 'pull_batch_size'"):
        PushConsumer("g", "127.0.0.1:9876", pull_batchsize=8)
    with pytest.raises(TypeError, match="'orderly'"):  # a push setting the lite-pull consumer has not
        LitePullConsumer("g", "127.0.0.1:9876", orderly=True)
    with pytest.raises(ConfigError, match="settings must be a PushSettings, not LitePullSettings"):
        PushConsumer("g", "127.0.0.1:9876", settings=LitePullSettings())
    with pytest.raises(ConfigError, match="pull_batch_size must be an integer"):
        PushConsumer("g", "127.0.0.1:9876", settings=PushSettings(), pull_batch_size=0)
