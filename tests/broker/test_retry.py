"""CONSUMER_SEND_MSG_BACK: the retry ladder through %RETRY%<group> and the schedule service, the
dead-letter queue after retryMaxTimes, error codes, and the send path's own DLQ rule.

In-process brokers (tidemq.broker.Broker on loopback) check the stored records directly; one real
broker process checks the whole ladder with a short delay table and `tidemq admin updateSubGroup`.
"""

from __future__ import annotations

import contextlib
import time
import uuid
import zlib

import orjson

from tidemq.broker.broker import Broker
from tidemq.broker.config import BrokerConfig
from tidemq.broker.store.replay import SCHEDULE_TOPIC
from tidemq.client import Admin
from tidemq.message import SysFlag, decode_record, decode_records
from tidemq.remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from tests.broker.store.util import config
from tests.broker.test_broker_protocol import pull_cmd, send_cmd
from tests.procs import free_port
from tests.support.routes import wait_for_route

SHORT = " ".join(["100ms"] * 18)


@contextlib.asynccontextmanager
async def broker(tmp_path, **kw):
    port = free_port()
    cfg = BrokerConfig(store=config(tmp_path / "store"), listen_host="127.0.0.1", listen_port=port,
                       advertise_host="127.0.0.1", advertise_port=port, **kw)
    b = Broker(cfg)
    await b.start()
    c = RemotingClient()
    try:
        yield b, c, f"127.0.0.1:{port}"
    finally:
        await c.close()
        await b.stop()


def send_back(offset, group, delay_level=0, version=None, **extra) -> RemotingCommand:
    cmd = RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK, {
        "offset": offset, "group": group, "delayLevel": delay_level, "originMsgId": "", "originTopic": "",
        "unitMode": "false", **extra,
    })
    if version is not None:
        cmd.version = version
    return cmd


def stored(b: Broker, topic: str, qid: int = 0):
    res = b.store.get_messages(topic, qid, 0, 100, None)
    return [decode_record(r) for r in res.records]


async def put_original(b: Broker, c, addr, topic="Orig", props=None):
    if b.topics.get(topic) is None:
        r = await c.invoke(addr, RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
            "topic": topic, "defaultTopic": "TBW102", "readQueueNums": 1, "writeQueueNums": 1, "perm": 6,
            "topicFilterType": "SINGLE_TAG"}), 3)
        assert r.code == 0
    r = await c.invoke(addr, send_cmd(topic, b"body-1", 0, props or {"TAGS": "T", "UNIQ_KEY": "UNIQ-1", "p": "v"}), 3)
    assert r.code == 0, r.remark
    [m] = [m for m in stored(b, topic) if m.offset_msg_id == r.ext_fields["msgId"]]
    return m


async def set_group(c, addr, group, **fields):
    body = {"groupName": group, "retryQueueNums": 1, "retryMaxTimes": 16, **fields}
    r = await c.invoke(addr, RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                                                     body=orjson.dumps(body)), 3)
    assert r.code == 0


async def test_first_send_back_schedules_the_retry_at_level_3_with_the_origin_recorded(tmp_path):
    async with broker(tmp_path) as (b, c, addr):
        orig = await put_original(b, c, addr)
        r = await c.invoke(addr, send_back(orig.commit_log_offset, "g1", version=63), 3)
        assert r.code == ResponseCode.SUCCESS, r.remark
        [s] = stored(b, SCHEDULE_TOPIC, 2)  # level 3 = 3 + reconsumeTimes 0
        assert s.properties["REAL_TOPIC"] == "%RETRY%g1" and s.properties["DELAY"] == "3"
        assert s.properties["RETRY_TOPIC"] == "Orig"
        assert s.properties["ORIGIN_MESSAGE_ID"] == orig.offset_msg_id
        assert s.properties["UNIQ_KEY"] == "UNIQ-1" and s.properties["p"] == "v"
        assert s.reconsume_times == 1 and s.body == b"body-1"
        assert s.born_timestamp == orig.born_timestamp and s.born_host == orig.born_host
        assert b.topics.get("%RETRY%g1") is not None and b.groups.get("g1") is not None  # auto-created


async def test_explicit_delay_level_and_the_ladder_level_grow_with_reconsume_times(tmp_path):
    async with broker(tmp_path) as (b, c, addr):
        orig = await put_original(b, c, addr)
        assert (await c.invoke(addr, send_back(orig.commit_log_offset, "g", delay_level=5), 3)).code == 0
        [s] = stored(b, SCHEDULE_TOPIC, 4)
        assert s.properties["DELAY"] == "5"
        # a message already retried twice goes back at level 3 + 2
        r = await c.invoke(addr, send_back(s.commit_log_offset, "g"), 3)
        assert r.code == 0
        [s2] = stored(b, SCHEDULE_TOPIC, 3)  # level 3 + reconsumeTimes 1 = 4 -> queue 3
        assert s2.reconsume_times == 2 and s2.properties["ORIGIN_MESSAGE_ID"] == orig.offset_msg_id
        assert s2.properties["RETRY_TOPIC"] == "Orig"


