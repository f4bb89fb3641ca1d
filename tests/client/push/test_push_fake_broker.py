"""PushConsumer failure paths against the in-memory fake broker: send-back, the retry-topic
fallback, local re-consumption, retry-topic restoring, broadcasting drops, orderly DLQ."""

from __future__ import annotations

import asyncio
import logging

import pytest

from tests.client.fake_server import props_string
from tests.client.push.fake_push import PushFakeCluster
from tests.support.waiting import wait_until
from tidemq.client import ClientConfig
from tidemq.client.push import (
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    MessageModel,
    PushConsumer,
)
from tidemq.errors import ClientError
from tidemq.message import Prop
from tidemq.remoting import RequestCode, ResponseCode

TOPIC, GROUP = "FakeT", "fake-g"
RETRY = "%RETRY%" + GROUP


# The fake broker answers at once: a test that takes longer than this is stuck.
pytestmark = pytest.mark.timeout(20, func_only=True)


@pytest.fixture
async def fake():
    """The in-memory name server + broker with TOPIC and its retry topic (one queue each)."""
    fake = await PushFakeCluster().start()
    fake.topics[TOPIC] = (1, 1, 6)
    fake.topics[RETRY] = (1, 1, 6)
    try:
        yield fake
    finally:
        await fake.stop()


def make(fake, listener, **kw) -> PushConsumer:
    kw.setdefault("consume_from", ConsumeFromWhere.FIRST_OFFSET)
    kw.setdefault("rebalance_interval", 0.5)
    kw.setdefault("persist_interval", 0.2)
    c = PushConsumer(GROUP, config=ClientConfig(name_servers=fake.addr, instance_name="fk"), **kw)
    c.subscribe(TOPIC)
    c.register_listener(listener)
    return c


def put(fake, topic, body: bytes, **props) -> None:
    props.setdefault("UNIQ_KEY", f"UNIQ{len(fake.queues[(topic, 0)]):028d}")
    fake._store(topic, 0, body, props_string(**props), 0, 0, 1700000000000)


async def test_reconsume_later_sends_the_message_back_and_moves_on(fake):
    calls = []

    def later(msgs):
        calls.append(msgs[0])
        return ConsumeConcurrentlyStatus.RECONSUME_LATER

    async with make(fake, later):
        put(fake, TOPIC, b"x", TAGS="A")
        await wait_until(lambda: fake.send_backs, "a send-back", timeout=5)
        await wait_until(lambda: fake.offsets.get((GROUP, TOPIC, 0)) == 1, "offset 1", timeout=5)
    m = calls[0]
    sb = fake.send_backs[0]
    assert sb["offset"] == str(m.commit_log_offset) and sb["group"] == GROUP
    assert sb["delayLevel"] == "0" and sb["maxReconsumeTimes"] == "16"
    assert sb["originMsgId"] == m.msg_id and sb["originTopic"] == TOPIC
    assert len(calls) == 1


async def test_failed_send_back_falls_back_to_the_retry_topic(fake):
    fake.fail_next.append((RequestCode.CONSUMER_SEND_MSG_BACK, ResponseCode.SYSTEM_ERROR))

    async with make(fake, lambda msgs: ConsumeConcurrentlyStatus.RECONSUME_LATER):
        put(fake, TOPIC, b"y", TAGS="B")
        await wait_until(lambda: fake.queues.get((RETRY, 0)), "a message in the retry topic", timeout=5)
        await wait_until(lambda: fake.offsets.get((GROUP, TOPIC, 0)) == 1, "offset 1", timeout=5)
    sends = [c for c in fake.requests if c.code == RequestCode.SEND_MESSAGE_V2]
    assert sends[0].ext_fields["a"] == "CLIENT_INNER_PRODUCER"
    assert sends[0].ext_fields["j"] == "1" and sends[0].ext_fields["l"] == "16"
    stored = fake.queues[(RETRY, 0)][0]
    assert stored.props[Prop.RETRY_TOPIC] == TOPIC and stored.props[Prop.DELAY] == "3"
    assert stored.props[Prop.ORIGIN_MESSAGE_ID] == "UNIQ" + "0" * 28
    assert stored.props[Prop.TAGS] == "B" and stored.props[Prop.UNIQ_KEY] == "UNIQ" + "0" * 28


