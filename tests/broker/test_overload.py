"""Overload (research matrix row H5): 16 concurrent producers against a SYNC_FLUSH broker whose
CommitLog flush is stalled for 1.5 s through the test-only hook (--test-flush-stall-file).

Pass: sends arriving while the oldest flush wait is older than --busy-wait-ms get SYSTEM_BUSY (2)
with RocketMQ's "[TIMEOUT_CLEAN_QUEUE]" remark instead of piling up; producers back off and retry;
every acknowledged message is stored (lost = 0); acknowledgements resume within 3 s of the stall's end.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from tests.procs import Cluster
from tests.support.topics import create_topic
from tidemq.broker.hooks import FlowControlHook, Outcome
from tidemq.client import Admin, ClientConfig, MessageQueue, Producer, PullConsumer
from tidemq.client.pull import PullStatus
from tidemq.client.send import SendStatus
from tidemq.message import Message
from tidemq.remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode

TOPIC = "OverloadT"
STALL = 1.5


@pytest.fixture(scope="module")
def stalled(tmp_path_factory):
    root = tmp_path_factory.mktemp("overload")
    stall = root / "stall"
    c = Cluster(root, flush="sync", extra_broker_args=[
        "--busy-wait-ms", "200", "--test-flush-stall-file", str(stall)])
    try:
        c.start()
    except Exception:
        c.stop()
        raise
    yield c, stall
    c.stop()


def _raw_send(seq: int) -> RemotingCommand:
    fields = {"a": "raw-pg", "b": TOPIC, "c": "TBW102", "d": "4", "e": "0", "f": "0",
              "g": str(int(time.time() * 1000)), "h": "0", "i": "UNIQ_KEY\x01raw%d\x02WAIT\x01true" % seq,
              "j": "0", "k": "false", "m": "false"}
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, fields, b"raw-%d" % seq)


async def test_stalled_flush_answers_system_busy_and_clients_retry_without_loss(stalled):
    c, stall = stalled

    cfg = ClientConfig(name_servers=c.namesrv_addr, request_timeout=6.0)
    async with Admin(config=cfg) as admin:
        await create_topic(c, TOPIC, 4, admin=admin)
    acked: dict[bytes, float] = {}
    failed: list[str] = []
    stop = asyncio.Event()

    async def produce(p: Producer, w: int) -> None:
        i = 0
        while not stop.is_set():
            body = b"p%d-%d" % (w, i)
            i += 1
            try:
                r = await p.send(Message(TOPIC, body))
            except Exception as exc:  # noqa: BLE001 (every failure is counted, asserted below)
                failed.append(repr(exc))
                continue
            if r.status is SendStatus.SEND_OK:
                acked[body] = time.monotonic()

    producers = [Producer(f"overload-pg{k}", config=cfg) for k in range(4)]
    for p in producers:
        await p.start()
    raw = RemotingClient()
    tasks = [asyncio.create_task(produce(producers[w % 4], w)) for w in range(16)]
    t0 = time.monotonic()
    await asyncio.sleep(1.0)
    stall.touch()
    stall_at = time.monotonic()
    await asyncio.sleep(0.5)
    busy = await raw.invoke(c.broker_addr, _raw_send(1), 5.0)
    await asyncio.sleep(STALL - 0.5)
    stall.unlink()
    end_at = time.monotonic()
    await asyncio.sleep(3.0)
    stop.set()
    await asyncio.gather(*tasks)
    await raw.close()
    for p in producers:
        await p.close()
    # read everything back
    stored: list[bytes] = []
    async with PullConsumer("overload-check", config=cfg) as consumer:
        for q in range(4):
            mq = MessageQueue(TOPIC, "broker-a", q)
            offset = 0
            while True:
                r = await consumer.pull(mq, offset, 256)
                if r.status is not PullStatus.FOUND:
                    break
                stored += [m.body for m in r.messages]
                offset = r.next_begin_offset
    before = sum(1 for t in acked.values() if t0 + 0.2 <= t < stall_at) / (stall_at - t0 - 0.2)
    during = sum(1 for t in acked.values() if stall_at + 0.3 <= t < end_at) / (end_at - stall_at - 0.3)
    after = sum(1 for t in acked.values() if end_at + 0.5 <= t < end_at + 3.0) / 2.5
    stored_set = set(stored)
    lost = [b for b in acked if b not in stored_set]
    dups = len(stored) - len(stored_set)
    print(f"\nH5: acked {len(acked)}, failed {len(failed)}, stored {len(stored)} (duplicates {dups}), lost "
          f"{len(lost)}; throughput {before:.0f}/s before, {during:.0f}/s stalled, {after:.0f}/s after; "
          f"busy answer: {busy.code} {busy.remark!r}")
    assert busy.code == ResponseCode.SYSTEM_BUSY
    assert busy.remark.startswith("[TIMEOUT_CLEAN_QUEUE]broker busy, start flow control for a while, "
                                  "period in queue: ")
    assert not lost, f"{len(lost)} acknowledged messages missing"
    assert not failed, f"sends failed despite back-off and retry: {failed[:3]}"
    assert during < before / 4, "sends were acknowledged while the flush was stalled"
    # recovered: the windows are short and a shared CI runner's load shifts them, so not a ratio target
    assert after > 4 * during and after >= before / 4, "throughput did not recover within 3 s of the stall"


def _flow_control(pending: list[float], busy_wait_ms: int = 200, cap: int = 10_000) -> FlowControlHook:
    hook = FlowControlHook(lambda: SimpleNamespace(busy_wait_ms=busy_wait_ms, max_pending_sends=cap))
    hook.waits.update({i + 1: t for i, t in enumerate(pending)})
    return hook


def test_flow_control_rule():
    cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {"b": "T"})
    now = 100.0
    assert _flow_control([now - 0.1]).busy(cmd, now) is None
    old = _flow_control([now - 0.25, now - 0.01]).busy(cmd, now)
    assert old.code == ResponseCode.SYSTEM_BUSY
    assert old.remark == ("[TIMEOUT_CLEAN_QUEUE]broker busy, start flow control for a while, "
                          "period in queue: 250ms, size of queue: 2")
    full = _flow_control([now] * 3, cap=3).busy(cmd, now)
    assert full.code == ResponseCode.SYSTEM_BUSY and full.remark == "[OVERLOAD]system busy, start flow control for a while"


def test_flow_control_counts_only_sends_answered_later():
    """A send is waited on from its arrival when its answer is deferred (a SYNC_FLUSH wait) until it
    is settled; a send answered at once never counts, and requests other than sends are never
    refused."""
    hook = _flow_control([], busy_wait_ms=0)
    quick = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {"b": "T"})
    assert hook.before(None, quick, 0.5) is None
    send = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {"b": "T"})
    assert hook.before(None, send, 1.0) is None and not hook.waits
    hook.deferred(send, 1.0)
    assert list(hook.waits.values()) == [1.0]
    later = RemotingCommand.request(RequestCode.SEND_MESSAGE, {"topic": "T"})
    assert hook.before(None, later, 2.0).code == ResponseCode.SYSTEM_BUSY  # behind one waiting send
    pull = RemotingCommand.request(RequestCode.PULL_MESSAGE, {})
    assert hook.before(None, pull, 2.0) is None
    hook.settled(send, Outcome.ANSWERED)
    assert not hook.waits and hook.before(None, later, 3.0) is None and hook.rejections == 1
