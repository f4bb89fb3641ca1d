"""The compiled Spark decoder (spark/_arrow_c.pyx) against its pure-Python twin in
tidemq.spark.arrow: for any pull body, well-formed or hostile, both give equal Arrow batches and
the same returned offset, or the same error (type and message).

tests/spark/test_arrow.py checks whichever twin runs against the reference message decoder; this
module runs both twins side by side, so it needs the extension (skipped, with the reason, in a
``TIDEMQ_NO_EXTENSIONS=1`` run or where it was not built).
"""

from __future__ import annotations

import re
import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from tests.spark.test_arrow import (  # noqa: E402
    NO_END,
    UNIQ,
    V4_BORN,
    V4_STORE,
    V6_BORN,
    V6_STORE,
    VALID,
    _records,
    record,
    rows_of,
)
from tidemq.message import (  # noqa: E402
    MESSAGE_MAGIC,
    MIN_RECORD_SIZE,
    PHYSICAL_OFFSET_POS,
    QUEUE_OFFSET_POS,
    RECORD_FIXED_V4,
    STORE_TIMESTAMP_POS,
    SYS_FLAG_POS,
    SysFlag,
)
from tidemq.spark import arrow  # noqa: E402

pytestmark = pytest.mark.skipif(
    arrow._c is None, reason="the compiled decoder tidemq.spark._arrow_c is not loaded "
    "(TIDEMQ_NO_EXTENSIONS is set, or the extension is not built): nothing to compare")

CORPUS = Path(__file__).resolve().parents[1] / "fuzz" / "corpus" / "record"


def _twin(compiled: bool, parts: list[bytes], end: int, tags: frozenset[str] | None,
          props: bool) -> tuple:
    """Collect ``parts`` into one Columns and make the batch with one twin: ("ok", offsets
    returned, batch) or ("error", type, message, offsets returned before it)."""
    if compiled:
        columns, collect, to_batch = arrow._c.Columns, arrow._c.collect, arrow._to_batch_c
    else:
        columns, collect, to_batch = arrow._ColumnsPy, arrow._collect_py, arrow._to_batch_py
    cols = columns(props=[] if props else None)
    lasts = []
    try:
        for part in parts:
            lasts.append(collect(part, cols, end, tags))
        batch = to_batch(cols, "orders", "broker-a", 3)
    except Exception as exc:  # noqa: BLE001 (the very thing compared)
        return ("error", type(exc), str(exc), lasts)
    return ("ok", lasts, batch)


def assert_twins_agree(parts: list[bytes], end: int = NO_END, tags: frozenset[str] | None = None,
                       props: bool = True) -> tuple:
    py = _twin(False, parts, end, tags, props)
    c = _twin(True, parts, end, tags, props)
    if py[0] == "error" or c[0] == "error":
        assert c == py
        return c
    assert c[1] == py[1]
    batch_c, batch_py = c[2], py[2]
    batch_c.validate(full=True)  # the compiled buffers are well-formed Arrow data
    assert batch_c.schema.equals(batch_py.schema)
    assert rows_of(batch_c) == rows_of(batch_py)  # timestamps as integers: any int64 is allowed
    assert batch_c.equals(batch_py)
    return c


def test_layout_constants_are_tidemq_messages():
    layout = arrow._c.LAYOUT
    assert layout["fixed_size"] == RECORD_FIXED_V4.size
    assert layout["min_record_size"] == MIN_RECORD_SIZE
    assert layout["message_magic"] == MESSAGE_MAGIC
    assert layout["queue_offset"] == QUEUE_OFFSET_POS
    assert layout["physical_offset"] == PHYSICAL_OFFSET_POS
    assert layout["sys_flag"] == SYS_FLAG_POS
    assert layout["store_timestamp"] == STORE_TIMESTAMP_POS
    # the rest from the format's fields: TOTALSIZE MAGICCODE ... BORNTIMESTAMP(8th) BORNHOST
    # BORNPORT STORETIMESTAMP STOREHOST(12th) STOREPORT RECONSUMETIMES(14th) PREPARED BODYLENGTH
    codes = re.findall(r"\d*[a-zA-Z]", RECORD_FIXED_V4.format)
    assert len(codes) == 17
    at = {name: struct.calcsize(">" + "".join(codes[:i])) for name, i in (
        ("magic", 1), ("born_timestamp", 8), ("store_host", 12), ("reconsume_times", 14),
        ("body_length", 16))}
    assert {k: layout[k] for k in at} == at
    assert layout["v6_hosts"] == SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6
    assert layout["compressed"] == SysFlag.COMPRESSED


