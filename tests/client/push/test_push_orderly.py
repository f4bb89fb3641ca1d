"""Orderly PushConsumers against real TideMQ processes: per-key order across a restart, queue
locks, local re-delivery on SUSPEND_CURRENT_QUEUE_A_MOMENT."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pytest

from tests.client.push.helpers import cfg
from tests.support.topics import create_topic
from tests.support.waiting import wait_until
from tidemq.client import Producer
from tidemq.client.push import ConsumeOrderlyStatus, PushConsumer
from tidemq.client.route import MessageQueue
from tidemq.message import Message, MessageExt


# A bound per test body (the shared cluster's start is not counted): a stuck consumer fails the test.
pytestmark = pytest.mark.timeout(40, func_only=True)

KEYS, STEPS = 5, 200


def by_key(queues: list[MessageQueue], msg: Message, key: int) -> MessageQueue:
    return queues[key % len(queues)]


class OrderRecorder:
    """A plain orderly listener recording (key, step) in the order it was called."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []
        self._lock = threading.Lock()

    def __call__(self, msgs: list[MessageExt]) -> ConsumeOrderlyStatus:
        with self._lock:
            for m in msgs:
                key, step = m.body.decode().split(":")
                self.seen.append((int(key), int(step)))
        return ConsumeOrderlyStatus.SUCCESS


def orderly(cluster, group, topic, listener, instance, **kw) -> PushConsumer:
    c = PushConsumer(group, config=cfg(cluster, instance), orderly=True, rebalance_interval=1.0,
                     **kw)
    c.subscribe(topic)
    c.register_listener(listener)
    return c


@pytest.mark.timeout(60, func_only=True)
async def test_per_key_order_holds_while_one_consumer_restarts(cluster):
    topic, group = "PushOrderly", "push-orderly-cg"

    await create_topic(cluster, topic, 4)
    r1, r2, r1b = OrderRecorder(), OrderRecorder(), OrderRecorder()
    c1 = orderly(cluster, group, topic, r1, "o1", consume_batch_max_size=3)
    c2 = orderly(cluster, group, topic, r2, "o2", consume_batch_max_size=3)
    await c1.start()
    await c2.start()
    c1b = orderly(cluster, group, topic, r1b, "o1", consume_batch_max_size=3)
    try:
        async with Producer("push-orderly-pg", config=cfg(cluster, "opg")) as p:
            async def produce(lo: int, hi: int) -> None:
                for step in range(lo, hi):
                    for key in range(KEYS):
                        await p.send(Message(topic, f"{key}:{step}".encode()),
                                     selector=by_key, arg=key)

            await produce(0, 60)
            await wait_until(lambda: len(r1.seen) + len(r2.seen) >= 100, "first messages", timeout=10)
            await c1.close()  # restart c1 while messages keep coming
            await produce(60, 120)
            await c1b.start()
            await produce(120, STEPS)
        await wait_until(
            lambda: {kv for r in (r1, r2, r1b) for kv in r.seen}
            >= {(k, s) for k in range(KEYS) for s in range(STEPS)}, "every message", timeout=20)
    finally:
        await c1.close()
        await c1b.close()
        await c2.close()
    for rec in (r1, r2, r1b):
        last: dict[int, int] = defaultdict(lambda: -1)
        for key, step in rec.seen:
            assert step > last[key], f"key {key}: step {step} after {last[key]}"
            last[key] = step
    assert r1.seen and r2.seen and r1b.seen


async def test_orderly_suspend_redelivers_the_same_message_locally_in_order(cluster):
    topic, group = "PushOrderlySuspend", "push-orderly-sus-cg"

    await create_topic(cluster, topic, 1)
    calls: list[tuple[bytes, int]] = []

    async def listener(msgs):
        m = msgs[0]
        calls.append((m.body, m.reconsume_times))
        if m.body == b"x1" and m.reconsume_times < 2:
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeOrderlyStatus.SUCCESS

    c = orderly(cluster, group, topic, listener, "sus")
    async with c, Producer("push-orderly-sus-pg", config=cfg(cluster, "spg")) as p:
        for i in range(3):
            await p.send(Message(topic, f"x{i}".encode()))
        started = time.monotonic()
        await wait_until(lambda: len(calls) >= 5, "five calls", timeout=10)
        # two suspensions of about a second each before x1 passes
        assert time.monotonic() - started >= 1.5
        mq = MessageQueue(topic, cluster.broker_name, 0)
        assert c.process_queues()[mq].locked
    assert calls == [(b"x0", 0), (b"x1", 0), (b"x1", 1), (b"x1", 2), (b"x2", 0)]
