"""Message codecs: the stored record layout (golden vector from PROTOCOL-REFERENCE A.6), properties,
batches, message ids, tag hashes; round trips and random bytes."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.errors import CodecError
from tidemq.message import (
    MAX_BATCH_MESSAGES,
    MIN_RECORD_SIZE,
    PHYSICAL_OFFSET_POS,
    QUEUE_OFFSET_POS,
    RECORD_FIXED_V4,
    STORE_TIMESTAMP_POS,
    SYS_FLAG_POS,
    SysFlag,
    count_batch,
    decode_batch,
    decode_offset_msg_id,
    decode_properties,
    decode_record,
    decode_record_header,
    decode_records,
    encode_batch,
    encode_offset_msg_id,
    encode_properties,
    encode_record,
    inflate,
    java_hash,
    make_uniq_id,
    pack_host,
    record_fixed,
)

A6 = bytes.fromhex(
    "00000089daa320a73610a686000000000000000000000000000000000000000000000000000000000000018bcfe568"
    "007f0000010000c3500000018bcfe5687b7f00000100002a9f0000000000000000000000000000000568656c6c6f09"
    "546f70696354657374002054414753015461674102434c55535445520144656661756c74436c7573746572"
)
LOCAL = bytes([127, 0, 0, 1])


def _record(**kw) -> bytes:
    base = dict(
        topic=b"TopicTest", body=b"hello",
        properties=encode_properties({"TAGS": "TagA", "CLUSTER": "DefaultCluster"}).encode(),
        queue_id=0, flag=0, queue_offset=0, physical_offset=0, sys_flag=0,
        born_timestamp=1700000000000, born_host=LOCAL, born_port=50000,
        store_timestamp=1700000000123, store_host=LOCAL, store_port=10911,
    )
    base.update(kw)
    return encode_record(**base)


def test_record_matches_the_reference_vector():
    assert _record() == A6
    m = decode_record(A6)
    assert (m.topic, m.body, m.tags, m.store_host, m.born_host) == ("TopicTest", b"hello", "TagA", "127.0.0.1:10911", "127.0.0.1:50000")
    assert m.offset_msg_id == "7F00000100002A9F0000000000000000"
    assert m.body_crc == 907060870 and m.store_size == 137


def test_the_one_record_layout_names_the_reference_vector_fields():
    fields = RECORD_FIXED_V4.unpack_from(A6)
    assert RECORD_FIXED_V4.size == 88 and MIN_RECORD_SIZE == 91
    assert fields == (137, 0xDAA320A7, 907060870, 0, 0, 0, 0, 0, 1700000000000, LOCAL, 50000,
                      1700000000123, LOCAL, 10911, 0, 0, 5)
    raw = _record(queue_offset=7, physical_offset=4096, sys_flag=int(SysFlag.MULTI_TAGS))
    assert struct.unpack_from(">q", raw, QUEUE_OFFSET_POS) == (7,)
    assert struct.unpack_from(">q", raw, PHYSICAL_OFFSET_POS) == (4096,)
    assert struct.unpack_from(">i", raw, SYS_FLAG_POS) == (int(SysFlag.MULTI_TAGS),)
    assert struct.unpack_from(">q", raw, STORE_TIMESTAMP_POS) == (1700000000123,)


def test_ipv6_layouts_move_the_fields_after_each_host():
    v6 = bytes(range(16))
    raw = _record(born_host=v6, store_host=LOCAL)
    fields = record_fixed(True, False).unpack_from(raw)
    assert fields[9:14] == (v6, 50000, 1700000000123, LOCAL, 10911)
    assert record_fixed(True, True).size == RECORD_FIXED_V4.size + 24
    m = decode_record(_record(born_host=LOCAL, store_host=v6))
    assert (m.born_host, m.store_timestamp, m.body) == ("127.0.0.1:50000", 1700000000123, b"hello")
    assert m.store_host.startswith("[") and m.sys_flag & SysFlag.STOREHOST_V6


def test_pack_host_takes_ip_literals_only():
    assert pack_host("127.0.0.1", 1) == (LOCAL, False)
    assert pack_host("::ffff:127.0.0.1", 1) == (LOCAL, False)
    assert pack_host("::1", 1) == (bytes(15) + b"\x01", True)
    # A name used to be looked up here (blocking the event loop) and, when the lookup failed,
    # stored as 0.0.0.0 in the record's store host and offset message id.
    for name in ("localhost", "no-such-broker.invalid", ""):
        with pytest.raises(ValueError, match="not an IP address"):
            pack_host(name, 1)


def test_java_hash_matches_reference_values():
    assert [java_hash(t) for t in ("TagA", "TagB", "TagC", "*", "中文")] == [2598919, 2598920, 2598921, 42, 646394]
    assert java_hash("polygenelubricants") == -2147483648  # wraps like Java's int


def test_properties_accept_java_and_cpp_forms():
    assert decode_properties("a\x01b\x02c\x01d") == {"a": "b", "c": "d"}
    assert decode_properties("a\x01b\x02c\x01d\x02") == {"a": "b", "c": "d"}
    assert decode_properties("a\x01\x02\x01x\x02junk\x02k\x01v") == {"k": "v"}
    assert encode_properties({"a": "b", "c": "d"}) == "a\x01b\x02c\x01d"


def test_offset_message_id_round_trip():
    mid = encode_offset_msg_id(LOCAL, 10911, 123456789)
    assert len(mid) == 32 and mid == mid.upper()
    assert decode_offset_msg_id(mid) == ("127.0.0.1:10911", 123456789)
    with pytest.raises(CodecError):
        decode_offset_msg_id("nothex")


def test_uniq_id_is_32_upper_hex():
    u = make_uniq_id(LOCAL, 1234, b"abcd", 5000, 7)
    assert len(u) == 32 and u == u.upper() and u != make_uniq_id(LOCAL, 1234, b"abcd", 5000, 8)


def test_batch_round_trip_and_compressed_bodies():
    items = [(0, b"one", "TAGS\x01a"), (3, b"two" * 100, "KEYS\x01k1 k2")]
    back = decode_batch(encode_batch(items))
    assert [(b.flag, b.body, b.properties) for b in back] == items
    assert inflate(zlib.compress(b"x" * 10000)) == b"x" * 10000
    with pytest.raises(CodecError):
        inflate(zlib.compress(b"x" * 10000), limit=100)
    with pytest.raises(CodecError):
        decode_batch(b"")


def test_batch_of_the_maximum_is_decoded_and_one_more_is_refused_with_a_reason():
    items = [(0, b"m", "")] * MAX_BATCH_MESSAGES
    assert len(decode_batch(encode_batch(items))) == MAX_BATCH_MESSAGES == 32_767
    with pytest.raises(CodecError, match=r"more than 32767 messages.*smaller batches"):
        decode_batch(encode_batch(items + [(0, b"m", "")]))
    # the body: 65,536 empty elements (1.4 MiB, 56 KB when zlib-compressed)
    with pytest.raises(CodecError, match="more than 32767 messages"):
        decode_batch(memoryview(encode_batch([(0, b"", "")] * 65_536)))


def test_batch_limit_is_a_parameter():
    three = encode_batch([(0, b"a", ""), (0, b"b", "X\x01y"), (0, b"", "")])
    assert len(decode_batch(three, max_messages=3)) == 3
    with pytest.raises(CodecError, match="more than 2 messages"):
        decode_batch(three, max_messages=2)
    with pytest.raises(CodecError, match="more than 1 messages"):
        decode_batch(three, 1)


def test_too_many_messages_are_refused_before_any_is_decoded():
    # The first element's properties are not UTF-8: decoding would stop there with another error,
    # so getting the count error proves the count came first.
    body = encode_batch([(0, b"x", "\u00e9")] + [(0, b"x", "")] * 4)
    bad = bytearray(body)
    bad[20 + 1 + 2] = 0xFF  # head, body "x", properties length: the first properties byte
    with pytest.raises(CodecError, match="not UTF-8"):
        decode_batch(bytes(bad), max_messages=5)
    with pytest.raises(CodecError, match="more than 4 messages"):
        decode_batch(bytes(bad), max_messages=4)


def test_count_batch_stops_after_the_limit_and_at_an_impossible_size():
    body = encode_batch([(0, b"x", "")] * 10)
    assert count_batch(body, 100) == 10
    assert count_batch(body, 3) == 4  # limit + 1 is enough to refuse
    assert count_batch(body[:23] + b"\0\0\0\x05" + body[27:], 100) == 1  # a 5-byte element cannot be


@settings(max_examples=200)
@given(st.lists(st.tuples(st.integers(-2**31, 2**31 - 1), st.binary(max_size=30), st.text(max_size=10)),
                min_size=1, max_size=12), st.integers(1, 12))
def test_batch_decodes_exactly_when_it_fits_the_limit(items, limit):
    body = encode_batch(items)
    if len(items) <= limit:
        assert [(b.flag, b.body, b.properties) for b in decode_batch(body, limit)] == items
    else:
        with pytest.raises(CodecError, match=f"more than {limit} messages"):
            decode_batch(body, limit)


@settings(max_examples=300)
@given(st.binary(max_size=400), st.integers(0, 4))
def test_random_batch_bodies_with_a_small_limit_raise_only_codec_error(data, limit):
    try:
        items = decode_batch(data, limit)
    except CodecError:
        return
    assert 1 <= len(items) <= limit


def test_records_concatenate_and_decompress():
    big = b"abc" * 5000
    two = _record(body=b"plain", physical_offset=0) + _record(body=zlib.compress(big), sys_flag=1, physical_offset=137)
    msgs = decode_records(two)
    assert [m.body for m in msgs] == [b"plain", big]


hosts = st.sampled_from([LOCAL, bytes(16), bytes(range(16))])


@given(
    topic=st.text(st.characters(min_codepoint=48, max_codepoint=122), min_size=1, max_size=100),
    body=st.binary(max_size=500),
    props=st.dictionaries(st.text("abcXYZ_", min_size=1, max_size=8), st.text("xyz012 ", min_size=1, max_size=20), max_size=5),
    qid=st.integers(0, 2**31 - 1),
    qoff=st.integers(0, 2**62),
    born=hosts,
    store=hosts,
    reconsume=st.integers(0, 100),
)
def test_record_round_trip(topic, body, props, qid, qoff, born, store, reconsume):
    raw = _record(topic=topic.encode(), body=body, properties=encode_properties(props).encode(), queue_id=qid,
                  queue_offset=qoff, born_host=born, store_host=store, reconsume_times=reconsume)
    m = decode_record(raw)
    assert (m.topic, m.body, m.properties, m.queue_id, m.queue_offset, m.reconsume_times) == (topic, body, props, qid, qoff, reconsume)
    assert m.store_size == len(raw)
    h = decode_record_header(raw)
    assert raw[h.body_start : h.body_start + h.body_length] == body


@settings(max_examples=300)
@given(st.binary(max_size=400))
def test_random_bytes_raise_only_codec_error(data):
    for fn in (decode_record, decode_records, decode_batch, decode_properties):
        try:
            fn(data)
        except CodecError:
            pass


@settings(max_examples=200)
@given(st.integers(0, 136), st.binary(min_size=1, max_size=8))
def test_corrupted_vector_raises_only_codec_error(pos, junk):
    data = bytearray(A6)
    data[pos : pos + len(junk)] = junk
    try:
        decode_record(bytes(data))
    except CodecError:
        pass


def test_decoded_compressed_records_keep_the_stored_sys_flag():
    """As RocketMQ's MessageDecoder: the body is inflated, the sysFlag reported as stored (the
    admin tool shows "System Flag: 1" for a compressed message); the single-record decoder the
    broker re-stores from keeps the body compressed, so body and flag stay consistent there."""
    big = b"abc" * 5000
    stored = zlib.compress(big)
    flags = int(SysFlag.COMPRESSED | SysFlag.MULTI_TAGS)
    rec = _record(body=stored, sys_flag=flags)
    [m] = decode_records(rec)
    assert m.body == big and m.sys_flag == flags
    [raw] = decode_records(rec, decompress=False)
    assert raw.body == stored and raw.sys_flag == flags
    one = decode_record(rec)
    assert one.body == stored and one.sys_flag == flags
