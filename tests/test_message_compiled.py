"""The compiled message codecs (tidemq/_message_c.pyx) against their pure-Python twins in
tidemq.message: ``decode_records`` gives equal messages (every field, lazy ones included) or the
same error, ``encode_batch`` the same bytes, ``encode_properties`` the same text and
``decode_properties`` the same dict, or the same error, on any input, hostile input and the fuzz
corpora included.

Needs the extension: skipped, with the reason, in a ``TIDEMQ_NO_EXTENSIONS=1`` run or where it
was not built (the rest of the suite then tests the Python twins alone).
"""

from __future__ import annotations

import re
import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemq import message
from tidemq.message import (
    BLANK_MAGIC,
    MAX_PROPERTIES_LENGTH,
    MESSAGE_MAGIC,
    MIN_RECORD_SIZE,
    RECORD_FIXED_V4,
    SysFlag,
    decode_batch,
    encode_properties,
    encode_record,
)

pytestmark = pytest.mark.skipif(
    message._c is None, reason="the compiled codecs tidemq._message_c are not loaded "
    "(TIDEMQ_NO_EXTENSIONS is set, or the extension is not built): nothing to compare")

CORPUS = Path(__file__).resolve().parent / "fuzz" / "corpus"
V4, V6 = b"\x0a\x00\x00\x07", bytes.fromhex("20010db8000000000000000000000001")
V4_STORE = b"\xc0\xa8\x01\x14"


def _outcome(fn, *args, **kwargs) -> tuple:
    try:
        return ("ok", fn(*args, **kwargs))
    except Exception as exc:  # noqa: BLE001 (the very thing compared)
        return ("error", type(exc), str(exc))


def _fields(m: message.MessageExt) -> tuple:
    return m._values() + (m.tags, m.keys, m.msg_id, type(m.body), type(m.properties))


def assert_decoders_agree(data: bytes | bytearray | memoryview, **kwargs) -> tuple:
    py = _outcome(message._decode_records_py, data, **kwargs)
    c = _outcome(message._c.decode_records, data, **kwargs)
    if py[0] == "ok" and c[0] == "ok":
        assert [_fields(m) for m in c[1]] == [_fields(m) for m in py[1]]
        assert c[1] == py[1]
    else:
        assert c == py
    return c


def assert_encoders_agree(items) -> tuple:
    """``items``, or a function making them (an iterator is used up by the first twin)."""
    make = items if callable(items) else lambda: items
    py = _outcome(message._encode_batch_py, make())
    c = _outcome(message._c.encode_batch, make())
    assert c == py
    return c


def rec(offset: int = 0, body: bytes = b"hello", props: dict[str, str] | None = None, *,
        topic: bytes = b"orders", born: bytes = V4, store: bytes = V4_STORE, sys_flag: int = 0,
        **kw) -> bytes:
    return encode_record(topic=topic, body=body, properties=encode_properties(props or {}).encode(),
                         queue_id=kw.get("queue_id", 3), flag=kw.get("flag", 0), queue_offset=offset,
                         physical_offset=kw.get("physical", 1000 + offset), sys_flag=sys_flag,
                         born_timestamp=kw.get("born_ts", 1_700_000_000_123), born_host=born,
                         born_port=kw.get("born_port", 50123), store_timestamp=kw.get("store_ts", 5),
                         store_host=store, store_port=10911, reconsume_times=kw.get("reconsume", 0),
                         prepared_transaction_offset=kw.get("prepared", 0))


