"""Route parsing (quoted and bare broker ids), publish/subscribe queue lists, the route cache."""

from __future__ import annotations

import pytest

from tidemq.client.fault import FaultStrategy
from tidemq.client.route import BrokerData, ClusterInfo, MessageQueue, Perm, QueueData, TopicRouteData
from tidemq.client.route_cache import RouteCache
from tidemq.errors import CodecError

# The reference's example body (PROTOCOL-REFERENCE 2.3, GET_ROUTEINFO_BY_TOPIC).
REFERENCE_ROUTE = b"""
{"brokerDatas":[{"brokerAddrs":{"0":"10.0.0.5:10911","1":"10.0.0.6:10911"},
                 "brokerName":"broker-a","cluster":"DefaultCluster"}],
 "filterServerTable":{},
 "queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,
                "topicSysFlag":0,"writeQueueNums":4}]}
"""

FASTJSON_ROUTE = (
    b'{"brokerDatas":[{"brokerAddrs":{0:"10.0.0.5:10911",1:"10.0.0.6:10911"},'
    b'"brokerName":"broker-a","cluster":"DefaultCluster"}],"filterServerTable":{},'
    b'"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,"topicSysFlag":0,'
    b'"writeQueueNums":4}]}'
)


def test_reference_route_parses_with_quoted_broker_ids():
    route = TopicRouteData.from_json(REFERENCE_ROUTE)
    assert route.queue_datas == (QueueData("broker-a", 4, 4, Perm.READ | Perm.WRITE, 0),)
    bd = route.broker_datas[0]
    assert bd.cluster == "DefaultCluster"
    assert bd.broker_addrs == {0: "10.0.0.5:10911", 1: "10.0.0.6:10911"}
    assert bd.master_addr == "10.0.0.5:10911"
    assert route.order_topic_conf is None


def test_fastjson_bare_integer_keys_parse_the_same():
    assert TopicRouteData.from_json(FASTJSON_ROUTE) == TopicRouteData.from_json(REFERENCE_ROUTE)


def test_numbers_given_as_strings_are_accepted():
    body = (b'{"queueDatas":[{"brokerName":"b","perm":"6","readQueueNums":"2","writeQueueNums":"3"}],'
            b'"brokerDatas":[{"brokerName":"b","brokerAddrs":{"0":"h:1"}}]}')
    route = TopicRouteData.from_json(body)
    assert route.queue_datas[0].write_queue_nums == 3
    assert route.queue_datas[0].perm == Perm.READ | Perm.WRITE


def test_publish_and_subscribe_queues_of_reference_route():
    route = TopicRouteData.from_json(REFERENCE_ROUTE)
    assert route.publish_queues("T") == [MessageQueue("T", "broker-a", i) for i in range(4)]
    assert route.subscribe_queues("T") == [MessageQueue("T", "broker-a", i) for i in range(4)]


def _route(*brokers: tuple[str, int, int, int, dict[int, str]]) -> TopicRouteData:
    qds = tuple(QueueData(n, r, w, Perm(p)) for n, r, w, p, _ in brokers)
    bds = tuple(BrokerData("C", n, addrs) for n, _r, _w, _p, addrs in brokers)
    return TopicRouteData(qds, bds)


def test_publish_queues_need_write_perm_and_a_master():
    route = _route(
        ("b-read-only", 2, 2, 4, {0: "h:1"}),
        ("b-rw", 4, 3, 6, {0: "h:2"}),
        ("b-write-only", 1, 2, 2, {0: "h:3"}),
        ("b-no-master", 2, 2, 6, {1: "h:4"}),
    )
    pub = route.publish_queues("T")
    assert pub == [MessageQueue("T", "b-rw", i) for i in range(3)] + [
        MessageQueue("T", "b-write-only", i) for i in range(2)
    ]


def test_subscribe_queues_need_read_perm_and_use_read_queue_nums():
    route = _route(
        ("b-read-only", 2, 5, 4, {0: "h:1"}),
        ("b-rw", 4, 3, 6, {0: "h:2"}),
        ("b-write-only", 1, 2, 2, {0: "h:3"}),
        ("b-no-master", 1, 2, 6, {1: "h:4"}),
    )
    sub = route.subscribe_queues("T")
    assert sub == sorted(
        [MessageQueue("T", "b-read-only", i) for i in range(2)]
        + [MessageQueue("T", "b-rw", i) for i in range(4)]
        + [MessageQueue("T", "b-no-master", 0)]
    )


