"""Prometheus metrics of a broker (names: tidemq_broker_*, base units, _total counters).

Invariants:
- Hot-path counters (messages/bytes per topic, request latency, errors by code) are updated in
  place with labelled children cached per key; nothing on the hot path allocates per call beyond
  the first time a key is seen.
- Everything else is a gauge computed at scrape time by ``_BrokerCollector`` from in-memory state
  (store offsets, offset table, store.stats()); a scrape never touches the disk or blocks the loop.
- Every series carries ``cluster`` and ``broker``; per-queue lag only exists when
  ``BrokerConfig.metrics_queue_lag`` is on (its cardinality is groups x topics x queues).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.registry import Collector

from tidemq.broker.delay import TIMER_TOPIC
from tidemq.broker.store.replay import SCHEDULE_TOPIC
from tidemq.broker.topics import DLQ_PREFIX, RETRY_PREFIX
from tidemq.broker.transaction.half import HALF_QUEUE_ID, HALF_TOPIC
from tidemq.remoting import RequestCode, ResponseCode

if TYPE_CHECKING:
    from tidemq.broker.broker import Broker

# Request codes whose latency is measured, by the ``request`` label they get.
TIMED_REQUESTS: dict[int, str] = {
    int(RequestCode.SEND_MESSAGE): "send",
    int(RequestCode.SEND_MESSAGE_V2): "send",
    int(RequestCode.SEND_BATCH_MESSAGE): "send_batch",
    int(RequestCode.PULL_MESSAGE): "pull",
    int(RequestCode.LITE_PULL_MESSAGE): "pull",
}

# Response codes of the normal pull flow: not counted as errors.
NOT_ERRORS = frozenset({int(ResponseCode.SUCCESS), int(ResponseCode.PULL_NOT_FOUND),
                        int(ResponseCode.PULL_RETRY_IMMEDIATELY)})

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def code_name(code: int) -> str:
    """The ``code`` label of a response code: its ResponseCode name, else the number."""
    try:
        return ResponseCode(code).name
    except ValueError:
        return str(code)


class BrokerMetrics:
    def __init__(self, cluster: str, broker: str, queue_lag: bool = False) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["cluster", "broker", "topic"]
        self._base = (cluster, broker)
        self.queue_lag = queue_lag
        self.messages_in = Counter("tidemq_broker_messages_in", "Messages stored", labels, registry=self.registry)
        self.bytes_in = Counter("tidemq_broker_bytes_in", "Message body bytes stored", labels, registry=self.registry)
        self.messages_out = Counter("tidemq_broker_messages_out", "Messages served to pulls", labels, registry=self.registry)
        self.bytes_out = Counter("tidemq_broker_bytes_out", "Stored bytes served to pulls", labels, registry=self.registry)
        self.request_latency = Histogram(
            "tidemq_broker_request_latency_seconds",
            "Time from a send/pull request's arrival to its response (long polls and SYNC_FLUSH waits included)",
            ["cluster", "broker", "request"], buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.errors = Counter(
            "tidemq_broker_errors", "Responses with a non-success code (PULL_NOT_FOUND/PULL_RETRY_IMMEDIATELY excluded)",
            ["cluster", "broker", "code"], registry=self.registry,
        )
        self._in: dict[str, tuple] = {}
        self._out: dict[str, tuple] = {}
        self._latency: dict[str, object] = {}
        self._errors: dict[int, object] = {}

    def on_put(self, topic: str, count: int, size: int) -> None:
        self._count(self._in, self.messages_in, self.bytes_in, topic, count, size)

    def on_get(self, topic: str, count: int, size: int) -> None:
        self._count(self._out, self.messages_out, self.bytes_out, topic, count, size)

    def on_latency(self, request: str, seconds: float) -> None:
        child = self._latency.get(request)
        if child is None:
            child = self._latency[request] = self.request_latency.labels(*self._base, request)
        child.observe(seconds)

    def on_response(self, code: int) -> None:
        """Count a response by code (successes and the normal pull-flow codes are ignored)."""
        if code in NOT_ERRORS:
            return
        child = self._errors.get(code)
        if child is None:
            child = self._errors[code] = self.errors.labels(*self._base, code_name(code))
        child.inc()

    def _count(self, cache: dict[str, tuple], messages: Counter, nbytes: Counter, topic: str,
               count: int, size: int) -> None:
        pair = cache.get(topic)
        if pair is None:  # the labelled children are cached per topic (hot path)
            pair = cache[topic] = (messages.labels(*self._base, topic), nbytes.labels(*self._base, topic))
        pair[0].inc(count)
        pair[1].inc(size)

    def attach(self, broker: "Broker") -> None:
        self.registry.register(_BrokerCollector(broker, self._base, self.queue_lag))


def _gauge(name: str, doc: str, base: tuple[str, str], value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=["cluster", "broker"])
    g.add_metric(base, value)
    return g


class _BrokerCollector(Collector):
    def __init__(self, broker: "Broker", base: tuple[str, str], queue_lag: bool = False) -> None:
        self.broker = broker
        self.base = base
        self.queue_lag = queue_lag

    def _backlog(self, topic: str) -> int:
        """Messages held by a topic's consume queues (max minus min offset, summed over queues)."""
        store = self.broker.store
        return sum(max(0, store.max_offset(topic, q) - store.min_offset(topic, q)) for q in store.queue_ids(topic))

    def collect(self):
        b = self.broker
        base = self.base
        store = b.store
        stats = store.stats()
        yield _gauge("tidemq_broker_commitlog_max_offset_bytes", "CommitLog end offset", base, stats["commitlog_max_offset"])
        yield _gauge("tidemq_broker_commitlog_min_offset_bytes", "CommitLog start offset", base, stats["commitlog_min_offset"])
        yield _gauge("tidemq_broker_commitlog_size_bytes", "Bytes the CommitLog spans (max minus min offset)", base,
                     stats["commitlog_max_offset"] - stats["commitlog_min_offset"])
        yield _gauge("tidemq_broker_commitlog_flushed_offset_bytes", "CommitLog offset known to be on disk", base,
                     stats["flushed_offset"])
        yield _gauge("tidemq_broker_disk_usage_ratio", "Used fraction of the store's disk (probed by the store)", base,
                     stats["disk_usage_ratio"])
        flush = SummaryMetricFamily("tidemq_broker_commitlog_flush_seconds", "CommitLog flush rounds (fsync time)",
                                    labels=["cluster", "broker"])
        flush.add_metric(base, count_value=stats["flush_rounds"], sum_value=stats.get("flush_seconds", 0.0))
        yield flush
        yield _gauge("tidemq_broker_long_poll_waiters", "Pull requests held by long polling", base, b.holds.waiting)
        yield _gauge("tidemq_broker_connections", "Open client connections", base, b.connection_count)
        yield _gauge("tidemq_broker_topics", "Topics configured on this broker", base, len(b.topics.topics))
        yield _gauge("tidemq_broker_delayed_messages", "Scheduled (delay level or delivery time) messages not delivered yet",
                     base, self._delayed())
        yield _gauge("tidemq_broker_half_messages", "Transactional half messages not committed or rolled back yet",
                     base, self._half())
        retry = GaugeMetricFamily("tidemq_broker_retry_messages", "Messages in a group's %RETRY% topic",
                                  labels=["cluster", "broker", "group"])
        dlq = GaugeMetricFamily("tidemq_broker_dlq_messages", "Messages in a group's %DLQ% topic",
                                labels=["cluster", "broker", "group"])
        for topic in store.topics():
            if topic.startswith(RETRY_PREFIX):
                retry.add_metric([*base, topic[len(RETRY_PREFIX):]], self._backlog(topic))
            elif topic.startswith(DLQ_PREFIX):
                dlq.add_metric([*base, topic[len(DLQ_PREFIX):]], self._backlog(topic))
        yield retry
        yield dlq
        yield from self._lag()

    def _delayed(self) -> int:
        sched = self.broker.schedule
        store = self.broker.store
        total = 0
        for t in sched.level_timers:
            total += max(0, store.max_offset(SCHEDULE_TOPIC, t.queue_id) - t.offset)
        timer = sched.timer
        total += len(timer) + max(0, store.max_offset(TIMER_TOPIC, 0) - timer.scanned)
        return total

    def _half(self) -> int:
        svc = self.broker.transactions
        store = self.broker.store
        start = max(svc.half_progress, store.min_offset(HALF_TOPIC, HALF_QUEUE_ID))
        return max(0, store.max_offset(HALF_TOPIC, HALF_QUEUE_ID) - start - len(svc.book))

    def _lag(self):
        b = self.broker
        base = self.base
        lag = GaugeMetricFamily(
            "tidemq_broker_consumer_lag_messages",
            "Max offset minus committed offset, summed over the topic's queues",
            labels=["cluster", "broker", "group", "topic"],
        )
        qlag = GaugeMetricFamily(
            "tidemq_broker_consumer_queue_lag_messages",
            "Max offset minus committed offset of one queue (only with --metrics-queue-lag)",
            labels=["cluster", "broker", "group", "topic", "queue"],
        ) if self.queue_lag else None
        for key, queues in list(b.offsets.table.items()):
            topic, _, group = key.rpartition("@")
            tc = b.topics.get(topic)
            if tc is None:
                continue
            total = 0
            for q in range(tc.read_queue_nums):
                one = max(0, b.store.max_offset(topic, q) - queues.get(q, 0))
                total += one
                if qlag is not None:
                    qlag.add_metric([*base, group, topic, str(q)], one)
            lag.add_metric([*base, group, topic], total)
        yield lag
        if qlag is not None:
            yield qlag
