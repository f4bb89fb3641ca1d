"""The SEND family's remoting adapter against a fake service: header decoding (long and one-letter
names), the request it builds, and the responses it encodes."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from tidemq.broker.messaging.context import refused
from tidemq.broker.messaging.send import PendingSend, SendRequest, SendResult
from tidemq.remoting.reply import Reply
from tidemq.broker.processors.common import Callers
from tidemq.broker.processors.send import SendProcessor
from tidemq.remoting import RemotingCommand, RequestCode, ResponseCode
from tidemq.remoting.acl import ACCESS_KEY

CONN = SimpleNamespace(peer="10.0.0.1:5555")


class FakeSend:
    def __init__(self, answer=None) -> None:
        self.answer = answer if answer is not None else SendResult("AB,CD", 2, 7)
        self.requests: list[SendRequest] = []

    def send(self, req: SendRequest):
        self.requests.append(req)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def processor(svc: FakeSend, acl: bool = False) -> SendProcessor:
    return SendProcessor(svc, callers=Callers(acl), region="Region1")


V2 = {"a": "pg", "b": "T", "c": "TBW102", "d": "3", "e": "1", "f": "0", "g": "1700", "h": "5", "i": "K\x01v\x02",
      "j": "2", "k": "false", "l": "4", "m": "false"}


def test_a_v2_header_is_read_by_its_one_letter_names():
    svc = FakeSend()
    cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {**V2, "topic": "Other"}, b"body")
    resp = processor(svc).send(CONN, cmd)
    [req] = svc.requests
    assert (req.topic, req.queue_id, req.body, req.properties, req.flag, req.born_timestamp) == (
        "T", 1, b"body", "K\x01v\x02", 5, 1700)
    assert (req.reconsume_times, req.batch, req.default_topic, req.default_topic_queue_nums) == (2, False, "TBW102", 3)
    assert req.caller.peer == CONN.peer and req.caller.code == 310 and req.born_host == ("10.0.0.1", 5555)
    assert (resp.code, resp.remark) == (ResponseCode.SUCCESS, None)
    assert resp.ext_fields == {"msgId": "AB,CD", "queueId": "2", "queueOffset": "7", "MSG_REGION": "Region1",
                               "TRACE_ON": "true"}


def test_code_10_reads_long_names_and_a_batch_flag():
    svc = FakeSend()
    fields = {"producerGroup": "pg", "topic": "T", "queueId": "0", "batch": "true", "b": "Ignored"}
    processor(svc).send(CONN, RemotingCommand.request(RequestCode.SEND_MESSAGE, fields, b"x"))
    processor(svc).send(CONN, RemotingCommand.request(RequestCode.SEND_BATCH_MESSAGE, {"b": "T"}, b"x"))
    assert [(r.topic, r.batch) for r in svc.requests] == [("T", True), ("T", True)]


def test_max_reconsume_times_counts_from_version_121():
    svc = FakeSend()
    old = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, V2, b"x")
    old.version = 120
    new = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, V2, b"x")
    new.version = 121
    processor(svc).send(CONN, old)
    processor(svc).send(CONN, new)
    assert [r.max_reconsume_times for r in svc.requests] == [None, 4]


def test_the_access_key_names_the_caller_only_with_acl_on():
    svc = FakeSend()
    fields = {**V2, ACCESS_KEY: "appKey0001"}
    processor(svc, acl=False).send(CONN, RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, fields, b"x"))
    processor(svc, acl=True).send(CONN, RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, fields, b"x"))
    assert [r.caller.principal for r in svc.requests] == ["host 10.0.0.1", "accessKey appKey0001"]


def test_refusals_and_bad_headers_answer_with_empty_ids():
    empty = {"msgId": "", "queueId": "0", "queueOffset": "0", "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
    svc = FakeSend(refused(ResponseCode.TOPIC_NOT_EXIST, "topic[T] not exist"))
    resp = processor(svc).send(CONN, RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, V2, b"x"))
    assert (resp.code, resp.remark, resp.ext_fields) == (ResponseCode.TOPIC_NOT_EXIST, "topic[T] not exist", empty)
    bad = processor(FakeSend()).send(CONN, RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {**V2, "e": "one"}))
    assert (bad.code, bad.remark) == (ResponseCode.SYSTEM_ERROR,
                                      "bad send request header: header field 'queueId' is not an integer: 'one'")


def test_a_deferred_result_is_answered_when_it_settles_and_frees_the_body():
    async def main():
        pending = PendingSend(SendResult("AB", 1, 3), 100)
        pending.waits = 1  # its flush round
        cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, V2, b"x" * 100)
        answer = processor(FakeSend(pending)).send(CONN, cmd)
        assert isinstance(answer, Reply) and cmd.body is None and not answer.done()
        pending.flushed(False)
        assert answer.done()  # at once, in the flusher's release: no loop turn in between
        resp = await answer
        assert (resp.code, resp.remark, resp.ext_fields["msgId"]) == (
            ResponseCode.FLUSH_DISK_TIMEOUT, "flush to disk timed out; the message is stored", "AB")

        async def big_batch_refused():
            raise refused(ResponseCode.MESSAGE_ILLEGAL, "bad message body: truncated")

        late = processor(FakeSend(big_batch_refused())).send(CONN, cmd)
        resp = await late
        assert (resp.code, resp.remark, resp.ext_fields["msgId"]) == (ResponseCode.MESSAGE_ILLEGAL,
                                                                       "bad message body: truncated", "")

    asyncio.run(main())
