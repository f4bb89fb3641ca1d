"""OffsetProcessor against a fake OffsetService: headers decoded once, answers in response fields."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tidemq.broker.messaging.context import refused
from tidemq.broker.messaging.offsets import OffsetCommit
from tidemq.broker.processors.common import Callers
from tidemq.broker.processors.offsets import OffsetProcessor
from tidemq.remoting import RemotingCommand, RequestCode, ResponseCode
from tests.broker.processors import Dispatched, assert_bad_request

CONN = SimpleNamespace(peer="10.0.0.5:6000")


class FakeService:
    def __init__(self) -> None:
        self.commits: list[tuple] = []

    def committed(self, group, topic, queue_id):
        if group == "new":
            raise refused(ResponseCode.QUERY_NOT_FOUND,
                          "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first")
        return 100 + queue_id

    def commit(self, caller, c):
        if c.topic == "gone":
            raise refused(ResponseCode.TOPIC_NOT_EXIST, "Topic gone not exist!")
        self.commits.append((caller, c))

    def max_offset(self, topic, q):
        return 50 + q

    def min_offset(self, topic, q):
        return 5 + q

    def offset_by_time(self, topic, q, ts):
        return ts

    def earliest_store_time(self, topic, q):
        return -1


@pytest.fixture
def handlers():
    service = FakeService()
    return service, Dispatched(OffsetProcessor(service, callers=Callers(True))).handlers()


def call(handlers, code, fields):
    return handlers[1][code](CONN, RemotingCommand.request(code, fields))


def test_a_committed_offset_is_answered_in_the_offset_field_or_refused(handlers):
    resp = call(handlers, RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "g", "topic": "t", "queueId": 2})
    assert (resp.code, resp.ext_fields) == (ResponseCode.SUCCESS, {"offset": "102"})
    resp = call(handlers, RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "new", "topic": "t", "queueId": 2})
    assert resp.code == ResponseCode.QUERY_NOT_FOUND and resp.remark.startswith("Not found")


def test_a_commit_reaches_the_service_with_the_verified_caller(handlers):
    fields = {"consumerGroup": "g", "topic": "t", "queueId": 1, "commitOffset": 9, "AccessKey": "appKey0001"}
    assert call(handlers, RequestCode.UPDATE_CONSUMER_OFFSET, fields).code == ResponseCode.SUCCESS
    (caller, commit), = handlers[0].commits
    assert commit == OffsetCommit("g", "t", 1, 9) and caller.principal == "accessKey appKey0001"
    resp = call(handlers, RequestCode.UPDATE_CONSUMER_OFFSET, dict(fields, topic="gone"))
    assert (resp.code, resp.remark) == (ResponseCode.TOPIC_NOT_EXIST, "Topic gone not exist!")


@pytest.mark.parametrize("fields, problem", [
    ({"topic": "t", "queueId": 0, "commitOffset": 1}, "consumerGroup and topic are required"),
    ({"consumerGroup": "g", "topic": "t", "queueId": 0}, "missing header field 'commitOffset'"),
    ({"consumerGroup": "g", "topic": "t", "queueId": 1 << 31, "commitOffset": 1},
     "header field 'queueId' is out of range"),
    ({"consumerGroup": "g", "topic": "t", "queueId": 0, "commitOffset": 2**70},
     "header field 'commitOffset' is out of range"),
])
def test_a_bad_commit_header_is_a_bad_request_naming_the_field(handlers, fields, problem):
    assert_bad_request(
        call(handlers, RequestCode.UPDATE_CONSUMER_OFFSET, fields),
        problem)


def test_queue_offsets_and_times(handlers):
    q = {"topic": "t", "queueId": 3}
    assert call(handlers, RequestCode.GET_MAX_OFFSET, q).ext_fields == {"offset": "53"}
    assert call(handlers, RequestCode.GET_MIN_OFFSET, q).ext_fields == {"offset": "8"}
    assert call(handlers, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, dict(q, timestamp=77)).ext_fields == {"offset": "77"}
    assert call(handlers, RequestCode.GET_EARLIEST_MSG_STORETIME, q).ext_fields == {"timestamp": "-1"}
    assert_bad_request(
        call(handlers, RequestCode.GET_MAX_OFFSET, {"topic": "t"}),
        "missing header field 'queueId'")