async def test_unknown_offset_and_unknown_group_get_their_error_codes(tmp_path):
    async with broker(tmp_path, auto_create_subscription_group=False) as (b, c, addr):
        orig = await put_original(b, c, addr)
        r = await c.invoke(addr, send_back(orig.commit_log_offset, "nobody"), 3)
        assert r.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST and "nobody" in r.remark
        await set_group(c, addr, "known")
        r = await c.invoke(addr, send_back(987_654_321, "known"), 3)
        assert r.code == ResponseCode.SYSTEM_ERROR and r.remark == "look message by offset failed, 987654321"
        r = await c.invoke(addr, send_back(orig.commit_log_offset + 1, "known"), 3)  # not a record start
        assert r.code == ResponseCode.SYSTEM_ERROR
        r = await c.invoke(addr, RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK, {"group": "known"}), 3)
        assert r.code == ResponseCode.SYSTEM_ERROR and "offset" in r.remark
        assert stored(b, SCHEDULE_TOPIC, 2) == []


async def test_group_without_retry_queues_drops_the_message(tmp_path):
    async with broker(tmp_path) as (b, c, addr):
        await set_group(c, addr, "noretry", retryQueueNums=0)
        orig = await put_original(b, c, addr)
        r = await c.invoke(addr, send_back(orig.commit_log_offset, "noretry"), 3)
        assert r.code == ResponseCode.SUCCESS
        assert all(stored(b, SCHEDULE_TOPIC, q) == [] for q in range(18))
        assert b.topics.get("%DLQ%noretry") is None and b.topics.get("%RETRY%noretry") is None


async def test_negative_delay_level_and_exhausted_retries_go_to_the_dlq(tmp_path):
    async with broker(tmp_path) as (b, c, addr):
        await set_group(c, addr, "g", retryMaxTimes=2)
        orig = await put_original(b, c, addr)
        assert (await c.invoke(addr, send_back(orig.commit_log_offset, "g", delay_level=-1), 3)).code == 0
        [d] = stored(b, "%DLQ%g")
        assert d.reconsume_times == 1 and d.properties["RETRY_TOPIC"] == "Orig" and "DELAY" not in d.properties
        tc = b.topics.get("%DLQ%g")
        assert tc.read_queue_nums == tc.write_queue_nums == 1 and tc.perm == 6
        # reconsumeTimes 2 >= retryMaxTimes 2
        await put_original(b, c, addr, props={"TAGS": "T"})
        m2 = stored(b, "Orig")[-1]
        for _ in range(2):
            assert (await c.invoke(addr, send_back(m2.commit_log_offset, "g"), 3)).code == 0
            m2 = stored(b, SCHEDULE_TOPIC, 2 + m2.reconsume_times)[-1]
        assert m2.reconsume_times == 2
        assert (await c.invoke(addr, send_back(m2.commit_log_offset, "g"), 3)).code == 0
        d2 = stored(b, "%DLQ%g")[-1]
        assert d2.reconsume_times == 3 and d2.properties["ORIGIN_MESSAGE_ID"] == m2.properties["ORIGIN_MESSAGE_ID"]


async def test_header_max_reconsume_times_is_honoured_only_from_version_121(tmp_path):
    async with broker(tmp_path) as (b, c, addr):
        orig = await put_original(b, c, addr)
        r = await c.invoke(addr, send_back(orig.commit_log_offset, "g", version=63, maxReconsumeTimes=0), 3)
        assert r.code == 0 and stored(b, "%DLQ%g") == []  # the C++ client's version: group's 16 applies
        r = await c.invoke(addr, send_back(orig.commit_log_offset, "g", version=407, maxReconsumeTimes=0), 3)
        assert r.code == 0 and len(stored(b, "%DLQ%g")) == 1


async def test_send_into_a_retry_topic_past_max_goes_to_the_dlq_and_below_max_is_delayed(tmp_path):
    async with broker(tmp_path) as (b, c, addr):
        await set_group(c, addr, "jg", retryMaxTimes=3)
        for reconsume in (2, 3):
            cmd = send_cmd("%RETRY%jg", b"fallback", 0, {"DELAY": "5", "RETRY_TOPIC": "Orig", "TAGS": "T"})
            cmd.ext_fields["j"] = str(reconsume)  # reconsumeTimes (V2 short name)
            r = await c.invoke(addr, cmd, 3)
            assert r.code == 0, r.remark
        [sched] = stored(b, SCHEDULE_TOPIC, 4)
        assert sched.properties["REAL_TOPIC"] == "%RETRY%jg" and sched.reconsume_times == 2
        [dead] = stored(b, "%DLQ%jg")
        assert dead.reconsume_times == 3 and "DELAY" not in dead.properties


