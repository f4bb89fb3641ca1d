"""PULL_MESSAGE construction, pull-result parsing, tag filtering; heartbeat bodies."""

from __future__ import annotations

import zlib

import orjson
import pytest

from tidemq.client.heartbeat import ConsumerData, Subscription, build_heartbeat, build_unregister
from tidemq.client.pull import (
    PullStatus,
    PullSysFlag,
    build_pull_request,
    normalize_expression,
    parse_pull_response,
    parse_tag_expression,
)
from tidemq.client.route import MessageQueue
from tidemq.errors import BrokerError
from tidemq.message import SysFlag, encode_properties, encode_record
from tidemq.remoting import RemotingCommand, RequestCode, ResponseCode

MQ = MessageQueue("TopicTest", "broker-a", 1)


def record(offset: int, body: bytes, tags: str | None = None, sys_flag: int = 0) -> bytes:
    props = {"UNIQ_KEY": f"{offset:032X}"}
    if tags:
        props["TAGS"] = tags
    return encode_record(
        topic=b"TopicTest", body=body, properties=encode_properties(props).encode(), queue_id=1,
        flag=0, queue_offset=offset, physical_offset=1000 + offset, sys_flag=sys_flag,
        born_timestamp=1700000000000, born_host=b"\x7f\0\0\1", born_port=5000,
        store_timestamp=1700000000001, store_host=b"\x7f\0\0\1", store_port=10911,
    )


@pytest.mark.parametrize(
    "expr,tags",
    [("*", None), ("", None), (None, None), (" * ", None), ("TagA", {"TagA"}),
     ("TagA || TagB", {"TagA", "TagB"}), ("TagA||TagB|| ", {"TagA", "TagB"})],
)
def test_tag_expressions(expr, tags):
    assert parse_tag_expression(expr) == (frozenset(tags) if tags else None)


def test_normalized_expression():
    assert normalize_expression("TagB ||TagA") == "TagA || TagB"
    assert normalize_expression("") == "*"


def test_pull_header_without_and_with_long_polling():
    cmd = build_pull_request("cg", MQ, 17, 32, "TagA || TagB")
    assert cmd.code == RequestCode.PULL_MESSAGE
    f = cmd.ext_fields
    assert f == {
        "consumerGroup": "cg", "topic": "TopicTest", "queueId": "1", "queueOffset": "17",
        "maxMsgNums": "32", "sysFlag": str(int(PullSysFlag.SUBSCRIPTION)), "commitOffset": "0",
        "suspendTimeoutMillis": "0", "subscription": "TagA || TagB", "subVersion": "0",
        "expressionType": "TAG",
    }
    long = build_pull_request("cg", MQ, 0, 8, "*", suspend_ms=15000).ext_fields
    assert long["sysFlag"] == "6" and long["suspendTimeoutMillis"] == "15000"


def _resp(code: int, body: bytes | None = None, **fields) -> RemotingCommand:
    base = {"nextBeginOffset": 5, "minOffset": 0, "maxOffset": 9, "suggestWhichBrokerId": 0}
    base.update(fields)
    return RemotingCommand.request(RequestCode.PULL_MESSAGE).response(code, None, base, body)


def test_found_decodes_records_and_inflates_compressed_bodies():
    big = b"hello " * 2000
    body = record(3, b"one", "TagA") + record(4, zlib.compress(big), "TagB", SysFlag.COMPRESSED)
    r = parse_pull_response(_resp(ResponseCode.SUCCESS, body), MQ, None)
    assert r.status is PullStatus.FOUND
    assert (r.next_begin_offset, r.min_offset, r.max_offset) == (5, 0, 9)
    assert [m.body for m in r.messages] == [b"one", big]
    assert [m.queue_offset for m in r.messages] == [3, 4]
    assert r.messages[1].sys_flag & SysFlag.COMPRESSED  # inflated; the flag as stored (as RocketMQ)
    assert r.messages[0].properties["MAX_OFFSET"] == "9"


def test_client_side_tag_filter_drops_hash_collisions():
    body = record(0, b"a", "TagA") + record(1, b"b", "TagB") + record(2, b"none")
    r = parse_pull_response(_resp(0, body), MQ, frozenset({"TagB"}))
    assert [m.body for m in r.messages] == [b"b"]


@pytest.mark.parametrize(
    "code,status",
    [(ResponseCode.PULL_NOT_FOUND, PullStatus.NO_NEW_MSG),
     (ResponseCode.PULL_RETRY_IMMEDIATELY, PullStatus.NO_MATCHED_MSG),
     (ResponseCode.PULL_OFFSET_MOVED, PullStatus.OFFSET_ILLEGAL)],
)
def test_other_pull_statuses_carry_offsets_and_no_messages(code, status):
    r = parse_pull_response(_resp(code, nextBeginOffset=7), MQ, None)
    assert r.status is status and r.next_begin_offset == 7 and r.messages == []


def test_pull_errors_raise():
    with pytest.raises(BrokerError) as ei:
        parse_pull_response(_resp(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST), MQ, None)
    assert ei.value.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
    with pytest.raises(BrokerError, match="undecodable"):
        parse_pull_response(_resp(0, b"\0\0\0\x05junk"), MQ, None)


# --- heartbeat --------------------------------------------------------------------------------

def test_heartbeat_body_shape():
    cd = ConsumerData("cg", (Subscription("T", "TagB || TagA", 17),))
    cmd = build_heartbeat("127.0.0.1@1#2", ["pg"], [cd])
    assert cmd.code == RequestCode.HEART_BEAT
    body = orjson.loads(cmd.body)
    assert body["clientID"] == "127.0.0.1@1#2"
    assert body["producerDataSet"] == [{"groupName": "pg"}]
    (c,) = body["consumerDataSet"]
    assert (c["groupName"], c["consumeType"], c["messageModel"]) == ("cg", "CONSUME_ACTIVELY", "CLUSTERING")
    (s,) = c["subscriptionDataSet"]
    assert s["subString"] == "TagA || TagB" and s["tagsSet"] == ["TagA", "TagB"]
    assert s["codeSet"] == [2598919, 2598920] and s["subVersion"] == 17 and s["topic"] == "T"
    assert orjson.loads(build_heartbeat("c", [], [ConsumerData("g", (Subscription("T"),))]).body)[
        "consumerDataSet"][0]["subscriptionDataSet"][0]["tagsSet"] == []


def test_unregister_header_omits_absent_group():
    cmd = build_unregister("cid", producer_group="pg")
    assert cmd.code == RequestCode.UNREGISTER_CLIENT
    assert cmd.ext_fields == {"clientID": "cid", "producerGroup": "pg"}
