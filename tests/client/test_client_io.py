"""Producer, PullConsumer, Admin and the sync facades against an in-process fake server.

These exercise the client's I/O paths (retries, name-server rotation, server-to-client requests,
heartbeats) without the real broker; test_client_integration.py repeats the main flows against
real processes.
"""

from __future__ import annotations

import asyncio
import zlib

import pytest

from tests.client.fake_server import fake_config, fake_fixture
from tests.support.waiting import wait_until_sync
from tidemq.client import Admin, ClientConfig, ClientInstance, MessageQueue, Producer, PullConsumer
from tidemq.client.pull import PullStatus
from tidemq.client.push.broker_api import ConsumerBrokerApi
from tidemq.client.send import SendStatus
from tidemq.client.sync import SyncAdmin, SyncProducer, SyncPullConsumer
from tidemq.errors import AdminError, BrokerError, ClientError, ConnectError, RemotingTimeoutError
from tidemq.message import Message, decode_properties
from tidemq.remoting import RemotingCommand, RequestCode, ResponseCode

from tests.procs import free_port


# The fake answers at once: a test body that takes longer than this is stuck.
pytestmark = pytest.mark.timeout(20, func_only=True)
fake = fake_fixture()
cfg = fake_config


async def test_send_and_pull_round_trip(fake):
    fake.topics["T"] = (4, 4, 6)
    async with Producer("pg", config=cfg(fake)) as p:
        results = [await p.send(Message("T", f"m{i}".encode(), tags="TagA", keys=f"k{i}")) for i in range(8)]
    assert {r.status for r in results} == {SendStatus.SEND_OK}
    assert sorted(r.message_queue.queue_id for r in results) == [0, 0, 1, 1, 2, 2, 3, 3]  # round robin
    assert all(len(r.msg_id) == 32 for r in results) and len({r.msg_id for r in results}) == 8
    sends = [c for c in fake.requests if c.code == RequestCode.SEND_MESSAGE_V2]
    assert {c.ext_fields["a"] for c in sends} == {"pg"}
    assert decode_properties(sends[0].ext_fields["i"])["WAIT"] == "true"

    async with PullConsumer("cg", config=cfg(fake)) as c:
        queues = await c.fetch_queues("T")
        assert queues == [MessageQueue("T", "broker-a", i) for i in range(4)]
        got = {}
        for mq in queues:
            r = await c.pull(mq, 0)
            assert r.status is PullStatus.FOUND and r.next_begin_offset == 2
            for m in r.messages:
                got[m.msg_id] = m
            assert (await c.pull(mq, 2)).status is PullStatus.NO_NEW_MSG
            assert (await c.pull(mq, 5)).status is PullStatus.OFFSET_ILLEGAL
        assert set(got) == {r.msg_id for r in results}
        assert sorted(m.body for m in got.values()) == [f"m{i}".encode() for i in range(8)]
        assert all(m.tags == "TagA" and m.keys == [f"k{int(m.body[1:])}"] for m in got.values())
        # a consumer heartbeat reached the broker before the pulls
        assert any(hb["consumerDataSet"] and hb["consumerDataSet"][0]["groupName"] == "cg" for hb in fake.heartbeats)


async def test_compressed_body_is_sent_compressed_and_read_back_inflated(fake):
    fake.topics["T"] = (1, 1, 6)
    body = b"compressible " * 8000
    async with Producer("pg", config=cfg(fake)) as p, PullConsumer("cg", config=cfg(fake)) as c:
        await p.send(Message("T", body))
        sent = [x for x in fake.requests if x.code == RequestCode.SEND_MESSAGE_V2][0]
        assert sent.ext_fields["f"] == "1" and zlib.decompress(sent.body_bytes()) == body
        r = await c.pull(MessageQueue("T", "broker-a", 0), 0)
        assert r.messages[0].body == body


