"""RegisterBrokerBody codecs: both forms round-trip; junk raises only CodecError."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.errors import CodecError
from tidemq.namesrv import bodies
from tidemq.namesrv.bodies import (
    MAX_INFLATED,
    encode_register_body,
    parse_data_version,
    parse_register_body,
)

TOPICS = {
    "TopicTest": {"readQueueNums": 4, "writeQueueNums": 4, "perm": 6, "topicFilterType": "SINGLE_TAG"},
    "TBW102": {"readQueueNums": 8, "writeQueueNums": 8, "perm": 7, "topicFilterType": "SINGLE_TAG"},
}
VERSION = {"counter": 3, "timestamp": 1700000000000}


def test_json_form_round_trip() -> None:
    body = parse_register_body(encode_register_body(TOPICS, VERSION, ["f:1"]))
    assert body.topic_configs == TOPICS
    assert body.data_version == VERSION
    assert body.filter_servers == ("f:1",)


def test_compressed_form_round_trip() -> None:
    body = parse_register_body(encode_register_body(TOPICS, VERSION, compressed=True), compressed=True)
    assert body.data_version == VERSION
    assert body.topic_configs["TBW102"] == {
        "topicName": "TBW102",
        "readQueueNums": 8,
        "writeQueueNums": 8,
        "perm": 7,
        "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": 0,
    }
    assert set(body.topic_configs) == set(TOPICS)


def test_java_style_json_with_unquoted_int_keys_is_accepted() -> None:
    raw = (
        b'{"filterServerList":[],"topicConfigSerializeWrapper":{"dataVersion":{"counter":1,"timestamp":5},'
        b'"topicConfigTable":{"T":{"order":false,"perm":6,"readQueueNums":4,"topicFilterType":"SINGLE_TAG",'
        b'"topicName":"T","topicSysFlag":0,"writeQueueNums":4,"attributes":{1:"x"}}}}}'
    )
    body = parse_register_body(raw)
    assert body.topic_configs["T"]["readQueueNums"] == 4
    assert body.data_version == {"counter": 1, "timestamp": 5}


def test_empty_body_means_no_topics() -> None:
    body = parse_register_body(b"")
    assert body.topic_configs == {}
    assert body.data_version == {"counter": 0, "timestamp": 0}


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b"[1,2]",
        b'{"topicConfigSerializeWrapper":[]}',
        b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":3}}}',
        b'{"topicConfigSerializeWrapper":{"dataVersion":"x"}}',
        b'{"filterServerList":{}}',
    ],
)
def test_malformed_json_body_raises_codec_error(raw: bytes) -> None:
    with pytest.raises(CodecError):
        parse_register_body(raw)


def test_compressed_body_with_lying_counts_raises_codec_error() -> None:
    dv = b'{"counter":1}'
    lying = zlib.compress(struct.pack(">i", len(dv)) + dv + struct.pack(">i", 1_000_000))
    with pytest.raises(CodecError, match="topics"):
        parse_register_body(lying, compressed=True)
    short = zlib.compress(struct.pack(">i", 100) + dv)
    with pytest.raises(CodecError, match="exceeds"):
        parse_register_body(short, compressed=True)


def test_zip_bomb_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bodies, "MAX_INFLATED", 1024)
    bomb = zlib.compress(b"\0" * 1025, 9)
    with pytest.raises(CodecError, match="more than 1024"):
        parse_register_body(bomb, compressed=True)
    assert MAX_INFLATED >= 16 * 1024 * 1024


def test_data_version_body() -> None:
    assert parse_data_version(b'{"counter":2,"timestamp":9}') == {"counter": 2, "timestamp": 9}
    assert parse_data_version(b"") is None
    with pytest.raises(CodecError):
        parse_data_version(b"[]")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.booleans())
def test_random_bytes_raise_only_codec_error(data: bytes, compressed: bool) -> None:
    try:
        parse_register_body(data, compressed)
    except CodecError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_random_inflated_bytes_raise_only_codec_error(data: bytes) -> None:
    try:
        parse_register_body(zlib.compress(data), compressed=True)
    except CodecError:
        pass
