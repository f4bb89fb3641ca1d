"""`tidemq namesrv --metrics-listen` and `tidemq broker --metrics-listen`: health, readiness and
Prometheus metrics that reflect what the CLI just did."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.cli.clirun import http_get, tidemq


def samples(url: str) -> dict[tuple[str, frozenset], float]:
    status, text = http_get(url)
    assert status == 200, text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_health_readiness_and_metrics(cluster):
    n = 6
    cluster.create_topic("MetricsTopic", queues=2)
    tidemq("send", "-n", cluster.namesrv_addr, "-t", "MetricsTopic", "-b", "12345", "-c", str(n)).ok()

    for port in (cluster.namesrv_metrics_port, cluster.broker_metrics_port):
        for path in ("/healthz", "/readyz"):
            status, _ = http_get(f"http://127.0.0.1:{port}{path}")
            assert status == 200, (port, path)
        assert http_get(f"http://127.0.0.1:{port}/no-such-page")[0] == 404

    broker = samples(cluster.metrics_url)
    labels = frozenset({"cluster": cluster.cluster_name, "broker": cluster.broker_name, "topic": "MetricsTopic"}.items())
    assert broker[("tidemq_broker_messages_in_total", labels)] == n
    assert broker[("tidemq_broker_bytes_in_total", labels)] == 5 * n

    namesrv = samples(f"http://127.0.0.1:{cluster.namesrv_metrics_port}/metrics")
    assert namesrv[("tidemq_namesrv_brokers_alive", frozenset())] == 1
