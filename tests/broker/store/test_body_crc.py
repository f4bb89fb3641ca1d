"""BODYCRC is zlib's CRC-32 (RocketMQ's polynomial), whichever implementation computes it:
writer.body_crc32 is ISA-L's when installed, and must give zlib's values, or recovery (which
checks with zlib) and every RocketMQ reader would refuse the records."""

from __future__ import annotations

import random
import zlib

from hypothesis import given
from hypothesis import strategies as st

from tidemq.message import decode_record

from tidemq.broker.store.writer import body_crc32

from tests.broker.store.util import Clock, config, open_store, req


_LONG = st.builds(lambda n, seed: random.Random(seed).randbytes(n), st.integers(4097, 70_000), st.integers())


@given(st.one_of(st.binary(max_size=4096), _LONG),
       st.integers(0, 0xFFFFFFFF))
def test_body_crc32_is_zlibs(data: bytes, start: int) -> None:
    assert body_crc32(data) == zlib.crc32(data)
    assert body_crc32(data, start) == zlib.crc32(data, start)


def test_the_stored_bodycrc_is_zlibs_and_recovery_accepts_it(tmp_path) -> None:
    cfg = config(tmp_path)
    store = open_store(cfg, clock=Clock())
    bodies = [bytes(range(i % 256)) * 5 for i in range(40)]
    assert store.put_batch([req("C", 0, b) for b in bodies]).count == 40
    assert store.put(req("C", 0, b"single")).count == 1
    store.close_abruptly()
    again = open_store(cfg, clock=Clock())  # a crash: recovery checks every record's BODYCRC
    got = again.get_messages("C", 0, 0, 100, None).records
    assert [decode_record(r).body for r in got] == [*bodies, b"single"]
    assert all(decode_record(r).body_crc == zlib.crc32(decode_record(r).body) & 0x7FFFFFFF for r in got)
    again.close_abruptly()
