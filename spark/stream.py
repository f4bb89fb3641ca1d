"""Streaming reads (``spark.readStream.format("tidemq")``): micro-batches over queue offsets.

Runs in Spark's long-lived driver-side Python process, so the reader keeps state there: the
driver client, the latest offsets seen (shown as ``latestOffset`` in query progress) and, for
``Trigger.AvailableNow``, the target fixed when the run started. Executors only run :meth:`read`.

Exactly-once comes from Spark's checkpoint: the offsets of a batch are written before it runs and
a restarted query re-plans the same [start, end) per queue, which reads the same messages (queue
offsets are stable and tag filtering is deterministic). Queues that appear while the query runs
(a topic grown from 4 to 8 queues, a new broker, a new topic matching ``subscribePattern``) are
read from offset 0 by the next micro-batch. ``maxOffsetsPerTrigger`` bounds each batch on Spark 4.2+
(admission control); Spark 4.0/4.1 call ``latestOffset()`` without a limit and read all there is.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from tidemq.spark.brokers import TopicView, check_start
from tidemq.spark.offsets import Offsets, from_json, limit_rows, plan, to_json
from tidemq.spark.options import SourceOptions
from tidemq.spark.reader import read_partition, start_offsets, to_partitions

if TYPE_CHECKING:
    from pyspark.sql.streaming.datasource import ReadLimit

log = logging.getLogger(__name__)

try:  # Spark 4.2+: admission control and Trigger.AvailableNow for Python sources
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # Spark 4.0/4.1
    ReadAllAvailable = ReadMaxRows = None  # type: ignore[assignment,misc]

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stand-in base on Spark < 4.2 (where Python sources have no AvailableNow support)."""


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._view: TopicView | None = None
        self._latest: Offsets | None = None
        self._target: Offsets | None = None

    # driver ------------------------------------------------------------------------------------
    def __getstate__(self) -> dict:
        # Executors get only the options; the driver-side client and state stay behind.
        return {"opts": self.opts, "_view": None, "_latest": None, "_target": None}

    def _topics(self) -> TopicView:
        if self._view is None:
            self._view = TopicView(self.opts)
        return self._view

    def initialOffset(self) -> dict:
        view = self._topics()
        start = start_offsets(view, self.opts, view.ranges())
        log.info("tidemq stream starts at %d queues", len(start))
        return to_json(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger and ReadMaxRows is not None:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._current()

    def _current(self) -> Offsets:
        return {k: r.max_offset for k, r in self._topics().ranges().items()}

    def latestOffset(self, start: dict | None = None, limit: object = None) -> dict:
        latest = self._current()
        if self._target is not None:  # AvailableNow: never beyond what existed at the start
            latest = {k: min(v, self._target[k]) for k, v in latest.items() if k in self._target}
        begin = from_json(start) if start is not None else {}
        # a queue that vanished from the route (fewer read queues) keeps its position
        end = {**begin, **{k: max(v, begin.get(k, 0)) for k, v in latest.items()}}
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            end = {**begin, **limit_rows(begin, end, limit.max_rows)}
        self._latest = latest
        return to_json(end)

    def reportLatestOffset(self) -> dict | None:
        return to_json(self._latest) if self._latest is not None else None

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        begin, stop = from_json(start), from_json(end)
        begin = {k: begin.get(k, 0) for k in stop}  # new queues start at 0
        if any(stop[k] > begin[k] for k in stop):
            begin = check_start(begin, self._topics().ranges(), self.opts.fail_on_data_loss)
        return to_partitions(plan(begin, stop, self.opts.min_partitions,
                                  self.opts.max_records_per_partition))

    def commit(self, end: dict) -> None:
        if self.opts.consumer_group is None:
            return
        try:
            self._topics().mirror(self.opts.consumer_group, from_json(end))
        except Exception as exc:  # noqa: BLE001 (informational only: never fail the query for it)
            log.warning("could not mirror offsets to consumer group %s: %s",
                        self.opts.consumer_group, exc)

    def stop(self) -> None:
        if self._view is not None:
            self._view.close()
            self._view = None

    # executors ---------------------------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[object]:
        return read_partition(self.opts, partition)
