"""Pull-response bodies to Arrow batches (tidemq.spark.arrow), checked against the reference
decoder tidemq.message.decode_records; and the read schema against Spark's own Arrow form.

Pure: no Spark session, no servers (pyspark is imported only for its type helpers).
"""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from pyspark.sql.pandas.types import to_arrow_schema  # noqa: E402
from pyspark.sql.types import (  # noqa: E402
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    TimestampType,
)

from tidemq.errors import CodecError  # noqa: E402
from tidemq.message import (  # noqa: E402
    MessageExt,
    SysFlag,
    decode_records,
    encode_offset_msg_id,
    encode_properties,
    encode_record,
)
from tidemq.spark.arrow import Columns, arrow_schema, collect, spark_schema, to_batch  # noqa: E402

V4_BORN, V4_STORE = bytes([10, 0, 0, 7]), bytes([192, 168, 1, 20])
V6_BORN = bytes.fromhex("20010db8000000000000000000000001")
V6_STORE = bytes.fromhex("fe800000000000000000000000000abc")
UNIQ = "0A00000700002A9F0000000000000001"
NO_END = 2**63 - 1

COLUMNS = ["key", "value", "topic", "broker", "queueId", "queueOffset", "msgId", "tags",
           "bornTimestamp", "storeTimestamp", "reconsumeTimes"]


def record(offset: int, body: bytes = b"hello", props: dict[str, str] | None = None, *,
           physical: int | None = None, sys_flag: int = 0, born_host: bytes = V4_BORN,
           store_host: bytes = V4_STORE, born_ts: int = 1_700_000_000_123,
           store_ts: int = 1_700_000_000_456, reconsume: int = 0, topic: str = "orders") -> bytes:
    return encode_record(
        topic=topic.encode(), body=body, properties=encode_properties(props or {}).encode(),
        queue_id=3, flag=0, queue_offset=offset,
        physical_offset=physical if physical is not None else 1000 + offset * 200,
        sys_flag=sys_flag, born_timestamp=born_ts, born_host=born_host, born_port=50123,
        store_timestamp=store_ts, store_host=store_host, store_port=10911,
        reconsume_times=reconsume)


def batch_of(body: bytes, end: int = NO_END, tags: frozenset[str] | None = None,
             props: bool = True) -> tuple[pa.RecordBatch, int]:
    cols = Columns(props=[] if props else None)
    last = collect(body, cols, end, tags)
    return to_batch(cols, "orders", "broker-a", 3), last


def expected_rows(refs: list[MessageExt], props: bool = True) -> list[dict]:
    """The rows the batch must hold, from the reference decoder."""
    rows = []
    for m in refs:
        keys = m.properties.get("KEYS")
        row = {
            "key": keys.encode() if keys is not None else None,
            "value": m.body,
            "topic": "orders",
            "broker": "broker-a",
            "queueId": 3,
            "queueOffset": m.queue_offset,
            "msgId": m.msg_id,
            "tags": m.tags,
            "bornTimestamp": m.born_timestamp * 1000,
            "storeTimestamp": m.store_timestamp * 1000,
            "reconsumeTimes": m.reconsume_times,
        }
        if props:
            row["properties"] = dict(m.properties)
        rows.append(row)
    return rows


def rows_of(batch: pa.RecordBatch) -> list[dict]:
    """Batch rows with timestamps as integer microseconds and the map as a dict."""
    cols = {}
    for name in batch.schema.names:
        col = batch.column(name)
        if pa.types.is_timestamp(col.type):
            col = col.cast(pa.int64())
        cols[name] = col.to_pylist()
    if "properties" in cols:
        cols["properties"] = [dict(items) for items in cols["properties"]]
    return [{n: cols[n][i] for n in cols} for i in range(batch.num_rows)]


# --- schema ----------------------------------------------------------------------------------


@pytest.mark.parametrize("include_properties", [False, True])
def test_arrow_schema_equals_sparks_arrow_form_of_the_spark_schema(include_properties):
    ours = arrow_schema(include_properties)
    spark = to_arrow_schema(spark_schema(include_properties), timezone="UTC")
    assert ours.equals(spark)  # Spark passes batches through only on exact equality
    assert [(f.name, f.type, f.nullable) for f in ours] == [(f.name, f.type, f.nullable) for f in spark]
    if include_properties:
        ours_map, spark_map = ours.field("properties").type, spark.field("properties").type
        assert ours_map.key_field.nullable is False and spark_map.key_field.nullable is False
        assert ours_map.item_field.nullable is True and spark_map.item_field.nullable is True
        assert ours_map.key_field.name == spark_map.key_field.name == "key"
        assert ours_map.item_field.name == spark_map.item_field.name == "value"


