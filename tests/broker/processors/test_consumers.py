"""ConsumerProcessor against a fake ConsumerService: bodies decoded leniently, answers encoded
as RocketMQ's clients read them."""

from __future__ import annotations

from types import SimpleNamespace

import orjson
import pytest

from tidemq.broker.clients import Subscription
from tidemq.broker.messaging.consumers import (
    ConsumerConnection,
    ConsumerConnections,
    ConsumerData,
    QueueLocks,
    QueueRef,
    SubscriptionData,
)
from tidemq.broker.messaging.context import refused
from tidemq.broker.processors.common import Callers
from tidemq.broker.processors.consumers import ConsumerProcessor, notify_consumer_ids_changed
from tidemq.remoting import RemotingCommand, RequestCode, ResponseCode
from tests.broker.processors import Dispatched, assert_bad_request

CONN = SimpleNamespace(peer="10.0.0.5:6000")


def adapter(service, acl: bool) -> Dispatched:
    return Dispatched(ConsumerProcessor(service, callers=Callers(acl)))


class FakeService:
    def __init__(self, pending=None, error=None) -> None:
        self.calls: list[tuple] = []
        self.pending = pending
        self.error = error

    def heartbeat(self, caller, channel, hb):
        self.calls.append(("heartbeat", caller, channel, hb))
        if self.error is not None:
            raise self.error
        return self.pending

    def unregister(self, channel, producer_group, consumer_group):
        self.calls.append(("unregister", channel, producer_group, consumer_group))

    def consumer_ids(self, group):
        if group == "none":
            raise refused(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return ["c1", "c2"]

    def connections(self, group):
        if group == "none":
            raise refused(ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online")
        return ConsumerConnections(
            (ConsumerConnection("c1", "10.0.0.5:6000", 0, 453), ConsumerConnection("c2", "10.0.0.6:1", 999, 1)),
            (Subscription("orders", "*", 7, None),), "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_LAST_OFFSET")

    def lock(self, req):
        self.calls.append(("lock", req))
        return req.queues[:1]

    def unlock(self, req):
        self.calls.append(("unlock", req))


def request(code: int, fields: dict | None = None, body: object = None, ak: str | None = None) -> RemotingCommand:
    cmd = RemotingCommand.request(code, fields, orjson.dumps(body) if isinstance(body, dict) else body)
    if ak:
        cmd.ext_fields["AccessKey"] = ak
    cmd.language, cmd.version = 0, 453
    return cmd


HEARTBEAT = {
    "clientID": "cid",
    "consumerDataSet": [
        {"groupName": "cg", "consumeType": 1, "messageModel": "BROADCASTING", "consumeFromWhere": "4",
         "subscriptionDataSet": [{"topic": "orders", "subString": "A || B", "subVersion": "12"}, "junk", {}]},
        {"groupName": ""}, "junk",
    ],
    "producerDataSet": [{"groupName": "pg"}, {"nope": 1}],
}


def test_a_heartbeat_body_is_decoded_once_into_the_services_request():
    service = FakeService()
    resp = adapter(service, acl=True).heartbeat(CONN, request(RequestCode.HEART_BEAT, None, HEARTBEAT, ak="appKey0001"))
    assert resp.code == ResponseCode.SUCCESS
    (_, caller, channel, hb), = service.calls
    assert channel is CONN and caller.access_key == "appKey0001" and caller.peer == CONN.peer
    assert (hb.client_id, hb.language, hb.version, hb.producer_groups) == ("cid", 0, 453, ("pg",))
    assert hb.consumers == (ConsumerData("cg", "CONSUME_PASSIVELY", "BROADCASTING", "CONSUME_FROM_FIRST_OFFSET",
                                         (SubscriptionData("orders", "A || B", 12, "TAG"),), 3),)


def test_without_acl_a_claimed_access_key_names_nobody():
    service = FakeService()
    adapter(service, acl=False).heartbeat(CONN, request(RequestCode.HEART_BEAT, None, {}, ak="appKey0001"))
    assert service.calls[0][1].access_key is None


@pytest.mark.parametrize("body, problem", [(b"{not json", "body is not JSON"), (b"[1]", "body is not a JSON object")])
def test_a_heartbeat_body_that_is_no_json_object_is_a_bad_request(body, problem):
    assert_bad_request(
        adapter(FakeService(), acl=False).heartbeat(CONN, request(RequestCode.HEART_BEAT, None, body)), problem)


def test_a_refused_heartbeat_answers_the_refusal():
    service = FakeService(error=refused(ResponseCode.SYSTEM_ERROR, "a heartbeat names 300 groups, more than 256"))
    resp = adapter(service, acl=False).heartbeat(CONN, request(RequestCode.HEART_BEAT, None, {}))
    assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, "a heartbeat names 300 groups, more than 256")


async def test_a_heartbeat_that_created_a_retry_topic_is_answered_after_the_wait():
    waited = []

    async def pending() -> None:
        waited.append(True)

    service = FakeService(pending=pending())
    answer = adapter(service, acl=False).heartbeat(CONN, request(RequestCode.HEART_BEAT, None, {}))
    resp = await answer
    assert waited and resp.code == ResponseCode.SUCCESS


def test_unregister_and_the_group_lists():
    service = FakeService()
    proc = adapter(service, acl=False)
    handlers = proc.handlers()
    resp = handlers[RequestCode.UNREGISTER_CLIENT](CONN, request(RequestCode.UNREGISTER_CLIENT,
                                                                 {"clientID": "c", "consumerGroup": "cg"}))
    assert resp.code == ResponseCode.SUCCESS and service.calls == [("unregister", CONN, "", "cg")]
    ids = handlers[RequestCode.GET_CONSUMER_LIST_BY_GROUP](CONN, request(0, {"consumerGroup": "cg"}))
    assert orjson.loads(ids.body) == {"consumerIdList": ["c1", "c2"]}
    none = handlers[RequestCode.GET_CONSUMER_LIST_BY_GROUP](CONN, request(0, {"consumerGroup": "none"}))
    assert (none.code, none.remark) == (ResponseCode.SYSTEM_ERROR, "no consumer for this group, none")
    conns = handlers[RequestCode.GET_CONSUMER_CONNECTION_LIST](CONN, request(0, {"consumerGroup": "cg"}))
    body = orjson.loads(conns.body)
    assert body["connectionSet"] == [
        {"clientId": "c1", "clientAddr": "10.0.0.5:6000", "language": "JAVA", "version": 453},
        {"clientId": "c2", "clientAddr": "10.0.0.6:1", "language": "OTHER", "version": 1},
    ]
    assert body["subscriptionTable"]["orders"]["subVersion"] == 7
    assert (body["consumeType"], body["messageModel"], body["consumeFromWhere"]) == (
        "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_LAST_OFFSET")
    offline = handlers[RequestCode.GET_CONSUMER_CONNECTION_LIST](CONN, request(0, {"consumerGroup": "none"}))
    assert (offline.code, offline.remark) == (ResponseCode.CONSUMER_NOT_ONLINE, "the consumer group[none] not online")


def test_lock_bodies_are_decoded_leniently_and_the_held_queues_answered():
    service = FakeService()
    proc = adapter(service, acl=False)
    body = {"consumerGroup": "cg", "clientId": "c1",
            "mqSet": [{"topic": "t", "brokerName": "b", "queueId": 2}, {"topic": "t", "queueId": "x"}, 5]}
    resp = proc.lock(CONN, request(RequestCode.LOCK_BATCH_MQ, None, body))
    assert service.calls[0] == ("lock", QueueLocks("cg", "c1", (QueueRef("t", "b", 2), QueueRef("t", "None", -1))))
    assert orjson.loads(resp.body) == {"lockOKMQSet": [{"topic": "t", "brokerName": "b", "queueId": 2}]}
    assert proc.unlock(CONN, request(RequestCode.UNLOCK_BATCH_MQ, None, body)).code == ResponseCode.SUCCESS


def test_the_registry_notifier_sends_a_oneway_notify_consumer_ids_changed():
    sent = []
    conn = SimpleNamespace(peer="10.0.0.5:6000", invoke_oneway=sent.append)
    notify_consumer_ids_changed(conn, "cg")
    (cmd,) = sent
    assert (cmd.code, cmd.is_oneway, cmd.ext_fields) == (RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, True,
                                                         {"consumerGroup": "cg"})
