"""EndTransactionProcessor against a fake EndTransactionService."""

from __future__ import annotations

from types import SimpleNamespace


from tidemq.broker.messaging.context import refused
from tidemq.broker.messaging.transaction import EndTransaction
from tidemq.broker.processors.common import Callers
from tidemq.broker.processors.transaction import EndTransactionProcessor
from tidemq.remoting import RemotingCommand, RequestCode, ResponseCode
from tests.broker.processors import Dispatched, assert_bad_request

CONN = SimpleNamespace(peer="10.0.0.5:6000")
FIELDS = {"producerGroup": "pg", "tranStateTableOffset": 3, "commitLogOffset": 4096, "commitOrRollback": 8,
          "fromTransactionCheck": "true", "msgId": "MSGID", "transactionId": "TX"}


class FakeService:
    def __init__(self, durable: int | None = None) -> None:
        self.durable = durable
        self.calls: list[tuple] = []

    def end(self, caller, req):
        self.calls.append((caller, req))
        if req.kind == 12:
            raise refused(ResponseCode.SYSTEM_ERROR, "The producer group wrong")
        if self.durable is None:
            return None
        return self._durable()

    async def _durable(self) -> int:
        return self.durable


def end(service, fields=FIELDS, oneway=False):
    cmd = RemotingCommand.request(RequestCode.END_TRANSACTION, fields, oneway=oneway)
    return Dispatched(EndTransactionProcessor(service, callers=Callers(False))).end(CONN, cmd)


def test_the_header_is_decoded_into_the_services_request():
    service = FakeService()
    assert end(service).code == ResponseCode.SUCCESS
    end(service, oneway=True)
    assert [req for _, req in service.calls] == [EndTransaction("pg", 3, 4096, 8, True, "MSGID", True),
                                                 EndTransaction("pg", 3, 4096, 8, True, "MSGID", False)]
    resp = end(service, dict(FIELDS, commitOrRollback=12))
    assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, "The producer group wrong")
    assert_bad_request(
        end(service, {k: v for k, v in FIELDS.items() if k != "commitLogOffset"}),
        "missing header field 'commitLogOffset'")


async def test_an_awaited_commit_is_answered_when_durable_and_acknowledged_or_says_why_not():
    assert (await end(FakeService(durable=ResponseCode.SUCCESS))).code == ResponseCode.SUCCESS
    late = await end(FakeService(durable=ResponseCode.FLUSH_DISK_TIMEOUT))
    assert (late.code, late.remark) == (ResponseCode.FLUSH_DISK_TIMEOUT,
                                        "flush to disk timed out; the committed message is stored")
    alone = await end(FakeService(durable=ResponseCode.SLAVE_NOT_AVAILABLE))
    assert alone.code == ResponseCode.SLAVE_NOT_AVAILABLE and "minInSync" in alone.remark
