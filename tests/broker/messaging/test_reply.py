"""ReplyService against a fake store and a recording channel: checks, the push to the requester,
the stored copy."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from tidemq.broker.messaging.reply import PushedReply, ReplyRequest, ReplyResult, ReplyService
from tidemq.broker.store.results import PutStatus
from tidemq.errors import BrokerError
from tidemq.message import Prop, encode_properties
from tidemq.remoting import ResponseCode

from tests.broker.messaging.fakes import CALLER, STORE_HOST, Parts

REPLY_TOPIC = "DefaultCluster_REPLY_TOPIC"


class Channel:
    def __init__(self, answer: str | None = None) -> None:
        self.answer = answer
        self.pushed: list[tuple[str, PushedReply, float]] = []

    async def push(self, client_id: str, reply: PushedReply, timeout: float) -> str | None:
        self.pushed.append((client_id, reply, timeout))
        return self.answer


@pytest.fixture
def parts(tmp_path) -> Parts:
    p = Parts(tmp_path)
    p.topic(REPLY_TOPIC, queues=1)
    return p


def service(p: Parts, channel: Channel) -> ReplyService:
    return ReplyService(settings=p.settings, store=p.store, topics=p.topics, channel=channel,
                        store_host=STORE_HOST, clock=lambda: 1700000000.5, on_put=p.on_put)


def request(props: dict[str, str] | None = None, **over) -> ReplyRequest:
    props = {Prop.REPLY_TO_CLIENT: "me", Prop.CORRELATION_ID: "c1"} if props is None else props
    return dataclasses.replace(ReplyRequest(CALLER, ("10.0.0.1", 5555), REPLY_TOPIC, 0, b"answer",
                                            encode_properties(props)), **over)


def reply(p: Parts, channel: Channel, req: ReplyRequest) -> ReplyResult:
    return asyncio.run(service(p, channel).reply(req))


def test_a_reply_is_pushed_to_its_requester_then_stored(parts):
    channel = Channel()
    result = reply(parts, channel, request())
    assert result == ReplyResult(ResponseCode.SUCCESS, "00000000000000000000000000000000", 0, 0)
    [(client_id, pushed, timeout)] = channel.pushed
    assert (client_id, timeout, pushed.store_host, pushed.store_timestamp) == ("me", 3.0, "127.0.0.1:10911",
                                                                              1700000000500)
    assert pushed.properties[Prop.PUSH_REPLY_TIME] == "1700000000500" and pushed.request.body == b"answer"
    assert Prop.PUSH_REPLY_TIME not in parts.store.puts[0].properties  # the stored copy has none
    assert parts.puts == [(REPLY_TOPIC, 1, 6)]


def test_a_failed_push_is_a_system_error_naming_why_and_the_reply_is_stored_all_the_same(parts):
    result = reply(parts, Channel("push reply message to me fail: gone"), request())
    assert (result.code, result.remark) == (ResponseCode.SYSTEM_ERROR, "push reply message to me fail: gone")
    assert len(parts.store.puts) == 1


def test_a_reply_without_a_requester_is_not_pushed(parts):
    channel = Channel()
    result = reply(parts, channel, request(props={}))
    assert result.remark == "reply message properties[REPLY_TO_CLIENT] is null" and not channel.pushed


def test_storing_is_optional_and_a_store_refusal_only_loses_the_copy(parts):
    parts.config = dataclasses.replace(parts.config, store_reply_message=False)
    assert reply(parts, Channel(), request()) == ReplyResult(ResponseCode.SUCCESS, "0", 0, 0)
    parts.config = dataclasses.replace(parts.config, store_reply_message=True)
    parts.store.refuse = PutStatus.SERVICE_NOT_AVAILABLE
    assert reply(parts, Channel(), request()) == ReplyResult(ResponseCode.SUCCESS, "0", 0, 0)


@pytest.mark.parametrize("over, code, words", [
    ({"topic": "Nope"}, ResponseCode.TOPIC_NOT_EXIST, "replies go to DefaultCluster_REPLY_TOPIC"),
    ({"queue_id": 1}, ResponseCode.SYSTEM_ERROR, "request queueId[1] is illegal"),
    ({"body": b""}, ResponseCode.MESSAGE_ILLEGAL, "reply body is 0 bytes"),
    ({"topic": "SCHEDULE_TOPIC_XXXX"}, ResponseCode.NO_PERMISSION, "is forbidden"),
])
def test_refusals_push_nothing(parts, over, code, words):
    channel = Channel()
    with pytest.raises(BrokerError) as e:
        reply(parts, channel, request(**over))
    assert e.value.code == code and words in e.value.remark and not channel.pushed
