"""`tidemq admin ...` (mqadmin's commands and flag letters) against a real name server + broker.

Independent commands run concurrently (tidemq_parallel) to keep the module fast.
"""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from tests.cli.clirun import (
    SEND_RESULT, assert_clean_failure, broker_request, json_body, tidemq, tidemq_parallel,
)
from tidemq.client.admin_protocol import create_topic_request
from tidemq.client.send import send_header
from tidemq.remoting import RemotingClient, RequestCode, ResponseCode


def admin_args(cluster, cmd: str, *args: str) -> tuple[str, ...]:
    return ("admin", cmd, "-n", cluster.namesrv_addr, *args)


def admin(cluster, cmd: str, *args: str):
    return tidemq(*admin_args(cluster, cmd, *args))


def create(cluster, topic: str, queues: int, *extra: str) -> None:
    admin(cluster, "updateTopic", "-c", cluster.cluster_name, "-t", topic, "-r", str(queues), "-w", str(queues), *extra).ok()


def test_update_topic_by_cluster_and_by_broker_then_route_and_list(cluster):
    by_cluster = admin(cluster, "updateTopic", "-c", cluster.cluster_name, "-t", "AdmByCluster", "-r", "3", "-w", "3")
    by_broker = admin(cluster, "updateTopic", "-b", cluster.broker_addr, "-t", "AdmByBroker", "-r", "2", "-w", "5")
    for r in (by_cluster.ok(), by_broker.ok()):
        assert f"create topic to {cluster.broker_addr} success." in r.lines()
    assert "TopicConfig [topicName=AdmByCluster, readQueueNums=3, writeQueueNums=3, perm=6" in by_cluster.out

    listing, route_c, route_b = tidemq_parallel(
        admin_args(cluster, "topicList"),
        admin_args(cluster, "topicRoute", "-t", "AdmByCluster"),
        admin_args(cluster, "topicRoute", "-t", "AdmByBroker"),
    )
    assert {"AdmByCluster", "AdmByBroker"} <= set(listing.ok().lines())
    rt = orjson.loads(route_c.ok().out)
    assert [(q["brokerName"], q["readQueueNums"], q["writeQueueNums"], q["perm"]) for q in rt["queueDatas"]] == [
        (cluster.broker_name, 3, 3, 6)
    ]
    assert rt["brokerDatas"] == [
        {"brokerAddrs": {"0": cluster.broker_addr}, "brokerName": cluster.broker_name, "cluster": cluster.cluster_name}
    ]
    rt = orjson.loads(route_b.ok().out)
    assert [(q["readQueueNums"], q["writeQueueNums"]) for q in rt["queueDatas"]] == [(2, 5)]


async def test_update_topic_attributes_set_kept_and_removed(cluster):
    """mqadmin 5's `updateTopic -a`: +key=value sets, -key removes, unnamed keys keep their value;
    a key the broker does not know is refused with its sentence and changes nothing."""
    async def attributes() -> dict:
        resp = await broker_request(cluster.broker_addr, RequestCode.GET_ALL_TOPIC_CONFIG)
        return json_body(resp)["topicConfigTable"]["AdmAttrs"].get("attributes") or {}

    made = admin(cluster, "updateTopic", "-c", cluster.cluster_name, "-t", "AdmAttrs", "-r", "2", "-w", "2",
                 "-a", "+message.type=FIFO").ok()
    assert "attributes=+message.type=FIFO]" in made.out
    assert await attributes() == {"message.type": "FIFO"}
    create(cluster, "AdmAttrs", 3)  # no -a: the attribute stays
    assert await attributes() == {"message.type": "FIFO"}
    bad = admin(cluster, "updateTopic", "-c", cluster.cluster_name, "-t", "AdmAttrs", "-a", "+no.such.key=1")
    assert_clean_failure(bad, "no.such.key")
    assert await attributes() == {"message.type": "FIFO"}
    create(cluster, "AdmAttrs", 3, "-a", "-message.type")
    assert await attributes() == {}