def test_layout_constants_are_tidemq_messages():
    layout = message._c.LAYOUT
    codes = re.findall(r"\d*[a-zA-Z]", RECORD_FIXED_V4.format)
    names = ["total", "magic", "body_crc", "queue_id", "flag", "queue_offset", "physical_offset",
             "sys_flag", "born_timestamp", "born_host", "born_port", "store_timestamp", "store_host",
             "store_port", "reconsume_times", "prepared_transaction_offset", "body_length"]
    assert len(codes) == len(names)
    at = {name: struct.calcsize(">" + "".join(codes[:i])) for i, name in enumerate(names)}
    assert {k: layout[k] for k in names[2:]} == {k: at[k] for k in names[2:]}
    assert layout["fixed_size"] == RECORD_FIXED_V4.size
    assert layout["min_record_size"] == MIN_RECORD_SIZE
    assert layout["message_magic"] == MESSAGE_MAGIC
    assert layout["v6_hosts"] == SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6
    assert layout["compressed"] == SysFlag.COMPRESSED
    assert layout["max_properties_length"] == MAX_PROPERTIES_LENGTH


def test_the_compiled_twins_are_the_ones_that_run():
    assert message.decode_records is message._c.decode_records
    assert message.encode_batch is message._c.encode_batch
    assert message.encode_properties is message._c.encode_properties
    assert message.decode_properties is message._c.decode_properties


# -- decode_records ------------------------------------------------------------------------------


def test_a_typical_pull_body_decodes_alike_with_and_without_extra_properties():
    body = b"".join([
        rec(0, b"a" * 1024, {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "AB" * 16, "WAIT": "true"}),
        rec(1, b"", {}, topic=b"other", flag=-7, reconsume=3, prepared=2**40),
        rec(2, zlib.compress(b"z" * 300), {"TAGS": "Z"}, sys_flag=SysFlag.COMPRESSED),
        rec(3, b"v6", {"TAGS": "B"}, born=V6),
        rec(4, b"back", {"x\u00e9": "\u00fc"}, topic="t\u00e9".encode(), born_port=-1),
        rec(5, b"hosts", {}, born=b"\x01\x02\x03\x04", store=b"\x05\x06\x07\x08"),
    ])
    for kwargs in ({}, {"decompress": False},
                   {"extra_properties": {"MIN_OFFSET": "0", "MAX_OFFSET": "99"}}):
        kind, msgs = assert_decoders_agree(body, **kwargs)
        assert kind == "ok" and len(msgs) == 6
    assert assert_decoders_agree(bytearray(body))[0] == "ok"
    assert assert_decoders_agree(memoryview(body))[0] == "ok"


@pytest.mark.parametrize("mutate", [
    lambda r: r[:50], lambda r: r[:MIN_RECORD_SIZE], lambda r: r[:-1], lambda r: r + b"\x00",
    lambda r: r[:4] + struct.pack(">I", BLANK_MAGIC) + r[8:],
    lambda r: struct.pack(">i", 10) + r[4:], lambda r: struct.pack(">i", -1) + r[4:],
    lambda r: struct.pack(">i", 2**31 - 1) + r[4:],
    lambda r: r[:84] + struct.pack(">i", -5) + r[88:],
    lambda r: r[:84] + struct.pack(">i", 10**6) + r[88:],
    lambda r: r[:88 + 5] + b"\xc8" + r[94:],  # topic length 200
    lambda r: r[:88 + 5] + b"\x7f" + r[94:],  # topic length past the record
    lambda r: r[:36] + struct.pack(">i", SysFlag.BORNHOST_V6) + r[40:],
    lambda r: r[:36] + struct.pack(">i", SysFlag.COMPRESSED) + r[40:],  # not zlib
    lambda r: r.replace(b"orders", b"ord\xffrs"),  # topic not UTF-8
    lambda r: r.replace(b"TagA", b"Ta\xed\xa0\x80"[:4]),  # properties not UTF-8
    lambda r: r[:-3] + b"\xed\xa0\x80",  # an encoded surrogate
])
def test_hostile_records_give_the_same_messages_or_error(mutate):
    good = rec(0, b"hello", {"TAGS": "TagA", "KEYS": "k"})
    assert_decoders_agree(mutate(good))
    assert_decoders_agree(good + mutate(good) + good)


def test_the_fuzz_corpus_of_records_decodes_alike():
    files = sorted((CORPUS / "record").iterdir())
    assert files
    for path in files:
        assert_decoders_agree(path.read_bytes())
        assert_decoders_agree(path.read_bytes(), decompress=False, extra_properties={"A": "1"})


