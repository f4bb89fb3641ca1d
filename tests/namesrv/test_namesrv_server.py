"""NamesrvServer in-process on 127.0.0.1, driven over the wire with tidemq.remoting.RemotingClient."""

from __future__ import annotations

import json
import zlib

import pytest

from tests.support.waiting import wait_until
from tidemq.errors import ConfigError
from tidemq.namesrv import NamesrvConfig, NamesrvServer
from tidemq.namesrv.bodies import encode_register_body
from tidemq.remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode

# Everything runs in this process: a test that takes longer has hung (the default is 300 s).
pytestmark = pytest.mark.timeout(8)

V1 = {"counter": 1, "timestamp": 1700000000000}
TOPICS = {
    "TopicTest": {
        "readQueueNums": 4,
        "writeQueueNums": 4,
        "perm": 6,
        "topicSysFlag": 0,
        "topicName": "TopicTest",
        "topicFilterType": "SINGLE_TAG",
        "order": False,
    },
    "Orders": {"readQueueNums": 8, "writeQueueNums": 2, "perm": 6, "topicSysFlag": 0},
}


class Env:
    def __init__(self, **cfg: float) -> None:
        self.server = NamesrvServer(NamesrvConfig(listen_host="127.0.0.1", listen_port=0, **cfg))
        self.client = RemotingClient()
        self.addr = ""

    async def __aenter__(self) -> Env:
        host, port = await self.server.start()
        self.addr = f"{host}:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()
        await self.server.stop()

    async def call(
        self,
        code: int,
        fields: dict | None = None,
        body: bytes | None = None,
        client: RemotingClient | None = None,
    ) -> RemotingCommand:
        return await (client or self.client).invoke(
            self.addr, RemotingCommand.request(code, fields, body), 3.0
        )


def register_fields(
    name: str = "broker-a", addr: str = "10.0.0.5:10911", broker_id: int = 0, **extra: object
) -> dict:
    return {
        "brokerName": name,
        "brokerAddr": addr,
        "clusterName": "DefaultCluster",
        "haServerAddr": addr.rsplit(":", 1)[0] + ":10912",
        "brokerId": broker_id,
        "compressed": False,
        "bodyCrc32": 0,
        **extra,
    }


async def register(
    env: Env, client: RemotingClient | None = None, topics: dict = TOPICS, **kw: object
) -> RemotingCommand:
    return await env.call(
        RequestCode.REGISTER_BROKER, register_fields(**kw), encode_register_body(topics, V1), client
    )


async def test_register_and_read_route_back() -> None:
    async with Env() as env:
        resp = await register(env)
        assert resp.code == ResponseCode.SUCCESS
        assert env.server.registrations == 1
        resp = await env.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Orders"})
        assert resp.code == ResponseCode.SUCCESS
        raw = resp.body_bytes()
        assert b'"brokerAddrs":{"0":"10.0.0.5:10911"}' in raw
        route = json.loads(raw)  # standard JSON, as jsoncpp's strict reader needs
        assert route["brokerDatas"] == [
            {
                "brokerAddrs": {"0": "10.0.0.5:10911"},
                "brokerName": "broker-a",
                "cluster": "DefaultCluster",
            }
        ]
        assert route["queueDatas"] == [
            {
                "brokerName": "broker-a",
                "perm": 6,
                "readQueueNums": 8,
                "topicSysFlag": 0,
                "writeQueueNums": 2,
            }
        ]
        for key in ("perm", "readQueueNums", "writeQueueNums", "topicSysFlag"):
            assert type(route["queueDatas"][0][key]) is int
        assert env.server.route_lookups == 1
        assert env.server.brokers_alive == 1
        assert env.server.topics == 2


async def test_route_json_is_strict_standard_json() -> None:
    async with Env() as env:
        await register(env)
        resp = await env.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicTest"})
        text = resp.body_bytes().decode("utf-8")

        def no_constants(name: str) -> None:
            raise AssertionError(f"non-standard JSON constant {name}")

        route = json.loads(text, parse_constant=no_constants)
        assert set(route) == {"brokerDatas", "filterServerTable", "queueDatas"}
        assert all(isinstance(k, str) for b in route["brokerDatas"] for k in b["brokerAddrs"])


async def test_unknown_topic_is_topic_not_exist() -> None:
    async with Env() as env:
        resp = await env.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Nope"})
        assert resp.code == ResponseCode.TOPIC_NOT_EXIST
        assert resp.remark == "No topic route info in name server for the topic: Nope"
        assert resp.is_response and not resp.body_bytes()
        assert env.server.route_not_found == 1


