"""PushConsumer against real TideMQ processes: clustering split and takeover, broadcasting,
where a new group starts, offset persistence across restarts, flow control."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from tests.client.push.helpers import Collector, cfg, committed_offsets, send, send_sync
from tests.support.topics import create_topic, create_topic_sync
from tests.support.waiting import wait_until, wait_until_sync
from tidemq.client import PullConsumer, SyncPushConsumer
from tidemq.client.push import (
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    MessageModel,
    PushConsumer,
)
from tidemq.client.route import MessageQueue


# A bound per test body (the shared cluster's start is not counted): a stuck consumer fails the test.
pytestmark = pytest.mark.timeout(40, func_only=True)


def consumer(cluster, group, topic, listener, instance, **kw) -> PushConsumer:
    c = PushConsumer(group, config=cfg(cluster, instance), **kw)
    c.subscribe(topic)
    c.register_listener(listener)
    return c


async def test_two_consumers_split_queues_then_one_takes_over(cluster):
    topic, group = "PushSplit", "push-split-cg"
    all_queues = [MessageQueue(topic, cluster.broker_name, i) for i in range(8)]

    await create_topic(cluster, topic, 8)
    a, b = Collector("a"), Collector("b")
    ca = consumer(cluster, group, topic, a, "ca", rebalance_interval=3.0)
    cb = consumer(cluster, group, topic, b, "cb", rebalance_interval=3.0)
    await ca.start()
    await cb.start()
    try:
        def split():
            qa, qb = set(ca.assigned_queues(topic)), set(cb.assigned_queues(topic))
            return len(qa) == 4 and len(qb) == 4 and qa | qb == set(all_queues)
        await wait_until(split, "the queues to be split 4/4", timeout=10)
        await send(cluster, topic, [f"m{i}".encode() for i in range(200)])
        await wait_until(lambda: len(a) + len(b) >= 200, "200 messages", timeout=15)
        await asyncio.sleep(0.3)
        both = a.bodies() + b.bodies()
        assert Counter(both) == Counter(f"m{i}".encode() for i in range(200))  # exactly once
        assert len(a) > 0 and len(b) > 0
        assert {m.queue_id for m in a.msgs}.isdisjoint({m.queue_id for m in b.msgs})

        await ca.close()
        closed = time.monotonic()
        await wait_until(lambda: set(cb.assigned_queues(topic)) == set(all_queues),
                         "the survivor to take every queue", timeout=3.0 + 7)
        assert time.monotonic() - closed <= 3.0 + 5  # about one rebalance interval; slack for a loaded CI box
        await send(cluster, topic, [f"n{i}".encode() for i in range(100)])
        await wait_until(lambda: len(b.bodies()) + len(a) >= 300, "the rest", timeout=15)
        await asyncio.sleep(0.3)
        assert Counter(a.bodies() + b.bodies()) == Counter(
            [f"m{i}".encode() for i in range(200)] + [f"n{i}".encode() for i in range(100)])
    finally:
        await ca.close()
        await cb.close()


async def test_broadcasting_delivers_every_message_to_each_consumer(cluster, tmp_path):
    topic, group = "PushBroadcast", "push-bc-cg"

    await create_topic(cluster, topic, 4)
    a, b = Collector("a"), Collector("b")
    kw = dict(message_model=MessageModel.BROADCASTING, offset_store_dir=tmp_path,
              persist_interval=0.2)
    ca = consumer(cluster, group, topic, a, "bca", **kw)
    cb = consumer(cluster, group, topic, b, "bcb", **kw)
    async with ca, cb:
        assert len(ca.assigned_queues(topic)) == 4 == len(cb.assigned_queues(topic))
        await send(cluster, topic, [f"b{i}".encode() for i in range(40)])
        await wait_until(lambda: len(a) >= 40 and len(b) >= 40, "both to get 40", timeout=10)
        await asyncio.sleep(0.3)
        expected = sorted(f"b{i}".encode() for i in range(40))
        assert sorted(a.bodies()) == expected == sorted(b.bodies())
    # offsets stay local, per consumer instance
    files = sorted(p.name for p in tmp_path.rglob("*.json"))
    assert files == [f"{group}.json", f"{group}.json"]
    async with PullConsumer(group, config=cfg(cluster)) as pc:
        mq = MessageQueue(topic, cluster.broker_name, 0)
        assert await pc.committed_offset(mq) in (None, 0)


async def test_broadcasting_resumes_from_its_offset_file(cluster, tmp_path):
    topic, group = "PushBcResume", "push-bcr-cg"

    await create_topic(cluster, topic, 2)
    first = Collector()
    kw = dict(message_model=MessageModel.BROADCASTING, offset_store_dir=tmp_path,
              consume_from=ConsumeFromWhere.FIRST_OFFSET)
    async with consumer(cluster, group, topic, first, "bcr", **kw):
        await send(cluster, topic, [f"r{i}".encode() for i in range(10)])
        await wait_until(lambda: len(first) >= 10, "10 messages", timeout=10)
    await send(cluster, topic, [f"s{i}".encode() for i in range(5)])
    second = Collector()
    async with consumer(cluster, group, topic, second, "bcr", **kw):
        await wait_until(lambda: len(second) >= 5, "5 new messages", timeout=10)
        await asyncio.sleep(0.5)
    assert sorted(second.bodies()) == sorted(f"s{i}".encode() for i in range(5))


async def test_where_a_new_group_starts(cluster, tmp_path):
    """Clustering on a young queue starts at 0 whatever consume_from says (the broker answers
    offset 0); broadcasting has no broker offset, so LAST / FIRST / TIMESTAMP apply."""
    topic = "PushFrom"

    await create_topic(cluster, topic, 1)
    await send(cluster, topic, [f"old{i}".encode() for i in range(5)])
    await asyncio.sleep(1.0)
    ts = int(time.time() * 1000)
    await send(cluster, topic, [f"new{i}".encode() for i in range(3)])
    old = [f"old{i}".encode() for i in range(5)]
    new = [f"new{i}".encode() for i in range(3)]

    async def consume(group, instance, expect, **kw):
        c = Collector()
        async with consumer(cluster, group, topic, c, instance, **kw):
            await wait_until(lambda: len(c) >= expect, f"{expect} messages for {group}", timeout=10)
            await asyncio.sleep(0.3)
            return c.bodies()

    bc = dict(message_model=MessageModel.BROADCASTING, offset_store_dir=tmp_path)
    assert await consume("from-cl-last", "f1", 8) == old + new
    assert await consume("from-bc-first", "f2", 8, consume_from=ConsumeFromWhere.FIRST_OFFSET,
                         **bc) == old + new
    assert await consume("from-bc-ts", "f3", 3, consume_from=ConsumeFromWhere.TIMESTAMP,
                         consume_timestamp=ts, **bc) == new
    c = Collector()
    async with consumer(cluster, "from-bc-last", topic, c, "f4", **bc):
        await asyncio.sleep(0.5)
        assert c.bodies() == []
        await send(cluster, topic, [b"later"])
        await wait_until(lambda: len(c) >= 1, "the message sent after start", timeout=10)
    assert c.bodies() == [b"later"]


async def test_offsets_persist_periodically_and_on_close_and_restart_resumes(cluster):
    topic, group = "PushResume", "push-resume-cg"

    async def total() -> int:
        return sum((await committed_offsets(cluster, group, topic)).values())

    await create_topic(cluster, topic, 2)
    first = Collector()
    async with consumer(cluster, group, topic, first, "r1", persist_interval=0.3):
        await send(cluster, topic, [f"a{i}".encode() for i in range(20)])
        await wait_until(lambda: len(first) >= 20, "20 messages", timeout=10)
        deadline = time.monotonic() + 5  # periodic persistence, consumer still running
        while await total() != 20:
            assert time.monotonic() < deadline, await committed_offsets(cluster, group, topic)
            await asyncio.sleep(0.1)

    # persistence on close: a long persist interval, so only close() can commit
    second = Collector()
    async with consumer(cluster, group, topic, second, "r2", persist_interval=600):
        await send(cluster, topic, [f"b{i}".encode() for i in range(10)])
        await wait_until(lambda: len(second) >= 10, "10 messages", timeout=10)
        await asyncio.sleep(0.2)
    assert await total() == 30
    assert sorted(second.bodies()) == sorted(f"b{i}".encode() for i in range(10))

    await send(cluster, topic, [f"c{i}".encode() for i in range(5)])
    third = Collector()
    async with consumer(cluster, group, topic, third, "r3"):
        await wait_until(lambda: len(third) >= 5, "5 messages", timeout=10)
        await asyncio.sleep(0.5)
    assert sorted(third.bodies()) == sorted(f"c{i}".encode() for i in range(5))


async def test_flow_control_bounds_the_process_queue(cluster):
    topic, group = "PushFlow", "push-flow-cg"
    threshold, batch = 10, 4

    await create_topic(cluster, topic, 1)
    seen = []

    async def slow(msgs):
        await asyncio.sleep(0.01)
        seen.extend(msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    c = consumer(cluster, group, topic, slow, "flow", pull_threshold_for_queue=threshold,
                 pull_batch_size=batch, consume_concurrency=1)
    await send(cluster, topic, [f"f{i}".encode() for i in range(120)])
    peak = 0
    async with c:
        deadline = time.monotonic() + 15
        while len(seen) < 120:
            assert time.monotonic() < deadline
            for stats in c.process_queues().values():
                peak = max(peak, stats.msg_count)
            await asyncio.sleep(0.002)
    assert threshold < peak <= threshold + batch
    assert sorted(m.body for m in seen) == sorted(f"f{i}".encode() for i in range(120))


async def test_a_slow_message_holds_the_offset_and_the_span_bounds_pulling(cluster):
    topic, group = "PushSpan", "push-span-cg"
    span, batch = 20, 4
    mq = MessageQueue(topic, cluster.broker_name, 0)

    await create_topic(cluster, topic, 1)
    release = asyncio.Event()
    seen = []

    async def listener(msgs):
        if msgs[0].queue_offset == 0:
            await release.wait()
        seen.extend(msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    await send(cluster, topic, [f"s{i}".encode() for i in range(100)])
    c = consumer(cluster, group, topic, listener, "span", consume_concurrently_max_span=span,
                 pull_batch_size=batch, persist_interval=0.2)
    async with c:
        await wait_until(lambda: len(seen) >= span - 1, "the fast messages", timeout=10)
        await asyncio.sleep(0.5)
        stats = c.process_queues()[mq]
        assert stats.max_span <= span + batch
        assert len(seen) < 100  # pulling stopped at the span limit
        # the offset waits for offset 0 however far the others got
        assert (await committed_offsets(cluster, group, topic)).get(0, 0) == 0
        release.set()
        await wait_until(lambda: len(seen) >= 100, "everything", timeout=10)
        deadline = time.monotonic() + 10  # periodic persistence (0.2 s) catches up to 100
        while (await committed_offsets(cluster, group, topic)).get(0, 0) != 100:
            assert time.monotonic() < deadline, await committed_offsets(cluster, group, topic)
            await asyncio.sleep(0.1)


def test_blocking_push_consumer(cluster):
    topic, group = "PushSync", "push-sync-cg"
    create_topic_sync(cluster, topic, 2)
    got = Collector()
    c = SyncPushConsumer(group, config=cfg(cluster, "sync"), persist_interval=0.2)
    c.subscribe(topic)
    c.register_listener(got)
    with c:
        assert len(c.assigned_queues(topic)) == 2
        send_sync(cluster, topic, [b"p", b"q"])
        wait_until_sync(lambda: len(got) >= 2, "both messages")
    assert sorted(got.bodies()) == [b"p", b"q"]
