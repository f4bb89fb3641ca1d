"""Pull-response bodies to Arrow record batches, and the read schema they must match.

The read schema is Spark's Kafka source's, in RocketMQ's words (``partition``/``offset``/
``timestamp`` become ``queueId``/``queueOffset``/``storeTimestamp``)::

    key binary, value binary, topic string, broker string, queueId int, queueOffset bigint,
    msgId string, tags string, bornTimestamp timestamp, storeTimestamp timestamp,
    reconsumeTimes int [, properties map<string,string>]

Spark passes Arrow batches through only when their schema *equals* the Spark schema's Arrow form
(``to_arrow_schema(..., timezone="UTC")``), so :func:`arrow_schema` is checked against it in tests.

The decoder is the source's hot path (guarded by bench/spark_read.py): no per-message
``MessageExt`` or property dict (only KEYS, TAGS and UNIQ_KEY are looked up in the raw property
bytes). It has two twins with the same results and errors: the compiled one (``spark/_arrow_c.pyx``,
issue 19) writes every row straight into Arrow column buffers; the pure-Python one here
(``_ColumnsPy``/``_collect_py``/``_to_batch_py``, the reference and the fallback when the
extension is not built or ``TIDEMQ_NO_EXTENSIONS`` is set) does one struct unpack per record and
builds the ``value`` column from one joined buffer and an offsets array. ``Columns``, ``collect``
and ``to_batch`` are whichever twin runs.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tidemq import compiled
from tidemq.errors import CodecError
from tidemq.message import (
    MESSAGE_MAGIC,
    MIN_RECORD_SIZE,
    RECORD_FIXED_V4,
    SysFlag,
    decode_properties,
    encode_offset_msg_id,
    inflate,
)

_FIELDS = [
    ("key", BinaryType(), pa.binary()),
    ("value", BinaryType(), pa.binary()),
    ("topic", StringType(), pa.string()),
    ("broker", StringType(), pa.string()),
    ("queueId", IntegerType(), pa.int32()),
    ("queueOffset", LongType(), pa.int64()),
    ("msgId", StringType(), pa.string()),
    ("tags", StringType(), pa.string()),
    ("bornTimestamp", TimestampType(), pa.timestamp("us", tz="UTC")),
    ("storeTimestamp", TimestampType(), pa.timestamp("us", tz="UTC")),
    ("reconsumeTimes", IntegerType(), pa.int32()),
]
_PROPS_ARROW = pa.map_(pa.string(), pa.string())


def spark_schema(include_properties: bool = False) -> StructType:
    fields = [StructField(name, t, True) for name, t, _ in _FIELDS]
    if include_properties:
        fields.append(StructField("properties", MapType(StringType(), StringType(), True), True))
    return StructType(fields)


def arrow_schema(include_properties: bool = False) -> pa.Schema:
    fields = [pa.field(name, t) for name, _, t in _FIELDS]
    if include_properties:
        fields.append(pa.field("properties", _PROPS_ARROW))
    return pa.schema(fields)


# Records are decoded with tidemq.message's layout: RECORD_FIXED_V4 is the fixed part with IPv4
# hosts, TOTALSIZE through BODYLENGTH; IPv6 hosts (rare) go through decode_record.
_FIXED_SIZE = RECORD_FIXED_V4.size
_V6 = int(SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6)  # plain ints: IntFlag & costs ~1 us
_COMPRESSED = int(SysFlag.COMPRESSED)


@dataclass(slots=True)
class _ColumnsPy:
    """Column values collected from one or more pull responses of one queue (Python twin)."""

    keys: list[bytes | None] = field(default_factory=list)
    bodies: list[bytes | memoryview] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    msg_ids: list[bytes] = field(default_factory=list)  # UTF-8, cast to strings per batch
    tags: list[bytes | None] = field(default_factory=list)
    born: list[int] = field(default_factory=list)
    stored: list[int] = field(default_factory=list)
    reconsume: list[int] = field(default_factory=list)
    props: list[bytes] | None = None

    def __len__(self) -> int:
        return len(self.offsets)


def _prop(props: bytes, key: bytes) -> bytes | None:
    """The raw value of property ``key`` (given as b"NAME\\x01") in a property blob, or None."""
    if props.startswith(key):
        i = len(key)
    else:
        i = props.find(b"\x02" + key)
        if i < 0:
            return None
        i += len(key) + 1
    j = props.find(b"\x02", i)
    return props[i:] if j < 0 else props[i:j]


_KEYS, _TAGS, _UNIQ = b"KEYS\x01", b"TAGS\x01", b"UNIQ_KEY\x01"


def _v6_record(body: bytes, pos: int) -> tuple[bytes, bytes, int, int, int, str]:
    """The fields a row takes from a record with an IPv6 host (rare: every field after the host
    moves), through the reference decoder: body (as stored), raw properties, reconsume times,
    store and born timestamps, offset message id. Both twins use it."""
    from tidemq.message import decode_record
    m = decode_record(body, pos)
    return (m.body, _encode_props(m.properties), m.reconsume_times, m.store_timestamp,
            m.born_timestamp, m.offset_msg_id)


def _collect_py(body: bytes, cols: _ColumnsPy, end_offset: int,
                tags_filter: frozenset[str] | None) -> int:
    """Append the records of a pull-response ``body`` with queue offset < ``end_offset`` (and a
    tag in ``tags_filter``, when given) to ``cols``. Returns the offset after the last record
    looked at (filtered or not), or -1 when none was below ``end_offset``.

    Tags and message ids are collected as UTF-8 bytes and become strings in :func:`to_batch`
    (one Arrow cast per batch instead of one decode per message)."""
    # hot path: bench/spark_read.py (plain-int flag masks, bound appends, no per-record decode)
    mv = memoryview(body)
    n = len(body)
    pos = 0
    last = -1
    unpack = RECORD_FIXED_V4.unpack_from
    want_props = cols.props is not None
    wanted = None if tags_filter is None else {t.encode("utf-8") for t in tags_filter}
    add_body, add_offset, add_key = cols.bodies.append, cols.offsets.append, cols.keys.append
    add_tag, add_id, add_born = cols.tags.append, cols.msg_ids.append, cols.born.append
    add_stored, add_reconsume = cols.stored.append, cols.reconsume.append
    while pos < n:
        if pos + _FIXED_SIZE > n:
            raise CodecError(f"pull response truncated at byte {pos}")
        (total, magic, _crc, _qid, _flag, qoff, phys, sys_flag, born_ts, _bh, _bp, store_ts,
         store_host, store_port, reconsume, _prep, blen) = unpack(body, pos)
        if magic != MESSAGE_MAGIC or total < MIN_RECORD_SIZE or pos + total > n:
            raise CodecError(f"bad record at byte {pos} of a pull response")
        if qoff >= end_offset:
            break
        if sys_flag & _V6:
            b: bytes | memoryview
            b, raw_props, reconsume, store_ts, born_ts, store_id = _v6_record(body, pos)
        else:
            p = pos + _FIXED_SIZE
            if not 0 <= blen <= total - MIN_RECORD_SIZE:
                raise CodecError(f"bad body length {blen} at byte {pos} of a pull response")
            b = mv[p:p + blen]
            p += blen
            tlen = body[p]
            p += 1 + tlen
            if p + 2 > pos + total:
                raise CodecError(f"record at byte {pos} of a pull response: lengths do not add up")
            plen = (body[p] << 8) | body[p + 1]
            if p + 2 + plen != pos + total:
                raise CodecError(f"record at byte {pos} of a pull response: lengths do not add up")
            raw_props = body[p + 2:p + 2 + plen]
            store_id = ""
        pos += total
        last = qoff + 1
        tag = _prop(raw_props, _TAGS)
        if wanted is not None and tag not in wanted:
            continue
        if sys_flag & _COMPRESSED:
            b = inflate(bytes(b))
        add_body(b)
        add_offset(qoff)
        add_key(_prop(raw_props, _KEYS))
        add_tag(tag)
        uniq = _prop(raw_props, _UNIQ)
        if uniq is None:
            uniq = (store_id or encode_offset_msg_id(store_host, store_port, phys)).encode("ascii")
        add_id(uniq)
        add_born(born_ts)
        add_stored(store_ts)
        add_reconsume(reconsume)
        if want_props:
            cols.props.append(raw_props)  # type: ignore[union-attr]
    return last


def _encode_props(props: dict[str, str]) -> bytes:
    return "".join(f"{k}\x01{v}\x02" for k, v in props.items()).encode("utf-8")


_TS = pa.timestamp("us", tz="UTC")


def _binary(values: list[bytes | memoryview]) -> pa.Array:
    """A binary array from one joined buffer and an offsets array (no per-value objects)."""
    data = b"".join(values)
    if len(data) >= 2**31:
        raise CodecError("one Arrow batch would exceed 2 GiB; lower pullBatchSize")
    offsets = array("i", [0])
    offsets.extend(accumulate(len(v) for v in values))
    return pa.Array.from_buffers(pa.binary(), len(values),
                                 [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _millis(values: list[int]) -> pa.Array:
    return pc.multiply(pa.array(values, pa.int64()), 1000).cast(_TS)


def _properties(blobs: list[bytes]) -> pa.Array:
    keys: list[str] = []
    items: list[str] = []
    offsets = [0]
    for blob in blobs:
        props = decode_properties(blob)
        keys.extend(props.keys())
        items.extend(props.values())
        offsets.append(len(keys))
    return pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(keys, pa.string()),
                                   pa.array(items, pa.string()))


def _strings(arr: pa.Array) -> pa.Array:
    """A string array from a binary one of UTF-8 bytes: one cast, or a decode with replacement
    when not UTF-8."""
    try:
        return arr.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([None if v is None else v.decode("utf-8", "replace") for v in arr.to_pylist()],
                        pa.string())


def _to_batch_py(cols: _ColumnsPy, topic: str, broker: str, queue_id: int) -> pa.RecordBatch:
    """The record batch of ``cols``; its schema equals :func:`arrow_schema`."""
    n = len(cols)
    arrays = [
        pa.array(cols.keys, pa.binary()),
        _binary(cols.bodies),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(broker, pa.string()), n),
        pa.repeat(pa.scalar(queue_id, pa.int32()), n),
        pa.array(cols.offsets, pa.int64()),
        _strings(pa.array(cols.msg_ids, pa.binary())),
        _strings(pa.array(cols.tags, pa.binary())),
        _millis(cols.born),
        _millis(cols.stored),
        pa.array(cols.reconsume, pa.int32()),
    ]
    if cols.props is not None:
        arrays.append(_properties(cols.props))
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(cols.props is not None))


# -- the compiled twin's batches: its buffers wrapped as they are ----------------------------------

def _from_binary(column: tuple, n: int) -> pa.Array:
    """A binary array of the compiled Columns' (validity, null count, offsets, data, overflowed)."""
    valid, nulls, offsets, data, overflow = column
    if overflow:
        raise CodecError("one Arrow batch would exceed 2 GiB; lower pullBatchSize")
    return pa.Array.from_buffers(pa.binary(), n, [None if valid is None else pa.py_buffer(valid),
                                           pa.py_buffer(offsets), pa.py_buffer(data)],
                                 null_count=nulls)