async def test_batch_lands_on_one_queue_with_consecutive_offsets(fake):
    fake.topics["T"] = (2, 2, 6)
    async with Producer("pg", config=cfg(fake)) as p, PullConsumer("cg", config=cfg(fake)) as c:
        mq = MessageQueue("T", "broker-a", 1)
        res = await p.send_batch([Message("T", f"b{i}".encode(), keys=f"k{i}") for i in range(32)], queue=mq)
        assert res.message_queue == mq and res.queue_offset == 0
        assert len(res.msg_id.split(",")) == 32 and len(res.offset_msg_id.split(",")) == 32
        r = await c.pull(mq, 0, max_nums=64)
        assert [m.body for m in r.messages] == [f"b{i}".encode() for i in range(32)]
        assert [m.msg_id for m in r.messages] == res.msg_id.split(",")
        assert [m.queue_offset for m in r.messages] == list(range(32))


async def test_tag_filtering(fake):
    fake.topics["T"] = (1, 1, 6)
    mq = MessageQueue("T", "broker-a", 0)
    async with Producer("pg", config=cfg(fake)) as p, PullConsumer("cg", config=cfg(fake)) as c:
        for tag in ["TagA", "TagB", "TagC", "TagA"]:
            await p.send(Message("T", tag.encode(), tags=tag), queue=mq)
        r = await c.pull(mq, 0, expression="TagA || TagC")
        assert [m.tags for m in r.messages] == ["TagA", "TagC", "TagA"] and r.next_begin_offset == 4
        pulls = [x for x in fake.requests if x.code == RequestCode.PULL_MESSAGE]
        assert pulls[-1].ext_fields["subscription"] == "TagA || TagC"
        r = await c.pull(mq, 1, max_nums=1, expression="TagA")
        assert r.status is PullStatus.NO_MATCHED_MSG and r.next_begin_offset == 2


async def test_offsets_commit_and_query(fake):
    fake.topics["T"] = (1, 1, 6)
    mq = MessageQueue("T", "broker-a", 0)
    async with PullConsumer("cg", config=cfg(fake)) as c, Producer("pg", config=cfg(fake)) as p:
        assert await c.committed_offset(mq) is None
        await c.commit(mq, 3)
        assert await c.committed_offset(mq) == 3
        await p.send(Message("T", b"x"))
        assert await c.max_offset(mq) == 1 and await c.min_offset(mq) == 0
        assert await c.search_offset(mq, 0) == 0
        assert await c.search_offset(mq, 2**50) == 1


async def test_send_retries_on_retryable_code_and_raises_on_others(fake):
    fake.topics["T"] = (2, 2, 6)
    async with Producer("pg", config=cfg(fake)) as p:
        fake.fail_next.append((RequestCode.SEND_MESSAGE_V2, ResponseCode.SYSTEM_ERROR))
        r = await p.send(Message("T", b"x"))
        assert r.status is SendStatus.SEND_OK
        assert fake.codes().count(RequestCode.SEND_MESSAGE_V2) == 2
        fake.fail_next.append((RequestCode.SEND_MESSAGE_V2, ResponseCode.MESSAGE_ILLEGAL))
        with pytest.raises(BrokerError) as ei:
            await p.send(Message("T", b"x"))
        assert ei.value.code == ResponseCode.MESSAGE_ILLEGAL and ei.value.remark == "scripted failure"
        assert fake.codes().count(RequestCode.SEND_MESSAGE_V2) == 3
        fake.fail_next.extend([(RequestCode.SEND_MESSAGE_V2, ResponseCode.SERVICE_NOT_AVAILABLE)] * 3)
        with pytest.raises(BrokerError, match="after 3 attempt") as ei:
            await p.send(Message("T", b"x"))
        assert ei.value.code == ResponseCode.SERVICE_NOT_AVAILABLE
        # a flush timeout is a non-OK success, not an error
        fake.fail_next.append((RequestCode.SEND_MESSAGE_V2, ResponseCode.FLUSH_DISK_TIMEOUT))
        with pytest.raises(BrokerError, match="msgId|queueId"):
            await p.send(Message("T", b"x"))  # scripted reply lacks the send header


