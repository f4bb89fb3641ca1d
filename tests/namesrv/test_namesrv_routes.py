"""RouteInfoManager on a fake clock: registration, liveness, topic removal, admin operations."""

from __future__ import annotations

import json

import pytest

from tidemq.namesrv import RouteInfoManager
from tidemq.namesrv.routes import Perm


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def topic(read: int = 4, write: int = 4, perm: int = 6, sys_flag: int = 0) -> dict:
    return {"readQueueNums": read, "writeQueueNums": write, "perm": perm, "topicSysFlag": sys_flag}


V1 = {"counter": 1, "timestamp": 100}
V2 = {"counter": 2, "timestamp": 100}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def rim(clock: FakeClock) -> RouteInfoManager:
    return RouteInfoManager(clock, broker_expiry=120.0)


def test_register_master_creates_route_with_exact_shape(rim: RouteInfoManager) -> None:
    rim.register_broker("C", "broker-a", "10.0.0.5:10911", 0, {"T1": topic(), "T2": topic(8, 2, 7)}, V1)
    route = rim.pickup_topic_route("T2")
    assert route == {
        "brokerDatas": [
            {"brokerAddrs": {"0": "10.0.0.5:10911"}, "brokerName": "broker-a", "cluster": "C"}
        ],
        "filterServerTable": {},
        "queueDatas": [
            {
                "brokerName": "broker-a",
                "perm": 7,
                "readQueueNums": 8,
                "topicSysFlag": 0,
                "writeQueueNums": 2,
            }
        ],
    }
    # Ready for standard JSON: string keys only.
    assert json.loads(json.dumps(route)) == route
    assert rim.all_topics() == ["T1", "T2"]
    assert rim.broker_addrs() == ["10.0.0.5:10911"]
    assert rim.pickup_topic_route("nope") is None


def test_two_brokers_serve_one_topic(rim: RouteInfoManager) -> None:
    rim.register_broker("C", "broker-b", "10.0.0.6:10911", 0, {"T": topic(2, 2)}, V1)
    rim.register_broker("C", "broker-a", "10.0.0.5:10911", 0, {"T": topic(4, 4)}, V1)
    route = rim.pickup_topic_route("T")
    assert [b["brokerName"] for b in route["brokerDatas"]] == ["broker-a", "broker-b"]
    assert [(q["brokerName"], q["readQueueNums"]) for q in route["queueDatas"]] == [
        ("broker-a", 4),
        ("broker-b", 2),
    ]
    assert rim.cluster_info()["clusterAddrTable"] == {"C": ["broker-a", "broker-b"]}


def test_slave_registration_adds_address_but_never_queue_data(rim: RouteInfoManager) -> None:
    rim.register_broker(
        "C", "broker-a", "10.0.0.5:10911", 0, {"T": topic(4, 4)}, V1, ha_server_addr="10.0.0.5:10912"
    )
    info = rim.register_broker(
        "C", "broker-a", "10.0.0.6:10911", 1, {"T": topic(1, 1), "SLAVE_ONLY": topic()}, V2
    )
    assert info == {"haServerAddr": "10.0.0.5:10912", "masterAddr": "10.0.0.5:10911"}
    route = rim.pickup_topic_route("T")
    assert route["brokerDatas"][0]["brokerAddrs"] == {"0": "10.0.0.5:10911", "1": "10.0.0.6:10911"}
    assert route["queueDatas"][0]["readQueueNums"] == 4
    assert rim.pickup_topic_route("SLAVE_ONLY") is None
    assert rim.all_topics() == ["T"]


def test_master_info_empty_for_master_and_orphan_slave(rim: RouteInfoManager) -> None:
    assert rim.register_broker("C", "b", "1.1.1.1:1", 1, {}, V1) == {
        "haServerAddr": "",
        "masterAddr": "",
    }
    assert rim.register_broker("C", "b", "1.1.1.2:1", 0, {}, V1) == {
        "haServerAddr": "",
        "masterAddr": "",
    }


def test_same_address_under_new_id_leaves_old_id(rim: RouteInfoManager) -> None:
    rim.register_broker("C", "broker-a", "10.0.0.6:10911", 1, {}, V1)
    rim.register_broker("C", "broker-a", "10.0.0.6:10911", 0, {"T": topic()}, V1)
    addrs = rim.cluster_info()["brokerAddrTable"]["broker-a"]["brokerAddrs"]
    assert addrs == {"0": "10.0.0.6:10911"}
    # Promotion counts as a first registration under id 0: queue data is written though the
    # data version did not change.
    assert rim.pickup_topic_route("T") is not None