_texts = st.text(st.characters(exclude_characters="\x01\x02", exclude_categories=["Cs"]), min_size=1,
                 max_size=6)


@st.composite
def _bodies(draw):
    parts = []
    for i in range(draw(st.integers(0, 6))):
        payload = draw(st.binary(max_size=64))
        compressed = draw(st.booleans())
        parts.append(rec(
            draw(st.integers(0, 2**62)), zlib.compress(payload) if compressed else payload,
            draw(st.dictionaries(st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY"]) | _texts, _texts, max_size=4)),
            topic=draw(st.sampled_from([b"T", b"orders", "t\u00e9".encode()])),
            born=draw(st.sampled_from([V4, V6, b"\x7f\x00\x00\x01"])),
            store=draw(st.sampled_from([V4_STORE, V6])),
            sys_flag=SysFlag.COMPRESSED if compressed else draw(st.sampled_from([0, 4, 8, 0xC])),
            queue_id=draw(st.integers(-2**31, 2**31 - 1)), flag=draw(st.integers(-2**31, 2**31 - 1)),
            physical=draw(st.integers(-2**63, 2**63 - 1)), born_ts=draw(st.integers(-2**63, 2**63 - 1)),
            born_port=draw(st.integers(-2**31, 2**31 - 1)), reconsume=draw(st.integers(-2**31, 2**31 - 1)),
            prepared=draw(st.integers(-2**63, 2**63 - 1))))
    return b"".join(parts)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=_bodies(), decompress=st.booleans(),
       extra=st.none() | st.dictionaries(_texts, _texts, max_size=2))
def test_well_formed_bodies_decode_alike(body, decompress, extra):
    assert assert_decoders_agree(body, decompress=decompress, extra_properties=extra)[0] == "ok"


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(body=_bodies(), edits=st.lists(st.tuples(st.integers(0, 10**4), st.integers(0, 255)), max_size=4),
       cut=st.integers(0, 10**4))
def test_corrupted_bodies_decode_alike(body, edits, cut):
    bad = bytearray(body)
    for i, b in edits:
        if bad:
            bad[i % len(bad)] = b
    assert_decoders_agree(bytes(bad[:cut]))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(data=st.binary(max_size=600))
def test_random_bytes_decode_alike(data):
    assert_decoders_agree(data)


# -- encode_batch --------------------------------------------------------------------------------


def test_a_typical_batch_encodes_to_the_same_bytes():
    items = [(0, b"a" * 1024, "UNIQ_KEY\x01" + "AB" * 16 + "\x02WAIT\x01true\x02TAGS\x01TagA"),
             (-1, b"", ""), (2**31 - 1, b"\x00\xff", "k\u00e9\x01\u00fc\U0001f600")]
    kind, body = assert_encoders_agree(items)
    assert kind == "ok" and [(i.flag, i.body, i.properties) for i in decode_batch(body)] == items
    assert assert_encoders_agree([]) == ("ok", b"")


@pytest.mark.parametrize("items", [
    [(2**31, b"x", "")], [(-2**31 - 1, b"x", "")], [(True, b"x", "p")],  # flags out of range, a bool
    [(0, bytearray(b"x"), "")], [(0, memoryview(b"xy"), "a\x01b")],  # other buffers
    [(0, b"x", "\ud800")],  # a lone surrogate
    [(0, b"x", "p" * (MAX_PROPERTIES_LENGTH + 1))], [(0, b"x", "\u00e9" * 16384)],  # too long
    [(0, b"x")], [(0, b"x", "", 1)], [[0, b"x", "p"]], [(0, "text", "p")], [(0, b"x", b"p")],
    [(0.5, b"x", "")], [None], ((0, b"x", "p"),), lambda: iter([(0, b"y", "q")]), [(0, None, "p")],
])
def test_unusual_batches_give_the_same_bytes_or_error(items):
    assert_encoders_agree(items)


def test_the_fuzz_corpus_of_batches_encodes_alike():
    files = sorted((CORPUS / "batch").iterdir())
    assert files
    for path in files:
        try:
            items = decode_batch(path.read_bytes())
        except Exception:  # noqa: BLE001 (a crash input of the decoder: nothing to encode)
            continue
        kind, body = assert_encoders_agree([(i.flag, i.body, i.properties) for i in items])
        assert body == path.read_bytes()


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.integers(-2**31 - 2, 2**31 + 1), st.binary(max_size=64),
                          st.text(max_size=20)), max_size=8))
