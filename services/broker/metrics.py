"""Prometheus metrics of a broker (names: tidemq_broker_*, base units, _total counters).

Invariants:
- Hot-path counters (messages/bytes per topic, request latency, errors by code) are plain numbers
  updated in place on the event-loop thread and turned into counter/histogram families at scrape
  time; nothing on the hot path allocates per call beyond the first time a key is seen.
- Everything else is a gauge computed at scrape time by ``_BrokerCollector`` from in-memory state
  (store offsets, offset table, store.stats()); a scrape never touches the disk or blocks the loop.
- Every series carries ``cluster`` and ``broker``; per-queue lag only exists when
  ``BrokerConfig.metrics_queue_lag`` is on (its cardinality is groups x topics x queues).
- A replica (``--coordination``, issue 17) also exports ``tidemq_replica_*``, read from
  ``ReplicaService.status()`` at scrape time (``_ReplicaCollector``): nothing is pushed from the
  replication or send paths. A broker without replication exports none of them.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    Metric,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from tidemq.broker.delay import TIMER_TOPIC
from tidemq.broker.ha.election import RoleKind
from tidemq.broker.store.replay import SCHEDULE_TOPIC
from tidemq.broker.topics import DLQ_PREFIX, RETRY_PREFIX
from tidemq.broker.transaction.half import HALF_QUEUE_ID, HALF_TOPIC
from tidemq.remoting import RequestCode, ResponseCode

if TYPE_CHECKING:
    from tidemq.broker.broker import Broker
    from tidemq.broker.ha.replica import ReplicaService

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
_LE = [floatToGoString(b) for b in LATENCY_BUCKETS] + ["+Inf"]


def code_name(code: int) -> str:
    """The ``code`` label of a response code: its ResponseCode name, else the number."""
    try:
        return ResponseCode(code).name
    except ValueError:
        return str(code)


class BrokerMetrics:
    """Hot-path counters as plain numbers, exported as Prometheus counters/histograms at scrape time.

    prometheus_client's Counter/Histogram take a lock per update (about 1.4 us per send for the
    four updates); these are updated only on the event-loop thread, so plain ints suffice.
    """

    def __init__(self, cluster: str, broker: str, queue_lag: bool = False) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._base = (cluster, broker)
        self.queue_lag = queue_lag
        self.put_counts: dict[str, list[int]] = {}  # topic -> [messages, body bytes] stored
        self.get_counts: dict[str, list[int]] = {}  # topic -> [messages, stored bytes] served
        # request label -> [count per bucket (last = +Inf), sum of seconds]
        self.latency: dict[str, list] = {}
        self.error_counts: dict[int, int] = {}
        self.registry.register(_HotCollector(self))

    def on_put(self, topic: str, count: int, size: int) -> None:
        c = self.put_counts.get(topic)
        if c is None:
            c = self.put_counts[topic] = [0, 0]
        c[0] += count
        c[1] += size

    def on_get(self, topic: str, count: int, size: int) -> None:
        c = self.get_counts.get(topic)
        if c is None:
            c = self.get_counts[topic] = [0, 0]
        c[0] += count
        c[1] += size

    def on_latency(self, request: str, seconds: float) -> None:
        h = self.latency.get(request)
        if h is None:
            h = self.latency[request] = [[0] * (len(LATENCY_BUCKETS) + 1), 0.0]
        h[0][bisect_left(LATENCY_BUCKETS, seconds)] += 1
        h[1] += seconds

    def on_response(self, code: int) -> None:
        """Count a response by code (successes and the normal pull-flow codes are ignored)."""
        if code in NOT_ERRORS:
            return
        self.error_counts[code] = self.error_counts.get(code, 0) + 1

    def totals(self) -> tuple[int, int]:
        """(messages stored, messages served to pulls) since the broker started."""
        return (sum(c[0] for c in list(self.put_counts.values())),
                sum(c[0] for c in list(self.get_counts.values())))

    def attach(self, broker: "Broker") -> None:
        self.registry.register(_BrokerCollector(broker, self._base, self.queue_lag))
        if broker.replica is not None:
            self.registry.register(_ReplicaCollector(broker.replica, self._base))


class _HotCollector(Collector):
    """Exports BrokerMetrics' plain counters (a scrape copies them; the loop keeps updating)."""

    def __init__(self, metrics: BrokerMetrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.m
        base = m._base
        topic_labels = ["cluster", "broker", "topic"]
        for name, doc, table, i in (
            ("tidemq_broker_messages_in", "Messages stored", m.put_counts, 0),
            ("tidemq_broker_bytes_in", "Message body bytes stored", m.put_counts, 1),
            ("tidemq_broker_messages_out", "Messages served to pulls", m.get_counts, 0),
            ("tidemq_broker_bytes_out", "Stored bytes served to pulls", m.get_counts, 1),
        ):
            fam = CounterMetricFamily(name, doc, labels=topic_labels)
            for topic, counts in list(table.items()):
                fam.add_metric([*base, topic], counts[i])
            yield fam
        hist = HistogramMetricFamily(
            "tidemq_broker_request_latency_seconds",
            "Time from a send/pull request's arrival to its response (long polls and SYNC_FLUSH waits included)",
            labels=["cluster", "broker", "request"],
        )
        for request, (counts, total) in list(m.latency.items()):
            cumulative, buckets = 0, []
            for le, n in zip(_LE, counts):
                cumulative += n
                buckets.append((le, cumulative))
            hist.add_metric([*base, request], buckets, total)
        yield hist
        errors = CounterMetricFamily(
            "tidemq_broker_errors", "Responses with a non-success code (PULL_NOT_FOUND/PULL_RETRY_IMMEDIATELY excluded)",
            labels=["cluster", "broker", "code"],
        )
        for code, n in list(m.error_counts.items()):
            errors.add_metric([*base, code_name(code)], n)
        yield errors


def _gauge(name: str, doc: str, base: tuple[str, str], value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=["cluster", "broker"])
    g.add_metric(base, value)
    return g


def _counter_by(name: str, doc: str, base: tuple[str, str], label: str,
                counts: dict[str, int]) -> CounterMetricFamily:
    c = CounterMetricFamily(name, doc, labels=["cluster", "broker", label])
    for value, n in counts.items():
        c.add_metric([*base, value], n)
    return c


class _BrokerCollector(Collector):
    def __init__(self, broker: "Broker", base: tuple[str, str], queue_lag: bool = False) -> None:
        self.broker = broker
        self.base = base
        self.queue_lag = queue_lag

    def _backlog(self, topic: str) -> int:
        """Messages held by a topic's consume queues (max minus min offset, summed over queues)."""
        store = self.broker.store
        return sum(max(0, store.max_offset(topic, q) - store.min_offset(topic, q)) for q in store.queue_ids(topic))

    def collect(self) -> Iterator[Metric]:
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
        flush.add_metric(base, count_value=int(stats["flush_rounds"]), sum_value=stats.get("flush_seconds", 0.0))
        yield flush
        yield _gauge("tidemq_broker_long_poll_waiters", "Pull requests held by long polling", base, b.holds.waiting)
        yield _gauge("tidemq_broker_connections", "Open client connections", base, b.connection_count)
        yield _gauge("tidemq_broker_topics", "Topics configured on this broker", base, len(b.topics.topics))
        yield _gauge("tidemq_broker_subscription_groups", "Subscription groups configured on this broker", base,
                     len(b.groups.groups))
        limits = b.quota.limits
        yield _gauge("tidemq_broker_topics_limit", "Most topics this broker creates (maxTopicCount)", base,
                     limits.max_topics)
        yield _gauge("tidemq_broker_subscription_groups_limit",
                     "Most subscription groups this broker creates (maxSubscriptionGroupCount)", base, limits.max_groups)
        reg = b.registrar
        yield _gauge("tidemq_broker_register_body_bytes",
                     "Bytes of the last registration sent to each name server (all parts, compressed when compressed)",
                     base, reg.body_bytes)
        yield _gauge("tidemq_broker_register_parts",
                     "Requests the last registration took per name server (0: it fit in none, see the log)", base,
                     reg.parts)
        not_sent = CounterMetricFamily("tidemq_broker_register_rounds_not_sent",
                                       "Registration rounds sent to no name server because not even one topic per "
                                       "request fit the body limit", labels=["cluster", "broker"])
        not_sent.add_metric(list(base), reg.rounds_not_sent)
        yield not_sent
        yield _counter_by("tidemq_broker_implicit_creations",
                          "Topics and groups created implicitly (first heartbeat, pull, send-back, send)", base, "kind",
                          b.quota.created)
        yield _counter_by("tidemq_broker_creation_refusals",
                          "Creations refused: total = a broker limit, rate = a principal's window limit", base, "limit",
                          b.quota.refused)
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

    def _lag(self) -> Iterator[Metric]:
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


class _ReplicaCollector(Collector):
    """``tidemq_replica_*`` from the replica's status at scrape time (see the module docstring)."""

    def __init__(self, replica: "ReplicaService", base: tuple[str, str]) -> None:
        self.replica = replica
        self.base = base

    def collect(self) -> Iterator[Metric]:
        s = self.replica.status()
        base = self.base
        role = GaugeMetricFamily("tidemq_replica_role", "This replica's role: 1 for the role it has, 0 for the others",
                                 labels=["cluster", "broker", "role"])
        for name in (k.value for k in RoleKind):
            role.add_metric([*base, name], 1 if s.role == name else 0)
        yield role
        yield _gauge("tidemq_replica_epoch", "Highest election epoch this replica has seen", base, s.epoch)
        yield _gauge("tidemq_replica_in_sync", "Members of the group's in-sync set, as this replica knows it", base,
                     len(s.in_sync))
        yield _gauge("tidemq_replica_min_in_sync", "In-sync members a write needs (--min-in-sync)", base, s.min_in_sync)
        yield _gauge("tidemq_replica_high_water_offset_bytes",
                     "CommitLog offset below which every message is acknowledged by the group's rule", base,
                     s.high_water)
        lag = GaugeMetricFamily("tidemq_replica_follower_lag_bytes",
                                "Bytes of the master's CommitLog a follower has not acknowledged (master only)",
                                labels=["cluster", "broker", "replica"])
        for f in s.followers:
            lag.add_metric([*base, str(f.replica_id)], f.lag_bytes)
        yield lag
        for name, doc, value in (
            ("tidemq_replica_failovers", "Times this replica became master by election", s.failovers),
            ("tidemq_replica_switchovers", "Planned hand-overs of mastership this replica made as master",
             s.switchovers),
            ("tidemq_replica_deposed", "Masters this replica deposed without waiting for their lease "
             "(their replication address refused connections)", s.deposed),
        ):
            c = CounterMetricFamily(name, doc, labels=["cluster", "broker"])
            c.add_metric(list(base), value)
            yield c
        seconds = GaugeMetricFamily(
            "tidemq_replica_failover_seconds",
            "Last failover: from the old master's lease lapsing (as this replica saw it) to this replica being master",
            labels=["cluster", "broker"])
        if s.last_failover_seconds is not None:
            seconds.add_metric(list(base), s.last_failover_seconds)
        yield seconds