def _from_fixed(kind: pa.DataType, n: int, data: bytearray) -> pa.Array:
    return pa.Array.from_buffers(kind, n, [None, pa.py_buffer(data)], null_count=0)


def _to_batch_c(cols: object, topic: str, broker: str, queue_id: int) -> pa.RecordBatch:
    """The record batch of the compiled twin's ``cols`` (same rows as :func:`_to_batch_py`)."""
    assert _c is not None
    (n, keys, values, ids, tags, offsets, born, stored, reconsume,
     props) = cols.export()  # type: ignore[attr-defined]
    arrays = [
        _from_binary(keys, n),
        _from_binary(values, n),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(broker, pa.string()), n),
        pa.repeat(pa.scalar(queue_id, pa.int32()), n),
        _from_fixed(pa.int64(), n, offsets),
        _strings(_from_binary(ids, n)),
        _strings(_from_binary(tags, n)),
        _from_fixed(_TS, n, born),
        _from_fixed(_TS, n, stored),
        _from_fixed(pa.int32(), n, reconsume),
    ]
    if props is not None:
        map_offsets, key_offsets, key_data, value_offsets, value_data = _c.properties_map(
            props[2], props[3], n)
        arrays.append(pa.MapArray.from_arrays(
            _from_fixed(pa.int32(), n + 1, map_offsets),
            pa.Array.from_buffers(pa.string(), len(key_offsets) // 4 - 1,
                                  [None, pa.py_buffer(key_offsets), pa.py_buffer(key_data)]),
            pa.Array.from_buffers(pa.string(), len(value_offsets) // 4 - 1,
                                  [None, pa.py_buffer(value_offsets), pa.py_buffer(value_data)])))
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(props is not None))


_c = compiled.load("tidemq.spark._arrow_c")
# whichever twin runs (tests reach both through the names above and ``_c``)
Columns: type = _c.Columns if _c is not None else _ColumnsPy
collect: Callable[[bytes, Any, int, frozenset[str] | None], int] = (
    _c.collect if _c is not None else _collect_py)
to_batch: Callable[[Any, str, str, int], pa.RecordBatch] = _to_batch_c if _c is not None else _to_batch_py