def test_spark_schema_is_kafkas_in_rocketmq_words():
    s = spark_schema()
    assert s.names == COLUMNS
    assert [type(f.dataType) for f in s.fields] == [
        BinaryType, BinaryType, StringType, StringType, IntegerType, LongType, StringType,
        StringType, TimestampType, TimestampType, IntegerType]
    assert all(f.nullable for f in s.fields)
    p = spark_schema(include_properties=True)
    assert p.names == COLUMNS + ["properties"]
    assert p["properties"].dataType == MapType(StringType(), StringType(), True)


@pytest.mark.parametrize("include_properties", [False, True])
def test_empty_columns_make_an_empty_batch_of_the_read_schema(include_properties):
    cols = Columns(props=[] if include_properties else None)
    assert len(cols) == 0
    batch = to_batch(cols, "orders", "broker-a", 0)
    assert batch.num_rows == 0
    assert batch.schema.equals(to_arrow_schema(spark_schema(include_properties), timezone="UTC"))


# --- columns ---------------------------------------------------------------------------------


def test_every_column_of_a_pull_body_is_decoded():
    body = b"".join([
        record(10, b"first", {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": UNIQ, "color": "red"},
               reconsume=2),
        record(11, b"", {}),  # no properties at all: no key, no tag, offset msg id
        record(12, b"\x00\xffbin", {"KEYS": "only-key", "x\u00e9": "\u00fcml\u00e4ut"},
               born_ts=0, store_ts=1),
    ])
    batch, last = batch_of(body)
    assert last == 13
    assert batch.schema.equals(arrow_schema(True))
    rows = rows_of(batch)
    assert rows == expected_rows(decode_records(body))
    # spelled out once, independently of the reference decoder
    assert rows[0]["key"] == b"k1 k2" and rows[0]["value"] == b"first"
    assert rows[0]["msgId"] == UNIQ and rows[0]["tags"] == "TagA"
    assert rows[0]["bornTimestamp"] == 1_700_000_000_123_000
    assert rows[0]["storeTimestamp"] == 1_700_000_000_456_000
    assert rows[0]["reconsumeTimes"] == 2
    assert rows[0]["properties"] == {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": UNIQ, "color": "red"}
    assert rows[1]["key"] is None and rows[1]["tags"] is None and rows[1]["value"] == b""
    assert rows[1]["msgId"] == encode_offset_msg_id(V4_STORE, 10911, 1000 + 11 * 200)
    assert rows[1]["properties"] == {}
    assert rows[2]["value"] == b"\x00\xffbin" and rows[2]["key"] == b"only-key"
    assert rows[2]["properties"] == {"KEYS": "only-key", "x\u00e9": "\u00fcml\u00e4ut"}
    assert [r["queueOffset"] for r in rows] == [10, 11, 12]
    assert {r["topic"] for r in rows} == {"orders"} and {r["broker"] for r in rows} == {"broker-a"}
    assert {r["queueId"] for r in rows} == {3}
    assert str(batch.schema.field("bornTimestamp").type) == "timestamp[us, tz=UTC]"


def test_without_properties_the_batch_has_no_map_column():
    body = record(0, b"v", {"TAGS": "A", "user": "1"})
    batch, _ = batch_of(body, props=False)
    assert batch.schema.equals(arrow_schema(False))
    assert rows_of(batch) == expected_rows(decode_records(body), props=False)


def test_property_names_that_end_like_reserved_keys_do_not_confuse_the_lookup():
    props = {"MYKEYS": "wrong", "xTAGS": "wrong", "UNIQ_KEYS": "wrong", "KEYS": "right-key",
             "TAGS": "right-tag"}
    body = record(0, b"v", props) + record(1, b"w", {"MYKEYS": "no", "ATAGS": "no"})
    batch, _ = batch_of(body)
    rows = rows_of(batch)
    assert rows == expected_rows(decode_records(body))
    assert rows[0]["key"] == b"right-key" and rows[0]["tags"] == "right-tag"
    assert rows[1]["key"] is None and rows[1]["tags"] is None


def test_several_pull_responses_accumulate_into_one_batch():
    first = record(0, b"a", {"TAGS": "A"}) + record(1, b"b")
    second = record(2, b"c", {"KEYS": "k"})
    cols = Columns(props=[])
    assert collect(first, cols, NO_END, None) == 2
    assert collect(second, cols, NO_END, None) == 3
    assert len(cols) == 3
    batch = to_batch(cols, "orders", "broker-a", 3)
    assert rows_of(batch) == expected_rows(decode_records(first + second))


# --- bounds and filters ----------------------------------------------------------------------


def test_end_offset_stops_before_the_first_record_at_or_past_it():
    body = b"".join(record(o, f"m{o}".encode()) for o in range(10, 15))
    batch, last = batch_of(body, end=12)
    assert last == 12
    assert batch.column("queueOffset").to_pylist() == [10, 11]
    assert batch.column("value").to_pylist() == [b"m10", b"m11"]


def test_end_offset_past_the_body_takes_everything_and_returns_the_next_offset():
    body = b"".join(record(o) for o in (7, 8, 9))
    batch, last = batch_of(body, end=1000)
    assert last == 10 and batch.num_rows == 3


def test_end_offset_before_the_first_record_takes_nothing_and_returns_minus_one():
    body = b"".join(record(o) for o in (7, 8))
    batch, last = batch_of(body, end=7)
    assert last == -1 and batch.num_rows == 0


def test_empty_body_returns_minus_one():
    batch, last = batch_of(b"")
    assert last == -1 and batch.num_rows == 0


def test_tags_filter_keeps_matching_tags_but_still_advances_the_offset():
    body = b"".join([record(0, b"a", {"TAGS": "A"}), record(1, b"b", {"TAGS": "B"}),
                     record(2, b"n", {}), record(3, b"c", {"TAGS": "C"}),
                     record(4, b"b2", {"TAGS": "B"})])
    batch, last = batch_of(body, tags=frozenset({"A", "C"}))
    assert last == 5  # the filtered-out record at 4 was looked at
    assert batch.column("queueOffset").to_pylist() == [0, 3]
    assert batch.column("tags").to_pylist() == ["A", "C"]
    assert batch.column("value").to_pylist() == [b"a", b"c"]
    assert [dict(p) for p in batch.column("properties").to_pylist()] == [{"TAGS": "A"}, {"TAGS": "C"}]


def test_tags_filter_that_matches_nothing_still_returns_the_next_offset():
    body = record(5, b"x", {"TAGS": "A"}) + record(6, b"y")
    batch, last = batch_of(body, tags=frozenset({"Z"}))
    assert last == 7 and batch.num_rows == 0


# --- compressed bodies and IPv6 hosts --------------------------------------------------------


def test_compressed_body_is_inflated():
    payload = b"compress me " * 100
    body = (record(0, zlib.compress(payload), {"TAGS": "Z"}, sys_flag=SysFlag.COMPRESSED)
            + record(1, b"plain"))
    batch, last = batch_of(body)
    assert last == 2
    assert batch.column("value").to_pylist() == [payload, b"plain"]
    assert rows_of(batch) == expected_rows(decode_records(body))


def test_compressed_body_that_is_not_zlib_raises_codec_error():
    body = record(0, b"not zlib at all", sys_flag=SysFlag.COMPRESSED)
    with pytest.raises(CodecError):
        collect(body, Columns(), NO_END, None)


@pytest.mark.parametrize("born, store", [(V6_BORN, V6_STORE), (V6_BORN, V4_STORE), (V4_BORN, V6_STORE)])
def test_ipv6_host_records_decode(born, store):
    body = b"".join([
        record(0, b"v4-before", {"TAGS": "A"}),
        record(1, b"six", {"TAGS": "T6", "KEYS": "k6", "user": "u"}, born_host=born, store_host=store,
               reconsume=4, born_ts=5, store_ts=6),
        record(2, b"six-no-uniq", {}, born_host=born, store_host=store),
        record(3, b"six-uniq", {"UNIQ_KEY": UNIQ}, born_host=born, store_host=store),
        record(4, b"v4-after", {"KEYS": "k4"}),
    ])
    refs = decode_records(body)
    assert refs[1].sys_flag & (SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6)
    batch, last = batch_of(body)
    assert last == 5
    rows = rows_of(batch)
    assert rows == expected_rows(refs)
    assert rows[1]["value"] == b"six" and rows[1]["key"] == b"k6" and rows[1]["tags"] == "T6"
    assert rows[1]["reconsumeTimes"] == 4 and rows[1]["bornTimestamp"] == 5000
    assert rows[1]["properties"] == {"TAGS": "T6", "KEYS": "k6", "user": "u"}
    assert rows[2]["msgId"] == encode_offset_msg_id(store, 10911, 1000 + 2 * 200)
    assert rows[3]["msgId"] == UNIQ
    assert rows[4]["value"] == b"v4-after"


def test_ipv6_compressed_and_filtered():
    body = (record(0, zlib.compress(b"inflated"), {"TAGS": "A"}, sys_flag=SysFlag.COMPRESSED,
                   born_host=V6_BORN, store_host=V6_STORE)
            + record(1, b"skip", {"TAGS": "B"}, born_host=V6_BORN, store_host=V6_STORE))
    batch, last = batch_of(body, tags=frozenset({"A"}))
    assert last == 2
    assert batch.column("value").to_pylist() == [b"inflated"]


# --- malformed bodies ------------------------------------------------------------------------

VALID = b"".join([record(0, b"a" * 30, {"TAGS": "A", "KEYS": "k"}),
                  record(1, b"b", {"UNIQ_KEY": UNIQ}, born_host=V6_BORN),
                  record(2, b"c" * 5)])


@pytest.mark.parametrize("cut", [1, 50, 87, 88, 100, len(VALID) - 1])
def test_truncated_body_raises_codec_error(cut):
    with pytest.raises(CodecError):
        collect(VALID[:cut], Columns(), NO_END, None)


def test_bad_magic_raises_codec_error():
    bad = bytearray(VALID)
    bad[4:8] = b"\xde\xad\xbe\xef"
    with pytest.raises(CodecError):
        collect(bytes(bad), Columns(), NO_END, None)


@pytest.mark.parametrize("blen", [-5, -1, 32, 10**6])
def test_body_length_that_does_not_fit_the_record_raises_codec_error(blen):
    bad = bytearray(record(0, b"x" * 31, {"TAGS": "A"}))
    struct.pack_into(">i", bad, 84, blen)  # bodyLength of an IPv4 record
    with pytest.raises(CodecError):
        collect(bytes(bad), Columns(), NO_END, None)


def test_topic_length_that_does_not_fit_the_record_raises_codec_error():
    rec = record(0, b"xyz", {"TAGS": "A"})
    bad = bytearray(rec)
    bad[88 + 3] = 200  # topic length byte after the 3-byte body
    with pytest.raises(CodecError):
        collect(bytes(bad), Columns(), NO_END, None)


def _collect_and_batch(data: bytes) -> None:
    cols = Columns(props=[])
    try:
        collect(data, cols, NO_END, None)
        to_batch(cols, "t", "b", 0)
    except CodecError:
        pass


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=400))
def test_random_bytes_raise_only_codec_errors(data):
    _collect_and_batch(data)


