"""AdminProcessor against a fake AdminService: headers to typed values, answers after the
change is persisted, statistics keyed by message queue objects."""

from __future__ import annotations

from types import SimpleNamespace

import orjson

from tidemq.bodies import SubscriptionGroupConfig
from tidemq.broker.messaging.admin import QueueProgress, QueueStats
from tidemq.broker.messaging.context import refused
from tidemq.broker.processors.admin import AdminProcessor
from tidemq.broker.topics import TopicConfig
from tidemq.remoting import RemotingCommand, RequestCode, ResponseCode, fastjson
from tests.broker.processors import Dispatched

CONN = SimpleNamespace(peer="10.0.0.5:6000")


class FakeService:
    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.persisted = 0

    async def _persist(self) -> None:
        self.persisted += 1

    def update_topic(self, tc, attributes=()):
        self.calls.append(("update_topic", tc) + ((attributes,) if attributes else ()))
        if tc.topic_name == "TBW102":
            raise refused(ResponseCode.SYSTEM_ERROR, "The topic[TBW102] is conflict with system topic.")
        return self._persist()

    def delete_topic(self, topic):
        self.calls.append(("delete_topic", topic))
        return self._persist()

    def topic_table(self):
        return {"topicConfigTable": {"t": {"topicName": "t"}}, "dataVersion": {"counter": 1}}

    def update_group(self, g):
        self.calls.append(("update_group", g))
        return self._persist() if g.group_name == "new" else None

    def delete_group(self, name, remove_offsets):
        self.calls.append(("delete_group", name, remove_offsets))
        return None

    def group_table(self):
        return {"subscriptionGroupTable": {}}

    def topic_stats(self, topic):
        if topic == "nope":
            raise refused(ResponseCode.TOPIC_NOT_EXIST, "topic[nope] not exist")
        return (QueueStats("t", 0, 1, 10, 99),)

    def consume_stats(self, group, topic=""):
        self.calls.append(("consume_stats", group, topic))
        return (QueueProgress("t", 1, 10, 4, 98),)

    def consumer_offsets(self):
        return {"t@g": {0: 4}}


def proc() -> tuple[FakeService, AdminProcessor]:
    service = FakeService()
    return service, Dispatched(AdminProcessor(service, broker_name="broker-a"))


async def test_a_topic_update_is_decoded_with_rocketmq_defaults_and_answered_once_persisted():
    service, p = proc()
    answer = p.update_topic(CONN, RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC,
                                                          {"topic": "t", "readQueueNums": 2, "order": "true"}))
    assert service.calls == [("update_topic", TopicConfig("t", 2, 8, 6, "SINGLE_TAG", 0, True))]
    changed = p.update_topic(CONN, RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC,
                                                           {"topic": "t", "attributes": "+message.type=FIFO,-x"}))
    assert service.calls.pop()[2] == (("message.type", "FIFO"), ("x", None))  # changes, for the service to merge
    assert (await changed).code == ResponseCode.SUCCESS and service.persisted == 1
    service.persisted = 0
    assert service.persisted == 0
    assert (await answer).code == ResponseCode.SUCCESS and service.persisted == 1
    refused_resp = p.update_topic(CONN, RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC,
                                                                {"topic": "TBW102"}))
    assert (refused_resp.code, refused_resp.remark) == (
        ResponseCode.SYSTEM_ERROR, "The topic[TBW102] is conflict with system topic.")
    assert (await p.delete_topic(CONN, RemotingCommand.request(0, {"topic": "t"}))).code == ResponseCode.SUCCESS


async def test_group_updates_answer_at_once_when_nothing_changed():
    service, p = proc()
    body = orjson.dumps(SubscriptionGroupConfig("same").to_json())
    assert p.update_group(CONN, RemotingCommand.request(0, None, body)).code == ResponseCode.SUCCESS
    new = orjson.dumps(SubscriptionGroupConfig("new").to_json())
    answer = p.update_group(CONN, RemotingCommand.request(0, None, new))
    assert (await answer).code == ResponseCode.SUCCESS
    bad = p.update_group(CONN, RemotingCommand.request(0, None, b"[1]"))
    assert (bad.code, bad.remark) == (ResponseCode.SYSTEM_ERROR, "bad subscription group config: not a JSON object")
    resp = p.delete_group(CONN, RemotingCommand.request(0, {"groupName": "g", "removeOffset": "true"}))
    assert resp.code == ResponseCode.SUCCESS and service.calls[-1] == ("delete_group", "g", True)


def test_tables_and_statistics_bodies():
    service, p = proc()
    assert orjson.loads(p.all_topic_config(CONN, RemotingCommand.request(0)).body)["topicConfigTable"] == {
        "t": {"topicName": "t"}}
    assert orjson.loads(p.all_groups(CONN, RemotingCommand.request(0)).body) == {"subscriptionGroupTable": {}}
    stats = p.topic_stats(CONN, RemotingCommand.request(0, {"topic": "t"})).body
    assert stats == fastjson.dumps({"offsetTable": {
        fastjson.ObjectKey.of(brokerName="broker-a", queueId=0, topic="t"):
            {"minOffset": 1, "maxOffset": 10, "lastUpdateTimestamp": 99}}})
    missing = p.topic_stats(CONN, RemotingCommand.request(0, {"topic": "nope"}))
    assert (missing.code, missing.remark) == (ResponseCode.TOPIC_NOT_EXIST, "topic[nope] not exist")
    consume = p.consume_stats(CONN, RemotingCommand.request(0, {"consumerGroup": "g"})).body
    assert service.calls[-1] == ("consume_stats", "g", "")
    assert consume == fastjson.dumps({"consumeTps": 0.0, "offsetTable": {
        fastjson.ObjectKey.of(brokerName="broker-a", queueId=1, topic="t"):
            {"brokerOffset": 10, "consumerOffset": 4, "lastTimestamp": 98}}})
    assert p.all_offsets(CONN, RemotingCommand.request(0)).body == fastjson.dumps({"offsetTable": {"t@g": {0: 4}}})