def test_queue_data_updates_only_when_data_version_changes(rim: RouteInfoManager) -> None:
    rim.register_broker("C", "a", "1.1.1.1:1", 0, {"T": topic(4, 4)}, V1)
    rim.register_broker("C", "a", "1.1.1.1:1", 0, {"T": topic(8, 8)}, dict(V1))
    assert rim.pickup_topic_route("T")["queueDatas"][0]["readQueueNums"] == 4
    rim.register_broker("C", "a", "1.1.1.1:1", 0, {"T": topic(8, 8), "U": topic()}, V2)
    assert rim.pickup_topic_route("T")["queueDatas"][0]["readQueueNums"] == 8
    assert rim.all_topics() == ["T", "U"]


def test_bad_topic_config_raises_before_any_change(rim: RouteInfoManager) -> None:
    with pytest.raises(ValueError, match="readQueueNums"):
        rim.register_broker("C", "a", "1.1.1.1:1", 0, {"T": {"readQueueNums": "four"}}, V1)
    assert rim.cluster_info() == {"brokerAddrTable": {}, "clusterAddrTable": {}}
    assert rim.broker_count == 0


def test_expiry_only_after_broker_expiry(rim: RouteInfoManager, clock: FakeClock) -> None:
    rim.register_broker("C", "a", "1.1.1.1:1", 0, {"T": topic()}, V1)
    clock.t += 120.0
    assert rim.scan_expired() == []
    assert rim.pickup_topic_route("T") is not None
    clock.t += 0.001
    assert rim.scan_expired() == ["1.1.1.1:1"]
    assert rim.pickup_topic_route("T") is None
    assert rim.all_topics() == []
    assert rim.cluster_info() == {"brokerAddrTable": {}, "clusterAddrTable": {}}


def test_reregistration_refreshes_liveness(rim: RouteInfoManager, clock: FakeClock) -> None:
    rim.register_broker("C", "a", "1.1.1.1:1", 0, {"T": topic()}, V1)
    clock.t += 100
    rim.register_broker("C", "a", "1.1.1.1:1", 0, {"T": topic()}, V1)
    clock.t += 100
    assert rim.scan_expired() == []
    assert rim.broker_count == 1


def test_topic_disappears_only_when_last_broker_leaves(rim: RouteInfoManager) -> None:
    rim.register_broker("C", "a", "1.1.1.1:1", 0, {"T": topic(), "ONLY_A": topic()}, V1)
    rim.register_broker("C", "b", "1.1.1.2:1", 0, {"T": topic()}, V1)
    assert rim.unregister_broker("C", "a", "1.1.1.1:1", 0) is True
    assert rim.all_topics() == ["T"]
    assert [q["brokerName"] for q in rim.pickup_topic_route("T")["queueDatas"]] == ["b"]
    assert rim.cluster_info()["clusterAddrTable"] == {"C": ["b"]}
    assert rim.unregister_broker("C", "b", "1.1.1.2:1", 0) is True
    assert rim.all_topics() == []
    assert rim.cluster_info()["clusterAddrTable"] == {}
    assert rim.unregister_broker("C", "b", "1.1.1.2:1", 0) is False


def test_master_leaving_keeps_slave_and_queue_data(rim: RouteInfoManager) -> None:
    rim.register_broker("C", "a", "1.1.1.1:1", 0, {"T": topic()}, V1)
    rim.register_broker("C", "a", "1.1.1.2:1", 1, {"T": topic()}, V1)
    rim.unregister_broker("C", "a", "1.1.1.1:1", 0)
    route = rim.pickup_topic_route("T")
    assert route["brokerDatas"][0]["brokerAddrs"] == {"1": "1.1.1.2:1"}


def test_an_old_master_unregistering_after_a_hand_over_leaves_the_new_masters_entry(rim: RouteInfoManager) -> None:
    rim.register_broker("C", "a", "1.1.1.1:1", 0, {"T": topic()}, V1)
    rim.register_broker("C", "a", "1.1.1.2:1", 0, {"T": topic()}, V1)  # the new master
    assert rim.unregister_broker("C", "a", "1.1.1.1:1", 0) is True  # the old one leaves as id 0
    route = rim.pickup_topic_route("T")
    assert route["brokerDatas"][0]["brokerAddrs"] == {"0": "1.1.1.2:1"}


