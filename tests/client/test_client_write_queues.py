"""A broker takes sends only on a topic's write queues (issue 18), against a real name server and
broker (the shared ``cluster`` fixture of tests/conftest.py).

A Topic shrink lowers writeQueueNums first and keeps the queues above it readable until every
consumer group drained them. Producers pick among the write queues of their route, which they
re-read only every ~30 s: a stale route still names the queues being drained, and a broker that
took those sends (RocketMQ 4.x accepts any queue below max(read, write)) would add messages that
no consumer reads once readQueueNums is lowered. The broker answers NO_PERMISSION instead, one of
the codes after which our producer re-reads the route and retries on a write queue.
"""

from __future__ import annotations

import time

import pytest

from tidemq.client import Admin, ClientConfig, MessageQueue, Producer
from tidemq.client.send import OutgoingMessage, build_send_request
from tidemq.errors import BrokerError
from tidemq.message import Message, Prop, encode_properties
from tidemq.remoting import ResponseCode
from tidemq.remoting.transport import RemotingClient
from tests.support.topics import create_topic
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60, func_only=True)

READ, WRITE = 8, 2


async def _shrink_writes(cluster, admin: Admin, topic: str) -> None:
    """Lower the topic's write queues to WRITE, keep READ readable (a shrink's first step), and
    wait until the name server routes the new count."""
    await admin.create_topic(topic, read_queues=READ, write_queues=WRITE, broker_addr=cluster.broker_addr)

    async def routed() -> bool:
        route = await admin.topic_route(topic)
        return len(route.publish_queues(topic)) == WRITE
    await wait_until(routed, f"the name server to route {WRITE} write queues of {topic}", timeout=10)


async def test_a_raw_send_to_a_read_only_queue_is_refused_with_no_permission(cluster):
    topic = "WqRaw"
    async with Admin(cluster.namesrv_addr) as admin:
        await create_topic(cluster, topic, READ, admin=admin)
        await _shrink_writes(cluster, admin, topic)
    out = OutgoingMessage(topic, b"late", 0, 0, encode_properties({Prop.UNIQ_KEY: "K1", Prop.WAIT: "true"}), "K1")
    client = RemotingClient()
    try:
        refused = await client.invoke(cluster.broker_addr, build_send_request("wq-raw-pg", out, 5, 0), 5.0)
        accepted = await client.invoke(cluster.broker_addr, build_send_request("wq-raw-pg", out, 1, 0), 5.0)
        missing = await client.invoke(cluster.broker_addr, build_send_request("wq-raw-pg", out, READ, 0), 5.0)
    finally:
        await client.close()
    assert refused.code == ResponseCode.NO_PERMISSION
    assert refused.remark == (
        f"queue 5 of topic[{topic}] on broker[{cluster.broker_name}] takes no new messages: writeQueueNums is 2, "
        "readQueueNums 8 (queues 2-7 are only read, as while a shrink drains them); refresh the topic's route "
        "and send to a queue below 2")
    assert accepted.code == ResponseCode.SUCCESS
    assert missing.code == ResponseCode.SYSTEM_ERROR and "is illegal" in (missing.remark or "")
    async with Admin(cluster.namesrv_addr) as admin:
        stored = {q: (await admin.queue_offset_range(cluster.broker_addr, topic, q))[1] for q in range(READ)}
    assert stored == {q: int(q == 1) for q in range(READ)}  # the refused send stored nothing


async def test_a_producer_with_a_stale_route_moves_to_the_write_queues(cluster):
    topic = "WqStale"
    # The periodic route refresh is pushed out of the test: only the refusal can renew the route.
    cfg = ClientConfig(name_servers=cluster.namesrv_addr, route_refresh_interval=600.0)
    async with Admin(cluster.namesrv_addr) as admin, Producer("wq-stale-pg", config=cfg) as producer:
        await create_topic(cluster, topic, READ, admin=admin)
        await producer.send(Message(topic, b"before"))  # the producer now routes 8 write queues
        await _shrink_writes(cluster, admin, topic)
        before = {q: (await admin.queue_offset_range(cluster.broker_addr, topic, q))[1] for q in range(READ)}
        results = [await producer.send(Message(topic, f"after-{i}".encode())) for i in range(16)]
        after = {q: (await admin.queue_offset_range(cluster.broker_addr, topic, q))[1] for q in range(READ)}
        # A send fixed on a draining queue (an orderly selector's choice) fails with the reason.
        started = time.monotonic()
        with pytest.raises(BrokerError) as refused:
            await producer.send(Message(topic, b"fixed"), queue=MessageQueue(topic, cluster.broker_name, 6))
        took = time.monotonic() - started
    assert {r.message_queue.queue_id for r in results} <= set(range(WRITE))
    assert sum(after.values()) - sum(before.values()) == 16
    assert all(after[q] == before[q] for q in range(WRITE, READ))  # nothing more in the draining queues
    assert refused.value.code == ResponseCode.NO_PERMISSION
    assert "takes no new messages" in str(refused.value) and "send to a queue below 2" in str(refused.value)
    assert took < 10.0