async def test_cluster_info_and_topic_lists() -> None:
    async with Env() as env:
        await register(env)
        await register(env, name="broker-b", addr="10.0.0.7:10911", topics={"Other": {"perm": 6}})
        info = json.loads((await env.call(RequestCode.GET_BROKER_CLUSTER_INFO)).body_bytes())
        assert info["clusterAddrTable"] == {"DefaultCluster": ["broker-a", "broker-b"]}
        assert info["brokerAddrTable"]["broker-b"] == {
            "brokerAddrs": {"0": "10.0.0.7:10911"},
            "brokerName": "broker-b",
            "cluster": "DefaultCluster",
        }
        resp = await env.call(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        assert json.loads(resp.body_bytes()) == {"topicList": ["Orders", "Other", "TopicTest"]}
        resp = await env.call(RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": "DefaultCluster"})
        assert json.loads(resp.body_bytes()) == {"topicList": ["Orders", "Other", "TopicTest"]}
        resp = await env.call(RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": "Elsewhere"})
        assert json.loads(resp.body_bytes()) == {"topicList": []}


async def test_delete_topic() -> None:
    async with Env() as env:
        await register(env)
        resp = await env.call(
            RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "Orders", "clusterName": "Other"}
        )
        assert resp.code == ResponseCode.SUCCESS
        assert (
            await env.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Orders"})
        ).code == ResponseCode.SUCCESS
        resp = await env.call(RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "Orders"})
        assert resp.code == ResponseCode.SUCCESS
        resp = await env.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Orders"})
        assert resp.code == ResponseCode.TOPIC_NOT_EXIST
        resp = await env.call(
            RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "TopicTest", "clusterName": "DefaultCluster"}
        )
        assert resp.code == ResponseCode.SUCCESS
        assert env.server.routes.all_topics() == []


async def test_unknown_request_code_is_not_supported() -> None:
    async with Env() as env:
        resp = await env.call(9999)
        assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        assert resp.remark == " request type 9999 not supported"


async def test_bad_bodies_and_headers_get_system_error_and_server_keeps_serving() -> None:
    async with Env() as env:
        resp = await env.call(RequestCode.REGISTER_BROKER, register_fields(), b"{this is not json")
        assert resp.code == ResponseCode.SYSTEM_ERROR
        assert resp.remark.startswith("REGISTER_BROKER: ")
        resp = await env.call(
            RequestCode.REGISTER_BROKER, register_fields(brokerId="x"), encode_register_body(TOPICS, V1)
        )
        assert resp.code == ResponseCode.SYSTEM_ERROR
        assert "brokerId" in resp.remark
        fields = register_fields()
        del fields["brokerName"]
        resp = await env.call(RequestCode.REGISTER_BROKER, fields, encode_register_body(TOPICS, V1))
        assert resp.code == ResponseCode.SYSTEM_ERROR and "brokerName" in resp.remark
        resp = await env.call(
            RequestCode.REGISTER_BROKER,
            register_fields(),
            encode_register_body({"T": {"perm": "rw"}}, V1),
        )
        assert resp.code == ResponseCode.SYSTEM_ERROR and "perm" in resp.remark
        resp = await env.call(RequestCode.GET_ROUTEINFO_BY_TOPIC)
        assert resp.code == ResponseCode.SYSTEM_ERROR and "topic" in resp.remark
        assert env.server.routes.broker_addrs() == []
        assert env.server.request_errors == 5
        # Same connection still served.
        assert (await register(env)).code == ResponseCode.SUCCESS
        assert (
            await env.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Orders"})
        ).code == ResponseCode.SUCCESS


