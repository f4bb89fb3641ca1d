"""The SEND_REPLY family's adapter against a fake service, and the push to the requester over a
fake connection."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from tidemq.broker.messaging.context import refused
from tidemq.broker.messaging.reply import PushedReply, ReplyRequest, ReplyResult
from tidemq.broker.processors.common import Callers
from tidemq.broker.processors.reply import ConnectedRequesters, ReplyProcessor
from tidemq.errors import RemotingError
from tidemq.message import Prop, decode_properties
from tidemq.remoting import RemotingCommand, RequestCode, ResponseCode

from tests.broker.messaging.fakes import CALLER

CONN = SimpleNamespace(peer="10.0.0.1:5555")
V2 = {"a": "pg", "b": "DefaultCluster_REPLY_TOPIC", "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1700",
      "h": "0", "i": "REPLY_TO_CLIENT\x01me\x02", "j": "0", "k": "false"}


class FakeReply:
    def __init__(self, answer) -> None:
        self.answer = answer
        self.requests: list[ReplyRequest] = []

    async def reply(self, req: ReplyRequest) -> ReplyResult:
        self.requests.append(req)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def reply(svc: FakeReply, code: int = RequestCode.SEND_REPLY_MESSAGE_V2, fields=None):
    proc = ReplyProcessor(svc, callers=Callers(False), region="Region1")
    return asyncio.run(proc.reply(CONN, RemotingCommand.request(code, fields or V2, b"answer")))


def test_a_reply_and_its_answer():
    svc = FakeReply(ReplyResult(ResponseCode.SUCCESS, "AB", 0, 4))
    resp = reply(svc)
    [req] = svc.requests
    assert (req.topic, req.producer_group, req.body, req.born_host) == ("DefaultCluster_REPLY_TOPIC", "pg", b"answer",
                                                                        ("10.0.0.1", 5555))
    assert resp.ext_fields == {"msgId": "AB", "queueId": "0", "queueOffset": "4", "MSG_REGION": "Region1",
                               "TRACE_ON": "true"}
    long = reply(svc, RequestCode.SEND_REPLY_MESSAGE, {"topic": "T", "queueId": "0", "b": "Ignored"})
    assert svc.requests[-1].topic == "T" and long.code == ResponseCode.SUCCESS


def test_refusals_carry_msg_id_0_and_the_region():
    resp = reply(FakeReply(refused(ResponseCode.TOPIC_NOT_EXIST, "topic[x] not exist")))
    assert (resp.code, resp.remark, resp.ext_fields["msgId"], resp.ext_fields["MSG_REGION"]) == (
        ResponseCode.TOPIC_NOT_EXIST, "topic[x] not exist", "0", "Region1")
    bad = reply(FakeReply(None), fields={**V2, "g": "soon"})
    assert bad.remark == "bad reply request header: header field 'bornTimestamp' is not an integer: 'soon'"


class Requester:
    def __init__(self, answer) -> None:
        self.peer = "10.0.0.2:6000"
        self.is_open = True
        self.answer = answer
        self.pushed: list[RemotingCommand] = []

    async def invoke(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        self.pushed.append(cmd)
        if isinstance(self.answer, Exception):
            raise self.answer
        return cmd.response(self.answer, "busy" if self.answer else None)


def push(conn: Requester | None, client_id: str = "me") -> str | None:
    producers = {} if conn is None else {"pg": {conn: SimpleNamespace(client_id="me")}}
    requesters = ConnectedRequesters(SimpleNamespace(producers=producers))
    req = ReplyRequest(CALLER, ("10.0.0.1", 5555), "R", -1, b"answer", "", flag=3, born_timestamp=1700,
                       producer_group="pg", default_topic="TBW102")
    pushed = PushedReply(req, {Prop.CORRELATION_ID: "c1", Prop.PUSH_REPLY_TIME: "9"}, "10.0.0.9:10911", 9)
    return asyncio.run(requesters.push(client_id, pushed, 3.0))


def test_the_push_carries_the_send_header_and_where_the_reply_was_born_and_stored():
    conn = Requester(ResponseCode.SUCCESS)
    assert push(conn) is None
    [cmd] = conn.pushed
    assert cmd.code == RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT and cmd.body == b"answer"
    f = cmd.ext_fields
    assert (f["producerGroup"], f["topic"], f["defaultTopic"], f["queueId"], f["flag"], f["bornTimestamp"]) == (
        "pg", "R", "TBW102", "-1", "3", "1700")
    assert (f["bornHost"], f["storeHost"], f["storeTimestamp"]) == (CALLER.peer, "10.0.0.9:10911", "9")
    assert decode_properties(f["properties"]) == {Prop.CORRELATION_ID: "c1", Prop.PUSH_REPLY_TIME: "9"}


def test_a_push_that_cannot_be_delivered_says_why():
    assert push(None).startswith("push reply message fail, channel of <me> not found")
    assert push(Requester(ResponseCode.SYSTEM_ERROR)) == "push reply message to me fail: code 1 busy"
    assert push(Requester(RemotingError("timed out"))) == "push reply message to me fail: timed out"
