"""The CONSUMER_SEND_MSG_BACK adapter against a fake service."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from tidemq.broker.messaging.context import refused
from tidemq.broker.messaging.sendback import SendBackRequest, SendBackResult
from tidemq.broker.processors.common import Callers
from tidemq.broker.processors.sendback import SendBackProcessor
from tidemq.remoting import RemotingCommand, RequestCode, ResponseCode

CONN = SimpleNamespace(peer="10.0.0.1:5555")


class FakeSendBack:
    def __init__(self, answer) -> None:
        self.answer = answer
        self.requests: list[SendBackRequest] = []

    def send_back(self, req: SendBackRequest):
        self.requests.append(req)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def send_back(svc: FakeSendBack, version: int = 121, **fields: str):
    cmd = RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK,
                                  {"group": "g", "offset": "42", "delayLevel": "2", "maxReconsumeTimes": "3", **fields})
    cmd.version = version
    return SendBackProcessor(svc, callers=Callers(False)).send_back(CONN, cmd)


def test_the_request_and_its_answer():
    svc = FakeSendBack(SendBackResult("%RETRY%g", 1))
    resp = send_back(svc)
    send_back(svc, version=120)
    assert [(r.group, r.offset, r.delay_level, r.max_reconsume_times) for r in svc.requests] == [
        ("g", 42, 2, 3), ("g", 42, 2, None)]
    assert (resp.code, resp.remark, resp.ext_fields) == (ResponseCode.SUCCESS, None, {})


def test_refusals_and_bad_headers():
    resp = send_back(FakeSendBack(refused(ResponseCode.SYSTEM_ERROR, "AclException: No default permission")))
    assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, "AclException: No default permission")
    bad = send_back(FakeSendBack(None), offset="")
    assert bad.remark == "bad send-back request header: missing header field 'offset'"


def test_a_flush_timeout_after_the_put_is_a_system_error():
    async def main():
        async def flushed_late():
            raise refused(ResponseCode.SYSTEM_ERROR, "FLUSH_DISK_TIMEOUT: the message is stored but not yet on disk")

        resp = await send_back(FakeSendBack(flushed_late()))
        assert resp.remark == "FLUSH_DISK_TIMEOUT: the message is stored but not yet on disk"

    asyncio.run(main())