async def test_compressed_registration_and_crc_check() -> None:
    async with Env() as env:
        body = encode_register_body(TOPICS, V1, compressed=True)
        crc = zlib.crc32(body) & 0x7FFFFFFF
        resp = await env.call(
            RequestCode.REGISTER_BROKER, register_fields(compressed=True, bodyCrc32=crc ^ 1), body
        )
        assert resp.code == ResponseCode.SYSTEM_ERROR and resp.remark == "crc32 not match"
        assert env.server.routes.all_topics() == []
        resp = await env.call(
            RequestCode.REGISTER_BROKER, register_fields(compressed=True, bodyCrc32=crc), body
        )
        assert resp.code == ResponseCode.SUCCESS
        route = json.loads(
            (await env.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Orders"})).body_bytes()
        )
        assert route["queueDatas"][0]["readQueueNums"] == 8


async def test_slave_registration_answers_master_address() -> None:
    async with Env() as env:
        await register(env)
        resp = await register(env, addr="10.0.0.6:10911", broker_id=1)
        assert resp.ext_fields == {"masterAddr": "10.0.0.5:10911", "haServerAddr": "10.0.0.5:10912"}
        route = json.loads(
            (await env.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Orders"})).body_bytes()
        )
        assert route["brokerDatas"][0]["brokerAddrs"] == {"0": "10.0.0.5:10911", "1": "10.0.0.6:10911"}


async def test_unregister_removes_routes() -> None:
    async with Env() as env:
        await register(env)
        resp = await env.call(
            RequestCode.UNREGISTER_BROKER,
            {
                "brokerName": "broker-a",
                "brokerAddr": "10.0.0.5:10911",
                "clusterName": "DefaultCluster",
                "brokerId": 0,
            },
        )
        assert resp.code == ResponseCode.SUCCESS
        assert (
            await env.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Orders"})
        ).code == ResponseCode.TOPIC_NOT_EXIST
        assert env.server.unregistrations == 1


async def test_broker_connection_closing_drops_its_routes() -> None:
    async with Env() as env:
        broker = RemotingClient()
        await register(env, client=broker)
        await register(env, name="broker-b", addr="10.0.0.7:10911", topics={"Other": {}})  # admin's link
        assert env.server.brokers_alive == 2
        await broker.close()
        await wait_until(lambda: env.server.brokers_alive == 1, "the closed broker to be dropped",
                         timeout=2.0, interval=0.01)
        assert (
            await env.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Orders"})
        ).code == ResponseCode.TOPIC_NOT_EXIST
        assert (
            await env.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Other"})
        ).code == ResponseCode.SUCCESS
        assert env.server.brokers_dropped_on_close == 1


async def test_silent_broker_expires() -> None:
    async with Env(broker_expiry=1.0, scan_interval=0.1) as env:  # 1 s: the lookup below beats it
        await register(env)
        assert (
            await env.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Orders"})
        ).code == ResponseCode.SUCCESS
        await wait_until(lambda: env.server.brokers_alive == 0, "the silent broker to expire",
                         timeout=10.0, interval=0.01)
        assert env.server.brokers_expired == 1
        assert (
            await env.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Orders"})
        ).code == ResponseCode.TOPIC_NOT_EXIST


async def test_wipe_and_add_write_perm_over_the_wire() -> None:
    async with Env() as env:
        await register(env)
        resp = await env.call(RequestCode.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"})
        assert resp.code == ResponseCode.SUCCESS and resp.ext_fields == {"wipeTopicCount": "2"}
        route = json.loads(
            (await env.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Orders"})).body_bytes()
        )
        assert route["queueDatas"][0]["perm"] == 4
        resp = await env.call(RequestCode.ADD_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"})
        assert resp.ext_fields == {"addTopicCount": "2"}
        route = json.loads(
            (await env.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Orders"})).body_bytes()
        )
        assert route["queueDatas"][0]["perm"] == 6


async def test_query_data_version() -> None:
    async with Env() as env:
        fields = {
            "brokerName": "broker-a",
            "brokerAddr": "10.0.0.5:10911",
            "clusterName": "DefaultCluster",
            "brokerId": 0,
        }
        resp = await env.call(RequestCode.QUERY_DATA_VERSION, fields, json.dumps(V1).encode())
        assert resp.ext_fields == {"changed": "true"}
        await register(env)
        resp = await env.call(RequestCode.QUERY_DATA_VERSION, fields, json.dumps(V1).encode())
        assert resp.ext_fields == {"changed": "false"}
        assert json.loads(resp.body_bytes()) == V1
        resp = await env.call(
            RequestCode.QUERY_DATA_VERSION, fields, json.dumps({**V1, "counter": 2}).encode()
        )
        assert resp.ext_fields == {"changed": "true"}


async def test_kv_config() -> None:
    async with Env() as env:
        key = {"namespace": "ORDER_TOPIC_CONFIG", "key": "Orders"}
        assert (await env.call(101, key)).code == ResponseCode.QUERY_NOT_FOUND
        assert (await env.call(100, {**key, "value": "broker-a:4"})).code == ResponseCode.SUCCESS
        resp = await env.call(101, key)
        assert resp.code == ResponseCode.SUCCESS and resp.ext_fields == {"value": "broker-a:4"}
        resp = await env.call(219, {"namespace": "ORDER_TOPIC_CONFIG"})
        assert json.loads(resp.body_bytes()) == {"table": {"Orders": "broker-a:4"}}
        # Brokers get the order-topic namespace back when they register.
        assert json.loads((await register(env)).body_bytes()) == {"table": {"Orders": "broker-a:4"}}
        assert (await env.call(102, key)).code == ResponseCode.SUCCESS
        assert (await env.call(101, key)).code == ResponseCode.QUERY_NOT_FOUND
        assert (
            await env.call(219, {"namespace": "ORDER_TOPIC_CONFIG"})
        ).code == ResponseCode.QUERY_NOT_FOUND
        assert (await env.call(100, key)).code == ResponseCode.SYSTEM_ERROR


async def test_stop_cancels_scan_and_closes_connections() -> None:
    env = Env()
    async with env:
        await register(env)
        task = env.server._scan_task
        assert task is not None and not task.done()
    assert task.done()
    assert env.server.address is None
    await wait_until(lambda: env.server.brokers_alive == 0, "the stopped server to forget its broker",
                     timeout=2.0, interval=0.01)


def test_config_validation() -> None:
    with pytest.raises(ConfigError, match="broker_expiry"):
        NamesrvConfig(broker_expiry=0)
    with pytest.raises(ConfigError, match="listen_port"):
        NamesrvConfig(listen_port=70000)
    assert NamesrvConfig().listen_port == 9876
