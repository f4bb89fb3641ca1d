"""The client against real TideMQ processes (the shared ``cluster`` fixture of tests/conftest.py).

Each test uses its own topic and group names, since the cluster is shared by the module.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tidemq.client import Admin, ClientConfig, MessageQueue, Producer, PullConsumer
from tidemq.client.pull import PullStatus
from tidemq.client.send import SendStatus
from tidemq.client.sync import SyncAdmin, SyncProducer, SyncPullConsumer
from tidemq.errors import AdminError, ClientError
from tidemq.message import Message, MessageExt, SysFlag
from tests.support.topics import create_topic, create_topic_sync
from tests.support.waiting import wait_until

# A bound per test body (the shared cluster's start is not counted).
pytestmark = pytest.mark.timeout(30, func_only=True)


def config(cluster) -> ClientConfig:
    return ClientConfig(name_servers=cluster.namesrv_addr)


async def drain(consumer: PullConsumer, mq: MessageQueue, offset: int = 0,
                expression: str = "*") -> list[MessageExt]:
    """Pull ``mq`` from ``offset`` until the broker has nothing new."""
    out: list[MessageExt] = []
    for _ in range(1000):
        r = await consumer.pull(mq, offset, 32, expression=expression)
        if r.status is PullStatus.NO_NEW_MSG:
            return out
        assert r.status in (PullStatus.FOUND, PullStatus.NO_MATCHED_MSG), r
        assert r.next_begin_offset > offset
        out.extend(r.messages)
        offset = r.next_begin_offset
    raise AssertionError("queue never drained")


async def test_cluster_info_and_topic_list(cluster):
    async with Admin(cluster.namesrv_addr) as admin:
        info = await admin.cluster_info()
        assert info.master_addrs(cluster.cluster_name) == {cluster.broker_name: cluster.broker_addr}
        await create_topic(cluster, "ItList", 2, admin=admin)
        assert "ItList" in await admin.topic_list()


async def test_produce_single_batch_and_large_then_pull_back(cluster):
    topic = "ItProduce"
    big = b"0123456789abcdef" * 6400  # 100 KiB, compressible

    async with Admin(config=config(cluster)) as admin:
        await create_topic(cluster, topic, 4, admin=admin)
    async with Producer("it-produce-pg", config=config(cluster)) as p:
        singles = [await p.send(Message(topic, f"single-{i}".encode(), tags=f"Tag{i % 2}",
                                        keys=[f"key-{i}", "common"]))
                   for i in range(8)]
        batch_mq = MessageQueue(topic, cluster.broker_name, 2)
        batch = await p.send_batch([Message(topic, f"batch-{i}".encode(), tags="TagB", keys=f"bk-{i}")
                                    for i in range(32)], queue=batch_mq)
        large = await p.send(Message(topic, big, tags="Big"))
    assert all(r.status is SendStatus.SEND_OK for r in [*singles, batch, large])
    assert sorted(r.message_queue.queue_id for r in singles) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert batch.message_queue == batch_mq
    assert len(batch.msg_id.split(",")) == 32 == len(batch.offset_msg_id.split(","))

    async with PullConsumer("it-produce-cg", config=config(cluster)) as c:
        queues = await c.fetch_queues(topic)
        assert queues == [MessageQueue(topic, cluster.broker_name, i) for i in range(4)]
        pulled = {mq: await drain(c, mq) for mq in queues}
    for mq, msgs in pulled.items():
        assert [m.queue_offset for m in msgs] == list(range(len(msgs))), mq
        assert all(m.queue_id == mq.queue_id and m.topic == topic for m in msgs)
    by_id = {m.msg_id: m for msgs in pulled.values() for m in msgs}
    assert len(by_id) == 8 + 32 + 1
    for i, r in enumerate(singles):
        m = by_id[r.msg_id]
        assert m.body == f"single-{i}".encode() and m.tags == f"Tag{i % 2}"
        assert m.keys == [f"key-{i}", "common"]
        assert m.queue_offset == r.queue_offset and m.offset_msg_id == r.offset_msg_id
        assert m.store_host == cluster.broker_addr
    ids = batch.msg_id.split(",")
    assert [m.msg_id for m in pulled[batch_mq] if m.msg_id in set(ids)] == ids
    for i, uid in enumerate(ids):
        m = by_id[uid]
        assert m.body == f"batch-{i}".encode() and m.keys == [f"bk-{i}"] and m.tags == "TagB"
        assert m.queue_offset == batch.queue_offset + i
        assert m.offset_msg_id == batch.offset_msg_id.split(",")[i]
    m = by_id[large.msg_id]
    assert m.body == big and m.sys_flag & SysFlag.COMPRESSED  # inflated; the flag as stored (as RocketMQ)
    assert m.store_size < len(big)  # stored compressed


async def test_tag_filtering(cluster):
    topic = "ItTags"

    async with Admin(config=config(cluster)) as admin:
        await create_topic(cluster, topic, 1, admin=admin)
    mq = MessageQueue(topic, cluster.broker_name, 0)
    tags = ["TagA", "TagB", "TagC", "TagA", "TagB", "TagC", "TagA"]
    async with Producer("it-tags-pg", config=config(cluster)) as p:
        for i, t in enumerate(tags):
            await p.send(Message(topic, f"{t}-{i}".encode(), tags=t), queue=mq)
    async with PullConsumer("it-tags-cg", config=config(cluster)) as c:
        got = await drain(c, mq, expression="TagA || TagC")
        assert [m.body for m in got] == [b"TagA-0", b"TagC-2", b"TagA-3", b"TagC-5", b"TagA-6"]
        only_b = await drain(c, mq, expression="TagB")
        assert [m.queue_offset for m in only_b] == [1, 4]
        assert len(await drain(c, mq, expression="*")) == len(tags)
        assert await drain(c, mq, expression="NoSuchTag") == []


async def test_commit_and_committed_offset(cluster):
    topic = "ItOffsets"

    async with Admin(config=config(cluster)) as admin:
        await create_topic(cluster, topic, 2, admin=admin)
    mq = MessageQueue(topic, cluster.broker_name, 1)
    async with PullConsumer("it-offsets-cg", config=config(cluster)) as c:
        # a fresh group on a queue that still starts at 0 reads from 0 (reference 2.3, 14)
        assert await c.committed_offset(mq) in (0, None)
        await c.commit(mq, 3)
        assert await c.committed_offset(mq) == 3
        await c.commit(mq, 5)
        assert await c.committed_offset(mq) == 5
        other = MessageQueue(topic, cluster.broker_name, 0)
        assert await c.committed_offset(other) in (0, None)


async def test_offsets_max_min_and_search(cluster):
    topic = "ItMaxMin"

    async with Admin(config=config(cluster)) as admin:
        await create_topic(cluster, topic, 1, admin=admin)
    mq = MessageQueue(topic, cluster.broker_name, 0)
    async with Producer("it-maxmin-pg", config=config(cluster)) as p, \
            PullConsumer("it-maxmin-cg", config=config(cluster)) as c:
        assert await c.max_offset(mq) == 0
        first = [await p.send(Message(topic, b"early"), queue=mq) for _ in range(3)]
        await asyncio.sleep(0.05)
        middle = int(time.time() * 1000)
        await asyncio.sleep(0.05)
        [await p.send(Message(topic, b"late"), queue=mq) for _ in range(2)]
        assert first[-1].queue_offset == 2
        assert await c.max_offset(mq) == 5
        assert await c.min_offset(mq) == 0
        assert await c.search_offset(mq, middle) in (2, 3)
        assert await c.search_offset(mq, 0) == 0


async def test_topic_status_and_consumer_progress(cluster):
    topic, group = "ItProgress", "it-progress-cg"

    async with Admin(config=config(cluster)) as admin:
        await create_topic(cluster, topic, 2, admin=admin)
        q0, q1 = (MessageQueue(topic, cluster.broker_name, i) for i in range(2))
        async with Producer("it-progress-pg", config=config(cluster)) as p:
            for i in range(5):
                await p.send(Message(topic, b"x"), queue=q0)
            for i in range(3):
                await p.send(Message(topic, b"y"), queue=q1)
        status = await admin.topic_status(topic)
        assert [(s.queue, s.min_offset, s.max_offset) for s in status] == [(q0, 0, 5), (q1, 0, 3)]
        assert all(s.last_update_ms > 0 for s in status)

        async with PullConsumer(group, config=config(cluster)) as c:
            await c.commit(q0, 2)
            await c.commit(q1, 3)
            progress = await admin.consumer_progress(group, topic)
            rows = {q.queue: (q.broker_offset, q.consumer_offset) for q in progress}
            assert rows[q0] == (5, 2) and rows[q1] == (3, 3)
            assert progress.total_lag == 3
            everything = await admin.consumer_progress(group)
            assert {q.queue for q in everything if q.queue.topic == topic} == {q0, q1}
            assert sum(q.lag for q in everything if q.queue.topic == topic) == 3
            assert c.client_id in await admin.get_consumer_list(group, topic)


async def test_query_by_key_and_by_both_id_kinds(cluster):
    topic = "ItQuery"

    async with Admin(config=config(cluster)) as admin:
        await create_topic(cluster, topic, 2, admin=admin)
        async with Producer("it-query-pg", config=config(cluster)) as p:
            sent = [await p.send(Message(topic, f"q{i}".encode(), keys=["order-7" if i % 2 else "other", f"k{i}"]))
                    for i in range(6)]

        async def by_key():
            return await admin.query_msg_by_key(topic, "order-7")
        found = await wait_until(by_key, "the index to find the messages of key order-7")
        assert sorted(m.body for m in found) == [b"q1", b"q3", b"q5"]
        assert all("order-7" in m.keys for m in found)
        assert await admin.query_msg_by_key(topic, "no-such-key") == []

        m = await admin.query_msg_by_id(topic, sent[2].offset_msg_id)
        assert m.body == b"q2" and m.offset_msg_id == sent[2].offset_msg_id
        m = await admin.query_msg_by_id(None, sent[4].offset_msg_id)
        assert m.body == b"q4"

        async def by_uniq():
            try:
                return await admin.query_msg_by_id(topic, sent[5].msg_id)
            except AdminError:
                return None
        m = await wait_until(by_uniq, f"the index to find message {sent[5].msg_id} by its unique key")
        assert m is not None and m.body == b"q5" and m.msg_id == sent[5].msg_id
        with pytest.raises(AdminError):
            await admin.query_msg_by_id(topic, "0" * 32)


async def test_long_poll_returns_when_a_message_arrives(cluster):
    topic = "ItLongPoll"

    async with Admin(config=config(cluster)) as admin:
        await create_topic(cluster, topic, 1, admin=admin)
    mq = MessageQueue(topic, cluster.broker_name, 0)
    async with Producer("it-lp-pg", config=config(cluster)) as p, \
            PullConsumer("it-lp-cg", config=config(cluster)) as c:
        await c.fetch_queues(topic)

        async def later():
            await asyncio.sleep(0.3)
            await p.send(Message(topic, b"wake"), queue=mq)

        t0 = time.monotonic()
        task = asyncio.create_task(later())
        r = await c.pull(mq, 0, suspend_ms=5000)
        await task
        assert r.status is PullStatus.FOUND and [m.body for m in r.messages] == [b"wake"]
        assert time.monotonic() - t0 < 4.0
        t0 = time.monotonic()
        r = await c.pull(mq, 1, suspend_ms=500)
        assert r.status is PullStatus.NO_NEW_MSG and r.next_begin_offset == 1
        assert 0.3 < time.monotonic() - t0 < 3.0


async def test_send_to_unknown_topic_says_how_to_create_it(cluster):
    async with Producer("it-unknown-pg", config=config(cluster)) as p:
        with pytest.raises(ClientError, match="no route for topic ItNeverCreated"):
            await p.send(Message("ItNeverCreated", b"x"))
    async with Admin(config=config(cluster)) as admin:
        with pytest.raises(AdminError, match="does not exist"):
            await admin.topic_route("ItNeverCreated")


async def test_update_subscription_group_and_delete_topic(cluster):
    async with Admin(config=config(cluster)) as admin:
        assert await admin.update_subscription_group("it-subgroup", cluster=cluster.cluster_name,
                                                     retry_max_times=3) == [cluster.broker_addr]
        assert await admin.update_subscription_group("it-subgroup",
                                                     broker_addr=cluster.broker_addr) == [cluster.broker_addr]
        await create_topic(cluster, "ItDelete", 1, admin=admin)
        assert await admin.delete_topic("ItDelete", cluster.cluster_name) == [cluster.broker_addr]
        assert "ItDelete" not in await admin.topic_list()
        with pytest.raises(AdminError):
            await admin.topic_route("ItDelete")


def test_sync_facade_round_trip(cluster):
    topic = "ItSync"
    create_topic_sync(cluster, topic, 1)
    with SyncProducer("it-sync-pg", cluster.namesrv_addr) as p:
        r1 = p.send(Message(topic, b"sync-1", tags="S"))
        rb = p.send_batch([Message(topic, b"sync-2"), Message(topic, b"sync-3")])
    assert r1.status is SendStatus.SEND_OK and rb.queue_offset == 1
    with SyncPullConsumer("it-sync-cg", cluster.namesrv_addr) as c:
        (mq,) = c.fetch_queues(topic)
        r = c.pull(mq, 0)
        assert [m.body for m in r.messages] == [b"sync-1", b"sync-2", b"sync-3"]
        assert r.messages[0].msg_id == r1.msg_id
        c.commit(mq, r.next_begin_offset)
        assert c.committed_offset(mq) == 3
        assert c.max_offset(mq) == 3
    with SyncAdmin(cluster.namesrv_addr) as admin:
        assert admin.consumer_progress("it-sync-cg", topic).total_lag == 0