def test_random_batches_encode_alike(items):
    assert_encoders_agree(items)


# -- encode_properties ---------------------------------------------------------------------------


def assert_property_encoders_agree(props) -> tuple:
    py = _outcome(message._encode_properties_py, props)
    c = _outcome(message._c.encode_properties, props)
    assert c == py
    if c[0] == "ok":
        assert type(c[1]) is str
    return c


class _Text(str):
    def __format__(self, spec: str) -> str:
        return "formatted"


@pytest.mark.parametrize("props", [
    {}, {"": "v"}, {"k": ""}, {"": ""}, {"TAGS": "a", "": "x", "KEYS": "", "UNIQ_KEY": "u"},
    {"k\u00e9": "\U0001f600", "a": "\u0100"}, {"k": "\ud800"},  # wide characters, a lone surrogate
    {"k": 1}, {1: "v"}, {0: "v"}, {"k": None}, {"k": _Text("v")}, {_Text("k"): "v"},
    __import__("collections").OrderedDict([("a", "b")]), [("a", "b")], None,
])
def test_unusual_properties_encode_alike(props):
    assert_property_encoders_agree(props)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=8))
def test_random_properties_encode_alike(props):
    assert_property_encoders_agree(props)


# -- decode_properties ---------------------------------------------------------------------------


def assert_property_decoders_agree(data) -> tuple:
    py = _outcome(message._decode_properties_py, data)
    c = _outcome(message._c.decode_properties, data)
    assert c == py
    if c[0] == "ok":
        assert list(c[1].items()) == list(py[1].items())  # the same order too
        assert all(type(k) is str and type(v) is str for k, v in c[1].items())
    return c


@pytest.mark.parametrize("data", [
    "", "\x02", "\x01", "\x01\x02", "a\x01b", "a\x01b\x02", "\x02a\x01b\x02\x02",
    "a\x01b\x02a\x01c\x02d\x01e\x02a\x01f",  # a repeated name: first place, last value
    "a\x01\x02\x01b\x02c", "a\x01b\x01c\x02d\x01\x01",  # empty parts; values holding \x01
    "k\u00e9\x01\U0001f600\x02\u0100\x01x", "k\x01\ud800",  # wide characters, a lone surrogate
    b"", b"a\x01b\x02c\x01d", b"a\x01\xff", b"a\x01\xed\xa0\x80", b"\xc0\xaf\x01x", b"a\x01\xe2\x82",
    bytearray(b"a\x01b"), memoryview(b"a\x01b"), bytearray(b"\xff"), 3, None, ["a"],
    type("Text", (str,), {"split": lambda self, sep: ["x\x01y"]})("a\x01b"),
])
def test_unusual_property_texts_decode_alike(data):
    assert_property_decoders_agree(data)


def test_the_fuzz_corpus_of_properties_decodes_alike():
    files = sorted((CORPUS / "properties").iterdir())
    assert files
    for path in files:
        raw = path.read_bytes()
        assert_property_decoders_agree(raw)
        assert_property_decoders_agree(raw.decode("utf-8", "replace"))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.text(st.sampled_from("ab\x01\x02\u00e9\U0001f600"), max_size=24)
       | st.binary(max_size=24) | st.text(max_size=24))
def test_random_property_texts_decode_alike(data):
    assert_property_decoders_agree(data)
    if isinstance(data, str):
        assert_property_decoders_agree(data.encode("utf-8", "surrogatepass"))