async def test_concurrent_topic_updates_all_succeed(cluster):
    """What two `tidemq admin updateTopic` (or mqadmin) runs at the same moment send."""
    client = RemotingClient()
    try:
        answers = await asyncio.gather(*(
            client.invoke(cluster.broker_addr, create_topic_request(f"AdmBurst{i}", 1, 1, 6, False), 5.0)
            for i in range(8)
        ))
    finally:
        await client.close()
    failures = [(r.code, r.remark) for r in answers if r.code != ResponseCode.SUCCESS]
    assert failures == []


async def test_read_only_topic_rejects_sends_until_made_writable(cluster):
    create(cluster, "AdmReadOnly", 2, "-p", "4")
    route, send = tidemq_parallel(
        admin_args(cluster, "topicRoute", "-t", "AdmReadOnly"),
        ("send", "-n", cluster.namesrv_addr, "-t", "AdmReadOnly", "-b", "x"),
    )
    assert [q["perm"] for q in orjson.loads(route.ok().out)["queueDatas"]] == [4]
    # the CLI producer refuses with one clear sentence (no writable queue in the route) ...
    assert_clean_failure(send, "AdmReadOnly", "perm")
    # ... and the broker itself answers NO_PERMISSION to a raw SEND_MESSAGE_V2
    header = send_header("raw-producer", "AdmReadOnly", 0, 0, int(time.time() * 1000), 0, "")
    resp = await broker_request(cluster.broker_addr, RequestCode.SEND_MESSAGE_V2, header, b"raw")
    assert resp.code == ResponseCode.NO_PERMISSION, (resp.code, resp.remark)

    # updateTopic updates: perm 6 makes the topic writable again
    create(cluster, "AdmReadOnly", 2, "-p", "6")
    r = tidemq("send", "-n", cluster.namesrv_addr, "-t", "AdmReadOnly", "-b", "x").ok()
    assert SEND_RESULT.search(r.out).group(1) == "SEND_OK"


def test_delete_topic_removes_it_from_list_and_route(cluster):
    create(cluster, "AdmDoomed", 1)
    assert "AdmDoomed" in admin(cluster, "topicList").ok().lines()
    r = admin(cluster, "deleteTopic", "-c", cluster.cluster_name, "-t", "AdmDoomed").ok()
    assert r.lines() == [f"delete topic [AdmDoomed] from cluster [{cluster.cluster_name}] success."]
    listing, route = tidemq_parallel(admin_args(cluster, "topicList"), admin_args(cluster, "topicRoute", "-t", "AdmDoomed"))
    assert "AdmDoomed" not in listing.ok().lines()
    assert_clean_failure(route, "AdmDoomed", "does not exist")


def test_topic_status_shows_min_and_max_per_queue(cluster):
    create(cluster, "AdmStatus", 2)
    r = tidemq("send", "-n", cluster.namesrv_addr, "-t", "AdmStatus", "-b", "m", "-c", "7").ok()
    assert "sent 7 messages to AdmStatus" in r.out

    lines = admin(cluster, "topicStatus", "-t", "AdmStatus").ok().lines()
    assert lines[0].split()[:7] == ["#Broker", "Name", "#QID", "#Min", "Offset", "#Max", "Offset"]
    rows = [line.split() for line in lines[1:]]
    assert [(row[0], int(row[1])) for row in rows] == [(cluster.broker_name, 0), (cluster.broker_name, 1)]
    assert [int(row[2]) for row in rows] == [0, 0]  # min offsets
    maxes = [int(row[3]) for row in rows]
    assert sum(maxes) == 7 and all(m > 0 for m in maxes), maxes  # the producer spreads over both queues
    assert all(row[4] != "-" for row in rows)  # a last-updated time for queues that have messages


def test_cluster_list_shows_the_broker_address(cluster):
    lines = admin(cluster, "clusterList").ok().lines()
    assert lines[0].split() == ["#Cluster", "Name", "#Broker", "Name", "#BID", "#Addr"]
    assert [line.split() for line in lines[1:]] == [[cluster.cluster_name, cluster.broker_name, "0", cluster.broker_addr]]