async def test_send_moves_to_another_broker_when_one_is_unreachable(fake):
    fake.topics["T"] = (1, 1, 6)
    fake.extra_brokers["broker-dead"] = f"127.0.0.1:{free_port()}"
    async with Producer("pg", config=cfg(fake)) as p:
        results = [await p.send(Message("T", b"x")) for _ in range(4)]
    assert {r.message_queue.broker_name for r in results} == {"broker-a"}


async def test_send_timeout_bounds_the_whole_send(fake):
    fake.topics["T"] = (1, 1, 6)
    fake.hold.add(RequestCode.SEND_MESSAGE_V2)
    # Many retries: a per-attempt timeout would take 20 x 0.3 s, the bounded send 0.3 s.
    async with Producer("pg", config=cfg(fake, retry_times_when_send_failed=19)) as p:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(RemotingTimeoutError):
            await p.send(Message("T", b"x"), timeout=0.3)
        assert loop.time() - t0 < 3.0


async def test_no_route_and_validation_errors(fake):
    async with Producer("pg", config=cfg(fake)) as p:
        with pytest.raises(ClientError, match="no route for topic Missing.*updateTopic"):
            await p.send(Message("Missing", b"x"))
        with pytest.raises(ClientError, match="system topic"):
            await p.send(Message("SCHEDULE_TOPIC_XXXX", b"x"))
        with pytest.raises(ClientError, match="empty"):
            await p.send(Message("T", b""))
    with pytest.raises(ClientError, match="not started"):
        await Producer("pg", config=cfg(fake)).send(Message("T", b"x"))


async def test_name_servers_are_tried_in_turn(fake):
    fake.topics["T"] = (1, 1, 6)
    dead = f"127.0.0.1:{free_port()}"
    async with Admin(config=ClientConfig(name_servers=[dead, fake.addr])) as a:
        for _ in range(3):
            assert "T" in await a.topic_list()
    async with Admin(config=ClientConfig(name_servers=[dead])) as a:
        with pytest.raises(ConnectError, match="no name server answered"):
            await a.topic_list()


