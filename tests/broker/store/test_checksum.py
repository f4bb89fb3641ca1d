"""checksum.crc32 (ISA-L's where installed) gives zlib's CRC-32 for any bytes: records and
replication frames written by one build are read by the other."""

from __future__ import annotations

import zlib

from hypothesis import given
from hypothesis import strategies as st

from tidemq.broker.store.checksum import crc32


@given(st.binary(max_size=70_000), st.integers(0, 64), st.integers(0, 64))
def test_crc32_is_zlibs_for_bytes_and_views(data: bytes, head: int, tail: int) -> None:
    view = memoryview(bytearray(data)).toreadonly()[head : max(head, len(data) - tail)]
    assert crc32(data) == zlib.crc32(data)
    assert crc32(view) == zlib.crc32(view)
