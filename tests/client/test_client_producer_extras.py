"""Producer extras: latency fault avoidance, queue selectors, batch splitting, callback sends,
reply sends, and retries on another broker (two real brokers)."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys

import pytest

from tests.client.fake_server import FakeCluster, fake_config, fake_fixture
from tests.procs import ServerProcess, free_port, tidemq_cmd
from tests.support.routes import wait_for_route
from tidemq.client import Admin, ClientConfig, MessageQueue, Producer
from tidemq.client.batching import batch_message_size, split_batches
from tidemq.client.fault import (
    ISOLATION_LATENCY_MS,
    FaultStrategy,
    LatencyFaultTolerance,
    not_available_ms,
)
from tidemq.client.selectors import select_by_hash, select_queue
from tidemq.client.send import SendResult, SendStatus
from tidemq.errors import ClientError
from tidemq.message import Message, Prop, decode_properties, java_hash
from tidemq.remoting import RequestCode


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def queues(*brokers: str, per: int = 2, topic: str = "T") -> list[MessageQueue]:
    return [MessageQueue(topic, b, q) for b in brokers for q in range(per)]


# latency fault avoidance ------------------------------------------------------------------------
@pytest.mark.parametrize("latency, expected_s", [
    (0, 0), (49, 0), (50, 0), (99, 0), (100, 0), (549, 0), (550, 30), (999, 30), (1000, 60),
    (1999, 60), (2000, 120), (3000, 180), (14999, 180), (15000, 600), (ISOLATION_LATENCY_MS, 600),
])
def test_latency_buckets_match_rocketmq(latency, expected_s):
    assert not_available_ms(latency) == expected_s * 1000


def test_slow_broker_is_skipped_until_its_penalty_expires():
    clock = FakeClock()
    fs = FaultStrategy(True, clock, seed=1)
    qs = queues("a", "b")
    fs.report("a", 600)  # 550 ms bucket -> 30 s
    assert not fs.tolerance.is_available("a")
    assert {fs.select("T", qs).broker_name for _ in range(10)} == {"b"}
    clock.t = 1029.9
    assert {fs.select("T", qs).broker_name for _ in range(10)} == {"b"}
    clock.t = 1030.0
    chosen = [fs.select("T", qs) for _ in range(4)]
    assert sorted(chosen) == sorted(qs)  # plain round-robin over all four again


def test_fast_sends_never_make_a_broker_unavailable():
    fs = FaultStrategy(True, FakeClock(), seed=2)
    for latency in (1, 49, 99, 549):
        fs.report("a", latency)
        assert fs.tolerance.is_available("a")


def test_failure_isolates_a_broker_for_600_s():
    clock = FakeClock()
    fs = FaultStrategy(True, clock, seed=3)
    qs = queues("a", "b", "c")
    fs.report("b", 3, isolation=True)
    item = fs.tolerance.item("b")
    assert item is not None and item.latency_ms == 3  # the measured latency is kept
    clock.t += 599
    assert "b" not in {fs.select("T", qs).broker_name for _ in range(30)}
    clock.t += 1
    assert "b" in {fs.select("T", qs).broker_name for _ in range(6)}


def test_round_robin_skips_the_broker_that_just_failed():
    for enabled in (True, False):
        fs = FaultStrategy(enabled, FakeClock(), seed=4)
        qs = queues("a", "b")
        for _ in range(10):
            assert fs.select("T", qs, last_broker="a").broker_name == "b"
        single = queues("a")
        assert fs.select("T", single, last_broker="a").broker_name == "a"  # nothing else


def test_when_all_brokers_are_unavailable_the_best_is_chosen():
    clock = FakeClock()
    fs = FaultStrategy(True, clock, seed=5)
    qs = queues("a", "b")
    fs.report("a", 700)  # 30 s
    fs.report("b", 20_000)  # 600 s
    picks = {fs.select("T", qs).broker_name for _ in range(10)}
    assert picks == {"a"}  # two items: the better half is just "a"
    clock.t += 31  # a recovered: available ranks first even though b has lower latency now
    fs.report("b", 100, isolation=True)
    assert {fs.select("T", qs).broker_name for _ in range(10)} == {"a"}


def test_best_broker_without_queues_for_the_topic_is_forgotten():
    fs = FaultStrategy(True, FakeClock(), seed=6)
    fs.report("gone", 20_000)
    fs.report("a", 20_000)
    fs.tolerance.item("gone").latency_ms = 1  # "gone" ranks best but serves no queue of T
    mq = fs.select("T", queues("a"), last_broker="a")
    assert mq.broker_name == "a"
    assert fs.tolerance.item("gone") is None


def test_pick_one_at_least_takes_the_better_half_in_turn():
    clock = FakeClock()
    tol = LatencyFaultTolerance(clock)
    for name, latency in [("w", 400), ("x", 100), ("y", 200), ("z", 300)]:
        tol.update(name, latency, 10_000)
    assert {tol.pick_one_at_least() for _ in range(6)} == {"x", "y"}
    assert LatencyFaultTolerance(clock).pick_one_at_least() is None


def test_disabled_strategy_ignores_reports_and_rotates():
    fs = FaultStrategy(False, FakeClock(), seed=7)
    qs = queues("a", "b")
    fs.report("a", 20_000, isolation=True)
    assert fs.tolerance.item("a") is None
    assert sorted(fs.select("T", qs) for _ in range(4)) == sorted(qs)


def test_fault_table_is_bounded():
    tol = LatencyFaultTolerance(FakeClock(), max_brokers=3)
    for i in range(10):
        tol.update(f"b{i}", 1, i)
    assert len(tol._items) == 3
    assert tol.item("b9") is not None and tol.item("b0") is None


# selectors --------------------------------------------------------------------------------------
def _java_rem(a: int, n: int) -> int:
    r = abs(a) % n
    return -r if a < 0 else r


@pytest.mark.parametrize("key", ["hello", "order-42", "polygenelubricants", "", "日本語", "x" * 100])
def test_select_by_hash_matches_javas_select_message_queue_by_hash(key):
    qs = queues("a", "b", per=3)
    expected = qs[abs(_java_rem(java_hash(key), len(qs)))]
    assert select_by_hash(key)(qs, Message("T", b"x"), None) == expected
    assert select_by_hash(key)(list(qs), Message("T", b"y"), "ignored") == expected


def test_select_by_hash_known_values():
    qs = queues("a", per=4)
    assert java_hash("hello") == 99162322 and select_by_hash("hello")(qs, None, None).queue_id == 2
    assert java_hash("polygenelubricants") == -(1 << 31)
    assert select_by_hash("polygenelubricants")(qs, None, None).queue_id == 0
    assert select_by_hash(7)(qs, None, None).queue_id == 3
    assert select_by_hash(-7)(qs, None, None).queue_id == 3
    with pytest.raises(ClientError, match="str or int"):
        select_by_hash(b"bytes")


def test_select_by_hash_is_stable_across_processes():
    code = ("from tidemq.client.selectors import select_by_hash;"
            "from tidemq.client.route import MessageQueue;"
            "qs=[MessageQueue('T','b',i) for i in range(7)];"
            "print([select_by_hash(f'key-{i}')(qs,None,None).queue_id for i in range(50)])")
    outs = set()
    for seed in ("1", "2", "random"):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env=dict(os.environ, PYTHONHASHSEED=seed))
        outs.add(r.stdout)
    assert len(outs) == 1
    qs = [MessageQueue("T", "b", i) for i in range(7)]
    assert outs.pop().strip() == str([select_by_hash(f"key-{i}")(qs, None, None).queue_id
                                      for i in range(50)])


def test_select_queue_by_index():
    qs = queues("a", "b", per=2)
    assert select_queue(3)(qs, Message("T", b"x"), None) == MessageQueue("T", "b", 1)
    with pytest.raises(ClientError, match="has 4 publish queues; there is no queue index 4"):
        select_queue(4)(qs, Message("T", b"x"), None)
    with pytest.raises(ClientError):
        select_queue(-1)


# batch splitting --------------------------------------------------------------------------------
def test_batch_message_size_is_listsplitter_plus_send_properties():
    m = Message("Topic", b"x" * 100, tags="A")
    base = len("Topic") + 100 + 20
    props = len("TAGS\x01A\x02UNIQ_KEY\x01" + "0" * 32 + "\x02WAIT\x01true")
    assert batch_message_size(m) == base + props


def test_split_batches_respects_the_limit_and_keeps_order():
    msgs = [Message("T", bytes([i % 256]) * (1000 + 37 * i)) for i in range(60)]
    limit = 20_000
    parts = split_batches(msgs, limit)
    assert [m for part in parts for m in part] == msgs
    assert len(parts) > 3
    for i, part in enumerate(parts):
        total = sum(batch_message_size(m) for m in part)
        assert total <= limit
        if i + 1 < len(parts):  # greedy: the next message would not have fitted
            assert total + batch_message_size(parts[i + 1][0]) > limit


def test_split_batches_puts_an_oversized_message_alone():
    small = Message("T", b"s" * 10)
    huge = Message("T", b"h" * 5000)
    parts = split_batches([small, small, huge, small], limit=1000)
    assert parts == [[small, small], [huge], [small]]
    assert split_batches([], 1000) == []


def test_default_limit_is_4_mib():
    msgs = [Message("T", b"z" * (512 * 1024)) for _ in range(20)]
    parts = split_batches(msgs)
    assert len(parts) == 3 and [len(p) for p in parts] == [7, 7, 6]


# producer against the in-process fake broker ----------------------------------------------------
class ReplyFake(FakeCluster):
    """The fake broker, taking replies (325) like sends."""

    def on_send_reply_message_v2(self, conn, cmd):
        return self.on_send_message_v2(conn, cmd)


fake = fake_fixture(ReplyFake)
cfg = fake_config


@pytest.mark.timeout(20, func_only=True)
async def test_send_async_calls_back_and_close_waits(fake):
    fake.topics["T"] = (2, 2, 6)
    got: list[object] = []
    errors: list[BaseException] = []

    async def async_ok(result):
        await asyncio.sleep(0.01)
        got.append(("async", result))

    p = Producer("pg", config=cfg(fake))
    await p.start()
    t1 = p.send_async(Message("T", b"a"), got.append, errors.append)
    t2 = p.send_async(Message("T", b"b"), async_ok, errors.append)
    t3 = p.send_async(Message("Missing", b"c"), got.append, errors.append)
    assert len(p._tasks) == 3
    await p.close()  # waits for all three
    assert t1.done() and t2.done() and t3.done()
    assert isinstance(t1.result(), SendResult) and t1.result().status is SendStatus.SEND_OK
    assert got[0] is t1.result() and got[1] == ("async", t2.result())
    assert t3.result() is None
    assert len(errors) == 1 and isinstance(errors[0], ClientError) and "Missing" in str(errors[0])
    with pytest.raises(ClientError, match="not started"):
        p.send_async(Message("T", b"x"))


@pytest.mark.timeout(20, func_only=True)
async def test_send_async_validates_eagerly_and_survives_a_failing_callback(fake):
    fake.topics["T"] = (1, 1, 6)
    async with Producer("pg", config=cfg(fake)) as p:
        with pytest.raises(ClientError, match="body is empty"):
            p.send_async(Message("T", b""))
        assert not p._tasks

        def boom(_result):
            raise RuntimeError("callback bug")

        task = p.send_async(Message("T", b"x"), boom)
        result = await task
        assert result is not None and result.status is SendStatus.SEND_OK


@pytest.mark.timeout(20, func_only=True)
async def test_close_bounds_the_wait_for_stuck_sends(fake):
    fake.topics["T"] = (1, 1, 6)
    fake.hold.add(RequestCode.SEND_MESSAGE_V2)
    called: list[object] = []
    p = Producer("pg", config=cfg(fake))
    await p.start()
    task = p.send_async(Message("T", b"x"), called.append, called.append, timeout=30)
    await asyncio.sleep(0.05)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await p.close(timeout=0.2)
    assert loop.time() - t0 < 1.0
    assert task.cancelled() and called == []


@pytest.mark.timeout(20, func_only=True)
async def test_send_batch_over_the_limit_and_send_batches(fake):
    fake.topics["T"] = (1, 1, 6)
    async with Producer("pg", config=cfg(fake, max_message_size=50_000)) as p:
        msgs = [Message("T", f"{i:04d}".encode() * 1000, keys=f"k{i}") for i in range(40)]
        with pytest.raises(ClientError, match=r"batch of 40 messages is \d+ bytes.*send_batches"):
            await p.send_batch(msgs)
        assert RequestCode.SEND_BATCH_MESSAGE not in fake.codes()
        results = await p.send_batches(msgs)
    parts = split_batches(msgs, 50_000)
    assert len(results) == len(parts) > 1
    assert fake.codes().count(RequestCode.SEND_BATCH_MESSAGE) == len(parts)
    stored = fake.queues[("T", 0)]
    assert [s.props["KEYS"] for s in stored] == [f"k{i}" for i in range(40)]
    assert [len(r.msg_id.split(",")) for r in results] == [len(p) for p in parts]


@pytest.mark.timeout(20, func_only=True)
async def test_selectors_route_sends(fake):
    fake.topics["T"] = (4, 4, 6)
    async with Producer("pg", config=cfg(fake)) as p:
        same = {(await p.send(Message("T", b"x"), selector=select_by_hash("order-7"))).message_queue
                for _ in range(5)}
        assert len(same) == 1
        assert same.pop().queue_id == abs(_java_rem(java_hash("order-7"), 4))
        r = await p.send(Message("T", b"x"), selector=select_queue(2))
        assert r.message_queue == MessageQueue("T", "broker-a", 2)
        await p.send_oneway(Message("T", b"y"), selector=select_queue(3))
        with pytest.raises(ClientError, match="no queue index 9"):
            await p.send(Message("T", b"x"), selector=select_queue(9))


@pytest.mark.timeout(20, func_only=True)
async def test_reply_messages_use_send_reply_message_v2(fake):
    fake.topics["DefaultCluster_REPLY_TOPIC"] = (1, 1, 6)
    reply = Message("DefaultCluster_REPLY_TOPIC", b"answer",
                    properties={Prop.MSG_TYPE: "reply", Prop.CORRELATION_ID: "c-1",
                                Prop.REPLY_TO_CLIENT: "1.2.3.4@x"})
    async with Producer("pg", config=cfg(fake)) as p:
        r = await p.send(reply)
        await p.send_oneway(reply)
        await p.send(Message("DefaultCluster_REPLY_TOPIC", b"plain"))
    codes = [c for c in fake.codes() if c in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_REPLY_MESSAGE_V2)]
    assert codes == [RequestCode.SEND_REPLY_MESSAGE_V2] * 2 + [RequestCode.SEND_MESSAGE_V2]
    assert r.status is SendStatus.SEND_OK
    first = next(c for c in fake.requests if c.code == RequestCode.SEND_REPLY_MESSAGE_V2)
    assert decode_properties(first.ext_fields["i"])[Prop.CORRELATION_ID] == "c-1"


@pytest.mark.timeout(20, func_only=True)
async def test_fault_avoidance_stops_trying_an_unreachable_broker(fake):
    fake.topics["T"] = (2, 2, 6)
    fake.extra_brokers["broker-dead"] = f"127.0.0.1:{free_port()}"
    counts = {}
    for enabled in (True, False):
        clock = FakeClock()
        async with Producer("pg", config=cfg(fake), send_latency_fault_enable=enabled,
                            clock=clock) as p:
            handler = _Count()
            logger = logging.getLogger("tidemq.client.sender")
            level = logger.level
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)
            try:
                results = [await p.send(Message("T", b"x")) for _ in range(12)]
            finally:
                logger.removeHandler(handler)
                logger.setLevel(level)
            failures = handler.count
            assert {r.message_queue.broker_name for r in results} == {"broker-a"}
            if enabled:
                assert not p.fault.tolerance.is_available("broker-dead")
                assert p.fault.tolerance.is_available("broker-a")
        counts[enabled] = failures
    assert counts[True] <= 1  # the first failure isolates the broker for 600 s
    assert counts[False] >= 3  # round-robin keeps landing on it (and retrying elsewhere)


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "failed (attempt" in record.getMessage():
            self.count += 1


# two real brokers: retries avoid the broker that failed -----------------------------------------
@pytest.fixture
def two_brokers(cluster_factory, tmp_path):
    c = cluster_factory()
    port, metrics = free_port(), free_port()
    b = ServerProcess(
        tidemq_cmd("broker", "--namesrv", c.namesrv_addr, "--listen", f"127.0.0.1:{port}",
                   "--store", str(tmp_path / "store-b"), "--cluster", c.cluster_name,
                   "--broker-name", "broker-b", "--flush", "async",
                   "--segment-size", str(c.segment_size),
                   "--metrics-listen", f"127.0.0.1:{metrics}"),
        tmp_path / "broker-b.log", f"http://127.0.0.1:{metrics}/readyz",
    ).start()
    try:
        yield c, b
    finally:
        b.stop()


@pytest.mark.parametrize("fault_enabled", [True, False])
@pytest.mark.timeout(60, func_only=True)
async def test_sends_survive_a_killed_broker(two_brokers, fault_enabled):
    cluster, broker_b = two_brokers
    topic = f"TwoBrokers{int(fault_enabled)}"
    await asyncio.to_thread(cluster.create_topic, topic, 4)  # updateTopic -c: on both masters
    config = ClientConfig(name_servers=cluster.namesrv_addr)
    async with Admin(config=config) as admin:
        await wait_for_route(admin, topic, 8, timeout=15)
    async with Producer("two-brokers-pg", config=config,
                        send_latency_fault_enable=fault_enabled) as p:
        before = [await p.send(Message(topic, f"b{i}".encode())) for i in range(8)]
        assert {r.message_queue.broker_name for r in before} == {cluster.broker_name, "broker-b"}
        broker_b.kill()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        after = [await p.send(Message(topic, f"a{i}".encode())) for i in range(20)]
        elapsed = loop.time() - t0
    assert all(r.status is SendStatus.SEND_OK for r in after)
    assert {r.message_queue.broker_name for r in after} == {cluster.broker_name}
    assert elapsed < 10, elapsed
