"""Prometheus metrics, scraped as Prometheus would reach them: through the API server's proxy to
the pods' metrics ports (names and labels as docs/metrics.md lists them)."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from e2e.install import BROKER_SELECTOR, NAMESRV_SELECTOR, Deployed
from e2e.jobs import LoadJobs
from e2e.k8s import Kube
from e2e.proc import NotYet, wait_for
from e2e.scenario import apply_topic, brief

pytestmark = pytest.mark.e2e

SENT = 100
CONSUMED = 40


def scrape(kube: Kube, namespace: str, pod: str, port: int) -> list[Sample]:
    text = kube.raw(f"/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy/metrics")
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def total(samples: Iterable[Sample], name: str, **labels: str) -> float:
    return sum(s.value for s in samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def named(samples: Iterable[Sample], name: str) -> list[Sample]:
    return [s for s in samples if s.name == name]


def test_brokers_name_servers_and_operator_export_tidemq_metrics(
        kube: Kube, tidemq: Deployed, load: LoadJobs, run_id: str) -> None:
    topic, group = f"e2e-metrics-{run_id}", f"e2e-metrics-{run_id}"
    apply_topic(kube, tidemq, topic, queues=4)
    sent = load.produce(topic, run_id, SENT)
    assert sent["acked_count"] == SENT, brief(sent)
    got = load.consume(topic, run_id, group, "--max-messages", str(CONSUMED))
    assert got["received"] == CONSUMED, brief(got)
    ns = tidemq.namespace
    brokers = sorted(p["metadata"]["name"] for p in kube.items("pods", selector=BROKER_SELECTOR))
    assert len(brokers) == len(tidemq.brokers), brokers

    def broker_samples() -> list[Sample]:
        return [s for pod in brokers for s in scrape(kube, ns, pod, tidemq.metrics_port)]

    samples = broker_samples()
    # every broker series carries cluster and broker; one broker name per pod
    for s in named(samples, "tidemq_broker_connections"):
        assert s.labels["cluster"] == tidemq.cluster and s.labels["broker"] in tidemq.brokers, s
    assert {s.labels["broker"] for s in named(samples, "tidemq_broker_topics")} == set(tidemq.brokers)
    # counters by topic: what the producer sent and the consumer pulled, summed over the brokers
    assert total(samples, "tidemq_broker_messages_in_total", topic=topic, cluster=tidemq.cluster) == SENT
    assert total(samples, "tidemq_broker_bytes_in_total", topic=topic) > 0
    assert total(samples, "tidemq_broker_messages_out_total", topic=topic) >= CONSUMED
    assert named(samples, "tidemq_broker_request_latency_seconds_count")
    assert total(samples, "tidemq_broker_commitlog_flushed_offset_bytes") > 0  # SYNC_FLUSH flushed

    def lag_exported() -> float:  # the lag gauge is computed at scrape time from committed offsets
        value = total(broker_samples(), "tidemq_broker_consumer_lag_messages", group=group, topic=topic)
        if value != SENT - CONSUMED:
            raise NotYet(f"tidemq_broker_consumer_lag_messages = {value}")
        return value

    wait_for(lag_exported, 60, f"the lag of {group} on {topic} in the brokers' metrics", interval=3.0)

    for pod in kube.items("pods", selector=NAMESRV_SELECTOR):
        ns_samples = scrape(kube, ns, pod["metadata"]["name"], tidemq.namesrv_metrics_port)
        assert total(ns_samples, "tidemq_namesrv_brokers_alive") == len(tidemq.brokers)
        assert total(ns_samples, "tidemq_namesrv_route_lookups_total") > 0 or \
            total(ns_samples, "tidemq_namesrv_requests_total") > 0

    op = kube.items("pods", selector=f"app.kubernetes.io/instance={tidemq.release},"
                                     "app.kubernetes.io/component=operator")
    assert len(op) == 1, [p["metadata"]["name"] for p in op]
    op_port = next(p["containerPort"] for c in op[0]["spec"]["containers"] for p in c["ports"]
                   if p["name"] == "metrics")
    op_samples = scrape(kube, ns, op[0]["metadata"]["name"], op_port)
    assert total(op_samples, "tidemq_operator_reconciles_total", kind="Cluster", result="ok") > 0
    assert total(op_samples, "tidemq_operator_reconciles_total", kind="Topic", result="ok") > 0
    assert total(op_samples, "tidemq_operator_managed", kind="Topic") >= 1
