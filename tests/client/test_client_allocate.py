"""AllocateMessageQueueAveragely against the reference formula (PROTOCOL-REFERENCE 6.3)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.client.allocate import AllocateMessageQueueAveragely, allocate_averagely
from tidemq.client.route import MessageQueue
from tidemq.errors import ClientError


def formula(n: int, m: int, i: int) -> range:
    mod = n % m
    if n <= m:
        size = 1
    else:
        size = n // m + 1 if mod > 0 and i < mod else n // m
    start = i * size if mod > 0 and i < mod else i * size + mod
    return range(start, start + min(size, n - start)) if n - start > 0 else range(0)


@pytest.mark.parametrize("n", range(0, 26))
@pytest.mark.parametrize("m", range(1, 12))
def test_matches_formula_and_partitions_queues(n, m):
    queues = [MessageQueue("T", f"b{q // 4}", q % 4) for q in range(n)]
    ids = [f"c{j:02d}" for j in range(m)]
    shares = [allocate_averagely(queues, ids, cid) for cid in ids]
    for i, share in enumerate(shares):
        assert share == [queues[k] for k in formula(n, m, i)]
    flat = [q for s in shares for q in s]
    assert sorted(flat) == queues  # every queue exactly once
    sizes = [len(s) for s in shares]
    assert max(sizes) - min(sizes) <= 1


def test_known_small_cases():
    qs = list(range(8))
    assert [allocate_averagely(qs, ["a", "b", "c"], c) for c in "abc"] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert [allocate_averagely([0, 1], ["a", "b", "c"], c) for c in "abc"] == [[0], [1], []]


def test_unknown_consumer_gets_nothing_and_blank_id_is_refused():
    assert allocate_averagely([1, 2], ["a"], "zzz") == []
    with pytest.raises(ClientError):
        allocate_averagely([1], ["a"], "")
    assert AllocateMessageQueueAveragely is allocate_averagely


@given(st.integers(0, 300), st.integers(1, 40))
def test_partition_property(n, m):
    ids = [str(j) for j in range(m)]
    shares = [allocate_averagely(range(n), ids, c) for c in ids]
    assert [q for s in shares for q in s] == list(range(n))
