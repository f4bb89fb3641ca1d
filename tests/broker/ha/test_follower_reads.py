"""Follower reads with real processes (issue 17: "followers serve pulls when asked"): a name
server, etcd and three `tidemq broker --coordination etcd://...` replicas of one group. Messages
are stored and replicated, then the master is SIGKILLed. Its lease (6 s) keeps a new master from
being elected for a while, and meanwhile our consumer keeps receiving the replicated messages
from a follower (the lowest brokerId the route names); once a new master registers, reads go
back to it. The group replicates with `--replication async`: a sync group's followers depose a
killed master at once (its address refuses) and elect within a second, leaving no masterless
window to read in; an async group waits out the lease, as a sync group does for a master on a
lost node."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli.clirun import tidemq
from tidemq.client import ClientConfig, LitePullConsumer, PullConsumer
from tidemq.client.admin import Admin
from tidemq.client.pull import PullStatus
from tidemq.client.push.types import ConsumeFromWhere
from tidemq.client.route import MessageQueue
from tidemq.client.send import SendStatus
from tidemq.client.sync import SyncProducer
from tidemq.message import Message

LEASE = 6.0  # s: long enough that the reads from a follower happen while no master exists
GROUP = "fr-broker"
TOPIC = "FollowerReadTopic"


def _ids(namesrv: str) -> dict[str, str]:
    """brokerId -> address of the group, as the name server routes it."""
    run = tidemq("admin", "clusterList", "-n", namesrv)
    rows = [line.split() for line in run.lines()[1:]] if run.rc == 0 else []
    return {r[2]: r[3] for r in rows if len(r) >= 4 and r[1] == GROUP}


def _commitlog(store: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted((store / "commitlog").iterdir()))


async def _until(what: str, check: Callable[[], object], timeout: float) -> object:
    """Poll ``check`` (run in a thread: it may block) until it gives something true."""
    deadline = time.monotonic() + timeout
    while True:
        value = await asyncio.to_thread(check)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        await asyncio.sleep(0.1)


@pytest.fixture
def group(replica_group):
    g = replica_group(GROUP, 3, LEASE, "--replication", "async")
    return g.namesrv, g.replicas


def _send(namesrv: str, bodies: list[bytes]) -> None:
    with SyncProducer("fr-pg", namesrv, ClientConfig(request_timeout=5.0)) as producer:
        for body in bodies:
            assert producer.send(Message(TOPIC, body)).status is SendStatus.SEND_OK


async def test_a_consumer_reads_replicated_messages_from_a_follower_while_its_group_has_no_master(group):
    namesrv, replicas = group
    ids = await _until("one master and two followers registered",
                       lambda: (i if "0" in (i := _ids(namesrv)) and len(i) == 3 else None), 20)
    master = ids["0"]
    followers = sorted((int(i), a) for i, a in ids.items() if i != "0")
    # The topic on the master and, where a replica takes it, on each follower (a follower that
    # replicates metadata refuses it and learns it from the master's log).
    await asyncio.to_thread(lambda: tidemq("admin", "updateTopic", "-n", namesrv, "-b", master, "-t", TOPIC,
                                           "-r", "1", "-w", "1").ok())
    for _bid, addr in followers:
        await asyncio.to_thread(tidemq, "admin", "updateTopic", "-n", namesrv, "-b", addr, "-t", TOPIC,
                                "-r", "1", "-w", "1")
    await asyncio.to_thread(_send, namesrv, [f"m{i}".encode() for i in range(10)])

    config = ClientConfig(name_servers=(namesrv,), request_timeout=2.0)
    mq = MessageQueue(TOPIC, GROUP, 0)
    consumer = LitePullConsumer("fr-cg", config=config, consume_from=ConsumeFromWhere.FIRST_OFFSET,
                                auto_commit=False, suspend_ms=200, poll_timeout=0.5)
    consumer.assign([mq])
    await consumer.start()
    got: list[bytes] = []

    async def receive(n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(got) < n:
            assert time.monotonic() < deadline, f"received {len(got)} of {n}: {got}"
            got.extend(m.body for m in await consumer.poll())

    try:
        await receive(10, 15)  # from the master
        consumer.pause([mq])
        await asyncio.sleep(0.5)  # a pull held at the master (200 ms) has returned: none is in flight
        await asyncio.to_thread(_send, namesrv, [f"m{i}".encode() for i in range(10, 20)])
        expected = _commitlog(replicas[master][1])
        for _bid, addr in followers:
            store = replicas[addr][1]
            await _until(f"follower {addr} holding the master's log", lambda s=store: _commitlog(s) == expected, 15)
        # A follower serves what it knows to be acknowledged: below the high-water mark its master
        # sends in every replication frame. Wait until each has heard the mark past the last send.
        async with Admin(namesrv) as admin:
            end = (await admin.get_broker_runtime_info(master))["haLogEnd"]

            async def heard(addr: str) -> bool:
                return (await admin.get_broker_runtime_info(addr)).get("haHighWater") == end
            for _bid, addr in followers:
                deadline = time.monotonic() + 10
                while not await heard(addr):
                    assert time.monotonic() < deadline, f"follower {addr} did not hear the mark {end}"
                    await asyncio.sleep(0.05)

        replicas[master][0].kill()
        killed = time.monotonic()
        consumer.resume([mq])
        await receive(20, LEASE - 1)
        took = time.monotonic() - killed
        print(f"\nfollower reads: the 10 replicated messages came {took:.2f} s after SIGKILL of the master")
        assert got == [f"m{i}".encode() for i in range(20)]
        assert "0" not in await asyncio.to_thread(_ids, namesrv)  # no master: a follower served them
        assert consumer._require().routes.read_addr(GROUP) == followers[0][1]  # the lowest brokerId

        # A consumer started meanwhile reads from the follower too, from the first offset.
        async with PullConsumer("fr-cg2", config=ClientConfig(name_servers=(namesrv,), request_timeout=2.0,
                                                              instance_name="fr2")) as other:
            res = await other.pull(mq, 0, 32)
            assert res.status is PullStatus.FOUND and len(res.messages) == 20

        # A new master is elected after the lease: reads go back to it, and a message sent to it
        # reaches the consumer.
        new_master = await _until("a new brokerId 0", lambda: _ids(namesrv).get("0"), LEASE + 10)
        await _until("the consumer reading from the new master",
                     lambda: consumer._require().routes.read_addr(GROUP) == new_master, 5)
        await asyncio.to_thread(_send, namesrv, [b"after failover"])
        await receive(21, 10)
        assert got[-1] == b"after failover"
    finally:
        await consumer.close()
