"""Two hostile clients of issue 14 ("Low") against a real broker process: a frame trickling in one
byte at a time, and a small compressed batch that inflates to 65,536 messages.

The broker runs with a 1.5 s frame read deadline and a 30 s idle timeout, so a connection closed
within a few seconds was closed by the deadline, not as idle. The batch cap is
tidemq.message.MAX_BATCH_MESSAGES (32,767): more is answered MESSAGE_ILLEGAL and nothing is stored.
"""

from __future__ import annotations

import asyncio
import re
import struct
import time
import zlib

import pytest

from tests.procs import Cluster
from tests.remoting.hostile import closed_within, commitlog_end, json_frame, read_frame, request
from tests.support.topics import create_topic_sync
from tests.support.waiting import wait_until
from tidemq.client import ClientConfig, Producer
from tidemq.message import MAX_BATCH_MESSAGES, Message, encode_batch
from tidemq.remoting import RequestCode, ResponseCode

FRAME_DEADLINE = 1.5
IDLE = 30.0
TOPIC = "SlowBatchT"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("slow"), extra_broker_args=[
        "--frame-read-timeout", str(FRAME_DEADLINE), "--idle-timeout", str(IDLE)])
    try:
        c.start()
        create_topic_sync(c, TOPIC, 2)
    except Exception:
        c.stop()
        raise
    yield c
    c.stop()


def _padded_request(opaque: int, body: int) -> bytes:
    """A GET_BROKER_CONFIG frame with ``body`` bytes of body."""
    frame = request(RequestCode.GET_BROKER_CONFIG, opaque=opaque)
    return struct.pack(">i", len(frame) - 4 + body) + frame[4:] + b"p" * body


async def _producer(c: Cluster) -> Producer:
    producer = Producer("slow-pg", config=ClientConfig(name_servers=c.namesrv_addr, request_timeout=5.0))
    await producer.start()
    return producer


async def test_a_frame_sent_one_byte_at_a_time_is_closed_at_the_deadline_and_others_are_served(broker):
    frame = _padded_request(5, 400)  # 42 s at 10 bytes a second

    producer = await _producer(broker)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", broker.broker_port)
        local_port = writer.get_extra_info("sockname")[1]
        sent = 0

        async def drip():
            nonlocal sent
            for b in frame:
                writer.write(bytes([b]))
                sent += 1
                await asyncio.sleep(0.1)

        dripping = asyncio.create_task(drip())
        t = time.perf_counter()
        served = 0
        while not await closed_within(reader, 0.02):
            await producer.send(Message(TOPIC, b"good-%d" % served))
            served += 1
            assert time.perf_counter() - t < 10.0, "the dripping connection is still open after 10 s"
        took = time.perf_counter() - t
        dripping.cancel()
        writer.close()
        for i in range(20):  # and after it
            await producer.send(Message(TOPIC, b"after-%d" % i))
    finally:
        await producer.close()
    print(f"\nslow frame closed after {took:.2f} s, {sent} of {len(frame)} bytes sent; {served} good sends meanwhile")
    assert FRAME_DEADLINE - 0.1 <= took < FRAME_DEADLINE + 3.0, took
    assert sent < len(frame) and served >= 5
    pattern = rf"closing connection from 127\.0\.0\.1:{local_port}: \d+ of {len(frame)} bytes of a frame arrived in"
    await wait_until(lambda: re.search(pattern, broker.broker.log()), "the broker to log the slow frame",
                     timeout=5, interval=0.1)
    assert len(re.findall(pattern, broker.broker.log())) == 1, "no single log line for the slow frame"


async def test_a_peer_silent_mid_frame_is_closed_at_the_deadline_not_the_idle_timeout(broker):
    reader, writer = await asyncio.open_connection("127.0.0.1", broker.broker_port)
    writer.write(_padded_request(6, 400)[:30])
    t = time.perf_counter()
    closed = await closed_within(reader, FRAME_DEADLINE + 5.0)
    writer.close()
    took = time.perf_counter() - t
    assert closed and FRAME_DEADLINE - 0.1 <= took < FRAME_DEADLINE + 3.0, took


def _batch_frame(opaque: int, n: int, code: int = RequestCode.SEND_BATCH_MESSAGE) -> tuple[bytes, int]:
    """A zlib-compressed batch of ``n`` one-byte messages to queue 0 (code 10 with batch "1" is how
    the C++ client 1.2.3 sends one), and its compressed size."""
    body = zlib.compress(encode_batch([(0, b"x", "")] * n), 9)
    if code == RequestCode.SEND_MESSAGE:
        fields = {"producerGroup": "bomb-pg", "topic": TOPIC, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
                  "queueId": "0", "sysFlag": "1", "bornTimestamp": "0", "flag": "0", "properties": "",
                  "reconsumeTimes": "0", "unitMode": "false", "batch": "1"}
    else:
        fields = {"a": "bomb-pg", "b": TOPIC, "c": "TBW102", "d": "4", "e": "0", "f": "1", "g": "0", "h": "0",
                  "i": "", "j": "0", "k": "false", "m": "true"}
    return json_frame({"code": code, "opaque": opaque, "flag": 0, "language": "CPP", "version": 399,
                       "extFields": fields}, body), len(body)


async def test_a_compressed_batch_of_65536_messages_is_refused_and_nothing_is_stored(broker):
    reader, writer = await asyncio.open_connection("127.0.0.1", broker.broker_port)

    async def call(data: bytes):
        writer.write(data)
        return await read_frame(reader, 10.0)

    async def max_offset() -> int:
        resp = await call(request(RequestCode.GET_MAX_OFFSET, opaque=90, topic=TOPIC, queueId=0))
        return int(resp.ext_fields["offset"])

    before, end = await max_offset(), commitlog_end(broker.metrics_url)
    refused = []
    for opaque, code in ((11, RequestCode.SEND_BATCH_MESSAGE), (12, RequestCode.SEND_MESSAGE)):
        data, size = _batch_frame(opaque, 65_536, code)
        t = time.perf_counter()
        resp = await call(data)
        refused.append((resp, size, time.perf_counter() - t))
    assert await max_offset() == before and commitlog_end(broker.metrics_url) == end, "a refused batch stored"
    # the broker keeps serving: the same connection, the largest batch allowed, a small one
    data, _size = _batch_frame(13, MAX_BATCH_MESSAGES)
    t = time.perf_counter()
    largest = await call(data)
    largest_took = time.perf_counter() - t
    small = await call(_batch_frame(14, 10)[0])
    after = await max_offset()
    writer.close()
    stored = after - before
    for resp, size, took in refused:
        print(f"\n65,536 messages in {size} compressed bytes: code {resp.code} in {took * 1000:.0f} ms: {resp.remark}")
        assert resp.code == ResponseCode.MESSAGE_ILLEGAL, (resp.code, resp.remark)
        assert "more than 32767 messages" in resp.remark and "smaller batches" in resp.remark
    print(f"largest allowed batch ({MAX_BATCH_MESSAGES} messages) answered in {largest_took * 1000:.0f} ms")
    assert largest.code == ResponseCode.SUCCESS and small.code == ResponseCode.SUCCESS, (largest.remark, small.remark)
    assert stored == MAX_BATCH_MESSAGES + 10