async def _group_config(cluster, group: str) -> dict:
    resp = await broker_request(cluster.broker_addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return json_body(resp)["subscriptionGroupTable"][group]


async def test_update_sub_group_by_cluster_then_by_broker(cluster):
    r = admin(cluster, "updateSubGroup", "-c", cluster.cluster_name, "-g", "AdmGroup", "-r", "5", "-q", "2").ok()
    assert r.lines() == [f"create subscription group to {cluster.broker_addr} success."]
    cfg = await _group_config(cluster, "AdmGroup")
    assert (cfg["groupName"], cfg["retryMaxTimes"], cfg["retryQueueNums"], cfg["consumeEnable"]) == ("AdmGroup", 5, 2, True)

    r = admin(cluster, "updateSubGroup", "-b", cluster.broker_addr, "-g", "AdmGroup", "-r", "7").ok()
    assert r.lines() == [f"create subscription group to {cluster.broker_addr} success."]
    assert (await _group_config(cluster, "AdmGroup"))["retryMaxTimes"] == 7


async def test_sub_group_with_consume_disabled_cannot_consume(cluster):
    create(cluster, "AdmGroupOff", 1)
    tidemq("send", "-n", cluster.namesrv_addr, "-t", "AdmGroupOff", "-b", "x").ok()
    admin(cluster, "updateSubGroup", "-c", cluster.cluster_name, "-g", "AdmOffGroup", "-q", "2", "-s", "false").ok()
    assert (await _group_config(cluster, "AdmOffGroup"))["consumeEnable"] is False
    r = tidemq("consume", "-n", cluster.namesrv_addr, "-t", "AdmGroupOff", "-g", "AdmOffGroup", "-c", "1", "--wait", "1")
    assert_clean_failure(r, "AdmOffGroup", "not allowed to consume")


def test_consumer_progress_reports_the_lag(cluster):
    n, k = 9, 4
    create(cluster, "AdmLag", 3)
    tidemq("send", "-n", cluster.namesrv_addr, "-t", "AdmLag", "-b", "lag", "-c", str(n)).ok()
    r = tidemq("consume", "-n", cluster.namesrv_addr, "-t", "AdmLag", "-g", "AdmLagGroup", "-c", str(k)).ok()
    assert len(r.lines()) == k

    lines = admin(cluster, "consumerProgress", "-g", "AdmLagGroup").ok().lines()
    assert lines[0].split()[:3] == ["#Topic", "#Broker", "Name"]
    assert lines[-1] == f"Diff Total: {n - k}"
    rows = [line.split() for line in lines[1:] if line.startswith("AdmLag ")]
    assert sorted(int(row[2]) for row in rows) == [0, 1, 2]
    broker_offsets = [int(row[3]) for row in rows]
    consumer_offsets = [int(row[4]) for row in rows]
    assert sum(broker_offsets) == n and sum(consumer_offsets) == k
    assert [int(row[5]) for row in rows] == [b - c for b, c in zip(broker_offsets, consumer_offsets)]


def test_query_message_by_key_by_offset_id_and_by_unique_key(cluster):
    create(cluster, "AdmQuery", 2)
    r = tidemq("send", "-n", cluster.namesrv_addr, "-t", "AdmQuery", "-b", "find me", "--tags", "TQ", "-k", "order-42").ok()
    status, uniq, offset_id, qid, qoff = SEND_RESULT.search(r.out).groups()
    assert status == "SEND_OK"

    by_key, by_offset, by_uniq, by_uniq_anywhere = tidemq_parallel(
        admin_args(cluster, "queryMsgByKey", "-t", "AdmQuery", "-k", "order-42"),
        admin_args(cluster, "queryMsgById", "-i", offset_id),
        admin_args(cluster, "queryMsgById", "-t", "AdmQuery", "-i", uniq),
        admin_args(cluster, "queryMsgById", "-i", uniq),  # the unique key without -t: every topic searched
    )
    lines = by_key.ok().lines()
    assert lines[0].split() == ["#Message", "ID", "#QID", "#Offset"]
    assert [line.split() for line in lines[1:]] == [[uniq, qid, qoff]]
    assert "found in topic AdmQuery" in by_uniq_anywhere.ok().err
    for out in (by_offset.ok().out, by_uniq.ok().out, by_uniq_anywhere.out):
        assert f"OffsetID:            {offset_id}" in out
        assert "Topic:               AdmQuery" in out
        assert "Tags:                [TQ]" in out
        assert "Keys:                [order-42]" in out
        assert f"Queue ID:            {qid}" in out
        assert f"Queue Offset:        {qoff}" in out
        assert f"Store Host:          {cluster.broker_addr}" in out
        assert "Message Body:        'find me'" in out
        assert f"'UNIQ_KEY': '{uniq}'" in out
        assert "System Flag:         0" in out


def test_a_compressed_message_shows_its_stored_system_flag(cluster):
    """RocketMQ's decoder keeps the COMPRESSED bit (1) after inflating; ours cleared it ("0")."""
    create(cluster, "AdmCompressed", 1)
    body = "compressible " * 800  # over the producer's 4 KiB compression threshold
    r = tidemq("send", "-n", cluster.namesrv_addr, "-t", "AdmCompressed", "-b", body).ok()
    _status, uniq, offset_id, _qid, _qoff = SEND_RESULT.search(r.out).groups()
    for run in tidemq_parallel(admin_args(cluster, "queryMsgById", "-i", offset_id),
                               admin_args(cluster, "queryMsgById", "-i", uniq)):
        assert "System Flag:         1" in run.ok().out
        assert "Message Body:        'compressible compressible" in run.out  # inflated
    consumed = tidemq("consume", "-n", cluster.namesrv_addr, "-t", "AdmCompressed", "-g", "AdmCompressedG",
                      "--from-beginning", "-c", "1").ok()
    assert consumed.out.rstrip("\n").endswith(body)


ERRORS = {
    "route-unknown-topic": (("topicRoute", "-t", "AdmNoSuchTopic"), ("AdmNoSuchTopic", "does not exist")),
    "status-unknown-topic": (("topicStatus", "-t", "AdmNoSuchTopic"), ("AdmNoSuchTopic", "does not exist")),
    "key-unknown-topic": (("queryMsgByKey", "-t", "AdmNoSuchTopic", "-k", "k"), ("AdmNoSuchTopic",)),
    "unknown-cluster": (("updateTopic", "-c", "NoSuchCluster", "-t", "AdmX"), ("NoSuchCluster",)),
    "illegal-topic-name": (("updateTopic", "-c", "DefaultCluster", "-t", "bad topic!"), ("bad topic!", "illegal")),
    "progress-unknown-group": (("consumerProgress", "-g", "AdmNeverConsumed"), ("AdmNeverConsumed",)),
    "bad-msg-id": (("queryMsgById", "-i", "not-an-id"), ("'not-an-id' is not a message id", "32 hexadecimal digits")),
    "unknown-uniq-key-without-topic": (("queryMsgById", "-i", "7F0000012AAF3B72290270E614240001"),
                                       ("no message with id or unique key 7F0000012AAF3B72290270E614240001 in any of the",
                                        "topics of the cluster")),
}


@pytest.fixture(scope="module")
def error_runs(cluster):
    names = list(ERRORS)
    runs = tidemq_parallel(*(admin_args(cluster, *ERRORS[n][0]) for n in names))
    return dict(zip(names, runs))


@pytest.mark.parametrize("name", list(ERRORS))
def test_admin_errors_are_one_line(error_runs, name):
    assert_clean_failure(error_runs[name], *ERRORS[name][1])


def test_query_message_by_key_honours_the_time_range(cluster):
    create(cluster, "AdmQueryTime", 1)
    before = int(time.time() * 1000) - 1
    tidemq("send", "-n", cluster.namesrv_addr, "-t", "AdmQueryTime", "-b", "timed", "-k", "tk").ok()
    after = int(time.time() * 1000) + 1
    inside, too_late = tidemq_parallel(
        admin_args(cluster, "queryMsgByKey", "-t", "AdmQueryTime", "-k", "tk", "-b", str(before), "-e", str(after)),
        admin_args(cluster, "queryMsgByKey", "-t", "AdmQueryTime", "-k", "tk", "-b", str(after + 60_000)),
    )
    assert len(inside.ok().lines()) == 2
    assert too_late.rc != 0 and "no message with key 'tk'" in too_late.err