async def test_server_requests_are_answered_not_supported_or_ignored(fake):
    fake.topics["T"] = (1, 1, 6)
    async with Producer("pg", config=cfg(fake)) as p:
        await p.send(Message("T", b"x"))
        (conn,) = list(fake.server.connections)
        resp = await conn.invoke(RemotingCommand.request(RequestCode.GET_CONSUMER_RUNNING_INFO, {"clientId": "x"}), 2)
        assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        conn.invoke_oneway(RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": "g"}))
        assert (await p.send(Message("T", b"y"))).status is SendStatus.SEND_OK


async def test_producer_heartbeat_and_shared_instance(fake):
    fake.topics["T"] = (1, 1, 6)
    config = cfg(fake)
    async with Producer("pg", config=config) as p, PullConsumer("cg", config=config) as c:
        assert p._instance is c._instance
        await p.send(Message("T", b"x"))
        await c.fetch_queues("T")
        assert await p._instance.send_heartbeat() == 1
        hb = fake.heartbeats[-1]
        assert hb["producerDataSet"] == [{"groupName": "pg"}]
        assert hb["consumerDataSet"][0]["subscriptionDataSet"][0]["topic"] == "T"
        assert hb["clientID"] == p.client_id
    assert not ClientInstance._registry
    assert RequestCode.UNREGISTER_CLIENT in fake.codes()


async def test_admin_operations(fake):
    async with Admin(config=cfg(fake)) as a:
        assert await a.create_topic("T", 2, 2, cluster="DefaultCluster") == [fake.addr]
        assert await a.create_topic("U", broker_addr=fake.addr) == [fake.addr]
        with pytest.raises(ClientError, match="exactly one"):
            await a.create_topic("V")
        with pytest.raises(AdminError, match="NoCluster.*DefaultCluster"):
            await a.create_topic("V", cluster="NoCluster")
        assert await a.topic_list() == ["T", "U"]
        route = await a.topic_route("T")
        assert route.publish_queues("T") == [MessageQueue("T", "broker-a", i) for i in range(2)]
        with pytest.raises(AdminError, match="does not exist"):
            await a.topic_route("Nope")
        info = await a.cluster_info()
        assert info.master_addrs("DefaultCluster") == {"broker-a": fake.addr}
        assert await a.update_subscription_group("cg", cluster="DefaultCluster") == [fake.addr]

        async with Producer("pg", config=cfg(fake)) as p, PullConsumer("cg", config=cfg(fake)) as c:
            sent = [await p.send(Message("T", f"{i}".encode(), keys=["order-1" if i < 3 else "other", "x"]),
                                 queue=MessageQueue("T", "broker-a", i % 2)) for i in range(5)]
            await c.commit(MessageQueue("T", "broker-a", 0), 1)
            assert await a.get_consumer_list("cg", "T") == [c.client_id]
        status = await a.topic_status("T")
        assert [(mq.queue_id, mn, mx) for mq, mn, mx, _ in status] == [(0, 0, 3), (1, 0, 2)]
        assert status[0].last_update_ms > 0
        progress = await a.consumer_progress("cg", "T")
        assert [(q.queue.queue_id, q.broker_offset, q.consumer_offset) for q in progress] == [(0, 3, 1)]
        assert progress.total_lag == 2
        assert (await a.consumer_progress("cg")).total_lag == 2

        by_key = await a.query_msg_by_key("T", "order-1")
        assert sorted(m.body for m in by_key) == [b"0", b"1", b"2"]
        assert await a.query_msg_by_key("T", "missing") == []
        m = await a.query_msg_by_id("T", sent[3].offset_msg_id)
        assert m.body == b"3"
        m = await a.query_msg_by_id("T", sent[4].msg_id)
        assert m.body == b"4" and m.msg_id == sent[4].msg_id
        assert (await a.query_msg_by_id(None, sent[1].offset_msg_id)).body == b"1"
        with pytest.raises(AdminError, match="not found"):
            await a.query_msg_by_id("T", "00" * 16)
        assert await a.delete_topic("T", "DefaultCluster") == [fake.addr]
        assert RequestCode.DELETE_TOPIC_IN_NAMESRV in fake.codes()
        assert await a.topic_list() == ["U"]


async def test_a_queue_of_a_topic_nobody_created_says_to_create_it(fake):
    """The pull consumer and the push consumer's broker calls find a queue's broker the same way
    (ClientInstance.queue_read_addr / queue_master_addr): an unknown topic is a ClientError saying what to do."""
    nope = MessageQueue("Nope", "broker-a", 0)
    async with PullConsumer("cg", config=cfg(fake)) as c:
        with pytest.raises(ClientError, match="no route for topic Nope: create the topic first"):
            await c.pull(nope, 0)
        api = ConsumerBrokerApi(c._instance, "cg")
        with pytest.raises(ClientError, match="no route for topic Nope: create the topic first"):
            await api.query_offset(nope)
    assert not [cmd for cmd in fake.requests if cmd.code in (RequestCode.PULL_MESSAGE,
                                                             RequestCode.QUERY_CONSUMER_OFFSET)]


async def test_sync_facades_round_trip(fake):
    await asyncio.to_thread(sync_part, fake)  # the blocking facades run off the test's loop


def sync_part(fake):
    with SyncAdmin(fake.addr) as a:
        a.create_topic("S", 1, 1, cluster="DefaultCluster")
    with SyncProducer("pg", fake.addr) as p:
        r = p.send(Message("S", b"sync"))
        p.send_batch([Message("S", b"b1"), Message("S", b"b2")])
        p.send_oneway(Message("S", b"oneway"))
    with SyncPullConsumer("cg", fake.addr) as c:
        (mq,) = c.fetch_queues("S")
        wait_until_sync(lambda: c.max_offset(mq) >= 4, "the oneway send to be stored")
        res = c.pull(mq, 0)
        assert [m.body for m in res.messages][:3] == [b"sync", b"b1", b"b2"]
        assert res.messages[0].msg_id == r.msg_id
        c.commit(mq, 2)
        assert c.committed_offset(mq) == 2
    p.close()  # idempotent
    with pytest.raises(ClientError, match="closed"):
        p.send(Message("S", b"late"))
