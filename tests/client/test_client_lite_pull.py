"""LitePullConsumer against real TideMQ processes: assign + seek + poll + commit, subscribe +
rebalance between two lite consumers, the blocking facade."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from tests.client.push.helpers import cfg, committed_offsets, send, send_sync
from tests.support.topics import create_topic, create_topic_sync
from tests.support.waiting import wait_until
from tidemq.client import LitePullConsumer, MessageQueue, SyncLitePullConsumer
from tidemq.client.push import ConsumeFromWhere
from tidemq.errors import ClientError, ConfigError


# A bound per test body (the shared cluster's start is not counted): a stuck consumer fails the test.
pytestmark = pytest.mark.timeout(40, func_only=True)


async def poll_until(c: LitePullConsumer, n: int, timeout: float = 10.0) -> list:
    out: list = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(out) < n:
        assert loop.time() < deadline, f"only {len(out)} of {n} messages polled"
        out.extend(await c.poll(0.5))
    return out


async def test_assign_poll_seek_and_commit(cluster):
    topic, group = "LiteAssign", "lite-assign-cg"
    mq0, mq1 = (MessageQueue(topic, cluster.broker_name, i) for i in range(2))

    await create_topic(cluster, topic, 2)
    results = await send(cluster, topic, [f"a{i}".encode() for i in range(30)])
    per_queue = Counter(r.message_queue for r in results)
    c = LitePullConsumer(group, config=cfg(cluster, "la"), auto_commit=False,
                         pull_batch_size=7)
    c.assign([mq0, mq1])
    async with c:
        assert c.assignment() == [mq0, mq1]
        first = await c.poll(5)
        assert 0 < len(first) <= 7  # at most pull_batch_size per poll
        got = first + await poll_until(c, 30 - len(first))
        assert sorted(m.body for m in got) == sorted(f"a{i}".encode() for i in range(30))
        assert await c.poll(0.2) == []
        assert c.position(mq0) == per_queue[mq0]
        assert await c.committed(mq0) in (-1, 0)  # auto_commit off: nothing stored yet
        await c.commit()
        assert await c.committed(mq0) == per_queue[mq0]
        assert await committed_offsets(cluster, group, topic) == {
            0: per_queue[mq0], 1: per_queue[mq1]}

        await c.seek(mq0, 2)
        again = await poll_until(c, per_queue[mq0] - 2)
        assert [m.queue_offset for m in again] == list(range(2, per_queue[mq0]))
        assert all(m.queue_id == 0 for m in again)
        await c.seek_to_begin(mq1)
        assert [m.queue_offset for m in await poll_until(c, per_queue[mq1])] == list(
            range(per_queue[mq1]))
        await c.seek_to_end(mq0)
        assert await c.poll(0.3) == []
        with pytest.raises(ClientError, match="outside"):
            await c.seek(mq0, 10_000)
        with pytest.raises(ClientError, match="not assigned"):
            await c.seek(MessageQueue(topic, cluster.broker_name, 7), 0)
        await send(cluster, topic, [b"late"])
        late = await poll_until(c, 1)
        assert [m.body for m in late] == [b"late"]
        await c.commit({mq0: 1})
        assert await c.committed(mq0) == 1


async def test_subscribe_rebalances_between_two_lite_consumers(cluster):
    topic, group = "LiteSub", "lite-sub-cg"

    await create_topic(cluster, topic, 4)
    a = LitePullConsumer(group, config=cfg(cluster, "lsa"), rebalance_interval=1.0,
                         auto_commit_interval=0.2, consume_from=ConsumeFromWhere.FIRST_OFFSET)
    b = LitePullConsumer(group, config=cfg(cluster, "lsb"), rebalance_interval=1.0,
                         auto_commit_interval=0.2)
    a.subscribe(topic)
    b.subscribe(topic)
    await a.start()
    try:
        assert len(a.assignment()) == 4
        await b.start()
        await wait_until(lambda: len(a.assignment()) == 2 and len(b.assignment()) == 2, "a 2/2 split",
                         timeout=5)
        assert set(a.assignment()).isdisjoint(b.assignment())
        await send(cluster, topic, [f"s{i}".encode() for i in range(40)])
        got_a: list = []
        got_b: list = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while len(got_a) + len(got_b) < 40:
            assert loop.time() < deadline
            got_a += await a.poll(0.1)
            got_b += await b.poll(0.1)
        assert Counter(m.body for m in got_a + got_b) == Counter(
            f"s{i}".encode() for i in range(40))
        assert {m.queue_id for m in got_a}.isdisjoint({m.queue_id for m in got_b})
        await a.close()  # commits its positions
        await wait_until(lambda: len(b.assignment()) == 4, "b to own all queues", timeout=10)
        await send(cluster, topic, [f"t{i}".encode() for i in range(10)])
        rest = await poll_until(b, 10)
        assert sorted(m.body for m in rest) == sorted(f"t{i}".encode() for i in range(10))
        # auto-commit (every 0.2 s) must eventually commit all 50; poll, don't bet on a sleep
        deadline = loop.time() + 10
        while sum((committed := await committed_offsets(cluster, group, topic)).values()) != 50:
            assert loop.time() < deadline, committed
            await asyncio.sleep(0.1)
    finally:
        await a.close()
        await b.close()


def test_blocking_lite_pull_consumer(cluster):
    topic, group = "LiteSync", "lite-sync-cg"
    create_topic_sync(cluster, topic, 1)
    send_sync(cluster, topic, [b"x", b"y"])
    mq = MessageQueue(topic, cluster.broker_name, 0)
    with SyncLitePullConsumer(group, config=cfg(cluster, "ls")) as c:
        c.assign([mq])
        got = []
        for _ in range(20):
            got += c.poll(0.5)
            if len(got) >= 2:
                break
        assert [m.body for m in got] == [b"x", b"y"]
        c.commit()
        assert c.committed(mq) == 2
        c.seek(mq, 1)
        assert [m.body for m in c.poll(5)] == [b"y"]


def test_lite_pull_rejects_bad_settings_and_mixing_modes():
    with pytest.raises(ConfigError):
        LitePullConsumer("g", "127.0.0.1:9876", pull_batch_size=0)
    c = LitePullConsumer("g", "127.0.0.1:9876")
    c.subscribe("T")
    with pytest.raises(ClientError, match="cannot be mixed"):
        c.assign([MessageQueue("T", "b", 0)])
    d = LitePullConsumer("g", "127.0.0.1:9876")
    d.assign([MessageQueue("T", "b", 0)])
    with pytest.raises(ClientError, match="cannot be mixed"):
        d.subscribe("T")


async def test_paused_queues_are_not_pulled_until_resumed(cluster):
    topic, group = "LitePause", "lite-pause-cg"
    mq = MessageQueue(topic, cluster.broker_name, 0)

    await create_topic(cluster, topic, 1)
    c = LitePullConsumer(group, config=cfg(cluster, "lp"))
    c.assign([mq])
    c.pause([mq])
    async with c:
        await send(cluster, topic, [b"held"])
        assert await c.poll(0.6) == []
        c.resume([mq])
        assert [m.body for m in await poll_until(c, 1)] == [b"held"]
