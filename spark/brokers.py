"""The Spark source's view of the brokers, used on the driver (planning) and executors (reads).

Driver side (:class:`TopicView`): which topics and queues a read covers, what each queue holds
now (min/max offsets from GET_TOPIC_STATS_INFO, one request per broker and topic), offsets by
store time, and the optional mirror of processed offsets into a consumer group. Executor side
(:func:`read_slice`): pull one slice's messages in large raw batches, on the reading thread's own
event loop with one pull ahead (:mod:`tidemq.spark.pulling`), and turn them into Arrow record
batches. Both go through :mod:`tidemq.client` only.

Spark's readers never consume as the group they may mirror to: executors pull as a private group
per process (``tidemq-spark-reader``) that never commits, so resuming always comes from Spark's
checkpoint, as with Kafka.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
from collections.abc import AsyncGenerator, Iterator

from tidemq.client.pull import PullStatus, parse_tag_expression
from tidemq.client.route import MessageQueue
from tidemq.client.sync import SyncAdmin, SyncPullConsumer
from tidemq.errors import AdminError, TideMQError
from tidemq.message import STORE_TIMESTAMP_POS, SysFlag
from tidemq.spark import clients
from tidemq.spark.offsets import (
    Offsets,
    QueueKey,
    QueueRange,
    Slice,
    data_loss,
    data_loss_message,
)
from tidemq.spark.options import SourceOptions
from tidemq.spark.pulling import Pull, ReaderLoop

log = logging.getLogger(__name__)

READER_GROUP = "tidemq-spark-reader"
ROWS_PER_BATCH = 8192  # Arrow batch size handed to Spark


class SourceError(TideMQError):
    """A read cannot go on (data loss, a vanished topic ...); the message says what to do."""


class TopicView:
    """Driver-side queries for one read. Not thread-safe; close() when done."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        config = clients.client_config(opts.name_servers, opts.credentials, opts.pull_timeout_ms)
        self._admin = SyncAdmin(config=config)
        self._admin.start()
        self._consumer: SyncPullConsumer | None = None
        self._config = config

    def close(self) -> None:
        try:
            self._admin.close()
        finally:
            if self._consumer is not None:
                self._consumer.close()

    def _pull_consumer(self, group: str = READER_GROUP) -> SyncPullConsumer:
        if self._consumer is None or self._consumer.group != group:
            if self._consumer is not None:
                self._consumer.close()
            self._consumer = SyncPullConsumer(group, config=self._config)
            self._consumer.start()
        return self._consumer

    def topics(self) -> list[str]:
        """The topics this read covers now (a pattern is matched against the name server's list)."""
        if self.opts.assign is not None:
            return sorted(self.opts.assign)
        if self.opts.pattern is None:
            return list(self.opts.topics)
        return [t for t in self._admin.topic_list() if self.opts.matches(t)]

    def ranges(self) -> dict[QueueKey, QueueRange]:
        """Every readable queue of the covered topics with its [min, max) offsets."""
        out: dict[QueueKey, QueueRange] = {}
        for topic in self.topics():
            try:
                route = self._admin.topic_route(topic)
                stats = self._admin.topic_status(topic)
            except AdminError as exc:
                if self.opts.pattern is not None:
                    log.info("topic %s vanished while listing it: %s", topic, exc)
                    continue
                raise SourceError(f"cannot read topic {topic}: {exc}") from None
            readable = {(q.broker_name, q.queue_id) for q in route.subscribe_queues(topic)}
            wanted = self.opts.assign.get(topic) if self.opts.assign is not None else None
            for s in stats:
                b, q = s.queue.broker_name, s.queue.queue_id
                if (b, q) not in readable:
                    continue
                if wanted is not None and q not in wanted.get(b, ()):
                    continue
                out[QueueKey(topic, b, q)] = QueueRange(s.min_offset, s.max_offset)
        if self.opts.assign is not None:
            named = {QueueKey(t, b, q) for t, bs in self.opts.assign.items()
                     for b, qs in bs.items() for q in qs}
            missing = sorted(str(k) for k in named - out.keys())
            if missing:
                raise SourceError(f"option assign names queues that do not exist (or are not "
                                  f"readable): {', '.join(missing)}")
        return out

    def offsets_at(self, ranges: dict[QueueKey, QueueRange], timestamp_ms: int) -> Offsets:
        """Per queue, the first offset whose store time is >= ``timestamp_ms`` (the queue's max
        offset when every message is older)."""
        consumer = self._pull_consumer()
        out: Offsets = {}
        for k, r in ranges.items():
            if r.max_offset <= r.min_offset:
                out[k] = r.max_offset
                continue
            mq = MessageQueue(k.topic, k.broker, k.queue_id)
            # The broker answers with the *nearest* message (RocketMQ's rule); step past it when
            # it is older than the timestamp (Kafka's rule: first at or after).
            off = max(r.min_offset, min(consumer.search_offset(mq, timestamp_ms), r.max_offset))
            if off < r.max_offset and self._store_time(consumer, mq, off) < timestamp_ms:
                off += 1
            out[k] = off
        return out

    @staticmethod
    def _store_time(consumer: SyncPullConsumer, mq: MessageQueue, offset: int) -> int:
        res = consumer.pull_raw(mq, offset, 1)
        if res.status is not PullStatus.FOUND or not res.body:
            return -1
        body = res.body
        sys_flag = int.from_bytes(body[36:40], "big", signed=True)
        pos = STORE_TIMESTAMP_POS + (12 if sys_flag & SysFlag.BORNHOST_V6 else 0)
        return int.from_bytes(body[pos:pos + 8], "big", signed=True)

    def mirror(self, group: str, offsets: Offsets) -> None:
        """Store ``offsets`` as ``group``'s consumer offsets (for lag in metrics and
        ``tidemq admin consumerProgress``; informational, never read back)."""
        consumer = self._pull_consumer(group)
        for k, off in sorted(offsets.items()):
            consumer.commit(MessageQueue(k.topic, k.broker, k.queue_id), off)


