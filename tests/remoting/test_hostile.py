"""Hostile and broken clients against a real broker process (research matrix rows H3 and H4).

The broker runs with a 2 s idle timeout, a 2,200 connection cap (a second one: 300) and a 32 MiB budget for incomplete
frames. Frame-level damage must close that one connection within 1 s; header-level damage gets
RocketMQ's code (3 unknown request, 1 bad header) and the connection stays usable; idle and
half-frame connections are closed by the idle timeout; connections past the cap are closed at
once; a well-behaved producer keeps being served (its p99 is printed) and memory stays bounded.
"""

from __future__ import annotations

import asyncio
import re
import struct
import time
from statistics import median

import pytest

from tests.procs import Cluster
from tests.remoting.hostile import (
    closed_within,
    commitlog_end,
    frame,
    json_frame,
    p99,
    raise_fd_limit,
    read_frame,
    request,
    rss_mib,
)
from tests.support.topics import create_topic
from tidemq.client import Admin, ClientConfig, MessageQueue, Producer
from tidemq.message import Message
from tidemq.remoting import RequestCode, ResponseCode

IDLE = 2.0
MAX_CONNECTIONS = 2200
BUDGET = 32 * 1024 * 1024
TOPIC = "HostileT"


def running_cluster(tmp_path_factory, name: str, *broker_args: str):
    """A name server and a broker started with ``broker_args`` (a generator for module fixtures)."""
    c = Cluster(tmp_path_factory.mktemp(name), extra_broker_args=list(broker_args))
    try:
        c.start()
    except Exception:
        c.stop()
        raise
    yield c
    c.stop()


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    raise_fd_limit(8192)
    yield from running_cluster(tmp_path_factory, "hostile", "--idle-timeout", str(IDLE), "--max-connections",
                               str(MAX_CONNECTIONS), "--max-buffered-bytes", str(BUDGET), "--auto-create-topic")


def _host_port(c: Cluster) -> tuple[str, int]:
    return "127.0.0.1", c.broker_port


async def _good_client(c: Cluster):
    cfg = ClientConfig(name_servers=c.namesrv_addr, request_timeout=5.0)
    admin = Admin(config=cfg)
    await admin.start()
    await create_topic(c, TOPIC, 2, admin=admin)
    await admin.close()
    producer = Producer("hostile-pg", config=cfg)
    await producer.start()
    return producer


async def _send_latencies(producer: Producer, n: int, pause: float = 0.005) -> list[float]:
    out = []
    for i in range(n):
        t = time.perf_counter()
        await producer.send(Message(TOPIC, b"good-%d" % i))
        out.append(time.perf_counter() - t)
        await asyncio.sleep(pause)
    return out


def _commitlog_end(c: Cluster) -> int:
    """The broker's CommitLog end offset (H3: hostile input appends 0 bytes)."""
    return commitlog_end(c.metrics_url)


# Frame-level damage: the connection is closed (RocketMQ's NettyDecoder closes the channel).
FRAME_CASES = {
    "length above 16 MiB": struct.pack(">i", 16 * 1024 * 1024 + 1) + b"\0" * 64,
    "negative length": struct.pack(">i", -5) + b"\0" * 8,
    "zero length": struct.pack(">i", 0) + b"\0" * 8,
    "length shorter than the header word": struct.pack(">i", 2) + b"\0\0",
    "header length beyond the frame": struct.pack(">iI", 14, 100) + b"{}" + b"\0" * 8,
    "unknown serialize type": frame(b'{"code":10}', serialize_type=7),
    "non-JSON header": frame(b"this is not json"),
    "JSON header not an object": frame(b"[1,2,3]"),
    "100,000-deep JSON header": frame(b"[" * 100_000 + b"]" * 100_000),
    "deep JSON inside extFields": frame(b'{"code":10,"extFields":' + b'{"a":' * 5000 + b"1" + b"}" * 5001),
    "non-UTF-8 header": frame(b'{"code":10,"remark":"\xff\xfe"}'),
    "non-integer code": json_frame({"code": "abc", "opaque": 1}),
    "opaque beyond Java's int as a string (found by fuzzing)": json_frame({"code": 10, "opaque": "5" * 39}),
    "extFields not an object": json_frame({"code": 10, "opaque": 1, "extFields": [1, 2]}),
    "binary header with a lying remark length": frame(
        struct.pack(">hBhiii", 10, 0, 399, 1, 0, 1_000_000) + b"x", serialize_type=1),
}


