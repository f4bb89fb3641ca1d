"""Producers and a pull consumer follow a broker group's failover with real processes (issue 17).

A name server and broker-a run on loopback; a producer sends in a loop; broker-a is killed
(SIGKILL) and a second broker registers the same broker name as brokerId 0 at another address
over a copy of the first one's store (what an elected follower holding the replicated log does).
The client must learn the new master from its fault-driven route refresh, not the 30 s route
poll: the time from the kill to the first acknowledged send after it is printed and bounded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import time
from pathlib import Path

import pytest

from tests.procs import Cluster
from tidemq.client import Producer, PullConsumer
from tidemq.client.config import ClientConfig
from tidemq.client.pull import PullStatus
from tidemq.client.route import MessageQueue
from tidemq.client.selectors import select_by_hash
from tidemq.client.send import SendStatus
from tidemq.errors import TideMQError
from tidemq.message import Message

TOPIC = "FailoverT"
ROUTE_POLL = 30.0  # the periodic route refresh the client must not depend on
KILL_TO_SEND_BOUND = 15.0  # includes starting the replacement broker process
READY_TO_SEND_BOUND = 3.0


@pytest.fixture
def cluster(tmp_path: Path):
    c = Cluster(tmp_path, segment_size=4 * 1024 * 1024).start()
    try:
        c.create_topic(TOPIC, queues=4)
        yield c
    finally:
        c.stop()


async def test_a_sending_producer_follows_a_new_master_registered_under_the_same_name(cluster, tmp_path):
    config = ClientConfig(name_servers=(cluster.namesrv_addr,), route_refresh_interval=ROUTE_POLL,
                          request_timeout=2.0)
    producer = Producer("failover-pg", config=config)
    await producer.start()
    acked: list[tuple[float, SendStatus]] = []
    failures: list[str] = []
    stop = asyncio.Event()

    async def send_loop() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                res = await producer.send(Message(TOPIC, f"m{n}".encode()))
                acked.append((time.monotonic(), res.status))
            except TideMQError as exc:
                failures.append(str(exc))
            await asyncio.sleep(0.02)

    # A pull consumer on its own client instance, its route learned before the kill.
    consumer = PullConsumer("failover-cg", config=dataclasses.replace(config, instance_name="cg"))
    await consumer.start()
    sender = asyncio.create_task(send_loop())
    try:
        await _until(lambda: len(acked) >= 5, 10.0)
        mq = (await consumer.fetch_queues(TOPIC))[0]
        assert (await consumer.pull(mq, 0, 8)).status in (PullStatus.FOUND, PullStatus.NO_NEW_MSG)
        await asyncio.to_thread(cluster.broker.kill)
        killed = time.monotonic()
        store = tmp_path / "store-2"
        await asyncio.to_thread(shutil.copytree, cluster.store_dir, store)
        replacement, new_addr = cluster.same_name_broker(store)
        try:
            await asyncio.to_thread(replacement.start)
            ready = time.monotonic()
            await _until(lambda: acked[-1][0] > ready, KILL_TO_SEND_BOUND)
            first = min(t for t, _ in acked if t > killed)
            print(f"\nfailover: kill -> first acknowledged send {first - killed:.2f} s "
                  f"(replacement ready after {ready - killed:.2f} s, then {first - ready:.2f} s); "
                  f"{len(failures)} sends failed meanwhile")
            assert first - killed < KILL_TO_SEND_BOUND < ROUTE_POLL
            assert first - ready < READY_TO_SEND_BOUND
            assert producer._require().routes.master_addr(cluster.broker_name) == new_addr
            assert all(status is SendStatus.SEND_OK for _, status in acked)

            # The consumer follows too: its first pull to the dead address fails and asks for the
            # refresh, a next one reaches the new master (its route poll is 30 s away).
            result = await _pull_until_found(consumer, mq)
            assert result.status is PullStatus.FOUND
            assert consumer._require().routes.master_addr(cluster.broker_name) == new_addr
        finally:
            stop.set()
            await sender
            await asyncio.to_thread(replacement.stop)
    finally:
        stop.set()
        await asyncio.gather(sender, return_exceptions=True)
        await consumer.close()
        await producer.close()


async def _pull_until_found(consumer: PullConsumer, mq):
    deadline = time.monotonic() + READY_TO_SEND_BOUND
    while True:
        try:
            return await consumer.pull(mq, 0, 8)
        except TideMQError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def _until(cond, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout} s")
        await asyncio.sleep(0.02)


async def test_ordered_and_fixed_queue_sends_follow_the_new_master_on_the_same_queue(cluster, tmp_path):
    """A selector's send and a send to an explicit queue, each made once with the route still
    naming the killed master, are retried on the same queue id at the group's new master
    (before issue 17's change they were tried once and failed)."""
    config = ClientConfig(name_servers=(cluster.namesrv_addr,), route_refresh_interval=ROUTE_POLL,
                          request_timeout=5.0)
    ordered = Producer("failover-ordered", config=config)
    explicit = Producer("failover-explicit", config=dataclasses.replace(config, instance_name="explicit"))
    consumer = PullConsumer("failover-order-cg", config=dataclasses.replace(config, instance_name="cg"))
    for client in (ordered, explicit, consumer):
        await client.start()
    try:
        key = select_by_hash("order-42")
        before = [await ordered.send(Message(TOPIC, f"o{i}".encode()), selector=key) for i in range(3)]
        mq = before[0].message_queue
        assert all(r.message_queue == mq for r in before)
        other = MessageQueue(TOPIC, cluster.broker_name, (mq.queue_id + 1) % 4)
        assert (await explicit.send(Message(TOPIC, b"e0"), queue=other)).message_queue == other

        await asyncio.to_thread(cluster.broker.kill)
        store = tmp_path / "store-2"
        await asyncio.to_thread(shutil.copytree, cluster.store_dir, store)
        replacement, new_addr = cluster.same_name_broker(store)
        try:
            await asyncio.to_thread(replacement.start)
            started = time.monotonic()
            after = await ordered.send(Message(TOPIC, b"o3"), selector=key)
            took = time.monotonic() - started
            print(f"\nfailover: an ordered send made with the stale route was acknowledged by the "
                  f"new master after {took:.2f} s")
            assert after.status is SendStatus.SEND_OK and after.message_queue == mq
            assert ordered._require().routes.master_addr(cluster.broker_name) == new_addr
            assert took < READY_TO_SEND_BOUND
            res = await explicit.send(Message(TOPIC, b"e1"), queue=other)
            assert res.status is SendStatus.SEND_OK and res.message_queue == other
            # The queue on the new master holds the ordered messages in order, the last one after them.
            pulled = await _pull_until_found(consumer, mq)
            assert [m.body for m in pulled.messages] == [b"o0", b"o1", b"o2", b"o3"]
        finally:
            await asyncio.to_thread(replacement.stop)
    finally:
        for client in (consumer, explicit, ordered):
            await client.close()