@settings(max_examples=300, deadline=None)
@given(edits=st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)),
                      min_size=1, max_size=4),
       cut=st.integers(0, len(VALID)))
def test_corrupted_records_raise_only_codec_errors(edits, cut):
    bad = bytearray(VALID)
    for i, b in edits:
        bad[i] = b
    _collect_and_batch(bytes(bad[:cut]))


# --- collect agrees with the reference decoder -----------------------------------------------

_prop_names = st.sampled_from(["KEYS", "TAGS", "UNIQ_KEY", "MYKEYS", "xTAGS", "UNIQ_KEYS", "a",
                               "k\u00e9"]) | st.text(
    st.characters(exclude_characters="\x01\x02", exclude_categories=["Cs"]), min_size=1, max_size=6)
_prop_values = st.text(st.characters(exclude_characters="\x02", exclude_categories=["Cs"]),
                       min_size=1, max_size=8)


@st.composite
def _records(draw):
    props = draw(st.dictionaries(_prop_names, _prop_values, max_size=5))
    if "UNIQ_KEY" in props:
        props["UNIQ_KEY"] = draw(st.binary(min_size=16, max_size=16)).hex().upper()
    payload = draw(st.binary(max_size=40))
    compressed = draw(st.booleans())
    return dict(
        body=zlib.compress(payload) if compressed else payload,
        props=props,
        sys_flag=SysFlag.COMPRESSED if compressed else 0,
        born_host=draw(st.sampled_from([V4_BORN, V6_BORN])),
        store_host=draw(st.sampled_from([V4_STORE, V6_STORE])),
        born_ts=draw(st.integers(-10**6, 2**43)),
        store_ts=draw(st.integers(0, 2**43)),
        reconsume=draw(st.integers(0, 2**31 - 1)),
    )


@settings(max_examples=150, deadline=None)
@given(recs=st.lists(_records(), max_size=6), first=st.integers(0, 2**40),
       end_delta=st.integers(-1, 8), tags=st.none() | st.frozensets(_prop_values, max_size=3),
       with_props=st.booleans())
def test_collect_agrees_with_the_reference_decoder(recs, first, end_delta, tags, with_props):
    body = b"".join(record(first + i, r.pop("body"), r.pop("props"), **r) for i, r in enumerate(recs))
    refs = decode_records(body)
    end = first + end_delta
    seen = [m for m in refs if m.queue_offset < end]
    kept = [m for m in seen if tags is None or m.tags in tags]
    batch, last = batch_of(body, end=end, tags=tags, props=with_props)
    assert last == (seen[-1].queue_offset + 1 if seen else -1)
    assert batch.schema.equals(arrow_schema(with_props))
    assert rows_of(batch) == expected_rows(kept, props=with_props)
