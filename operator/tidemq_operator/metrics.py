"""Prometheus metrics of the operator (its own registry, served by ``tidemq operator``).

Names: tidemq_operator_reconciles_total{kind,result}, tidemq_operator_reconcile_seconds{kind},
tidemq_operator_errors_total{kind,reason}, tidemq_operator_managed{kind} (topics/groups/clusters
this replica reconciles). ``result`` is one of ok, progressing (a Cluster rolling or waiting for
pods), draining, retry, invalid, error, deleted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

log = logging.getLogger(__name__)


class OperatorMetrics:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.registry = CollectorRegistry()
        self.reconciles = Counter(
            "tidemq_operator_reconciles", "Reconcile passes by resource kind and result",
            ["kind", "result"], registry=self.registry)
        self.duration = Histogram(
            "tidemq_operator_reconcile_seconds", "Duration of one reconcile pass", ["kind"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=self.registry)
        self.errors = Counter(
            "tidemq_operator_errors", "Reconcile errors by kind and reason", ["kind", "reason"],
            registry=self.registry)
        self.managed = Gauge(
            "tidemq_operator_managed", "Resources this operator manages, by kind", ["kind"],
            registry=self.registry)
        self._managed: dict[str, set[str]] = {}

    @contextmanager
    def timed(self, kind: str) -> Iterator[None]:
        start = self.clock()
        try:
            yield
        finally:
            self.duration.labels(kind).observe(max(0.0, self.clock() - start))

    def result(self, kind: str, result: str, reason: str | None = None) -> None:
        self.reconciles.labels(kind, result).inc()
        if reason is not None:
            self.errors.labels(kind, reason).inc()

    def track(self, kind: str, uid: str, present: bool = True) -> None:
        uids = self._managed.setdefault(kind, set())
        if present:
            uids.add(uid)
        else:
            uids.discard(uid)
        self.managed.labels(kind).set(len(uids))

    def serve(self, host: str, port: int) -> None:
        """Serve /metrics on host:port in a background thread."""
        start_http_server(port, addr=host, registry=self.registry)
        log.info("operator metrics on http://%s:%d/metrics", host, port)


METRICS = OperatorMetrics()
