"""The group record's JSON codec: round trips, and anything else raises only RecordCodecError."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.broker.ha.coordination import (
    MAX_INT64,
    MAX_RECORD_BYTES,
    MAX_REPLICAS,
    GroupRecord,
    RecordCodecError,
    decode_record,
    encode_record,
    group_key,
)

replica = st.integers(0, MAX_REPLICAS - 1)
records = st.builds(
    GroupRecord,
    epoch=st.integers(0, MAX_INT64),
    master=st.none() | replica,
    in_sync=st.lists(replica, unique=True, max_size=MAX_REPLICAS).map(tuple),
    min_in_sync=st.integers(1, MAX_REPLICAS),
    master_log_end=st.integers(0, MAX_INT64),
)


@given(records)
def test_record_round_trips(record: GroupRecord) -> None:
    assert decode_record(encode_record(record)) == record


@given(st.binary(max_size=300))
def test_random_bytes_raise_only_the_codec_error(data: bytes) -> None:
    try:
        decode_record(data)
    except RecordCodecError:
        pass


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
    max_leaves=12)
fields = st.sampled_from(["epoch", "master", "inSync", "minInSync", "masterLogEnd"])


@given(records, fields, json_values)
def test_a_wrong_field_raises_only_the_codec_error(record: GroupRecord, field: str, value: object) -> None:
    doc = orjson.loads(encode_record(record))
    doc[field] = value
    try:
        assert decode_record(orjson.dumps(doc)) is not None
    except RecordCodecError:
        pass


@pytest.mark.parametrize("doc, why", [
    ({"epoch": 1, "master": 0, "inSync": [0, 0], "minInSync": 1, "masterLogEnd": 0}, "twice"),
    ({"epoch": 1, "master": 7, "inSync": [0], "minInSync": 1, "masterLogEnd": 0}, "outside"),
    ({"epoch": -1, "master": 0, "inSync": [0], "minInSync": 1, "masterLogEnd": 0}, r"0\.\.2\^63-1"),
    ({"epoch": True, "master": 0, "inSync": [0], "minInSync": 1, "masterLogEnd": 0}, "integer"),
    ({"epoch": 1, "master": 0, "inSync": [0], "minInSync": 0, "masterLogEnd": 0}, "min_in_sync"),
    ([1, 2], "object"),
])
def test_invalid_records_say_what_is_wrong(doc: object, why: str) -> None:
    with pytest.raises(RecordCodecError, match=why):
        decode_record(orjson.dumps(doc))


def test_an_oversized_record_is_refused_before_parsing() -> None:
    with pytest.raises(RecordCodecError, match="exceeds"):
        decode_record(b" " * (MAX_RECORD_BYTES + 1))


def test_one_key_per_broker_group() -> None:
    assert group_key("DefaultCluster", "broker-a") == "/tidemq/DefaultCluster/broker-a/group"
    with pytest.raises(ValueError, match="no '/'"):
        group_key("c", "a/b")