async def test_when_both_fail_the_message_is_consumed_again_locally(fake):
    fake.fail_next += [(RequestCode.CONSUMER_SEND_MSG_BACK, ResponseCode.SYSTEM_ERROR),
                       (RequestCode.SEND_MESSAGE_V2, ResponseCode.MESSAGE_ILLEGAL)]
    seen = []

    def listener(msgs):
        seen.append(msgs[0].reconsume_times)
        return (ConsumeConcurrentlyStatus.RECONSUME_LATER if len(seen) == 1
                else ConsumeConcurrentlyStatus.CONSUME_SUCCESS)

    c = make(fake, listener)
    async with c:
        c._concurrent.local_retry_delay = 0.2
        put(fake, TOPIC, b"z")
        await asyncio.sleep(0.3)
        assert fake.offsets.get((GROUP, TOPIC, 0), 0) == 0  # held while not consumed
        await wait_until(lambda: len(seen) == 2, "the local retry", timeout=5)
        await wait_until(lambda: fake.offsets.get((GROUP, TOPIC, 0)) == 1, "offset 1", timeout=5)
    assert seen == [0, 1]


async def test_listener_exception_counts_as_reconsume_later_and_is_logged_once(fake, caplog):
    def boom(msgs):
        raise ValueError("listener bug")

    with caplog.at_level(logging.WARNING, logger="tidemq.client.push.invoker"):
        async with make(fake, boom):
            put(fake, TOPIC, b"e")
            await wait_until(lambda: fake.send_backs, "a send-back", timeout=5)
    records = [r for r in caplog.records if "raised" in r.getMessage()]
    assert len(records) == 1 and "listener bug" in caplog.text


