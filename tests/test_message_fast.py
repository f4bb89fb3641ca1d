"""The fast pull-body decoder (decode_records) agrees with the per-record reference decoder, and
lazy MessageExt properties behave like eager ones."""

from __future__ import annotations

import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.message import decode_record, decode_records, encode_properties, encode_record

hosts = st.sampled_from([b"\x7f\x00\x00\x01", b"\x00" * 15 + b"\x01"])
texts = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
                min_size=1, max_size=8)


@st.composite
def records(draw):
    n = draw(st.integers(1, 5))
    out = []
    for i in range(n):
        props = draw(st.dictionaries(texts, texts, max_size=4))
        out.append(encode_record(
            topic=draw(st.sampled_from([b"T", b"topic-x"])), body=draw(st.binary(max_size=64)),
            properties=encode_properties(props).encode(), queue_id=draw(st.integers(0, 7)), flag=0,
            queue_offset=i, physical_offset=draw(st.integers(0, 2**40)), sys_flag=0,
            born_timestamp=draw(st.integers(0, 2**41)), born_host=draw(hosts), born_port=1234,
            store_timestamp=draw(st.integers(0, 2**41)), store_host=draw(hosts), store_port=10911,
            reconsume_times=draw(st.integers(0, 16))))
    return out


def _same(a, b) -> None:
    for name in ("topic", "body", "queue_id", "queue_offset", "commit_log_offset", "store_size",
                 "sys_flag", "born_timestamp", "born_host", "store_timestamp", "store_host",
                 "reconsume_times", "properties", "offset_msg_id"):
        assert getattr(a, name) == getattr(b, name), name


@settings(max_examples=60, deadline=None)
@given(records())
def test_decode_records_matches_decode_record(recs):
    body = b"".join(recs)
    fast = decode_records(body)
    pos = 0
    for m in fast:
        ref = decode_record(body, pos)
        _same(m, ref)
        pos += ref.store_size
    assert pos == len(body) and len(fast) == len(recs)


def test_lazy_message_pickles_and_compares_like_an_eager_one():
    rec = encode_record(topic=b"T", body=b"hello", properties=encode_properties({"TAGS": "a", "k": "v"}).encode(),
                        queue_id=1, flag=0, queue_offset=3, physical_offset=99, sys_flag=0,
                        born_timestamp=1, born_host=b"\x7f\x00\x00\x01", born_port=1,
                        store_timestamp=2, store_host=b"\x7f\x00\x00\x01", store_port=10911)
    lazy = decode_records(rec)[0]
    eager = decode_record(rec)
    assert lazy == eager and lazy.tags == "a" and lazy.properties["k"] == "v"
    copy = pickle.loads(pickle.dumps(lazy))
    assert copy == eager and copy.properties == eager.properties
