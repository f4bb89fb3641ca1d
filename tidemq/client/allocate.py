"""Queue allocation strategies for client-side rebalancing (RocketMQ AllocateMessageQueueStrategy).

Pure. Every consumer of a group runs the same function over the same sorted inputs and takes a
disjoint share; together the shares cover every queue exactly once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from tidemq.errors import ClientError

Q = TypeVar("Q")


def allocate_averagely(queues: Sequence[Q], consumer_ids: Sequence[str], current_id: str) -> list[Q]:
    """AllocateMessageQueueAveragely: contiguous blocks, the first ``n % m`` consumers get one more.

    ``queues`` and ``consumer_ids`` must already be sorted (queues by topic, broker, queue id).
    A consumer not in ``consumer_ids`` (not yet registered) gets nothing.
    """
    if not current_id:
        raise ClientError("current consumer id is blank")
    if current_id not in consumer_ids:
        return []
    n, m = len(queues), len(consumer_ids)
    if n == 0:
        return []
    index = list(consumer_ids).index(current_id)
    mod = n % m
    if n <= m:
        size = 1
    elif mod > 0 and index < mod:
        size = n // m + 1
    else:
        size = n // m
    start = index * size if mod > 0 and index < mod else index * size + mod
    take = min(size, n - start)
    return list(queues[start : start + take]) if take > 0 else []


AllocateMessageQueueAveragely = allocate_averagely


def allocate_averagely_by_circle(queues: Sequence[Q], consumer_ids: Sequence[str],
                                 current_id: str) -> list[Q]:
    """AllocateMessageQueueAveragelyByCircle: deal the queues out like cards, consumer by
    consumer (queue ``k`` goes to consumer ``k % m``). Same input rules as
    :func:`allocate_averagely`."""
    if not current_id:
        raise ClientError("current consumer id is blank")
    if current_id not in consumer_ids:
        return []
    index = list(consumer_ids).index(current_id)
    return list(queues[index :: len(consumer_ids)])


AllocateMessageQueueAveragelyByCircle = allocate_averagely_by_circle


class AllocateStrategy(Protocol):
    """What a push or lite-pull consumer accepts as ``allocate_strategy``: a pure function of
    the sorted queues, the sorted consumer ids of the group and this consumer's id, returning
    this consumer's share. Every member must run the same strategy."""

    def __call__(self, queues: Sequence[Q], consumer_ids: Sequence[str],
                 current_id: str) -> list[Q]: ...