def assert_responsive(lat: list[float]) -> None:
    """The good client was served while the hostile peers were at it: not a latency target (a loaded
    2-core CI runner also closes thousands of sockets meanwhile), but no stall of a second."""
    assert median(lat) < 0.1 and p99(lat) < 1.0, f"good client p50 {median(lat) * 1000:.0f} ms, p99 {p99(lat) * 1000:.0f} ms"


@pytest.mark.parametrize("name", list(FRAME_CASES))
async def test_frame_level_damage_closes_that_connection(hostile, name):
    end = _commitlog_end(hostile)
    reader, writer = await asyncio.open_connection(*_host_port(hostile))
    writer.write(FRAME_CASES[name])
    t = time.perf_counter()
    assert await closed_within(reader, 5.0), f"{name}: connection still open after 5 s"
    elapsed = time.perf_counter() - t
    writer.close()
    # the broker is alive and answers a good request on a new connection
    reader, writer = await asyncio.open_connection(*_host_port(hostile))
    writer.write(request(RequestCode.GET_BROKER_CONFIG, opaque=7))
    resp = await read_frame(reader, 2.0)
    assert resp is not None and resp.opaque == 7 and resp.code == ResponseCode.SUCCESS
    writer.close()
    print(f"\n{name}: closed after {elapsed * 1000:.0f} ms")
    assert _commitlog_end(hostile) == end, "a damaged frame appended bytes to the CommitLog"


def _header_cases():
    many = {f"k{i}": "v" for i in range(100_000)}
    return {
        # name: (frame bytes, expected response code or None for "no answer")
        "unknown request code": (request(9999, opaque=11), ResponseCode.REQUEST_CODE_NOT_SUPPORTED),
        "missing code": (json_frame({"opaque": 11, "extFields": {}}), ResponseCode.REQUEST_CODE_NOT_SUPPORTED),
        "100,000 extFields": (json_frame({"code": RequestCode.SEND_MESSAGE_V2, "opaque": 11, "extFields": many}),
                              ResponseCode.SYSTEM_ERROR),
        "non-integer queueId in a pull": (request(RequestCode.PULL_MESSAGE, opaque=11, consumerGroup="g",
                                                  topic=TOPIC, queueId="zero", queueOffset="0"),
                                          ResponseCode.SYSTEM_ERROR),
        "non-string extFields values": (json_frame({"code": RequestCode.PULL_MESSAGE, "opaque": 11, "extFields": {
            "consumerGroup": "g", "topic": TOPIC, "queueId": {"nested": [1]}, "queueOffset": 0}}),
            ResponseCode.SYSTEM_ERROR),
        "queueOffset beyond a Java long": (request(RequestCode.PULL_MESSAGE, opaque=11, consumerGroup="g",
                                                   topic=TOPIC, queueId=0, queueOffset=str(2**70)),
                                           ResponseCode.SYSTEM_ERROR),
        "response flag set by a client": (request(RequestCode.SEND_MESSAGE_V2, opaque=11, flag=1), None),
        "body on a oneway request": (json_frame({"code": 9999, "opaque": 11, "flag": 2}, b"x" * 1000), None),
    }


HEADER_CASES = _header_cases()


