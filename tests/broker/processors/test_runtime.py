"""RuntimeProcessor (issue 17) against a fake RuntimeService: the KVTable of GET_BROKER_RUNTIME_INFO
(RocketMQ's keys, every value a string; the ha* keys only for a replica) and SWITCHOVER's header,
answer and refusals."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import orjson

from tests.broker.processors import Dispatched, assert_bad_request
from tidemq.broker.ha.replica import FollowerLag, ReplicaStatus
from tidemq.broker.messaging.context import refused
from tidemq.broker.messaging.runtime import BrokerRuntime
from tidemq.broker.processors.runtime import RuntimeProcessor
from tidemq.client.admin_protocol import parse_kv_table
from tidemq.remoting import RemotingCommand, RequestCode, ResponseCode
from tidemq.remoting.headers.replica import RUNTIME_KEYS, parse_id_list, parse_lag_list

CONN = SimpleNamespace(peer="10.0.0.5:6000")
PLAIN = BrokerRuntime(version="0.1.0", boot_ms=1700000000500, messages_in=7, messages_out=3,
                      commitlog_min_offset=0, commitlog_max_offset=5000, unflushed_bytes=1000,
                      disk_usage_ratio=0.25, replica=None)
MASTER = ReplicaStatus(
    replica_id=1, role="master", epoch=4, master=1, in_sync=(0, 1, 2), min_in_sync=2, replication="sync",
    log_end=9000, high_water=8000, followers=(FollowerLag(0, 9000, 0), FollowerLag(2, 4904, 4096)),
    failovers=1, last_failover_seconds=2.5, switchovers=3)
FOLLOWER = ReplicaStatus(
    replica_id=0, role="follower", epoch=4, master=None, in_sync=(), min_in_sync=1, replication="async",
    log_end=9000, high_water=9000, followers=(), failovers=0, last_failover_seconds=None, switchovers=0)


class FakeService:
    def __init__(self, rt: BrokerRuntime = PLAIN) -> None:
        self.rt = rt
        self.asked: list[tuple[str, int | None]] = []

    def runtime(self) -> BrokerRuntime:
        return self.rt

    async def switchover(self, broker_name: str, to: int | None) -> int:
        self.asked.append((broker_name, to))
        if to == 3:
            raise refused(ResponseCode.SYSTEM_ERROR, "replica 3 is not an in-sync follower")
        return 2 if to is None else to


def table(service: FakeService) -> dict[str, str]:
    p = Dispatched(RuntimeProcessor(service))  # type: ignore[arg-type]
    resp = p.runtime_info(CONN, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO))
    assert resp.code == ResponseCode.SUCCESS
    raw = orjson.loads(resp.body)
    assert set(raw) == {"table"} and all(isinstance(v, str) for v in raw["table"].values()), raw
    assert parse_kv_table(resp.body, "runtime info") == raw["table"]
    return raw["table"]


def test_a_plain_broker_answers_rocketmqs_keys_it_can_fill_and_no_ha_keys():
    t = table(FakeService())
    assert t == {
        "brokerVersionDesc": "TideMQ 0.1.0 (V4_9_7)", "brokerVersion": "407", "msgPutTotalTodayNow": "7",
        "msgGetTotalTodayNow": "3", "bootTimestamp": "1700000000500", "commitLogMinOffset": "0",
        "commitLogMaxOffset": "5000", "remainHowManyDataToFlush": "1000", "commitLogDiskRatio": "0.25",
        "transactionHalfProgress": "0",
    }
    assert not set(RUNTIME_KEYS) & set(t)


def test_a_master_adds_every_ha_key():
    t = table(FakeService(replace(PLAIN, replica=MASTER)))
    assert set(RUNTIME_KEYS) <= set(t)
    assert {k: t[k] for k in RUNTIME_KEYS} == {
        "haRole": "master", "haReplicaId": "1", "haEpoch": "4", "haMaster": "1", "haInSync": "0,1,2",
        "haMinInSync": "2", "haReplication": "sync", "haHighWater": "8000", "haLogEnd": "9000",
        "haFollowerLag": "0:0,2:4096", "haFailovers": "1", "haLastFailoverSeconds": "2.500", "haSwitchovers": "3",
        "haDeposed": "0",
    }
    assert parse_id_list(t["haInSync"]) == (0, 1, 2) and parse_lag_list(t["haFollowerLag"]) == ((0, 0), (2, 4096))


def test_values_that_do_not_exist_are_empty_strings():
    t = table(FakeService(replace(PLAIN, replica=FOLLOWER)))
    assert (t["haRole"], t["haMaster"], t["haInSync"], t["haFollowerLag"], t["haLastFailoverSeconds"]) == (
        "follower", "", "", "", "")


async def test_switchover_answers_the_replica_taking_over():
    service = FakeService()
    p = Dispatched(RuntimeProcessor(service))  # type: ignore[arg-type]
    best = await p.switchover(CONN, RemotingCommand.request(RequestCode.SWITCHOVER, {"brokerName": "broker-a"}))
    assert (best.code, best.ext_fields) == (ResponseCode.SUCCESS, {"replicaId": "2"})
    named = await p.switchover(CONN, RemotingCommand.request(RequestCode.SWITCHOVER,
                                                             {"brokerName": "broker-a", "toReplicaId": "0"}))
    assert named.ext_fields == {"replicaId": "0"}
    assert service.asked == [("broker-a", None), ("broker-a", 0)]


async def test_switchover_refusals_and_bad_headers_are_answered_with_a_sentence():
    service = FakeService()
    p = Dispatched(RuntimeProcessor(service))  # type: ignore[arg-type]
    no = await p.switchover(CONN, RemotingCommand.request(RequestCode.SWITCHOVER,
                                                          {"brokerName": "broker-a", "toReplicaId": "3"}))
    assert (no.code, no.remark) == (ResponseCode.SYSTEM_ERROR, "replica 3 is not an in-sync follower")
    bad = p.switchover(CONN, RemotingCommand.request(RequestCode.SWITCHOVER,
                                                     {"brokerName": "broker-a", "toReplicaId": "9"}))
    assert_bad_request(bad, "toReplicaId")
    assert service.asked == [("broker-a", 3)]
