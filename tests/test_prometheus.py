"""A REAL Prometheus server scrapes a name server and a broker (tests/procs.py Cluster) and its
HTTP query API reports the message counter, the consumer lag and the live broker count.

Needs the `prometheus` binary (Debian package `prometheus`; `python3 dev.py test` installs it with
apt-get when run as root). Without it the test skips and says so.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.procs import Cluster, free_port
from tidemq.client import SyncProducer, SyncPullConsumer
from tidemq.message import Message

TOPIC = "PromT"
GROUP = "prom-g"
N, K = 7, 3
WAIT = 30.0

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="prometheus not installed; `python3 dev.py test` installs it with apt-get when run as root "
           "(or: apt-get install prometheus)",
)


def _get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def _write_config(path: Path, cluster: Cluster) -> None:
    path.write_text(
        "global:\n"
        "  scrape_interval: 1s\n"
        "  scrape_timeout: 1s\n"
        "  evaluation_interval: 1s\n"
        "scrape_configs:\n"
        "  - job_name: tidemq-namesrv\n"
        "    static_configs:\n"
        f"      - targets: ['127.0.0.1:{cluster.namesrv_metrics_port}']\n"
        "  - job_name: tidemq-broker\n"
        "    static_configs:\n"
        f"      - targets: ['127.0.0.1:{cluster.broker_metrics_port}']\n"
    )


@pytest.fixture
def prometheus_stack(tmp_path):
    cluster = Cluster(tmp_path / "cluster").start()
    config = tmp_path / "prometheus.yml"
    _write_config(config, cluster)
    port = free_port()
    log = open(tmp_path / "prometheus.log", "wb")
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    log.close()
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + WAIT
        while True:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text(errors="replace")
            try:
                if _get(f"{base}/-/ready", 1.0)[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "prometheus not ready: " + (tmp_path / "prometheus.log").read_text()
            time.sleep(0.1)
        yield cluster, base
    finally:
        proc.terminate()  # by pid: only the process this fixture started
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        cluster.stop()


def query(base: str, promql: str) -> list[float]:
    status, text = _get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    assert status == 200, text
    body = json.loads(text)
    assert body["status"] == "success", body
    return [float(r["value"][1]) for r in body["data"]["result"]]


def wait_value(base: str, promql: str, expected: float) -> None:
    deadline = time.monotonic() + WAIT
    seen: list[float] = []
    while time.monotonic() < deadline:
        seen = query(base, promql)
        if seen == [expected]:
            return
        time.sleep(0.25)
    pytest.fail(f"Prometheus query {promql!r} gave {seen}, expected [{expected}] within {WAIT:.0f} s")


def test_prometheus_scrapes_counters_and_lag(prometheus_stack):
    cluster, base = prometheus_stack
    cluster.create_topic(TOPIC, queues=2)
    producer = SyncProducer("prom-pg", cluster.namesrv_addr)
    consumer = SyncPullConsumer(GROUP, cluster.namesrv_addr)
    producer.start()
    consumer.start()
    try:
        for i in range(N):
            producer.send(Message(TOPIC, f"m{i}".encode()))
        consumed = 0
        for mq in consumer.fetch_queues(TOPIC):
            want = K - consumed
            if want <= 0:
                break
            res = consumer.pull(mq, 0, max_nums=want)
            got = len(res.messages)
            if got:
                consumer.commit(mq, res.messages[-1].queue_offset + 1)
            consumed += got
        assert consumed == K, consumed
    finally:
        producer.close()
        consumer.close()

    wait_value(base, f'tidemq_broker_messages_in_total{{topic="{TOPIC}"}}', N)
    wait_value(base, f'tidemq_broker_consumer_lag_messages{{group="{GROUP}",topic="{TOPIC}"}}', N - K)
    wait_value(base, "tidemq_namesrv_brokers_alive", 1)
    # the targets carry the labels operators filter by
    [cluster_count] = query(base, f'count(tidemq_broker_messages_in_total{{cluster="{cluster.cluster_name}",'
                                  f'broker="{cluster.broker_name}"}})')
    assert cluster_count >= 1