def _reader_key(opts: SourceOptions) -> tuple:
    # one ReaderLoop per process and thread (see tidemq.spark.pulling: a loop has one driver)
    return ("reader", os.getpid(), threading.get_ident(), opts.name_servers, opts.credentials,
            opts.pull_timeout_ms)


def _reader(opts: SourceOptions) -> ReaderLoop:
    config = clients.client_config(opts.name_servers, opts.credentials, opts.pull_timeout_ms)
    return clients.cached(_reader_key(opts), lambda: ReaderLoop(READER_GROUP, config))


def read_slice(opts: SourceOptions, part: Slice) -> Iterator[object]:
    """Pull messages [start, end) of one queue and yield Arrow record batches (executor side).
    Offsets retention removed fail the task (``failOnDataLoss``) or are skipped.

    Each batch is read by one run of the reading thread's own event loop (tidemq.spark.pulling);
    the pull in flight when a batch is handed over stays in flight while Spark takes it."""
    # hot path: bench/spark_read.py (one loop run per Arrow batch, one pull ahead)
    reader = _reader(opts)
    batches = _batches(reader, opts, part)
    try:
        while True:
            try:
                batch = reader.run(anext(batches, None))
            except TideMQError as exc:
                if not isinstance(exc, SourceError):  # the client failed: start afresh next time
                    clients.drop(_reader_key(opts))
                raise
            if batch is None:
                return
            yield batch
    finally:
        if not reader.loop.is_closed():  # ended early (Spark closing the generator): drop the pull ahead
            try:
                reader.run(batches.aclose())
            except RuntimeError:
                # An interrupt (KeyboardInterrupt) raised inside one of the loop's steps left the
                # generator mid-step: this reader is forgotten, and what ended the read is raised,
                # not this.
                clients.drop(_reader_key(opts))
                if sys.exc_info()[1] is None:
                    raise


async def _batches(reader: ReaderLoop, opts: SourceOptions, part: Slice) -> AsyncGenerator[object, None]:
    """read_slice's batches. The pull after an answer is sent before the answer is decoded, from
    where this loop pulls next unless the decode says otherwise (then it is dropped and the right
    one sent), so the pulls and rows are exactly those of one pull at a time."""
    from tidemq.spark.arrow import Columns, collect, to_batch

    mq = MessageQueue(part.topic, part.broker, part.queue_id)
    tags = parse_tag_expression(opts.tag_expression)
    expr, end = opts.tag_expression, part.end
    offset = part.start
    cols = Columns(props=[] if opts.include_properties else None)

    def send(start: int) -> Pull:
        return reader.send(mq, start, min(opts.pull_batch_size, end - start), expr)

    pending: Pull | None = None
    try:
        while offset < end:
            if pending is None or pending.offset != offset:
                if pending is not None:
                    reader.cancel(pending)
                pending = send(offset)
            res = await reader.answer(pending)
            pending = None
            if res.min_offset > offset:  # retention removed [offset, min_offset)
                lost = {QueueKey(part.topic, part.broker, part.queue_id): res.min_offset}
                if opts.fail_on_data_loss:
                    raise SourceError(data_loss_message(lost, {k: offset for k in lost}))
                log.warning("skipping %d messages of %s removed by retention (failOnDataLoss=false)",
                            res.min_offset - offset, mq)
                offset = res.min_offset
                continue
            if res.status is PullStatus.OFFSET_ILLEGAL:
                raise SourceError(f"{mq}: offset {offset} is beyond the queue's end "
                                  f"{res.max_offset}; was the topic deleted and recreated?")
            if res.status is PullStatus.FOUND:
                # the branch below moves to min(next begin, end) unless the records say otherwise
                ahead = min(res.next_begin_offset, end)
                if offset < ahead < end:
                    pending = send(ahead)
                    await asyncio.sleep(0)  # one loop turn: its request leaves before the decode
                last = collect(res.body, cols, end, tags)
                if last < 0:
                    break
                offset = max(last, ahead)
            elif res.status is PullStatus.NO_MATCHED_MSG:
                offset = res.next_begin_offset
            else:  # NO_NEW_MSG below the planned end: the driver saw these messages when planning
                raise SourceError(f"{mq}: the queue now ends at {res.max_offset}, before offset "
                                  f"{offset}, although it reached {end} when the read was "
                                  "planned; was the topic deleted and recreated, or the broker's "
                                  "store replaced?")
            if len(cols) >= ROWS_PER_BATCH:
                yield to_batch(cols, part.topic, part.broker, part.queue_id)
                cols = Columns(props=[] if opts.include_properties else None)
    finally:
        if pending is not None:  # the read ended early (an error, Spark closing the generator)
            reader.cancel(pending)
    if len(cols):
        yield to_batch(cols, part.topic, part.broker, part.queue_id)


def check_start(start: Offsets, ranges: dict[QueueKey, QueueRange], fail: bool) -> Offsets:
    """``start`` with data-loss handled on the driver: fail, or move lost queues to their first
    remaining offset."""
    lost = data_loss(start, ranges)
    if not lost:
        return start
    if fail:
        raise SourceError(data_loss_message(lost, start))
    log.warning("skipping messages removed by retention on %d queues (failOnDataLoss=false)",
                len(lost))
    return {**start, **lost}


__all__ = ["READER_GROUP", "SourceError", "TopicView", "check_start", "read_slice"]
