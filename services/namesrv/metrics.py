"""Prometheus metrics of a name server (tidemq_namesrv_*), read from the server's counters."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from tidemq.namesrv.server import NamesrvServer


class NamesrvCollector(Collector):
    def __init__(self, server: "NamesrvServer") -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        s = self.server
        g = GaugeMetricFamily("tidemq_namesrv_brokers_alive", "Brokers currently registered")
        g.add_metric([], s.brokers_alive)
        yield g
        g = GaugeMetricFamily("tidemq_namesrv_topics", "Topics in the route table")
        g.add_metric([], s.topics)
        yield g
        for name, doc, value in (
            ("tidemq_namesrv_route_lookups", "GET_ROUTEINFO_BY_TOPIC requests", s.route_lookups),
            ("tidemq_namesrv_registrations", "REGISTER_BROKER requests accepted", s.registrations),
            ("tidemq_namesrv_brokers_expired", "Brokers dropped after the expiry", s.brokers_expired),
            ("tidemq_namesrv_requests", "Requests served", s.requests),
            ("tidemq_namesrv_acl_refused", "State-changing requests refused by the write ACL", s.acl_refused),
        ):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], value)
            yield c


def namesrv_registry(server: "NamesrvServer") -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(NamesrvCollector(server))
    return registry
