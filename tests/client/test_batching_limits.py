"""Client batches respect the broker's per-batch message cap (tidemq.message.MAX_BATCH_MESSAGES):
split_batches splits by count as well as by size, and send_batch refuses a batch over it."""

from __future__ import annotations

import pytest

from tidemq.client.batching import split_batches
from tidemq.client.validation import check_batch
from tidemq.errors import ClientError
from tidemq.message import MAX_BATCH_MESSAGES, Message


def test_tiny_messages_are_split_by_count_not_only_by_size():
    msgs = [Message("T", b"x") for _ in range(MAX_BATCH_MESSAGES + 10)]
    parts = split_batches(msgs)
    assert [len(p) for p in parts] == [MAX_BATCH_MESSAGES, 10]
    assert [len(p) for p in split_batches(msgs[:7], max_messages=3)] == [3, 3, 1]


def test_a_batch_over_the_cap_is_refused_before_sending():
    with pytest.raises(ClientError, match="at most 32767 messages"):
        check_batch([Message("T", b"x")] * (MAX_BATCH_MESSAGES + 1), 4 * 1024 * 1024)
