"""The sync acknowledgement rule on real processes (issue 17): a name server, etcd and three
replicas with ``--replication sync --min-in-sync 2``.

- With every follower stopped (SIGSTOP), a send is not answered SEND_OK: the master stores it, its
  in-sync followers never ack it, so it drops them from the in-sync set and answers
  SLAVE_NOT_AVAILABLE (or FLUSH_SLAVE_TIMEOUT at the ack deadline); from then on every send is
  answered SLAVE_NOT_AVAILABLE at once (fewer than minInSync; stored on the master only, as
  RocketMQ does). Consumers never read past the high-water mark while the followers are in
  sync and silent. With one follower back, sends are SEND_OK again.
- The master keeps its epoch history and the group record on disk (replica-epochs.json).
"""

from __future__ import annotations

import concurrent.futures
import json
import time

import pytest

from tests.broker.ha.faults.group import ReplicaGroup, wait_for
from tidemq.client import ClientConfig
from tidemq.client.send import SendStatus
from tidemq.client.sync import SyncProducer
from tidemq.errors import TideMQError
from tidemq.message import Message

TOPIC = "AckTopic"


@pytest.fixture
def group(etcd, tmp_path):
    g = ReplicaGroup(tmp_path, etcd.endpoint, "ack-broker", lease=3.0, min_in_sync=2)
    try:
        yield g.start()
    finally:
        g.close()


def _send(producer: SyncProducer, body: bytes) -> str:
    """The send's status name, or the error's class (never retried: retry_times 0)."""
    try:
        return producer.send(Message(TOPIC, body)).status.name
    except TideMQError as exc:
        return f"{type(exc).__name__}: {exc}"


def _bodies(g: ReplicaGroup, rid: int) -> bytes:
    return g.replicas[rid].commitlog()


def test_no_send_ok_without_the_in_sync_followers_and_a_fast_refusal_below_min_in_sync(group):
    g = group
    g.wait_all_registered(20)
    master = g.wait_master(20)
    g.wait_in_sync(20)
    g.create_topic(TOPIC, 1)
    no_retry = ClientConfig(request_timeout=6.0, retry_times_when_send_failed=0)
    with SyncProducer("ack-pg", g.namesrv_addr, no_retry) as producer:
        for i in range(5):
            assert _send(producer, f"ok-{i}".encode()) == SendStatus.SEND_OK.name
        followers = [r.rid for r in g.replicas if r.rid != master.rid]
        for rid in followers:
            g.stop(rid)
        started = time.monotonic()
        pending = concurrent.futures.ThreadPoolExecutor(1).submit(_send, producer, b"held-by-the-master")
        # While it waits for the followers' acks, consumers do not see it: the mark stays below.
        wait_for("the held message stored on the master", lambda: b"held-by-the-master" in _bodies(g, master.rid), 2)
        runtime = g.runtime(master.rid)
        assert int(runtime["haHighWater"]) < int(runtime["haLogEnd"]), runtime
        first = pending.result(timeout=10)
        took = time.monotonic() - started
        print(f"with both followers stopped: {first} after {took:.2f} s")
        # Stored, then answered when the followers left the in-sync set (SLAVE_NOT_AVAILABLE,
        # fewer than minInSync) or at the ack deadline (FLUSH_SLAVE_TIMEOUT), whichever is first.
        assert first in (SendStatus.FLUSH_SLAVE_TIMEOUT.name, SendStatus.SLAVE_NOT_AVAILABLE.name), first
        assert took < 4.0
        assert b"held-by-the-master" in _bodies(g, master.rid)  # stored, not acknowledged

        # The master drops the silent followers from the in-sync set, then refuses at once.
        record = wait_for("the in-sync set shrunk to the master",
                          lambda: (r if (r := g.record()) is not None and r.in_sync == (master.rid,) else None), 10)
        assert record.master == master.rid
        started = time.monotonic()
        refused = _send(producer, b"refused-below-min")
        took = time.monotonic() - started
        print(f"below minInSync: {refused} after {took:.3f} s")
        assert refused == SendStatus.SLAVE_NOT_AVAILABLE.name, refused
        assert took < 1.0
        # Stored on the master only (RocketMQ's SLAVE_NOT_AVAILABLE): a client sends it again.
        assert b"refused-below-min" in _bodies(g, master.rid)

        # Alone in sync, the master's own log is the mark again (Kafka's rule: the mark follows the
        # in-sync set, below minInSync too; only acknowledgement needs minInSync).
        runtime = g.runtime(master.rid)
        assert runtime["haHighWater"] == runtime["haLogEnd"], runtime

        g.cont(followers[0])
        wait_for("a follower back in sync", lambda: (r := g.record()) is not None and len(r.in_sync) >= 2, 15)
        assert wait_for("a send acknowledged again",
                        lambda: _send(producer, b"after") == SendStatus.SEND_OK.name, 10)
        wait_for("the high-water mark at the log end",
                 lambda: (rt := g.runtime(master.rid))["haHighWater"] == rt["haLogEnd"], 10)
        g.cont(followers[1])

    history = json.loads((g.replicas[master.rid].store / "replica-epochs.json").read_text())
    assert history["epochs"] and history["epochs"][-1][0] == g.record().epoch, history
    assert history["record"]["master"] == master.rid