@pytest.mark.parametrize("name", list(HEADER_CASES))
async def test_header_level_damage_gets_rocketmq_code_and_connection_stays(hostile, name):
    data, expected = HEADER_CASES[name]

    end = _commitlog_end(hostile)
    reader, writer = await asyncio.open_connection(*_host_port(hostile))
    writer.write(data)
    writer.write(request(RequestCode.GET_BROKER_CONFIG, opaque=12))
    first = await read_frame(reader, 3.0)
    assert first is not None, f"{name}: connection closed"
    if expected is None:  # no answer to the bad frame; the next good one is served
        assert first is not None and first.opaque == 12 and first.code == ResponseCode.SUCCESS
    else:
        assert first.opaque == 11 and first.code == expected, (first.code, first.remark)
        assert first.remark
        second = await read_frame(reader, 3.0)
        assert second is not None and second.opaque == 12 and second.code == ResponseCode.SUCCESS
    writer.close()
    assert _commitlog_end(hostile) == end, "a damaged request appended bytes to the CommitLog"


async def test_absurd_pull_batch_sizes_are_clamped(hostile):
    producer = await _good_client(hostile)
    try:
        # 1,100 small messages into queue 0 in one batch request
        for start in range(0, 1100, 550):
            await producer.send_batch([Message(TOPIC, b"m%d" % i) for i in range(start, start + 550)],
                                      queue=MessageQueue(TOPIC, "broker-a", 0))
    finally:
        await producer.close()
    reader, writer = await asyncio.open_connection(*_host_port(hostile))
    results = {}
    for opaque, max_nums in ((21, str(2**31 - 1)), (22, "-5"), (23, str(2**40))):
        writer.write(request(RequestCode.PULL_MESSAGE, opaque=opaque, consumerGroup="clampG", topic=TOPIC,
                             queueId=0, queueOffset=0, maxMsgNums=max_nums, sysFlag=4, subscription="*",
                             expressionType="TAG", subVersion=0))
        results[opaque] = await read_frame(reader, 3.0)
    writer.close()
    huge, negative, overflow = results[21], results[22], results[23]
    assert huge.code == ResponseCode.SUCCESS
    assert int(huge.ext_fields["nextBeginOffset"]) <= 1024, "maxMsgNums 2^31-1 was not clamped"
    assert negative.code == ResponseCode.SUCCESS and int(negative.ext_fields["nextBeginOffset"]) == 1
    assert overflow.code == ResponseCode.SYSTEM_ERROR and "maxMsgNums" in overflow.remark


@pytest.fixture(scope="module")
def flood(tmp_path_factory):
    """A broker for the full H4 (a) run: room for 10,000 idle connections and then some."""
    raise_fd_limit(12_000)
    yield from running_cluster(tmp_path_factory, "flood", "--idle-timeout", str(IDLE), "--max-connections",
                               "10500", "--auto-create-topic")


