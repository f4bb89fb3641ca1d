"""Frame and header codecs: golden vectors, round trips, and random bytes."""

from __future__ import annotations

import struct

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.errors import FrameError
from tidemq.remoting import RemotingCommand, SerializeType
from tidemq.remoting.frame import (
    decode_frame,
    decode_header,
    encode_frame,
    iter_frames,
)

CPP_ROUTE_REQUEST = (
    b'{"code":105,"extFields":{"AccessKey":"","OnsChannel":"ALIYUN","Signature":"N/YT7X6tJe5UfutmW+uNwTTJ7Fc=",'
    b'"topic":"TopicTest"},"flag":0,"language":"CPP","opaque":0,"remark":"","version":63}\n'
)


def test_cpp_route_request_vector_decodes():
    frame = struct.pack(">ii", 4 + len(CPP_ROUTE_REQUEST), len(CPP_ROUTE_REQUEST)) + CPP_ROUTE_REQUEST
    assert frame[:8] == bytes.fromhex("000000c1000000bd")  # as captured from the wheel
    cmd = decode_frame(frame)
    assert cmd.code == 105 and cmd.version == 63 and cmd.language == 1 and cmd.opaque == 0
    assert cmd.ext_fields["topic"] == "TopicTest" and not cmd.is_response


def test_numbers_and_bools_in_ext_fields_are_coerced_to_strings():
    header = orjson.dumps({"code": 10, "extFields": {"queueId": 3, "batch": True, "x": None, "f": 1.5}, "flag": 2})
    cmd = decode_header(0, header)
    assert cmd.ext_fields == {"queueId": "3", "batch": "true", "f": "1.5"}
    assert cmd.is_oneway
    assert cmd.get_bool("batch") and cmd.get_int("queueId") == 3


def test_response_fields_are_strings_and_flag_marks_a_response():
    req = RemotingCommand(code=10, opaque=77)
    resp = req.response(0, None, {"queueId": 1, "queueOffset": 9, "msgId": "AB"})
    frame = encode_frame(resp)
    back = decode_frame(frame)
    raw = orjson.loads(frame[8:])
    assert all(isinstance(v, str) for v in raw["extFields"].values())
    assert back.is_response and back.opaque == 77 and back.ext_fields["queueOffset"] == "9"


@given(
    code=st.integers(-(2**15), 2**15 - 1),
    opaque=st.integers(-(2**31), 2**31 - 1),
    flag=st.integers(0, 3),
    remark=st.one_of(st.none(), st.text(min_size=1, max_size=40)),
    fields=st.dictionaries(st.text(min_size=1, max_size=10), st.text(max_size=30), max_size=6),
    body=st.binary(max_size=200),
    stype=st.sampled_from([SerializeType.JSON, SerializeType.ROCKETMQ]),
)
def test_round_trip(code, opaque, flag, remark, fields, body, stype):
    cmd = RemotingCommand(code=code, opaque=opaque, flag=flag, remark=remark, ext_fields=fields, body=body, serialize_type=stype)
    back = decode_frame(encode_frame(cmd))
    assert (back.code, back.opaque, back.flag, back.ext_fields, back.body) == (code, opaque, flag, fields, body)
    assert (back.remark or None) == remark
    assert back.serialize_type == stype


def test_iter_frames_handles_partial_and_multiple_frames():
    frames = b"".join(encode_frame(RemotingCommand(code=i, opaque=i)) for i in range(3))
    buf = bytearray()
    out = []
    for i in range(0, len(frames), 7):
        buf += frames[i : i + 7]
        out.extend(c.code for c in iter_frames(buf))
    assert out == [0, 1, 2] and not buf


@pytest.mark.parametrize("length", [-1, 0, 3, 16 * 1024 * 1024 + 1, 2**31 - 1])
def test_bad_lengths_raise_before_allocating(length):
    buf = bytearray(struct.pack(">i", length) + b"\0" * 8)
    with pytest.raises(FrameError):
        list(iter_frames(buf))


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_random_bytes_raise_only_frame_error(data):
    buf = bytearray(data)
    try:
        list(iter_frames(buf, max_frame=1024))
    except FrameError:
        pass
    for stype in (0, 1, 7):
        try:
            decode_header(stype, data)
        except FrameError:
            pass
