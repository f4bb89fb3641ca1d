"""QueryProcessor against a fake QueryService: records as the body, index fields, refusals."""

from __future__ import annotations

from types import SimpleNamespace

from tidemq.broker.messaging.context import refused
from tidemq.broker.messaging.query import MessageQuery, QueryResult
from tidemq.broker.processors.common import Callers
from tidemq.broker.processors.query import QueryProcessor
from tidemq.remoting import RemotingCommand, RequestCode, ResponseCode
from tests.broker.processors import Dispatched

CONN = SimpleNamespace(peer="10.0.0.5:6000")


class FakeService:
    def __init__(self, records: tuple[bytes, ...] = ()) -> None:
        self.records = records
        self.asked: list[object] = []

    def query(self, q):
        self.asked.append(q)
        if not q.key:
            raise refused(ResponseCode.SYSTEM_ERROR, "topic and key are required")
        return QueryResult(self.records, 4242)

    def view(self, caller, offset):
        self.asked.append((caller, offset))
        if offset == 13:
            raise refused(ResponseCode.SYSTEM_ERROR, "AclException: No permission for topic:orders")
        return b"REC"


def test_a_query_answers_its_records_with_the_index_fields():
    service = FakeService((b"r1", b"r2"))
    proc = Dispatched(QueryProcessor(service, callers=Callers(False)))
    fields = {"topic": "t", "key": "k", "maxNum": 5, "beginTimestamp": 1, "endTimestamp": 2,
              "_UNIQUE_KEY_QUERY": "true"}
    resp = proc.query(CONN, RemotingCommand.request(RequestCode.QUERY_MESSAGE, fields))
    assert service.asked == [MessageQuery("t", "k", 5, True, 1, 2)]
    assert resp.code == ResponseCode.SUCCESS and resp.body_bytes() == b"r1r2"
    assert resp.ext_fields == {"indexLastUpdateTimestamp": "0", "indexLastUpdatePhyoffset": "4242"}


def test_a_query_finding_nothing_or_refused():
    proc = Dispatched(QueryProcessor(FakeService(), callers=Callers(False)))
    resp = proc.query(CONN, RemotingCommand.request(RequestCode.QUERY_MESSAGE, {"topic": "t", "key": "k"}))
    assert resp.code == ResponseCode.QUERY_NOT_FOUND
    assert resp.remark == "can not find message, maybe time range not correct"
    assert resp.ext_fields["indexLastUpdatePhyoffset"] == "4242"
    resp = proc.query(CONN, RemotingCommand.request(RequestCode.QUERY_MESSAGE, {"topic": "t"}))
    assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, "topic and key are required")


def test_view_by_id_answers_the_record_or_the_refusal_for_the_verified_caller():
    service = FakeService()
    proc = Dispatched(QueryProcessor(service, callers=Callers(True)))
    cmd = RemotingCommand.request(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": 12, "AccessKey": "appKey0001"})
    assert proc.view(CONN, cmd).body == b"REC"
    caller, offset = service.asked[0]
    assert (caller.access_key, caller.code, offset) == ("appKey0001", RequestCode.VIEW_MESSAGE_BY_ID, 12)
    resp = proc.view(CONN, RemotingCommand.request(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": 13}))
    assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, "AclException: No permission for topic:orders")