async def test_retry_topic_messages_show_their_real_topic(fake):
    seen = []

    async def listener(msgs):
        seen.extend(msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    async with make(fake, listener) as c:
        await wait_until(lambda: any(mq.topic == RETRY for mq in c.assigned_queues()), "the retry queue to be owned", timeout=5)
        put(fake, RETRY, b"r", RETRY_TOPIC=TOPIC, TAGS="T")
        await wait_until(lambda: seen, "the retried message", timeout=5)
    assert seen[0].topic == TOPIC and seen[0].body == b"r"
    hb = fake.heartbeats[-1]["consumerDataSet"][0]
    assert hb["consumeType"] == "CONSUME_PASSIVELY" and hb["messageModel"] == "CLUSTERING"
    assert hb["consumeFromWhere"] == "CONSUME_FROM_FIRST_OFFSET"
    assert {s["topic"]: s["subString"] for s in hb["subscriptionDataSet"]} == {TOPIC: "*", RETRY: "*"}


async def test_broadcasting_drops_what_the_listener_rejects(fake, tmp_path):
    calls = []

    def later(msgs):
        calls.append(msgs[0].body)
        return ConsumeConcurrentlyStatus.RECONSUME_LATER

    async with make(fake, later, message_model=MessageModel.BROADCASTING,
                    offset_store_dir=tmp_path) as c:
        assert [mq.topic for mq in c.assigned_queues()] == [TOPIC]  # no retry topic
        put(fake, TOPIC, b"b1")
        put(fake, TOPIC, b"b2")
        await wait_until(lambda: len(calls) == 2, "two calls", timeout=5)
        await asyncio.sleep(0.4)
    assert calls == [b"b1", b"b2"] and not fake.send_backs
    assert (GROUP, TOPIC, 0) not in fake.offsets  # broadcasting never commits to the broker
    assert b'"offset": 2' in next(tmp_path.rglob("*.json")).read_bytes()
    hb = fake.heartbeats[-1]["consumerDataSet"][0]
    assert hb["messageModel"] == "BROADCASTING"
    assert [s["topic"] for s in hb["subscriptionDataSet"]] == [TOPIC]


async def test_orderly_parks_a_message_in_the_dlq_after_max_reconsume_times(fake):
    calls = []

    def suspend(msgs):
        calls.append((msgs[0].body, msgs[0].reconsume_times))
        if msgs[0].body == b"bad":
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeOrderlyStatus.SUCCESS

    c = make(fake, suspend, orderly=True, max_reconsume_times=2)
    async with c:
        c._orderly.suspend_time = 0.05
        put(fake, TOPIC, b"bad")
        put(fake, TOPIC, b"good")
        await wait_until(lambda: (b"good", 0) in calls, "the next message", timeout=5)
        await wait_until(lambda: fake.offsets.get((GROUP, TOPIC, 0)) == 2, "offset 2", timeout=5)
        assert ("FakeT", "broker-a", 0) in fake.locks
    assert calls == [(b"bad", 0), (b"bad", 1), (b"bad", 2), (b"good", 0)]
    assert [sb["delayLevel"] for sb in fake.send_backs] == ["-1"]
    assert not fake.locks  # unlocked on close


async def test_orderly_waits_for_the_queue_lock(fake):
    fake.locks[(TOPIC, "broker-a", 0)] = "someone-else"
    seen = []
    c = make(fake, lambda msgs: seen.extend(msgs) or ConsumeOrderlyStatus.SUCCESS,
             orderly=True)
    async with c:
        put(fake, TOPIC, b"o")
        await asyncio.sleep(0.6)
        assert not seen and all(mq.topic != TOPIC for mq in c.assigned_queues())
        del fake.locks[(TOPIC, "broker-a", 0)]
        await wait_until(lambda: seen, "the message once the lock is free", timeout=5)


async def test_start_needs_listener_and_subscription_and_one_consumer_per_group(fake):
    cfg = ClientConfig(name_servers=fake.addr, instance_name="dup")
    c = PushConsumer(GROUP, config=cfg)
    with pytest.raises(ClientError, match="listener"):
        await c.start()
    c.register_listener(lambda msgs: ConsumeConcurrentlyStatus.CONSUME_SUCCESS)
    with pytest.raises(ClientError, match="subscribe"):
        await c.start()
    c.subscribe(TOPIC)
    d = PushConsumer(GROUP, config=cfg)
    d.subscribe(TOPIC)
    d.register_listener(lambda msgs: ConsumeConcurrentlyStatus.CONSUME_SUCCESS)
    async with c:
        with pytest.raises(ClientError, match="instance_name"):
            await d.start()
    async with d:  # fine once the first one is gone
        assert d.assigned_queues(TOPIC)


async def test_tag_subscription_is_sent_normalized_and_skipped_messages_advance_the_offset(fake):
    seen = []
    c = PushConsumer(GROUP, config=ClientConfig(name_servers=fake.addr, instance_name="tg"),
                     consume_from=ConsumeFromWhere.FIRST_OFFSET, persist_interval=0.2)
    c.subscribe(TOPIC, "TagB || TagA")
    c.register_listener(lambda msgs: seen.extend(m.body for m in msgs)
                        or ConsumeConcurrentlyStatus.CONSUME_SUCCESS)
    async with c:
        for i, tag in enumerate(["TagA", "TagC", "TagB", "TagC"]):
            put(fake, TOPIC, f"t{i}".encode(), TAGS=tag)
        await wait_until(lambda: len(seen) == 2, "two matching messages", timeout=5)
        await wait_until(lambda: fake.offsets.get((GROUP, TOPIC, 0)) == 4, "offset 4", timeout=5)
    assert seen == [b"t0", b"t2"]
    pulls = [r for r in fake.requests if r.code == RequestCode.PULL_MESSAGE]
    assert pulls[0].ext_fields["subscription"] == "TagA || TagB"


async def test_orderly_lost_lock_pauses_the_queue_and_resumes_without_rewinding(fake):
    seen = []
    c = make(fake, lambda msgs: seen.extend(m.body for m in msgs) or ConsumeOrderlyStatus.SUCCESS,
             orderly=True, lock_interval=0.2, persist_interval=600)  # broker offset stays stale
    key = (TOPIC, "broker-a", 0)
    async with c:
        for i in range(3):
            put(fake, TOPIC, f"o{i}".encode())
        await wait_until(lambda: len(seen) == 3, "three messages", timeout=5)
        fake.locks[key] = "someone-else"  # the broker gave the queue to another client
        mq = c.assigned_queues(TOPIC)[0]
        await wait_until(lambda: not c.process_queues()[mq].locked, "the lost lock", timeout=5)
        put(fake, TOPIC, b"o3")
        await asyncio.sleep(0.5)
        assert seen == [b"o0", b"o1", b"o2"]  # nothing consumed without the lock
        del fake.locks[key]
        await wait_until(lambda: len(seen) >= 4, "the message after the lock came back", timeout=5)
        await asyncio.sleep(0.3)
    assert seen == [b"o0", b"o1", b"o2", b"o3"]