def test_connection_close_drops_only_that_connections_brokers(rim: RouteInfoManager) -> None:
    c1, c2 = object(), object()
    rim.register_broker("C", "a", "1.1.1.1:1", 0, {"T": topic()}, V1, conn_key=c1)
    rim.register_broker("C", "b", "1.1.1.2:1", 0, {"T": topic(), "U": topic()}, V1, conn_key=c2)
    assert rim.on_connection_closed(object()) == []
    assert rim.on_connection_closed(c2) == ["1.1.1.2:1"]
    assert rim.all_topics() == ["T"]
    assert rim.broker_addrs() == ["1.1.1.1:1"]


def test_reregistration_over_new_connection_survives_old_one_closing(rim: RouteInfoManager) -> None:
    old, new = object(), object()
    rim.register_broker("C", "a", "1.1.1.1:1", 0, {"T": topic()}, V1, conn_key=old)
    rim.register_broker("C", "a", "1.1.1.1:1", 0, {"T": topic()}, V1, conn_key=new)
    assert rim.on_connection_closed(old) == []
    assert rim.pickup_topic_route("T") is not None


def test_wipe_and_add_write_perm(rim: RouteInfoManager) -> None:
    rim.register_broker("C", "a", "1.1.1.1:1", 0, {"T": topic(perm=6), "TBW102": topic(perm=7)}, V1)
    rim.register_broker("C", "b", "1.1.1.2:1", 0, {"T": topic(perm=6)}, V1)
    assert rim.wipe_write_perm("a") == 2
    perms = {q["brokerName"]: q["perm"] for q in rim.pickup_topic_route("T")["queueDatas"]}
    assert perms == {"a": Perm.READ, "b": Perm.READ | Perm.WRITE}
    assert rim.pickup_topic_route("TBW102")["queueDatas"][0]["perm"] == 5
    # An unchanged re-registration keeps the drain in force.
    rim.register_broker("C", "a", "1.1.1.1:1", 0, {"T": topic(perm=6), "TBW102": topic(perm=7)}, V1)
    assert rim.pickup_topic_route("T")["queueDatas"][0]["perm"] == 4
    assert rim.add_write_perm("a") == 2
    assert rim.pickup_topic_route("T")["queueDatas"][0]["perm"] == 6
    assert rim.pickup_topic_route("TBW102")["queueDatas"][0]["perm"] == 7
    assert rim.wipe_write_perm("unknown") == 0


def test_delete_topic_everywhere(rim: RouteInfoManager) -> None:
    rim.register_broker("C1", "a", "1.1.1.1:1", 0, {"T": topic(), "U": topic()}, V1)
    rim.register_broker("C2", "b", "1.1.1.2:1", 0, {"T": topic()}, V1)
    assert rim.delete_topic("T") is True
    assert rim.pickup_topic_route("T") is None
    assert rim.all_topics() == ["U"]
    assert rim.delete_topic("T") is False


def test_delete_topic_in_one_cluster(rim: RouteInfoManager) -> None:
    rim.register_broker("C1", "a", "1.1.1.1:1", 0, {"T": topic()}, V1)
    rim.register_broker("C2", "b", "1.1.1.2:1", 0, {"T": topic()}, V1)
    assert rim.topics_by_cluster("C1") == ["T"]
    assert rim.delete_topic("T", cluster="C1") is True
    assert [q["brokerName"] for q in rim.pickup_topic_route("T")["queueDatas"]] == ["b"]
    assert rim.topics_by_cluster("C1") == []
    assert rim.topics_by_cluster("C2") == ["T"]
    assert rim.delete_topic("T", cluster="nope") is False
    assert rim.delete_topic("T", cluster="C2") is True
    assert rim.all_topics() == []


def test_query_data_version(rim: RouteInfoManager, clock: FakeClock) -> None:
    assert rim.query_data_version("1.1.1.1:1", V1) == (True, None)
    rim.register_broker("C", "a", "1.1.1.1:1", 0, {}, V1)
    assert rim.query_data_version("1.1.1.1:1", V2) == (True, V1)
    clock.t += 100
    assert rim.query_data_version("1.1.1.1:1", dict(V1)) == (False, V1)
    clock.t += 100  # 200 s after registering, but the unchanged query refreshed liveness
    assert rim.scan_expired() == []


def test_cluster_info_shape(rim: RouteInfoManager) -> None:
    rim.register_broker("DefaultCluster", "broker-a", "10.0.0.5:10911", 0, {}, V1)
    assert rim.cluster_info() == {
        "brokerAddrTable": {
            "broker-a": {
                "brokerAddrs": {"0": "10.0.0.5:10911"},
                "brokerName": "broker-a",
                "cluster": "DefaultCluster",
            }
        },
        "clusterAddrTable": {"DefaultCluster": ["broker-a"]},
    }