def test_order_topic_conf_defines_publish_queues():
    route = TopicRouteData.from_json(
        b'{"orderTopicConf":"broker-b:2;broker-a:1","queueDatas":[],"brokerDatas":[]}'
    )
    assert route.publish_queues("T") == [
        MessageQueue("T", "broker-a", 0), MessageQueue("T", "broker-b", 0), MessageQueue("T", "broker-b", 1)
    ]


def test_message_queue_orders_by_topic_broker_queue():
    qs = [MessageQueue("T", "b", 1), MessageQueue("A", "z", 0), MessageQueue("T", "a", 7), MessageQueue("T", "b", 0)]
    assert sorted(qs) == [
        MessageQueue("A", "z", 0), MessageQueue("T", "a", 7), MessageQueue("T", "b", 0), MessageQueue("T", "b", 1)
    ]
    assert MessageQueue.from_json({"topic": "T", "brokerName": "b", "queueId": "3"}) == MessageQueue("T", "b", 3)


def test_perm_is_an_int_flag():
    assert Perm(6) == Perm.READ | Perm.WRITE
    assert Perm.read_write() & Perm.WRITE
    assert int(Perm.INHERIT | Perm.READ | Perm.WRITE) == 7


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[]", b'{"queueDatas":{}}', b'{"queueDatas":[{"perm":6}]}',
     b'{"brokerDatas":[{"brokerName":"b","brokerAddrs":{"x":"h:1"}}]}',
     b'{"queueDatas":[{"brokerName":"b","readQueueNums":"many"}]}'],
)
def test_malformed_routes_raise_codec_error(body):
    with pytest.raises(CodecError):
        TopicRouteData.from_json(body)


def test_route_to_json_round_trips():
    route = TopicRouteData.from_json(FASTJSON_ROUTE)
    assert TopicRouteData.from_json(route.to_json()) == route
    assert route.to_json()["brokerDatas"][0]["brokerAddrs"] == {"0": "10.0.0.5:10911", "1": "10.0.0.6:10911"}


def test_cluster_info_parses_bare_keys_and_lists_masters():
    body = (
        b'{"brokerAddrTable":{"broker-a":{"brokerAddrs":{0:"h:1",1:"h:2"},"brokerName":"broker-a",'
        b'"cluster":"C1"},"broker-b":{"brokerAddrs":{1:"h:3"},"brokerName":"broker-b","cluster":"C1"},'
        b'"broker-c":{"brokerAddrs":{"0":"h:4"},"brokerName":"broker-c","cluster":"C2"}},'
        b'"clusterAddrTable":{"C1":["broker-b","broker-a"],"C2":["broker-c"]}}'
    )
    info = ClusterInfo.from_json(body)
    assert info.cluster_addr_table == {"C1": ("broker-a", "broker-b"), "C2": ("broker-c",)}
    assert info.master_addrs("C1") == {"broker-a": "h:1"}
    assert info.master_addrs("nope") == {}
    assert info.all_master_addrs() == {"broker-a": "h:1", "broker-c": "h:4"}
    assert ClusterInfo.from_json(info.to_json()) == info


# --- route cache -------------------------------------------------------------------------------

def test_route_cache_tracks_brokers_and_new_addresses():
    cache = RouteCache()
    new = cache.update("T", TopicRouteData.from_json(REFERENCE_ROUTE))
    assert new == {"10.0.0.5:10911", "10.0.0.6:10911"}
    assert cache.master_addr("broker-a") == "10.0.0.5:10911"
    assert cache.update("T", TopicRouteData.from_json(REFERENCE_ROUTE)) == set()
    assert cache.master_addrs() == {"broker-a": "10.0.0.5:10911"}


def test_sends_round_robin_over_every_publish_queue_of_the_cached_route():
    cache = RouteCache()
    cache.update("T", _route(("a", 2, 2, 6, {0: "h:1"}), ("b", 2, 2, 6, {0: "h:2"})))
    fs = FaultStrategy(True, seed=7)
    picks = [fs.select("T", cache.publish_queues("T")) for _ in range(8)]
    assert sorted(picks[:4]) == cache.publish_queues("T")
    assert picks[:4] == picks[4:]
    assert fs.select("unknown", cache.publish_queues("unknown")) is None


def test_route_cache_is_bounded():
    cache = RouteCache(max_topics=3)
    for i in range(5):
        cache.update(f"T{i}", TopicRouteData.from_json(REFERENCE_ROUTE))
    assert cache.topics() == ["T2", "T3", "T4"]
