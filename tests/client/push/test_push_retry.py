"""The retry path against real TideMQ processes with short delay levels: RECONSUME_LATER goes
through CONSUMER_SEND_MSG_BACK and %RETRY%<group>, and ends in %DLQ%<group>."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tests.client.push.helpers import cfg, send
from tests.procs import Cluster
from tests.support.topics import create_topic
from tests.support.waiting import wait_until
from tidemq.client import PullConsumer
from tidemq.client.pull import PullStatus
from tidemq.client.push import ConsumeConcurrentlyStatus, ConsumeOrderlyStatus, PushConsumer
from tidemq.errors import TideMQError
from tidemq.message import MessageExt, Prop


# A bound per test body (the shared cluster's start is not counted): a stuck consumer fails the test.
pytestmark = pytest.mark.timeout(40, func_only=True)

FAST_LEVELS = " ".join(["200ms"] * 18)


@pytest.fixture(scope="module")
def fast_cluster(tmp_path_factory):
    """A cluster whose delay levels are all 200 ms, so retries come back at once."""
    c = Cluster(tmp_path_factory.mktemp("retry"), extra_broker_args=["--delay-levels", FAST_LEVELS])
    try:
        c.start()
    except Exception:
        c.stop()
        raise
    yield c
    c.stop()


class Flaky:
    """Fails the first ``failures`` deliveries of each message, then succeeds."""

    def __init__(self, failures: int | None) -> None:
        self.failures = failures
        self.seen: list[MessageExt] = []
        self._lock = threading.Lock()

    def __call__(self, msgs):
        with self._lock:
            self.seen.extend(msgs)
            m = msgs[0]
        if self.failures is None or m.reconsume_times < self.failures:
            return ConsumeConcurrentlyStatus.RECONSUME_LATER
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS


async def dlq_messages(cluster, group: str) -> list[MessageExt]:
    async with PullConsumer(group + "-dlq-reader", config=cfg(cluster, "dlq")) as pc:
        try:
            queues = await pc.fetch_queues("%DLQ%" + group)
        except TideMQError:  # no route yet (the DLQ topic comes with its first message): poll again
            return []
        out = []
        for mq in queues:
            r = await pc.pull(mq, 0, 32)
            if r.status is PullStatus.FOUND:
                out.extend(r.messages)
        return out


async def test_failing_three_times_then_succeeding_sees_reconsume_times_0_to_3(fast_cluster):
    topic, group = "PushRetry", "push-retry-cg"

    await create_topic(fast_cluster, topic, 2)
    flaky = Flaky(3)
    c = PushConsumer(group, config=cfg(fast_cluster, "rt"), rebalance_interval=1.0)
    c.subscribe(topic, "TagR")
    c.register_listener(flaky)
    async with c:
        [sent] = await send(fast_cluster, topic, [b"retry-me"], tags="TagR", keys="k1")
        await wait_until(lambda: len(flaky.seen) >= 4, "four deliveries", timeout=15)
        await asyncio.sleep(0.8)  # nothing more after the success
    assert [m.reconsume_times for m in flaky.seen] == [0, 1, 2, 3]
    assert all(m.topic == topic for m in flaky.seen)  # real topic restored
    assert {m.msg_id for m in flaky.seen} == {sent.msg_id}
    assert all(m.body == b"retry-me" and m.tags == "TagR" for m in flaky.seen)
    # the broker records the first incarnation's offset id (Java's broker does the same)
    origin = [m.properties.get(Prop.ORIGIN_MESSAGE_ID) for m in flaky.seen[1:]]
    assert origin == [sent.offset_msg_id] * 3
    assert c.send_back.sent_back == 3 and c.send_back.resent == 0


async def test_always_failing_message_ends_in_the_dlq(fast_cluster):
    topic, group = "PushDlq", "push-dlq-cg"

    await create_topic(fast_cluster, topic, 1)
    flaky = Flaky(None)
    c = PushConsumer(group, config=cfg(fast_cluster, "dq"), max_reconsume_times=2,
                     rebalance_interval=1.0)
    c.subscribe(topic)
    c.register_listener(flaky)
    async with c:
        [sent] = await send(fast_cluster, topic, [b"poison"])
        await wait_until(lambda: len(flaky.seen) >= 3, "three deliveries", timeout=15)
        dead = await wait_until(lambda: dlq_messages(fast_cluster, group), f"a message in the DLQ of {group}",
                                interval=0.2)
        await asyncio.sleep(0.6)
    assert [m.reconsume_times for m in flaky.seen] == [0, 1, 2]
    assert len(dead) == 1 and dead[0].body == b"poison" and dead[0].msg_id == sent.msg_id


async def test_orderly_consumer_parks_a_poison_message_in_the_dlq(fast_cluster):
    topic, group = "PushOrderlyDlq", "push-odlq-cg"

    await create_topic(fast_cluster, topic, 1)
    calls = []

    def listener(msgs):
        calls.append((msgs[0].body, msgs[0].reconsume_times))
        if msgs[0].body == b"poison":
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeOrderlyStatus.SUCCESS

    c = PushConsumer(group, config=cfg(fast_cluster, "od"), orderly=True, max_reconsume_times=1)
    c.subscribe(topic)
    c.register_listener(listener)
    async with c:
        await send(fast_cluster, topic, [b"poison", b"after"])
        await wait_until(lambda: (b"after", 0) in calls, "the message after the poison", timeout=10)
    assert calls == [(b"poison", 0), (b"poison", 1), (b"after", 0)]
    # the DLQ topic reaches the name server's routes with the broker's next registration
    dead = await wait_until(lambda: dlq_messages(fast_cluster, group), f"a message in the DLQ of {group}",
                            interval=0.2)
    assert [m.body for m in dead] == [b"poison"]
