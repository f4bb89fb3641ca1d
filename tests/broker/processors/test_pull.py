"""The PULL family's remoting adapter against a fake service: sysFlag bits, responses, holds."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from tidemq.broker.messaging.context import refused
from tidemq.broker.messaging.pull import PullRequest, PullResult
from tidemq.broker.processors.common import Callers
from tidemq.broker.processors.pull import PullProcessor
from tidemq.remoting import RemotingCommand, RequestCode, ResponseCode

CONN = SimpleNamespace(peer="10.0.0.1:5555")
HEADER = {"consumerGroup": "g", "topic": "T", "queueId": "1", "queueOffset": "5", "maxMsgNums": "5000",
          "sysFlag": "0", "commitOffset": "3", "suspendTimeoutMillis": "2000", "subscription": "a || b",
          "subVersion": "9"}


class FakePull:
    def __init__(self, answer) -> None:
        self.answer = answer
        self.requests: list[PullRequest] = []

    def pull(self, req: PullRequest):
        self.requests.append(req)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def pull(svc: FakePull, **over: str):
    return PullProcessor(svc, callers=Callers(False)).pull(
        CONN, RemotingCommand.request(RequestCode.PULL_MESSAGE, {**HEADER, **over}))


def test_sysflag_bits_decide_commit_suspend_and_subscription():
    svc = FakePull(PullResult(ResponseCode.PULL_NOT_FOUND, 5, 0, 5))
    pull(svc)
    pull(svc, sysFlag=str(0x1 | 0x2 | 0x4))
    plain, full = svc.requests
    assert (plain.commit_offset, plain.suspend, plain.subscription, plain.max_nums) == (-1, False, None, 1024)
    assert (full.commit_offset, full.suspend, full.suspend_timeout_ms, full.subscription) == (3, True, 2000, "a || b")
    assert (full.group, full.topic, full.queue_id, full.offset, full.sub_version) == ("g", "T", 1, 5, 9)


def test_found_records_are_the_body_and_offsets_are_strings():
    resp = pull(FakePull(PullResult(ResponseCode.SUCCESS, 7, 1, 9, [b"r1", b"r2"])))
    assert resp.code == ResponseCode.SUCCESS and resp.body == [b"r1", b"r2"]
    assert resp.ext_fields == {"suggestWhichBrokerId": "0", "nextBeginOffset": "7", "minOffset": "1",
                               "maxOffset": "9"}
    moved = pull(FakePull(PullResult(ResponseCode.PULL_OFFSET_MOVED, 0, 0, 0, [], "the queue is empty")))
    assert (moved.code, moved.remark, moved.body) == (ResponseCode.PULL_OFFSET_MOVED, "the queue is empty", None)


def test_refusals_and_bad_headers_answer_with_zero_offsets():
    zeros = {"suggestWhichBrokerId": "0", "nextBeginOffset": "0", "minOffset": "0", "maxOffset": "0"}
    resp = pull(FakePull(refused(ResponseCode.SUBSCRIPTION_NOT_EXIST, "send a heartbeat first")))
    assert (resp.code, resp.remark, resp.ext_fields) == (ResponseCode.SUBSCRIPTION_NOT_EXIST,
                                                         "send a heartbeat first", zeros)
    bad = pull(FakePull(None), consumerGroup="")
    assert (bad.code, bad.remark) == (ResponseCode.SYSTEM_ERROR,
                                      "bad pull request header: missing header field 'consumerGroup'")


def test_a_held_pull_is_answered_when_it_wakes():
    async def main():
        async def held():
            return PullResult(ResponseCode.SUCCESS, 6, 0, 6, [b"r"])

        resp = await pull(FakePull(held()))
        assert resp.code == ResponseCode.SUCCESS and resp.body == [b"r"]

    asyncio.run(main())
