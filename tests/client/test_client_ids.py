"""UniqIdGenerator against make_uniq_id: the cached prefix and per-millisecond time give the same ids."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tidemq.client.ids import UniqIdGenerator, month_start_ms
from tidemq.message import make_uniq_id

# 2023-11-30 23:59:59.990 UTC and on: a month boundary in every time zone near the steps below
START = 1701388799.990


@given(st.lists(st.sampled_from([0.0, 0.0, 0.0004, 0.001, 0.0105, 3600.0, 86400.0 * 3]), max_size=60))
def test_ids_equal_make_uniq_id_for_each_clock_reading(steps):
    now = [START]
    gen = UniqIdGenerator(b"\x0a\x00\x00\x05", lambda: now[0], pid=4242, start=b"\x01\x02\x03\x04")
    for counter, step in enumerate([0.0, *steps], start=1):
        now[0] += step
        now_ms = int(now[0] * 1000)
        begin, _end = month_start_ms(now_ms)
        expected = make_uniq_id(b"\x0a\x00\x00\x05", 4242, b"\x01\x02\x03\x04", now_ms - begin, counter)
        assert gen.next_id() == expected