@pytest.mark.parametrize("broker_fixture, idle", [
    ("hostile", 2_000),
    pytest.param("flood", 10_000, marks=pytest.mark.slow, id="flood-10000"),
])
async def test_idle_and_half_frame_connections_are_closed_and_good_client_stays_fast(request, broker_fixture, idle):
    """H4 (a): ``idle`` connections left idle plus 50 that send half a frame and go silent (the
    default suite opens 2,000; the slow run the issue's 10,000)."""
    hostile = request.getfixturevalue(broker_fixture)
    pid = hostile.broker.proc.pid

    producer = await _good_client(hostile)
    try:
        await _send_latencies(producer, 20)  # warm up
        rss_before = rss_mib(pid)
        conns = []
        for _ in range(idle // 100):  # 100 at a time (the listen backlog)
            conns += await asyncio.gather(*(asyncio.open_connection(*_host_port(hostile)) for _ in range(100)))
        half = []
        for _ in range(50):
            r, w = await asyncio.open_connection(*_host_port(hostile))
            w.write(struct.pack(">iI", 16 * 1024 * 1024, 20) + b'{"code":10,"opaq')
            half.append((r, w))
        opened = time.perf_counter()
        lat = await _send_latencies(producer, 150, pause=0.002)
        rss_loaded = rss_mib(pid)
        closed = await asyncio.gather(*(closed_within(r, IDLE * 3) for r, _w in conns + half))
        took = time.perf_counter() - opened
        for _r, w in conns + half:
            w.close()
        lat += await _send_latencies(producer, 20)  # the good client reconnects if it was idle
    finally:
        await producer.close()
    print(f"\nH4a: good client p99 {p99(lat) * 1000:.1f} ms over {len(lat)} sends; broker RSS "
          f"{rss_before:.0f} -> {rss_loaded:.0f} MiB with {idle + 50:,} hostile connections; "
          f"{sum(closed)} closed by the idle timeout after {took:.1f} s")
    assert all(closed), f"{closed.count(False)} idle connections were never closed"
    assert took < IDLE * 3
    assert rss_loaded - rss_before < 100 * idle / 2_000, f"{idle + 50:,} idle connections cost too much memory"
    assert_responsive(lat)


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    """A broker with a 300-connection cap and a long idle timeout (no idle closes during the test)."""
    yield from running_cluster(tmp_path_factory, "capped", "--idle-timeout", "60", "--max-connections", "300")


async def test_connections_past_the_maximum_are_refused_at_once(capped):
    """H4 (c): the cap is 300; of 400 connections exactly the 100 beyond it are closed at once."""
    conns = []
    for _ in range(4):
        conns += await asyncio.gather(*(asyncio.open_connection(*_host_port(capped)) for _ in range(100)))
    refused = await asyncio.gather(*(closed_within(r, 3.0) for r, _w in conns))
    for _r, w in conns:
        w.close()
    n = sum(refused)
    print(f"\nH4c: {n} of 400 connections refused at once (cap 300)")
    assert n == 100
    assert refused[:300].count(True) == 0, "a connection below the cap was closed"
    log = capped.broker.log()
    assert len(re.findall(r"refusing connection from", log)) <= 21, "refusals are not rate-limited in the log"


async def test_incomplete_frames_share_a_memory_budget(hostile):
    """H4 (b): 48 connections announce 16 MiB frames and push 6 MiB each (288 MiB) then stall;
    the broker buffers about its 32 MiB budget, stops reading the rest, and serves a good client."""
    pid = hostile.broker.proc.pid
    chunk = b"\0" * (6 * 1024 * 1024)

    async def push(sock_writer):
        sock_writer.write(struct.pack(">iI", 16 * 1024 * 1024, 20) + b'{"code":10,"opaque":1')
        sock_writer.write(chunk)
        try:
            await asyncio.wait_for(sock_writer.drain(), 2.0)
            return True
        except asyncio.TimeoutError:
            return False
        except ConnectionResetError:  # paused past the 2 s idle timeout, then aborted: not read either
            return False

    producer = await _good_client(hostile)
    try:
        await _send_latencies(producer, 10)
        rss_before = rss_mib(pid)
        conns = [await asyncio.open_connection(*_host_port(hostile)) for _ in range(48)]
        for _r, w in conns:
            w.transport.set_write_buffer_limits(high=64 * 1024)
        drained = await asyncio.gather(*(push(w) for _r, w in conns))
        await asyncio.sleep(0.3)
        rss_loaded = rss_mib(pid)
        lat = await _send_latencies(producer, 100, pause=0.002)
        for _r, w in conns:
            w.transport.abort()
        await asyncio.sleep(0.5)
        lat += await _send_latencies(producer, 10)
    finally:
        await producer.close()
    print(f"\nH4b: broker RSS {rss_before:.0f} -> {rss_loaded:.0f} MiB while 48 connections pushed 288 MiB of "
          f"incomplete frames ({sum(drained)} fully accepted); good client p99 {p99(lat) * 1000:.1f} ms")
    assert drained.count(False) > 0, "every connection was read fully: no budget"
    assert rss_loaded - rss_before < 120, "incomplete frames were buffered beyond the budget"
    assert_responsive(lat)