async def test_clients_cannot_send_into_the_timer_topic(tmp_path):
    async with broker(tmp_path) as (b, c, addr):
        r = await c.invoke(addr, send_cmd("rmq_sys_wheel_timer", b"x", 0, {"REAL_TOPIC": "Orig", "REAL_QID": "0"}), 3)
        assert r.code == ResponseCode.NO_PERMISSION


# ---------------------------------------------------------------------------------- real process
async def test_send_back_ladder_then_dead_letter_with_a_short_delay_table(cluster_factory):
    cl = cluster_factory(extra_broker_args=["--delay-levels", SHORT])
    topic, group = f"ladder_{uuid.uuid4().hex[:6]}", f"lg_{uuid.uuid4().hex[:6]}"
    cl.create_topic(topic, queues=1)
    cl.admin("updateSubGroup", "-c", cl.cluster_name, "-g", group, "-r", "3")
    addr = cl.broker_addr

    async def pull_one(c, t, offset, deadline_s=3.0):
        deadline = time.time() + deadline_s
        while time.time() < deadline:
            r = await c.invoke(addr, pull_cmd(t, 0, offset, suspend_ms=500, group=group), 5)
            if r.code == ResponseCode.SUCCESS:
                return decode_records(r.body_bytes())[0]
        raise AssertionError(f"nothing arrived in {t} at offset {offset}")

    c = RemotingClient()
    try:
        r = await c.invoke(addr, send_cmd(topic, b"ladder", 0, {"TAGS": "L", "KEYS": "k", "UNIQ_KEY": "U-LADDER"}), 3)
        assert r.code == 0
        first = await pull_one(c, topic, 0)
        cur = first
        for i in (1, 2, 3):
            t_back = time.time()
            r = await c.invoke(addr, send_back(cur.commit_log_offset, group, version=63), 3)
            assert r.code == ResponseCode.SUCCESS, r.remark
            cur = await pull_one(c, f"%RETRY%{group}", i - 1)
            assert cur.reconsume_times == i and cur.body == b"ladder"
            assert cur.properties["RETRY_TOPIC"] == topic and cur.properties["UNIQ_KEY"] == "U-LADDER"
            assert cur.properties["ORIGIN_MESSAGE_ID"] == first.offset_msg_id
            assert cur.store_timestamp / 1000 >= t_back + 0.098  # waited its (100 ms) level
        r = await c.invoke(addr, send_back(cur.commit_log_offset, group, version=63), 3)
        assert r.code == ResponseCode.SUCCESS
        dead = await pull_one(c, f"%DLQ%{group}", 0)
        assert dead.reconsume_times == 4 and dead.properties["RETRY_TOPIC"] == topic
        assert dead.properties["ORIGIN_MESSAGE_ID"] == first.offset_msg_id
    finally:
        await c.close()

    async with Admin(cl.namesrv_addr) as admin:  # the DLQ topic is registered with the name server
        await wait_for_route(admin, f"%DLQ%{group}", 1, timeout=5)
        route = await admin.topic_route(f"%DLQ%{group}")
    assert [q.read_queue_nums for q in route.queue_datas] == [1]


async def test_a_compressed_message_goes_back_compressed_with_its_flag_and_pulls_inflated(tmp_path):
    """Decoders keep the COMPRESSED bit as stored (issue 15): the broker re-stores the stored body
    (still compressed) with the bit, so a retry or dead letter is inflated once by the consumer."""
    big = b"compress me " * 1000

    async with broker(tmp_path) as (b, c, addr):
        await put_original(b, c, addr)  # creates the topic
        cmd = send_cmd("Orig", zlib.compress(big), 0, {"TAGS": "Z", "UNIQ_KEY": "UNIQ-Z"})
        cmd.ext_fields["f"] = str(int(SysFlag.COMPRESSED))  # V2 header: f = sysFlag
        assert (await c.invoke(addr, cmd, 3)).code == 0
        [orig] = [m for m in stored(b, "Orig") if m.properties.get("UNIQ_KEY") == "UNIQ-Z"]
        assert orig.sys_flag & SysFlag.COMPRESSED and zlib.decompress(orig.body) == big
        for level, topic, qid in ((0, SCHEDULE_TOPIC, 2), (-1, "%DLQ%gz", 0)):
            r = await c.invoke(addr, send_back(orig.commit_log_offset, "gz", delay_level=level, version=63), 3)
            assert r.code == ResponseCode.SUCCESS, r.remark
            [again] = stored(b, topic, qid)
            assert again.sys_flag & SysFlag.COMPRESSED and zlib.decompress(again.body) == big
        r = await c.invoke(addr, pull_cmd("%DLQ%gz", 0, 0, group="gz"), 3)
        [pulled] = decode_records(r.body_bytes())
        assert pulled.body == big and pulled.sys_flag & SysFlag.COMPRESSED
