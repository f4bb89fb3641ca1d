"""Helpers of the Spark tests: sending test messages and reading rows back (topics: tests/support/topics.py)."""

from __future__ import annotations

from tidemq.client.route import MessageQueue
from tidemq.client.sync import SyncProducer
from tidemq.message import Message


def send(cluster, topic: str, n: int, start: int = 0, queues: int | None = None,
         tags=lambda i: "even" if i % 2 == 0 else "odd", queue_ids: list[int] | None = None,
         **props: str) -> list[tuple[bytes, bytes, str]]:
    """Send messages ``m<start>..m<start+n-1>`` (key ``k<i>``) spread over the queues (or over
    ``queue_ids``) in batches; returns (key, value, tag) of each."""
    sent = []
    with SyncProducer("spark-test-producer", cluster.namesrv_addr) as producer:
        per_queue: dict[int, list[Message]] = {}
        ids = queue_ids if queue_ids is not None else list(range(queues or 4))
        for i in range(start, start + n):
            tag = tags(i)
            msg = Message(topic, b"m%d" % i, tags=tag, keys=f"k{i}", properties=dict(props))
            per_queue.setdefault(ids[i % len(ids)], []).append(msg)
            sent.append((b"k%d" % i, b"m%d" % i, tag))
        for qid, msgs in per_queue.items():
            producer.send_batches(msgs, queue=MessageQueue(topic, "broker-a", qid))
    return sent


def rows(df, *cols: str) -> list[tuple]:
    """Sorted tuples of ``cols`` (binary columns as bytes, not Spark's bytearray)."""
    def plain(v):
        return bytes(v) if isinstance(v, bytearray) else v
    return sorted(tuple(plain(r[c]) for c in cols) for r in df.select(*cols).collect())
