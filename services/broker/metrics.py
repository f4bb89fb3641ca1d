"""Prometheus metrics of a broker (names: tidemq_broker_*, base units, _total counters)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from tidemq.broker.broker import Broker


class BrokerMetrics:
    def __init__(self, cluster: str, broker: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["cluster", "broker", "topic"]
        self._base = (cluster, broker)
        self.messages_in = Counter("tidemq_broker_messages_in", "Messages stored", labels, registry=self.registry)
        self.bytes_in = Counter("tidemq_broker_bytes_in", "Message body bytes stored", labels, registry=self.registry)
        self.messages_out = Counter("tidemq_broker_messages_out", "Messages served to pulls", labels, registry=self.registry)
        self.bytes_out = Counter("tidemq_broker_bytes_out", "Stored bytes served to pulls", labels, registry=self.registry)
        self._in: dict[str, tuple] = {}
        self._out: dict[str, tuple] = {}

    def on_put(self, topic: str, count: int, size: int) -> None:
        self._count(self._in, self.messages_in, self.bytes_in, topic, count, size)

    def on_get(self, topic: str, count: int, size: int) -> None:
        self._count(self._out, self.messages_out, self.bytes_out, topic, count, size)

    def _count(self, cache: dict[str, tuple], messages: Counter, nbytes: Counter, topic: str,
               count: int, size: int) -> None:
        pair = cache.get(topic)
        if pair is None:  # the labelled children are cached per topic (hot path)
            pair = cache[topic] = (messages.labels(*self._base, topic), nbytes.labels(*self._base, topic))
        pair[0].inc(count)
        pair[1].inc(size)

    def attach(self, broker: "Broker") -> None:
        self.registry.register(_BrokerCollector(broker, self._base))


class _BrokerCollector(Collector):
    def __init__(self, broker: "Broker", base: tuple[str, str]) -> None:
        self.broker = broker
        self.base = base

    def collect(self):
        b = self.broker
        base_labels = ["cluster", "broker"]
        g = GaugeMetricFamily("tidemq_broker_commitlog_max_offset_bytes", "CommitLog end offset", labels=base_labels)
        g.add_metric(self.base, b.store.commitlog_max_offset)
        yield g
        g = GaugeMetricFamily("tidemq_broker_commitlog_min_offset_bytes", "CommitLog start offset", labels=base_labels)
        g.add_metric(self.base, b.store.commitlog_min_offset)
        yield g
        g = GaugeMetricFamily("tidemq_broker_long_poll_waiters", "Pull requests held by long polling", labels=base_labels)
        g.add_metric(self.base, b.holds.waiting)
        yield g
        g = GaugeMetricFamily("tidemq_broker_connections", "Open client connections", labels=base_labels)
        g.add_metric(self.base, b.connection_count)
        yield g
        g = GaugeMetricFamily("tidemq_broker_topics", "Topics configured on this broker", labels=base_labels)
        g.add_metric(self.base, len(b.topics.topics))
        yield g
        lag = GaugeMetricFamily(
            "tidemq_broker_consumer_lag_messages",
            "Max offset minus committed offset, summed over the topic's queues",
            labels=[*base_labels, "group", "topic"],
        )
        for key, queues in list(b.offsets.table.items()):
            topic, _, group = key.rpartition("@")
            tc = b.topics.get(topic)
            if tc is None:
                continue
            total = 0
            for q in range(tc.read_queue_nums):
                total += max(0, b.store.max_offset(topic, q) - queues.get(q, 0))
            lag.add_metric([*self.base, group, topic], total)
        yield lag
