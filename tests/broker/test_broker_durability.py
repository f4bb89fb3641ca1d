"""Restarts, crashes and expiry with real processes: offsets survive, acknowledged messages survive
kill -9 under SYNC_FLUSH, a torn CommitLog tail is truncated, a silent broker leaves the routes."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import uuid
from pathlib import Path

from tidemq.errors import TideMQError
from tidemq.message import MESSAGE_MAGIC, decode_record_header, decode_records
from tidemq.remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from tests.broker.test_broker_protocol import pull_cmd, send_cmd
from tests.support.waiting import wait_until


async def read_queue(c: RemotingClient, addr: str, topic: str, q: int) -> list:
    out, offset = [], 0
    while True:
        r = await c.invoke(addr, pull_cmd(topic, q, offset), 5)
        if r.code != ResponseCode.SUCCESS:
            return out
        msgs = decode_records(r.body_bytes())
        out.extend(msgs)
        offset = int(r.ext_fields["nextBeginOffset"])


async def read_topic(addr: str, topic: str, queues: int) -> list:
    c = RemotingClient()
    try:
        out = []
        for q in range(queues):
            out.extend(await read_queue(c, addr, topic, q))
        return out
    finally:
        await c.close()


async def commit(addr, group, topic, q, offset):
    c = RemotingClient()
    try:
        up = RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic, "queueId": q, "commitOffset": offset})
        assert (await c.invoke(addr, up, 3)).code == 0
    finally:
        await c.close()


async def query_offset(addr, group, topic, q):
    c = RemotingClient()
    try:
        return await c.invoke(addr, RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic, "queueId": q}), 3)
    finally:
        await c.close()


async def test_offsets_and_messages_survive_a_clean_restart(cluster_factory):
    c = cluster_factory()
    topic = f"rs_{uuid.uuid4().hex[:6]}"
    c.create_topic(topic, queues=2)

    async def produce():
        cl = RemotingClient()
        try:
            for i in range(10):
                assert (await cl.invoke(c.broker_addr, send_cmd(topic, f"m{i}".encode(), queue_id=i % 2), 3)).code == 0
        finally:
            await cl.close()
    await produce()
    await commit(c.broker_addr, "grp", topic, 0, 3)
    await commit(c.broker_addr, "grp", topic, 1, 5)
    c.restart_broker()
    assert (await query_offset(c.broker_addr, "grp", topic, 0)).ext_fields["offset"] == "3"
    assert (await query_offset(c.broker_addr, "grp", topic, 1)).ext_fields["offset"] == "5"
    assert sorted(m.body for m in await read_topic(c.broker_addr, topic, 2)) == sorted(f"m{i}".encode() for i in range(10))


async def test_new_group_reads_young_queue_from_zero(cluster):
    topic = f"young_{uuid.uuid4().hex[:6]}"
    cluster.create_topic(topic, queues=1)
    r = await query_offset(cluster.broker_addr, "brand-new-group", topic, 0)
    assert r.code == ResponseCode.SUCCESS and r.ext_fields["offset"] == "0"


async def _produce_until_killed(c, topic: str, queues: int, kill_after: int) -> dict[bytes, int]:
    """Send with 4 concurrent senders; kill -9 the broker after kill_after acks. Return acked bodies."""
    acked: dict[bytes, int] = {}
    killed = threading.Event()

    async def sender(idx: int, cl: RemotingClient):
        n = 0
        while not killed.is_set():
            body = f"s{idx}-{n}".encode()
            n += 1
            try:
                r = await cl.invoke(c.broker_addr, send_cmd(topic, body, queue_id=idx % queues), 3)
            except TideMQError:
                return
            if r.code == ResponseCode.SUCCESS:
                acked[body] = int(r.ext_fields["queueOffset"])
                if len(acked) >= kill_after and not killed.is_set():
                    killed.set()
                    os.kill(c.broker.proc.pid, signal.SIGKILL)

    cl = RemotingClient()
    try:
        await asyncio.gather(*(sender(i, cl) for i in range(4)))
    finally:
        await cl.close()
    c.broker.proc.wait()
    return acked


async def test_kill_9_under_sync_flush_loses_no_acknowledged_message(cluster_factory):
    c = cluster_factory(flush="sync")
    topic = f"crash_{uuid.uuid4().hex[:6]}"
    c.create_topic(topic, queues=4)
    acked = await _produce_until_killed(c, topic, 4, kill_after=400)
    assert len(acked) >= 400
    c.broker.start()
    stored = await read_topic(c.broker_addr, topic, 4)
    bodies = [m.body for m in stored]
    assert len(bodies) == len(set(bodies)), "a message is stored at two queue offsets"
    missing = set(acked) - set(bodies)
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:3]}"
    by_body = {m.body: m.queue_offset for m in stored}
    assert all(by_body[b] == off for b, off in acked.items())
    print(f"acknowledged {len(acked)}, stored {len(stored)} after kill -9")


def _data_end(segment: Path) -> int:
    data = segment.read_bytes()
    pos = 0
    while pos + 8 <= len(data):
        total = int.from_bytes(data[pos:pos + 4], "big", signed=True)
        magic = int.from_bytes(data[pos + 4:pos + 8], "big")
        if total <= 0 or magic != MESSAGE_MAGIC:
            break
        decode_record_header(data, pos)
        pos += total
    return pos


async def test_torn_commitlog_tail_is_truncated_after_a_crash(cluster_factory):
    c = cluster_factory(flush="sync")
    topic = f"torn_{uuid.uuid4().hex[:6]}"
    c.create_topic(topic, queues=1)

    async def produce(n, prefix):
        cl = RemotingClient()
        try:
            for i in range(n):
                assert (await cl.invoke(c.broker_addr, send_cmd(topic, f"{prefix}{i}".encode()), 3)).code == 0
        finally:
            await cl.close()
    await produce(50, "before-")
    c.broker.kill()
    segments = sorted((c.store_dir / "commitlog").iterdir())
    segment = [s for s in segments if s.read_bytes()[:4] != bytes(4)][-1]  # skip pre-created empty ones
    end = _data_end(segment)
    assert end > 0
    with open(segment, "r+b") as f:  # a torn record: plausible size and magic, garbage after
        f.seek(end)
        f.write((200).to_bytes(4, "big") + MESSAGE_MAGIC.to_bytes(4, "big") + os.urandom(60))
    c.broker.start()
    assert "truncat" in c.broker.log().lower()
    await produce(5, "after-")
    bodies = [m.body.decode() for m in await read_topic(c.broker_addr, topic, 1)]
    assert bodies == [f"before-{i}" for i in range(50)] + [f"after-{i}" for i in range(5)]


async def test_broker_that_stops_heartbeating_leaves_the_routes(cluster_factory):
    c = cluster_factory(broker_expiry=2.0, extra_broker_args=["--register-interval", "0.5"])
    topic = f"exp_{uuid.uuid4().hex[:6]}"
    c.create_topic(topic, queues=1)

    async def route_code() -> int:
        cl = RemotingClient()
        try:
            r = await cl.invoke(c.namesrv_addr, RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}), 3)
            return r.code
        finally:
            await cl.close()

    assert await route_code() == ResponseCode.SUCCESS
    os.kill(c.broker.proc.pid, signal.SIGSTOP)  # alive, connected, silent
    try:
        # SUCCESS is 0: this waits for the first lookup that fails, which must say the topic is gone.
        code = await wait_until(route_code, "the silent broker's route to expire", interval=0.25)
        assert code == ResponseCode.TOPIC_NOT_EXIST
    finally:
        os.kill(c.broker.proc.pid, signal.SIGCONT)
