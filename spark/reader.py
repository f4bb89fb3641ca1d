"""Batch reads (``spark.read.format("tidemq")``) and the partition type shared with streaming.

The driver plans one partition per queue (split by ``minPartitions``/``maxRecordsPerPartition``)
between ``startingOffsets`` (default earliest) and ``endingOffsets`` (default latest, resolved
when the query is planned); executors pull their slice and yield Arrow record batches.
"""

from __future__ import annotations

from collections.abc import Iterator

from pyspark.sql.datasource import DataSourceReader, InputPartition

from tidemq.spark.brokers import SourceError, TopicView, check_start, read_slice
from tidemq.spark.offsets import (
    Offsets,
    QueueKey,
    QueueRange,
    Slice,
    past_end,
    past_end_message,
    plan,
    resolve,
)
from tidemq.spark.options import SourceOptions


class QueuePartition(InputPartition):
    """One Spark partition: a :class:`~tidemq.spark.offsets.Slice` of one queue."""

    def __init__(self, value: Slice) -> None:
        super().__init__(value)


def to_partitions(slices: list[Slice]) -> list[InputPartition]:
    return [QueuePartition(s) for s in slices]  # Spark wants a list, not a tuple


def read_partition(opts: SourceOptions, partition: InputPartition) -> Iterator[object]:
    # Spark passes InputPartition(None) when there is nothing to read.
    if partition is None or partition.value is None:
        return iter(())
    return read_slice(opts, partition.value)


def start_offsets(view: TopicView, opts: SourceOptions,
                  ranges: dict[QueueKey, QueueRange]) -> Offsets:
    """Where a new read starts: ``startingTimestamp`` wins over ``startingOffsets`` (Kafka's
    precedence); queues a JSON spec leaves out start at their earliest offset."""
    if opts.starting_timestamp is not None:
        return view.offsets_at(ranges, opts.starting_timestamp)
    return resolve(opts.starting, ranges, "startingOffsets", missing="earliest")


class BatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> list[InputPartition]:
        view = TopicView(self.opts)
        try:
            ranges = view.ranges()
            start = check_start(start_offsets(view, self.opts, ranges), ranges,
                                self.opts.fail_on_data_loss)
            if self.opts.ending_timestamp is not None:
                end = view.offsets_at(ranges, self.opts.ending_timestamp)
            else:
                end = resolve(self.opts.ending, ranges, "endingOffsets", missing="latest")
        finally:
            view.close()
        # a batch read ends where the queues end now: an offset beyond it would never arrive
        for offsets, what in ((start, "startingOffsets"), (end, "endingOffsets")):
            past = past_end(offsets, ranges)
            if past:
                raise SourceError(past_end_message(past, ranges, what))
        behind = sorted(str(k) for k in end if end[k] < start.get(k, 0))
        if behind:
            raise SourceError(f"endingOffsets lie before startingOffsets on {', '.join(behind)}; "
                              "pick an end at or after the start")
        return to_partitions(plan(start, end, self.opts.min_partitions,
                                  self.opts.max_records_per_partition))

    def read(self, partition: InputPartition) -> Iterator[object]:
        return read_partition(self.opts, partition)
