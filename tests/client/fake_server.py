"""An in-memory name server + broker speaking just enough remoting to drive the client.

Not a broker: no persistence, no long polling. It follows PROTOCOL-REFERENCE for the shapes of
headers and bodies, records every request, and lets a test script failures (``fail_next``).
Tests get a started one from a fixture made by :func:`fake_fixture`.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass, field

import orjson
import pytest

from tidemq.message import (
    decode_batch,
    decode_properties,
    encode_offset_msg_id,
    encode_properties,
    encode_record,
)
from tidemq.remoting import RemotingCommand, RemotingServer, RequestCode, ResponseCode, fastjson

LOCAL = b"\x7f\x00\x00\x01"


@dataclass
class Stored:
    topic: str
    queue_id: int
    queue_offset: int
    phys: int
    record: bytes
    props: dict[str, str]
    store_ts: int


@dataclass
class FakeCluster:
    cluster: str = "DefaultCluster"
    broker_name: str = "broker-a"
    topics: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # read, write, perm
    queues: dict[tuple[str, int], list[Stored]] = field(default_factory=lambda: defaultdict(list))
    offsets: dict[tuple[str, str, int], int] = field(default_factory=dict)
    requests: list[RemotingCommand] = field(default_factory=list)
    heartbeats: list[dict] = field(default_factory=list)
    fail_next: list[tuple[int, int]] = field(default_factory=list)  # (request code, response code)
    hold: set[int] = field(default_factory=set)  # request codes never answered
    extra_brokers: dict[str, str] = field(default_factory=dict)  # broker name -> addr (route only)
    phys: int = 0
    addr: str = ""
    server: RemotingServer | None = None

    async def start(self) -> "FakeCluster":
        self.server = RemotingServer(self)
        host, port = await self.server.start("127.0.0.1", 0)
        self.addr = f"{host}:{port}"
        return self

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop()

    def codes(self) -> list[int]:
        return [c.code for c in self.requests]

    # RequestHandler --------------------------------------------------------------------------
    def connection_lost(self, conn) -> None:
        pass

    def handle(self, conn, cmd: RemotingCommand):
        self.requests.append(cmd)
        if cmd.code in self.hold:
            return asyncio.sleep(3600)
        for i, (code, resp_code) in enumerate(self.fail_next):
            if code == cmd.code:
                del self.fail_next[i]
                return cmd.response(resp_code, "scripted failure")
        fn = getattr(self, f"on_{RequestCode(cmd.code).name.lower()}", None)
        if fn is None:
            return cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported")
        return fn(conn, cmd)

    # name server ----------------------------------------------------------------------------
    def _broker_datas(self) -> list[dict]:
        out = [{"cluster": self.cluster, "brokerName": self.broker_name, "brokerAddrs": {"0": self.addr}}]
        for name, addr in self.extra_brokers.items():
            out.append({"cluster": self.cluster, "brokerName": name, "brokerAddrs": {"0": addr}})
        return out

    def on_get_routeinfo_by_topic(self, conn, cmd):
        topic = cmd.get_str("topic")
        if topic not in self.topics:
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"No topic route info in name server for the topic: {topic}")
        r, w, p = self.topics[topic]
        qds = [{"brokerName": self.broker_name, "readQueueNums": r, "writeQueueNums": w, "perm": p, "topicSysFlag": 0}]
        for name in self.extra_brokers:
            qds.append({"brokerName": name, "readQueueNums": r, "writeQueueNums": w, "perm": p, "topicSysFlag": 0})
        # fastjson style: bare integer broker ids
        body = orjson.dumps({"queueDatas": qds, "brokerDatas": self._broker_datas()}).replace(b'"0":', b"0:")
        return cmd.response(body=body)

    def on_get_broker_cluster_info(self, conn, cmd):
        table = {bd["brokerName"]: bd for bd in self._broker_datas()}
        body = {"brokerAddrTable": table, "clusterAddrTable": {self.cluster: sorted(table)}}
        return cmd.response(body=orjson.dumps(body))

    def on_get_all_topic_list_from_nameserver(self, conn, cmd):
        return cmd.response(body=orjson.dumps({"topicList": sorted(self.topics)}))

    def on_delete_topic_in_namesrv(self, conn, cmd):
        self.topics.pop(cmd.get_str("topic"), None)
        return cmd.response()

    # broker admin ----------------------------------------------------------------------------
    def on_update_and_create_topic(self, conn, cmd):
        self.topics[cmd.get_str("topic")] = (cmd.get_int("readQueueNums"), cmd.get_int("writeQueueNums"), cmd.get_int("perm"))
        return cmd.response()

    def on_delete_topic_in_broker(self, conn, cmd):
        return cmd.response()

    def on_update_and_create_subscriptiongroup(self, conn, cmd):
        orjson.loads(cmd.body_bytes())
        return cmd.response()

    def _max(self, topic: str, qid: int) -> int:
        return len(self.queues.get((topic, qid), []))

    def on_get_topic_stats_info(self, conn, cmd):
        topic = cmd.get_str("topic")
        r, w, _p = self.topics[topic]
        table = {}
        for q in range(w):
            msgs = self.queues.get((topic, q), [])
            table[fastjson.ObjectKey.of(brokerName=self.broker_name, queueId=q, topic=topic)] = {
                "minOffset": 0, "maxOffset": len(msgs), "lastUpdateTimestamp": msgs[-1].store_ts if msgs else 0}
        return cmd.response(body=fastjson.dumps({"offsetTable": table}))

    def on_get_consume_stats(self, conn, cmd):
        group = cmd.get_str("consumerGroup")
        topic = cmd.get_str("topic")
        table = {}
        for (g, t, q), off in self.offsets.items():
            if g == group and (not topic or t == topic):
                table[fastjson.ObjectKey.of(brokerName=self.broker_name, queueId=q, topic=t)] = {
                    "brokerOffset": self._max(t, q), "consumerOffset": off, "lastTimestamp": 0}
        return cmd.response(body=fastjson.dumps({"consumeTps": 0.0, "offsetTable": table}))

    def on_get_consumer_list_by_group(self, conn, cmd):
        ids = sorted({hb["clientID"] for hb in self.heartbeats
                      for c in hb["consumerDataSet"] if c["groupName"] == cmd.get_str("consumerGroup")})
        return cmd.response(body=orjson.dumps({"consumerIdList": ids}))

    # producing -------------------------------------------------------------------------------
    def _store(self, topic: str, qid: int, body: bytes, props: str, sys_flag: int, flag: int, born: int) -> Stored:
        q = self.queues[(topic, qid)]
        store_ts = int(time.time() * 1000)
        rec = encode_record(
            topic=topic.encode(), body=body, properties=props.encode(), queue_id=qid, flag=flag,
            queue_offset=len(q), physical_offset=self.phys, sys_flag=sys_flag, born_timestamp=born,
            born_host=LOCAL, born_port=1, store_timestamp=store_ts, store_host=LOCAL,
            store_port=int(self.addr.rsplit(":", 1)[1]),
        )
        s = Stored(topic, qid, len(q), self.phys, rec, decode_properties(props), store_ts)
        q.append(s)
        self.phys += len(rec)
        return s

    def _msg_id(self, s: Stored) -> str:
        return encode_offset_msg_id(LOCAL, int(self.addr.rsplit(":", 1)[1]), s.phys)

    def on_send_message_v2(self, conn, cmd):
        f = cmd.ext_fields
        topic = f["b"]
        if topic not in self.topics:
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        s = self._store(topic, int(f["e"]), cmd.body_bytes(), f.get("i", ""), int(f["f"]), int(f["h"]), int(f["g"]))
        return cmd.response(fields={"msgId": self._msg_id(s), "queueId": s.queue_id, "queueOffset": s.queue_offset,
                                    "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"})

    def on_send_batch_message(self, conn, cmd):
        f = cmd.ext_fields
        assert f["m"] == "true"
        stored = []
        for item in decode_batch(cmd.body_bytes()):
            stored.append(self._store(f["b"], int(f["e"]), item.body, item.properties, 0, item.flag, int(f["g"])))
        return cmd.response(fields={"msgId": ",".join(self._msg_id(s) for s in stored),
                                    "queueId": stored[0].queue_id, "queueOffset": stored[0].queue_offset})

    def on_heart_beat(self, conn, cmd):
        self.heartbeats.append(orjson.loads(cmd.body_bytes()))
        return cmd.response()

    def on_unregister_client(self, conn, cmd):
        return cmd.response()

    # consuming -------------------------------------------------------------------------------
    def on_pull_message(self, conn, cmd):
        topic, qid = cmd.get_str("topic"), cmd.get_int("queueId")
        offset, max_nums = cmd.get_int("queueOffset"), cmd.get_int("maxMsgNums")
        assert cmd.get_int("sysFlag") & 4, "client must send its subscription"
        msgs = self.queues.get((topic, qid), [])
        hdr = {"suggestWhichBrokerId": 0, "minOffset": 0, "maxOffset": len(msgs)}
        if offset == len(msgs):
            return cmd.response(ResponseCode.PULL_NOT_FOUND, None, {**hdr, "nextBeginOffset": offset})
        if offset > len(msgs):
            return cmd.response(ResponseCode.PULL_OFFSET_MOVED, None, {**hdr, "nextBeginOffset": len(msgs)})
        tags = {t.strip() for t in cmd.get_str("subscription", "*").split("||")}
        chosen = msgs[offset:offset + max_nums]
        found = [s for s in chosen if "*" in tags or s.props.get("TAGS") in tags]
        nxt = offset + len(chosen)
        if not found:
            return cmd.response(ResponseCode.PULL_RETRY_IMMEDIATELY, None, {**hdr, "nextBeginOffset": nxt})
        return cmd.response(ResponseCode.SUCCESS, None, {**hdr, "nextBeginOffset": nxt}, b"".join(s.record for s in found))

    def on_query_consumer_offset(self, conn, cmd):
        key = (cmd.get_str("consumerGroup"), cmd.get_str("topic"), cmd.get_int("queueId"))
        if key not in self.offsets:
            return cmd.response(ResponseCode.QUERY_NOT_FOUND, "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first")
        return cmd.response(fields={"offset": self.offsets[key]})

    def on_update_consumer_offset(self, conn, cmd):
        key = (cmd.get_str("consumerGroup"), cmd.get_str("topic"), cmd.get_int("queueId"))
        self.offsets[key] = cmd.get_int("commitOffset")
        return cmd.response()

    def on_get_max_offset(self, conn, cmd):
        return cmd.response(fields={"offset": self._max(cmd.get_str("topic"), cmd.get_int("queueId"))})

    def on_get_min_offset(self, conn, cmd):
        return cmd.response(fields={"offset": 0})

    def on_search_offset_by_timestamp(self, conn, cmd):
        ts = cmd.get_int("timestamp")
        msgs = self.queues.get((cmd.get_str("topic"), cmd.get_int("queueId")), [])
        return cmd.response(fields={"offset": next((s.queue_offset for s in msgs if s.store_ts >= ts), len(msgs))})

    # queries ---------------------------------------------------------------------------------
    def _all(self):
        return [s for q in self.queues.values() for s in q]

    def on_query_message(self, conn, cmd):
        topic, key = cmd.get_str("topic"), cmd.get_str("key")
        if cmd.get_bool("_UNIQUE_KEY_QUERY"):
            hits = [s for s in self._all() if s.topic == topic and s.props.get("UNIQ_KEY") == key]
        else:
            hits = [s for s in self._all() if s.topic == topic and key in s.props.get("KEYS", "").split()]
        if not hits:
            return cmd.response(ResponseCode.QUERY_NOT_FOUND, "can not find message, maybe time range not correct")
        return cmd.response(fields={"indexLastUpdateTimestamp": 0, "indexLastUpdatePhyoffset": 0},
                            body=b"".join(s.record for s in hits[: cmd.get_int("maxNum")]))

    def on_view_message_by_id(self, conn, cmd):
        off = cmd.get_int("offset")
        for s in self._all():
            if s.phys == off:
                return cmd.response(body=s.record)
        return cmd.response(ResponseCode.SYSTEM_ERROR, "can not find message by the offset")


def props_string(**kw: str) -> str:
    return encode_properties(kw)


def fake_fixture(factory: type[FakeCluster] = FakeCluster):
    """A pytest fixture named ``fake``: a started ``factory()`` for each test, stopped after it.

    A test module takes it by assignment (``fake = fake_fixture()``) and its tests ask for ``fake``.
    """

    @pytest.fixture
    async def fake():
        server = await factory().start()
        try:
            yield server
        finally:
            await server.stop()

    return fake


def fake_config(fake: FakeCluster, **kw):
    """A ClientConfig pointing at the fake name server."""
    from tidemq.client import ClientConfig  # noqa: PLC0415 (the fake itself needs no client)

    return ClientConfig(name_servers=fake.addr, **kw)
