"""Admin.get_broker_runtime_info and Admin.switchover (issue 17) against a real name server and
plain broker, and the KVTable codec: RocketMQ's keys as strings, a malformed body a CodecError."""

from __future__ import annotations

import pytest

from tidemq.client import Admin, SyncProducer
from tidemq.client.admin_protocol import parse_kv_table
from tidemq.errors import BrokerError, ClientError, CodecError
from tidemq.message import Message
from tidemq.remoting import ResponseCode
from tidemq.remoting.headers.replica import RUNTIME_KEYS


def test_kv_table_values_are_strings_and_junk_is_a_codec_error():
    assert parse_kv_table(b'{"table":{"a":"1","b":2,"c":null}}', "rt") == {"a": "1", "b": "2", "c": ""}
    assert parse_kv_table(b'{}', "rt") == {}
    for bad, problem in ((b"[1]", "not a JSON object"), (b'{"table":[1]}', "table is not an object"),
                         (b'{"table":{"a":{"b":1}}}', "value of 'a'"), (b"{nope", "not valid JSON")):
        with pytest.raises(CodecError, match=problem):
            parse_kv_table(bad, "rt")


async def test_a_plain_brokers_runtime_info_counts_its_messages(cluster):
    cluster.create_topic("RuntimeInfoT", queues=1)
    async with Admin(cluster.namesrv_addr) as admin:
        before = await admin.get_broker_runtime_info(cluster.broker_addr)
        with SyncProducer("runtime-info-pg", cluster.namesrv_addr) as producer:
            for i in range(3):
                producer.send(Message("RuntimeInfoT", f"m{i}".encode()))
        after = await admin.get_broker_runtime_info(cluster.broker_addr)
    assert before["brokerVersion"] == "407" and before["brokerVersionDesc"].startswith("TideMQ ")
    assert int(after["msgPutTotalTodayNow"]) == int(before["msgPutTotalTodayNow"]) + 3
    assert int(after["commitLogMaxOffset"]) > int(before["commitLogMaxOffset"]) >= 0
    assert int(after["bootTimestamp"]) > 0 and 0 <= float(after["commitLogDiskRatio"]) <= 1
    assert not set(RUNTIME_KEYS) & set(after)  # not a replica


async def test_a_plain_broker_refuses_a_switchover_with_a_sentence(cluster):
    async with Admin(cluster.namesrv_addr) as admin:
        with pytest.raises(BrokerError, match="runs alone") as err:
            await admin.switchover(cluster.broker_addr, cluster.broker_name, None)
        assert err.value.code == ResponseCode.SYSTEM_ERROR
        with pytest.raises(BrokerError, match="belongs to group"):
            await admin.switchover(cluster.broker_addr, "another-group", 1)
        with pytest.raises(ClientError, match="outside 0..4"):
            await admin.switchover(cluster.broker_addr, cluster.broker_name, 5)
