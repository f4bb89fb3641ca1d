"""Request-reply (RocketMQ 4.6+) against a real broker: the requester's Producer.request, a
pull-based responder answering with create_reply_message, the broker's SEND_REPLY_MESSAGE_V2 /
PUSH_REPLY_MESSAGE_TO_CLIENT; plus the push codec between the broker and the client."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import zlib

import pytest

from tidemq.broker.processors.reply import build_push
from tidemq.remoting.headers.send import decode_send_header, reply_push_fields
from tidemq.client import ClientConfig, MessageQueue, Producer, PullConsumer
from tidemq.client.pull import PullStatus
from tidemq.client.request_reply import (
    ReplyRouter,
    create_reply_message,
    decode_reply,
    reply_router,
    reply_topic,
)
from tidemq.client.sync import SyncProducer
from tidemq.errors import BrokerError, ClientError, CodecError, RequestTimeoutError
from tidemq.message import Message, MessageExt, Prop, SysFlag, encode_properties
from tidemq.remoting import RequestCode, ResponseCode
from tidemq.remoting.frame import decode_frame, encode_frame
from tests.support.topics import create_topic

REPLY_TOPIC = "DefaultCluster_REPLY_TOPIC"


def config(cluster) -> ClientConfig:
    return ClientConfig(name_servers=cluster.namesrv_addr)


@contextlib.asynccontextmanager
async def responder(cluster, topic: str, answer=lambda m: b"re:" + m.body):
    """Pull every queue of ``topic`` (long polling) and answer each request with a reply."""
    seen: list[MessageExt] = []
    async with PullConsumer(f"{topic}-responder", config=config(cluster)) as consumer, \
            Producer(f"{topic}-replier", config=config(cluster)) as replier:
        queues = await consumer.fetch_queues(topic)

        async def loop(mq: MessageQueue) -> None:
            offset = await consumer.max_offset(mq)
            while True:
                r = await consumer.pull(mq, offset, 32, suspend_ms=1000, timeout=5)
                offset = r.next_begin_offset
                if r.status is not PullStatus.FOUND:
                    continue
                requests = [m for m in r.messages if Prop.CORRELATION_ID in m.properties]
                seen.extend(requests)
                await asyncio.gather(*(replier.send(create_reply_message(m, answer(m)))
                                       for m in requests))

        tasks = [asyncio.create_task(loop(mq)) for mq in queues]
        try:
            yield seen
        finally:
            for t in tasks:
                t.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            for res in results:  # a responder that died would hide a real failure
                assert isinstance(res, asyncio.CancelledError), res


# real broker ----------------------------------------------------------------------------------
@pytest.mark.timeout(60, func_only=True)
async def test_hundred_concurrent_requests_each_get_their_own_reply(cluster):
    topic = "RrHundred"

    await create_topic(cluster, topic, 4)
    async with Producer("rr-requester", config=config(cluster)) as p:
        async with responder(cluster, topic) as seen:
            msgs = [Message(topic, f"q{i}".encode(), properties={"n": str(i)}) for i in range(100)]
            replies = await asyncio.gather(*(p.request(m, timeout=15) for m in msgs))
        client_id = p.client_id
    assert [r.body for r in replies] == [f"re:q{i}".encode() for i in range(100)]
    assert len({r.properties[Prop.CORRELATION_ID] for r in replies}) == 100
    assert all(m.properties == {"n": str(i)} for i, m in enumerate(msgs))  # not modified
    requests = {m.properties[Prop.CORRELATION_ID]: m for m in seen}
    for reply in replies:
        req = requests[reply.properties[Prop.CORRELATION_ID]]
        assert reply.body == b"re:" + req.body
        assert reply.topic == REPLY_TOPIC and reply.properties[Prop.MSG_TYPE] == "reply"
        assert reply.properties[Prop.REPLY_TO_CLIENT] == client_id
        assert int(reply.properties[Prop.PUSH_REPLY_TIME]) <= int(reply.properties[Prop.ARRIVE_TIME])
        assert reply.store_host == cluster.broker_addr and reply.born_host
    req = next(iter(requests.values()))
    assert req.properties[Prop.REPLY_TO_CLIENT] == client_id
    assert req.properties[Prop.TTL] == "15000"
    assert req.properties[Prop.CLUSTER] == cluster.cluster_name


@pytest.mark.timeout(60, func_only=True)
async def test_request_with_callback_and_a_compressed_reply(cluster):
    topic = "RrCallback"
    big = b"0123456789" * 2000  # compressed by the replier (over 4 KiB)

    await create_topic(cluster, topic, 2)
    async with Producer("rr-cb-requester", config=config(cluster)) as p:
        async with responder(cluster, topic, answer=lambda m: big + m.body):
            done = asyncio.get_running_loop().create_future()
            task = p.request_with_callback(Message(topic, b"!"), done.set_result,
                                           done.set_exception, timeout=10)
            reply = await asyncio.wait_for(done, 12)
            assert await task is reply
    assert reply.body == big + b"!" and reply.sys_flag & SysFlag.COMPRESSED  # inflated, flag as sent


@pytest.mark.timeout(60, func_only=True)
async def test_request_without_responder_times_out_clearly(cluster):
    topic = "RrNobody"

    await create_topic(cluster, topic, 1)
    async with Producer("rr-lonely", config=config(cluster)) as p:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(RequestTimeoutError) as ei:
            await p.request(Message(topic, b"anyone?"), timeout=1.0)
        elapsed = loop.time() - t0
        assert 0.95 <= elapsed < 3.0, elapsed  # the 1 s timeout, with slack for a loaded box
        assert isinstance(ei.value, ClientError)
        assert f"request to topic {topic} got no reply within 1 s" in str(ei.value)
        errors: list[BaseException] = []
        task = p.request_with_callback(Message(topic, b"cb"), None, errors.append, timeout=0.3)
        assert await task is None
        assert len(errors) == 1 and isinstance(errors[0], RequestTimeoutError)
        assert len(reply_router(p._require())) == 0  # nothing left in the table


@pytest.mark.timeout(60, func_only=True)
async def test_reply_to_an_unknown_client_gets_an_error_code(cluster):
    reply = Message(REPLY_TOPIC, b"late", properties={
        Prop.MSG_TYPE: "reply", Prop.CORRELATION_ID: "no-such-request",
        Prop.REPLY_TO_CLIENT: "10.9.8.7@ghost", Prop.TTL: "3000"})
    async with Producer("rr-stray", config=config(cluster)) as p:
        with pytest.raises(BrokerError) as ei:
            await p.send(reply)
        no_props = Message(REPLY_TOPIC, b"x", properties={Prop.MSG_TYPE: "reply"})
        with pytest.raises(BrokerError) as ei2:
            await p.send(no_props)
    assert ei.value.code == ResponseCode.SYSTEM_ERROR
    assert "channel of <10.9.8.7@ghost> not found" in ei.value.remark
    assert ei2.value.code == ResponseCode.SYSTEM_ERROR and "REPLY_TO_CLIENT" in ei2.value.remark


@pytest.mark.timeout(60, func_only=True)
async def test_replies_are_stored_in_the_reply_topic(cluster):
    topic = "RrStored"

    await create_topic(cluster, topic, 1)
    async with PullConsumer("rr-store-check", config=config(cluster)) as c:
        mq = MessageQueue(REPLY_TOPIC, cluster.broker_name, 0)
        start = await c.max_offset(mq)
        async with Producer("rr-store-req", config=config(cluster)) as p:
            async with responder(cluster, topic):
                reply = await p.request(Message(topic, b"keep me"), timeout=10)
        r = await c.pull(mq, start, 32)
    assert r.status is PullStatus.FOUND
    stored = [m for m in r.messages
              if m.properties.get(Prop.CORRELATION_ID) == reply.properties[Prop.CORRELATION_ID]]
    assert len(stored) == 1 and stored[0].body == b"re:keep me"


@pytest.mark.timeout(60, func_only=True)
async def test_sync_producer_request(cluster):
    topic = "RrSync"
    await create_topic(cluster, topic, 1)

    def request_blocking() -> list[bytes]:
        """The SyncProducer blocks: it runs in a thread while this loop serves the responder."""
        results: list[bytes] = []
        with SyncProducer("rr-sync", config=config(cluster)) as p:
            results.append(p.request(Message(topic, b"blocking"), timeout=10).body)
            got = threading.Event()
            p.request_with_callback(Message(topic, b"cb"), lambda m: (results.append(m.body), got.set()),
                                    None, timeout=10)
            sent = threading.Event()
            p.send_async(Message(topic, b"plain"), lambda r: sent.set())
            assert got.wait(10) and sent.wait(10)
        return results

    async with responder(cluster, topic):
        results = await asyncio.to_thread(request_blocking)
    assert results[:2] == [b"re:blocking", b"re:cb"]


# the push codec and the reply table (no processes) ----------------------------------------------
def _send_fields(**over: str) -> dict[str, str]:
    fields = {"producerGroup": "pg", "topic": REPLY_TOPIC, "defaultTopic": "TBW102",
              "defaultTopicQueueNums": "4", "queueId": "0", "sysFlag": "0",
              "bornTimestamp": "1700000000000", "flag": "3", "reconsumeTimes": "0",
              "unitMode": "false", "properties": "ignored"}
    fields.update(over)
    return fields


def _push(fields: dict[str, str], props: dict[str, str], body: bytes, born_host: str, store_host: str,
          store_timestamp: int):
    """The push the broker builds for a reply sent with the long-named header ``fields``."""
    header = decode_send_header(fields, v2=False)
    return build_push(reply_push_fields(header, encode_properties(props), born_host, store_host, store_timestamp),
                      body)


def test_push_built_by_the_broker_decodes_in_the_client():
    props = {Prop.CORRELATION_ID: "c1", Prop.REPLY_TO_CLIENT: "me", Prop.MSG_TYPE: "reply",
             Prop.PUSH_REPLY_TIME: "1700000000500"}
    cmd = _push(_send_fields(), props, b"body", "127.0.0.1:5555", "127.0.0.1:10911", 1700000000400)
    assert cmd.code == RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT and not cmd.is_oneway
    wire = decode_frame(encode_frame(cmd))
    assert all(isinstance(v, str) for v in wire.ext_fields.values())
    assert wire.ext_fields["storeTimestamp"] == "1700000000400"
    msg = decode_reply(wire, 1700000000600)
    assert (msg.topic, msg.body, msg.flag, msg.queue_id) == (REPLY_TOPIC, b"body", 3, 0)
    assert (msg.born_host, msg.store_host) == ("127.0.0.1:5555", "127.0.0.1:10911")
    assert msg.born_timestamp == 1700000000000 and msg.store_timestamp == 1700000000400
    assert msg.properties == {**props, Prop.ARRIVE_TIME: "1700000000600"}


def test_compressed_push_is_inflated_and_garbage_is_a_codec_error():
    body = b"x" * 10000
    cmd = _push(_send_fields(sysFlag=str(int(SysFlag.COMPRESSED))), {}, zlib.compress(body), "a:1", "b:2", 5)
    msg = decode_reply(decode_frame(encode_frame(cmd)), 6)
    assert msg.body == body and msg.sys_flag == SysFlag.COMPRESSED
    bad = _push(_send_fields(sysFlag="1"), {}, b"not zlib", "a:1", "b:2", 5)
    with pytest.raises(CodecError):
        decode_reply(bad, 6)
    bad_int = _push(_send_fields(), {}, b"x", "a:1", "b:2", 5)
    bad_int.ext_fields["queueId"] = "zero"  # not what a broker sends: the client must refuse it
    with pytest.raises(CodecError):
        decode_reply(bad_int, 6)


async def test_router_answers_every_push_and_matches_by_correlation_id():
    router = ReplyRouter(max_pending=2)
    fut = router.register("c1", "T", 5)
    push = _push(_send_fields(), {Prop.CORRELATION_ID: "c1"}, b"r", "a:1", "b:2", 1)
    resp = router.handle(_Conn(), push)
    assert resp.code == ResponseCode.SUCCESS and fut.result().body == b"r"
    stray = router.handle(_Conn(), push)  # no waiter any more: still SUCCESS, counted
    assert stray.code == ResponseCode.SUCCESS and router.unmatched == 1
    bad = _push(_send_fields(sysFlag="1"), {}, b"junk", "a:1", "b:2", 1)
    assert router.handle(_Conn(), bad).code == ResponseCode.SYSTEM_ERROR
    router.register("c2", "T", 5)
    router.register("c3", "T", 0.01)
    with pytest.raises(ClientError, match="limit"):
        router.register("c4", "T", 5)
    await asyncio.sleep(0.02)
    fut4 = router.register("c4", "T", 5)  # c3 expired and was swept
    assert not fut4.done() and len(router) == 2
    with pytest.raises(ClientError, match="already waiting"):
        router.register("c2", "T", 5)


def test_create_reply_message_copies_the_correlation_properties():
    request = Message("T", b"q", properties={Prop.CLUSTER: "C1", Prop.CORRELATION_ID: "c",
                                             Prop.REPLY_TO_CLIENT: "me", Prop.TTL: "3000", "x": "y"})
    reply = create_reply_message(request, b"a")
    assert reply.topic == reply_topic("C1") == "C1_REPLY_TOPIC" and reply.body == b"a"
    assert reply.properties == {Prop.MSG_TYPE: "reply", Prop.CORRELATION_ID: "c",
                                Prop.REPLY_TO_CLIENT: "me", Prop.TTL: "3000"}
    with pytest.raises(ClientError, match="CLUSTER"):
        create_reply_message(Message("T", b"q", properties={Prop.CORRELATION_ID: "c"}), b"a")
    with pytest.raises(ClientError, match="not a request"):
        create_reply_message(Message("T", b"q", properties={Prop.CLUSTER: "C1"}), b"a")


class _Conn:
    peer = "127.0.0.1:1"
