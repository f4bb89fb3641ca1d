"""SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE construction and send-response parsing."""

from __future__ import annotations

import zlib

import pytest

from tidemq.client.route import MessageQueue
from tidemq.client.send import (
    SendResult,
    SendStatus,
    build_batch_request,
    build_send_request,
    parse_send_response,
    prepare_message,
    send_header,
)
from tidemq.errors import BrokerError, ClientError
from tidemq.message import Message, SysFlag, decode_batch, decode_properties
from tidemq.remoting import RemotingCommand, RequestCode, ResponseCode
from tidemq.remoting.frame import decode_frame, encode_frame

UNIQ = "7F0000010F3C1A2B3C4D000000010001"


def test_v2_header_uses_short_names_and_string_values():
    h = send_header("pg", "TopicTest", 3, 1, 1700000000000, 7, "TAGS\x01A", batch=False)
    assert h == {
        "a": "pg", "b": "TopicTest", "c": "TBW102", "d": "4", "e": "3", "f": "1",
        "g": "1700000000000", "h": "7", "i": "TAGS\x01A", "j": "0", "k": "false", "m": "false",
    }
    assert all(isinstance(v, str) for v in h.values())
    assert send_header("pg", "T", 0, 0, 0, 0, "", batch=True, max_reconsume_times=5)["m"] == "true"
    assert send_header("pg", "T", 0, 0, 0, 0, "", max_reconsume_times=5)["l"] == "5"


def test_prepare_sets_uniq_key_and_wait_but_keeps_callers_values():
    out = prepare_message(Message("T", b"hi", tags="TagA", keys=["k1", "k2"]), UNIQ, 4096)
    props = decode_properties(out.properties)
    assert props == {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": UNIQ, "WAIT": "true"}
    assert out.uniq_key == UNIQ and out.body == b"hi" and out.sys_flag == 0
    own = prepare_message(Message("T", b"hi", properties={"UNIQ_KEY": "MINE", "WAIT": "false"}), UNIQ, 4096)
    assert decode_properties(own.properties) == {"UNIQ_KEY": "MINE", "WAIT": "false"}
    assert own.uniq_key == "MINE"


def test_large_bodies_are_zlib_compressed_with_sysflag():
    body = b"abc" * 5000
    out = prepare_message(Message("T", body), UNIQ, 4096, 5)
    assert out.sys_flag & SysFlag.COMPRESSED
    assert zlib.decompress(out.body) == body and len(out.body) < len(body)
    small = prepare_message(Message("T", b"x" * 4095), UNIQ, 4096)
    assert small.sys_flag == 0 and small.body == b"x" * 4095
    never = prepare_message(Message("T", body), UNIQ, None)
    assert never.sys_flag == 0 and never.body == body


def test_retry_topic_moves_reconsume_properties_into_the_header():
    msg = Message("%RETRY%g", b"x", properties={"RECONSUME_TIME": "3", "MAX_RECONSUME_TIMES": "5"})
    out = prepare_message(msg, UNIQ, 4096)
    assert "RECONSUME_TIME" not in decode_properties(out.properties)
    h = build_send_request("pg", out, 0, 1).ext_fields
    assert (h["j"], h["l"]) == ("3", "5")


def test_oversized_properties_are_refused():
    with pytest.raises(ClientError, match="properties"):
        prepare_message(Message("T", b"x", properties={"big": "v" * 40000}), UNIQ, 4096)


def test_send_request_survives_the_frame_codec():
    out = prepare_message(Message("TopicTest", b"payload", tags="TagA"), UNIQ, 4096)
    cmd = build_send_request("pg", out, 2, 1700000000000)
    assert cmd.code == RequestCode.SEND_MESSAGE_V2 and cmd.flag == 0
    decoded = decode_frame(encode_frame(cmd))
    assert decoded.ext_fields["b"] == "TopicTest" and decoded.ext_fields["e"] == "2"
    assert decode_properties(decoded.ext_fields["i"])["TAGS"] == "TagA"
    assert decoded.body_bytes() == b"payload"
    assert build_send_request("pg", out, 2, 1, oneway=True).is_oneway


def test_batch_request_body_is_the_batch_codec():
    msgs = [Message("T", f"m{i}".encode(), tags="A", keys=f"k{i}") for i in range(3)]
    outs = [prepare_message(m, f"{i:032X}", None) for i, m in enumerate(msgs)]
    cmd = build_batch_request("pg", "T", outs, 1, 5)
    assert cmd.code == RequestCode.SEND_BATCH_MESSAGE
    assert cmd.ext_fields["m"] == "true" and cmd.ext_fields["b"] == "T" and cmd.ext_fields["e"] == "1"
    assert decode_properties(cmd.ext_fields["i"]) == {"WAIT": "true"}
    items = decode_batch(cmd.body)
    assert [i.body for i in items] == [b"m0", b"m1", b"m2"]
    assert [decode_properties(i.properties)["UNIQ_KEY"] for i in items] == [f"{i:032X}" for i in range(3)]
    assert decode_properties(items[2].properties)["KEYS"] == "k2"


def _resp(code: int, **fields) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2).response(code, "why", fields)


@pytest.mark.parametrize(
    "code,status",
    [(ResponseCode.SUCCESS, SendStatus.SEND_OK), (ResponseCode.FLUSH_DISK_TIMEOUT, SendStatus.FLUSH_DISK_TIMEOUT),
     (ResponseCode.FLUSH_SLAVE_TIMEOUT, SendStatus.FLUSH_SLAVE_TIMEOUT),
     (ResponseCode.SLAVE_NOT_AVAILABLE, SendStatus.SLAVE_NOT_AVAILABLE)],
)
def test_send_result_from_response(code, status):
    resp = _resp(code, msgId="7F00000100002A9F0000000000000000", queueId=2, queueOffset=41,
                 MSG_REGION="DefaultRegion", TRACE_ON="true")
    assert parse_send_response(resp, "T", "broker-a", UNIQ) == SendResult(
        status, UNIQ, "7F00000100002A9F0000000000000000", MessageQueue("T", "broker-a", 2), 41
    )


def test_send_error_codes_raise_broker_error_with_remark():
    with pytest.raises(BrokerError) as ei:
        parse_send_response(_resp(ResponseCode.MESSAGE_ILLEGAL), "T", "b", UNIQ, "h:1")
    assert ei.value.code == ResponseCode.MESSAGE_ILLEGAL and ei.value.remark == "why"
    assert "MESSAGE_ILLEGAL" in str(ei.value) and "h:1" in str(ei.value)


def test_send_response_without_header_is_an_error():
    with pytest.raises(BrokerError, match="queueId"):
        parse_send_response(_resp(0, msgId="X"), "T", "b", UNIQ)
