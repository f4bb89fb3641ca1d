"""The broker over the wire: bad input, permissions, pull statuses, long polling.

Talks RocketMQ remoting directly (tidemq.remoting) to a real broker process.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
import uuid

import orjson
import pytest

from tidemq.message import decode_records, encode_properties
from tidemq.remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from tidemq.remoting.frame import encode_frame, iter_frames


def send_cmd(topic: str, body: bytes, queue_id: int = 0, props: dict | None = None, v2: bool = True) -> RemotingCommand:
    fields = {
        "producerGroup": "pg", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": 4,
        "queueId": queue_id, "sysFlag": 0, "bornTimestamp": int(time.time() * 1000), "flag": 0,
        "properties": encode_properties(props or {"TAGS": "TagA"}), "reconsumeTimes": 0,
    }
    if v2:
        short = dict(zip(["producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
                          "bornTimestamp", "flag", "properties", "reconsumeTimes"], "abcdefghij"))
        fields = {short[k]: v for k, v in fields.items()}
        return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, fields, body)
    return RemotingCommand.request(RequestCode.SEND_MESSAGE, fields, body)


def pull_cmd(topic: str, queue_id: int, offset: int, suspend_ms: int = 0, group: str = "g1", sub: str = "*") -> RemotingCommand:
    sys_flag = 0x4 | (0x2 if suspend_ms else 0)
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, {
        "consumerGroup": group, "topic": topic, "queueId": queue_id, "queueOffset": offset,
        "maxMsgNums": 32, "sysFlag": sys_flag, "commitOffset": 0, "suspendTimeoutMillis": suspend_ms,
        "subscription": sub, "subVersion": 0,
    })


def raw_exchange(addr: str, payload: bytes, timeout: float = 3.0) -> bytes:
    """Send raw bytes, return what comes back before the broker closes (b'' = closed at once)."""
    host, port = addr.split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(payload)
        chunks = []
        try:
            while True:
                data = s.recv(65536)
                if not data:
                    break
                chunks.append(data)
        except socket.timeout:
            return b"TIMEOUT" + b"".join(chunks)
        return b"".join(chunks)


@pytest.fixture
async def rc():
    """A RemotingClient for one test, closed after it."""
    client = RemotingClient()
    yield client
    await client.close()


async def broker_still_serves(cluster) -> None:
    c = RemotingClient()
    try:
        r = await c.invoke(cluster.broker_addr, RemotingCommand.request(RequestCode.GET_ALL_TOPIC_CONFIG), 3)
        assert r.code == ResponseCode.SUCCESS
    finally:
        await c.close()


@pytest.mark.parametrize(
    "payload",
    [
        struct.pack(">i", 16 * 1024 * 1024 + 1) + b"\0" * 16,  # longer than the maximum frame
        struct.pack(">i", -5) + b"\0" * 16,                       # negative length
        struct.pack(">i", 2) + b"\0\0",                           # shorter than the header length word
        struct.pack(">ii", 4 + 9, 9) + b"not json!",              # header that is not JSON
        struct.pack(">ii", 4 + 4, 400) + b"{}{}",                 # header length past the frame
    ],
    ids=["too-long", "negative", "short", "bad-json", "header-overflow"],
)
async def test_broken_frames_close_only_that_connection(cluster, payload):
    assert raw_exchange(cluster.broker_addr, payload) == b""
    await broker_still_serves(cluster)


async def test_unknown_request_code_is_answered_not_supported(cluster, rc):
    r = await rc.invoke(cluster.broker_addr, RemotingCommand.request(9999, {"x": 1}), 3)
    assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert "9999" in (r.remark or "")


def test_response_to_json_request_is_json_with_string_fields(cluster):
    topic = f"wire_{uuid.uuid4().hex[:6]}"
    cluster.create_topic(topic, queues=1)
    frame = encode_frame(send_cmd(topic, b"hello", v2=False))
    raw = b""
    host, port = cluster.broker_addr.split(":")
    with socket.create_connection((host, int(port)), timeout=3) as s:
        s.sendall(frame)
        while len(raw) < 8 or len(raw) < 4 + struct.unpack(">i", raw[:4])[0]:
            raw += s.recv(65536)
    length, type_len = struct.unpack(">iI", raw[:8])
    assert type_len >> 24 == 0  # JSON serialize type: the C++ client reads no other
    header = orjson.loads(raw[8 : 8 + (type_len & 0xFFFFFF)])
    assert header["flag"] == 1 and header["code"] == 0
    for key in ("msgId", "queueId", "queueOffset"):
        assert isinstance(header["extFields"][key], str)


def _max_offset(c: RemotingClient, addr: str, topic: str, q: int):
    return c.invoke(addr, RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": q}), 3)


async def test_bad_sends_get_rocketmq_codes_and_store_nothing(cluster, rc):
    topic = f"bad_{uuid.uuid4().hex[:6]}"
    ro_topic = f"ro_{uuid.uuid4().hex[:6]}"
    cluster.create_topic(topic, queues=2)
    cluster.create_topic(ro_topic, queues=2, p="4")

    addr = cluster.broker_addr
    missing = await rc.invoke(addr, send_cmd("no_such_topic_x", b"x"), 3)
    readonly = await rc.invoke(addr, send_cmd(ro_topic, b"x"), 3)
    bad_queue = await rc.invoke(addr, send_cmd(topic, b"x", queue_id=99), 3)
    bad_name = await rc.invoke(addr, send_cmd("bad topic!", b"x"), 3)
    empty = await rc.invoke(addr, send_cmd(topic, b""), 3)
    huge = await rc.invoke(addr, send_cmd(topic, b"z" * (4 * 1024 * 1024 + 1)), 10)
    system = await rc.invoke(addr, send_cmd("SCHEDULE_TOPIC_XXXX", b"x"), 3)
    bad_batch = RemotingCommand.request(RequestCode.SEND_BATCH_MESSAGE, {"a": "pg", "b": topic, "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": 0, "h": 0}, b"\x00\x00\x00\x40garbage")
    batch = await rc.invoke(addr, bad_batch, 3)
    maxes = [(await _max_offset(rc, addr, t, q)).ext_fields["offset"] for t in (topic, ro_topic) for q in (0, 1)]

    assert missing.code == ResponseCode.TOPIC_NOT_EXIST and "updateTopic" in missing.remark
    assert readonly.code == ResponseCode.NO_PERMISSION
    assert bad_queue.code == ResponseCode.SYSTEM_ERROR and "queueId" in bad_queue.remark
    assert bad_name.code == ResponseCode.SYSTEM_ERROR
    assert empty.code == ResponseCode.MESSAGE_ILLEGAL
    assert huge.code == ResponseCode.MESSAGE_ILLEGAL
    assert system.code == ResponseCode.NO_PERMISSION
    assert batch.code == ResponseCode.MESSAGE_ILLEGAL
    for r in (missing, readonly, bad_queue, empty, huge, batch):  # the C++ client needs the header always
        assert set(r.ext_fields) >= {"msgId", "queueId", "queueOffset"}
    assert maxes == ["0", "0", "0", "0"]


async def test_pull_statuses_follow_rocketmq(cluster, rc):
    topic = f"pulls_{uuid.uuid4().hex[:6]}"
    cluster.create_topic(topic, queues=2)

    addr = cluster.broker_addr
    for i in range(3):
        r = await rc.invoke(addr, send_cmd(topic, f"m{i}".encode(), queue_id=0), 3)
        assert r.code == 0
    found = await rc.invoke(addr, pull_cmd(topic, 0, 0), 3)
    at_end = await rc.invoke(addr, pull_cmd(topic, 0, 3), 3)
    beyond = await rc.invoke(addr, pull_cmd(topic, 0, 50), 3)
    empty_nz = await rc.invoke(addr, pull_cmd(topic, 1, 7), 3)
    bad_queue = await rc.invoke(addr, pull_cmd(topic, 5, 0), 3)
    no_topic = await rc.invoke(addr, pull_cmd("nope_" + topic, 0, 0), 3)
    filtered = await rc.invoke(addr, pull_cmd(topic, 0, 0, sub="TagZ"), 3)

    assert found.code == ResponseCode.SUCCESS
    assert [m.body for m in decode_records(found.body_bytes())] == [b"m0", b"m1", b"m2"]
    assert found.ext_fields["nextBeginOffset"] == "3" and found.ext_fields["maxOffset"] == "3"
    assert at_end.code == ResponseCode.PULL_NOT_FOUND and at_end.ext_fields["nextBeginOffset"] == "3"
    assert beyond.code == ResponseCode.PULL_OFFSET_MOVED and beyond.ext_fields["nextBeginOffset"] == "3"
    assert empty_nz.code == ResponseCode.PULL_OFFSET_MOVED and empty_nz.ext_fields["nextBeginOffset"] == "0"
    assert bad_queue.code == ResponseCode.SYSTEM_ERROR
    assert no_topic.code == ResponseCode.TOPIC_NOT_EXIST
    assert filtered.code == ResponseCode.PULL_RETRY_IMMEDIATELY and filtered.ext_fields["nextBeginOffset"] == "3"
    for r in (found, at_end, beyond, empty_nz, bad_queue, no_topic, filtered):
        assert set(r.ext_fields) >= {"nextBeginOffset", "minOffset", "maxOffset", "suggestWhichBrokerId"}


async def test_long_poll_wakes_on_arrival_not_at_its_timeout(cluster, rc):
    topic = f"lp_{uuid.uuid4().hex[:6]}"
    cluster.create_topic(topic, queues=1)

    addr = cluster.broker_addr
    await rc.connection(addr)
    pulls = asyncio.ensure_future(rc.invoke(addr, pull_cmd(topic, 0, 0, suspend_ms=10_000), 15))
    await asyncio.sleep(0.5)
    assert not pulls.done()  # held, not answered
    sent = await rc.invoke(addr, send_cmd(topic, b"wake up"), 3)
    acked = time.monotonic()
    resp = await pulls
    delay = time.monotonic() - acked

    assert sent.code == 0
    assert resp.code == ResponseCode.SUCCESS
    assert [m.body for m in decode_records(resp.body_bytes())] == [b"wake up"]
    # held for 10 s, answered within a second of the send: woken by the arrival (typically < 5 ms; the
    # bound leaves room for a loaded CI runner)
    assert delay < 1.0, f"long poll answered {delay * 1000:.1f} ms after the send was acknowledged"


async def test_long_poll_ignores_messages_that_do_not_match_and_times_out(cluster, rc):
    topic = f"lpf_{uuid.uuid4().hex[:6]}"
    cluster.create_topic(topic, queues=1)

    addr = cluster.broker_addr
    t0 = time.monotonic()
    pull = asyncio.ensure_future(rc.invoke(addr, pull_cmd(topic, 0, 0, suspend_ms=1000, sub="TagB"), 5))
    await asyncio.sleep(0.2)
    await rc.invoke(addr, send_cmd(topic, b"a", props={"TAGS": "TagA"}), 3)
    resp = await pull
    elapsed = time.monotonic() - t0

    assert elapsed >= 0.9  # not woken by TagA
    assert resp.code in (ResponseCode.PULL_RETRY_IMMEDIATELY, ResponseCode.PULL_NOT_FOUND)
    assert resp.ext_fields["nextBeginOffset"] in ("0", "1")


async def test_heartbeat_registers_consumer_and_retry_topic(cluster, rc):
    group = f"hb_{uuid.uuid4().hex[:6]}"
    body = orjson.dumps({
        "clientID": "9017-127.0.0.1@DEFAULT",
        "consumerDataSet": [{"consumeFromWhere": 0, "consumeType": 1, "groupName": group, "messageModel": 1,
                             "subscriptionDataSet": [{"subString": "*", "subVersion": "1", "topic": "x"}]}],
    }) + b"\n"

    addr = cluster.broker_addr
    hb = await rc.invoke(addr, RemotingCommand.request(RequestCode.HEART_BEAT, {}, body), 3)
    lst = await rc.invoke(addr, RemotingCommand.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group}), 3)
    topics = await rc.invoke(addr, RemotingCommand.request(RequestCode.GET_ALL_TOPIC_CONFIG), 3)

    assert hb.code == 0
    assert orjson.loads(lst.body_bytes()) == {"consumerIdList": ["9017-127.0.0.1@DEFAULT"]}
    assert f"%RETRY%{group}" in orjson.loads(topics.body_bytes())["topicConfigTable"]


async def test_broken_frames_leave_no_traceback_in_the_broker_log(cluster):
    raw_exchange(cluster.broker_addr, struct.pack(">ii", 4 + 9, 9) + b"not json!")
    await broker_still_serves(cluster)
    log = cluster.broker.log()
    assert "Traceback" not in log and "Fatal error" not in log
    assert "closing connection" in log


def test_long_poll_sees_a_message_sent_in_the_same_write(cluster):
    """A send right behind a suspended pull on one connection must wake it (no 15 s stall)."""
    topic = f"lpr_{uuid.uuid4().hex[:6]}"
    cluster.create_topic(topic, queues=1)
    host, port = cluster.broker_addr.split(":")
    pull = pull_cmd(topic, 0, 0, suspend_ms=5000)
    pull.opaque = 1
    send = send_cmd(topic, b"same write")
    send.opaque = 2
    t0 = time.monotonic()
    got: dict[int, RemotingCommand] = {}
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(encode_frame(pull) + encode_frame(send))
        buf = bytearray()
        while len(got) < 2:
            buf += s.recv(65536)
            for c in iter_frames(buf):
                got[c.opaque] = c
    assert got[2].code == 0 and got[1].code == ResponseCode.SUCCESS
    assert time.monotonic() - t0 < 2.0


async def test_oneway_commit_then_close_is_not_lost(cluster):
    topic = f"ow_{uuid.uuid4().hex[:6]}"
    cluster.create_topic(topic, queues=1)

    c = RemotingClient()
    up = RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "owg", "topic": topic, "queueId": 0, "commitOffset": 42}, oneway=True)
    await c.invoke_oneway(cluster.broker_addr, up)
    await c.close()
    await asyncio.sleep(0.2)
    c2 = RemotingClient()
    try:
        q = RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "owg", "topic": topic, "queueId": 0})
        r = await c2.invoke(cluster.broker_addr, q, 3)
    finally:
        await c2.close()
    assert r.ext_fields["offset"] == "42"


async def test_out_of_range_numbers_and_badly_typed_bodies_are_refused(cluster, rc):
    addr = cluster.broker_addr
    bad_topic = RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "poison_t", "readQueueNums": 1, "writeQueueNums": 1, "perm": 6, "topicSysFlag": 2**70})
    r1 = await rc.invoke(addr, bad_topic, 3)
    r2 = await rc.invoke(addr, RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "g", "topic": "x", "queueId": 0, "commitOffset": 2**70}), 3)
    r3 = await rc.invoke(addr, RemotingCommand.request(RequestCode.HEART_BEAT, {}, b'{"consumerDataSet":5,"producerDataSet":"x"}'), 3)
    r4 = await rc.invoke(addr, RemotingCommand.request(RequestCode.LOCK_BATCH_MQ, {}, b'{"mqSet":5}'), 3)
    r5 = await rc.invoke(addr, RemotingCommand.request(RequestCode.HEART_BEAT, {}, b'[1,2'), 3)
    topics = await rc.invoke(addr, RemotingCommand.request(RequestCode.GET_ALL_TOPIC_CONFIG), 3)
    assert r1.code == ResponseCode.SYSTEM_ERROR and "out of range" in r1.remark
    assert r2.code == ResponseCode.SYSTEM_ERROR
    assert r3.code == 0 and r4.code == 0  # wrong types ignored, nothing registered
    assert r5.code == ResponseCode.SYSTEM_ERROR and "JSON" in r5.remark
    assert topics.code == 0 and "poison_t" not in orjson.loads(topics.body_bytes())["topicConfigTable"]


async def test_system_topics_cannot_be_updated_or_deleted(cluster, rc):
    out = []
    for topic in ("TBW102", "SCHEDULE_TOPIC_XXXX", cluster.cluster_name, cluster.broker_name):
        out.append(await rc.invoke(cluster.broker_addr, RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic}), 3))
        out.append(await rc.invoke(cluster.broker_addr, RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": topic, "readQueueNums": 1, "writeQueueNums": 1, "perm": 6}), 3))
    for r in out:
        assert r.code == ResponseCode.SYSTEM_ERROR and "system topic" in r.remark


async def test_delete_then_recreate_and_send_keeps_the_new_message(cluster_factory):
    c = cluster_factory()
    topic = f"dr_{uuid.uuid4().hex[:6]}"
    c.create_topic(topic, queues=1)

    cl = RemotingClient()
    try:
        addr = c.broker_addr
        assert (await cl.invoke(addr, send_cmd(topic, b"old"), 3)).code == 0
        conn = await cl.connection(addr)
        delete = RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic})
        create = RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": topic, "readQueueNums": 1, "writeQueueNums": 1, "perm": 6})
        futs = [asyncio.ensure_future(conn.invoke(x, 5)) for x in (delete, create)]
        await asyncio.sleep(0)
        sent = await cl.invoke(addr, send_cmd(topic, b"new"), 3)
        await asyncio.gather(*futs)
        await asyncio.sleep(0.5)  # let the deletion worker run
    finally:
        await cl.close()
    assert sent.code == 0
    c.restart_broker()

    cl = RemotingClient()
    try:
        r = await cl.invoke(c.broker_addr, pull_cmd(topic, 0, 0), 3)
    finally:
        await cl.close()
    assert r.code == ResponseCode.SUCCESS
    assert [m.body for m in decode_records(r.body_bytes())] == [b"new"]


async def test_auto_create_subscription_group_follows_update_broker_config(cluster_factory, rc):
    """autoCreateSubscriptionGroup changed by UPDATE_BROKER_CONFIG applies to pulls and heartbeats
    at once (the implicit-creation rules once kept the value the broker started with)."""
    c = cluster_factory()
    topic = f"acg_{uuid.uuid4().hex[:6]}"
    c.create_topic(topic, queues=1)
    addr = c.broker_addr

    async def set_auto_create(on: bool) -> None:
        body = f"autoCreateSubscriptionGroup={'true' if on else 'false'}\n".encode()
        resp = await rc.invoke(addr, RemotingCommand.request(RequestCode.UPDATE_BROKER_CONFIG, body=body), 3)
        assert resp.code == ResponseCode.SUCCESS, resp.remark

    await set_auto_create(False)
    refused = await rc.invoke(addr, pull_cmd(topic, 0, 0, group="acg_off"), 3)
    assert refused.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, refused.remark
    groups = await rc.invoke(addr, RemotingCommand.request(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG), 3)
    assert "acg_off" not in orjson.loads(groups.body_bytes())["subscriptionGroupTable"]

    await set_auto_create(True)
    served = await rc.invoke(addr, pull_cmd(topic, 0, 0, group="acg_on"), 3)
    assert served.code != ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, served.remark
    groups = await rc.invoke(addr, RemotingCommand.request(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG), 3)
    assert "acg_on" in orjson.loads(groups.body_bytes())["subscriptionGroupTable"]