def test_every_column_agrees_on_a_typical_body():
    body = b"".join([
        record(10, b"first", {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": UNIQ, "c": "red"}, reconsume=2),
        record(11, b"", {}),
        record(12, b"\x00\xffbin", {"KEYS": "only-key", "x\u00e9": "\u00fcml\u00e4ut"}, born_ts=0),
        record(13, zlib.compress(b"z" * 500), {"TAGS": "Z"}, sys_flag=SysFlag.COMPRESSED),
        record(14, b"six", {"TAGS": "T6"}, born_host=V6_BORN, store_host=V6_STORE),
    ])
    for props in (True, False):
        kind, lasts, batch = assert_twins_agree([body], props=props)
        assert lasts == [15] and batch.num_rows == 5


@pytest.mark.parametrize("blob", [
    b"KEYS\x01a\x02KEYS\x01b\x02TAGS\x01t",  # a repeated name keeps its first place, last value
    b"\x02\x02KEYS\x01\x02TAGS\x01",  # empty values: no map entry, but b"" as key and tag
    b"\x01v\x02n\x01\x02\x01\x02x\x01y\x01z\x02",  # no name, no value, a value holding \x01
    b"TAGS\x01\xff\xfe",  # a tag (and properties) that are not UTF-8
    b"KEYS\x01\xed\xa0\x80",  # an encoded surrogate: not UTF-8 for Python
    b"UNIQ_KEY\x01\xf4\x90\x80\x80",  # past U+10FFFF
    b"UNIQ_KEY\x01\xc0\xaf",  # overlong
    b"UNIQ_KEY\x01\xe2\x82",  # truncated sequence
    b"UNIQ_KEY\x01\x02TAGS\x01\xf0\x9f\x98\x80",  # an empty msg id; a 4-byte character
    b"MYKEYS\x01x\x02xTAGS\x01y",
])
def test_property_blobs_with_edge_cases_agree(blob):
    rec = bytearray(record(0, b"v", {}))
    rec[-2:] = struct.pack(">h", len(blob))
    total = len(rec) + len(blob)
    rec[0:4] = struct.pack(">i", total)
    body = bytes(rec) + blob
    for props in (True, False):
        assert_twins_agree([body, record(1, b"w", {"TAGS": "B"})], props=props)
        assert_twins_agree([body], props=props, tags=frozenset({"t", "B"}))


def test_batches_already_made_do_not_change_when_the_columns_grow():
    cols = arrow._c.Columns(props=[])
    arrow._c.collect(record(0, b"a" * 10, {"TAGS": "A", "KEYS": "k"}), cols, NO_END, None)
    first = arrow._to_batch_c(cols, "orders", "broker-a", 3)
    snapshot = first.to_pylist()
    arrow._c.collect(record(1, b"b" * 5000, {"KEYS": "k2"}), cols, NO_END, None)
    second = arrow._to_batch_c(cols, "orders", "broker-a", 3)
    assert first.to_pylist() == snapshot
    assert second.num_rows == 2 and second.slice(0, 1).to_pylist() == snapshot


def test_several_pull_bodies_agree_row_for_row():
    parts = [b"".join(record(o, bytes([o]) * o, {"TAGS": f"T{o % 3}", "KEYS": f"k{o}"})
                      for o in range(s, s + 40)) for s in (0, 40, 80)]
    assert_twins_agree(parts)
    assert_twins_agree(parts, end=95, tags=frozenset({"T1"}))


@pytest.mark.parametrize("end", [-(2**70), -1, 0, 5, 2**63 - 1, 2**63, 2**80])
def test_end_offsets_beyond_int64_agree(end):
    body = record(2**63 - 1, b"last", {}, physical=0) if end >= 2**63 - 1 else record(3, b"x", {})
    assert_twins_agree([body], end=end)


# -- hostile bodies ---------------------------------------------------------------------------


@pytest.mark.parametrize("cut", [0, 1, 50, 87, 88, 89, 90, 100, len(VALID) - 1])
def test_truncated_bodies_give_the_same_error(cut):
    kind, *_ = assert_twins_agree([VALID[:cut]])
    assert kind == ("ok" if cut == 0 else "error")


def test_bad_magic_gives_the_same_error():
    bad = bytearray(VALID)
    bad[4:8] = b"\xde\xad\xbe\xef"
    assert assert_twins_agree([bytes(bad)])[0] == "error"


@pytest.mark.parametrize("field_at, value", [(84, -5), (84, 32), (84, 10**6), (0, 10), (0, 2**31 - 1),
                                             (0, -1), (36, SysFlag.COMPRESSED)])
def test_bad_lengths_and_flags_give_the_same_error(field_at, value):
    bad = bytearray(record(0, b"x" * 31, {"TAGS": "A"}))
    struct.pack_into(">i", bad, field_at, value)
    assert assert_twins_agree([bytes(bad)])[0] == "error"


def test_the_fuzz_corpus_of_records_agrees():
    files = sorted(CORPUS.iterdir())
    assert files, f"no corpus in {CORPUS}"
    for path in files:
        assert_twins_agree([path.read_bytes()])


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(data=st.binary(max_size=600))
def test_random_bytes_agree(data):
    assert_twins_agree([data])


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(edits=st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)),
                      min_size=1, max_size=5),
       cut=st.integers(0, len(VALID)), props=st.booleans())
def test_corrupted_bodies_agree(edits, cut, props):
    bad = bytearray(VALID)
    for i, b in edits:
        bad[i] = b
    assert_twins_agree([bytes(bad[:cut])], props=props)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(recs=st.lists(_records(), max_size=8), first=st.integers(0, 2**40),
       end_delta=st.integers(-1, 9), tags=st.none() | st.frozensets(st.sampled_from(["A", "B", "T6"]) | st.text(max_size=3), max_size=3),
       with_props=st.booleans(), split=st.integers(0, 8))
def test_well_formed_bodies_agree(recs, first, end_delta, tags, with_props, split):
    encoded = [record(first + i, r.pop("body"), r.pop("props"), **r) for i, r in enumerate(recs)]
    parts = [b"".join(encoded[:split]), b"".join(encoded[split:])]
    assert_twins_agree(parts, end=first + end_delta, tags=tags, props=with_props)


def test_hosts_of_both_families_agree():
    body = b"".join(record(i, b"h", {"UNIQ_KEY": UNIQ} if i % 2 else {}, born_host=born, store_host=store)
                    for i, (born, store) in enumerate([(V4_BORN, V4_STORE), (V6_BORN, V4_STORE),
                                                       (V4_BORN, V6_STORE), (V6_BORN, V6_STORE)]))
    assert assert_twins_agree([body])[0] == "ok"
