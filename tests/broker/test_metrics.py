"""Broker metrics (tidemq.broker.metrics) scraped from a real broker's /metrics after sends, pulls,
commits, a delayed message and failing requests."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tidemq.broker.metrics import NOT_ERRORS, code_name
from tests.procs import Cluster
from tests.support.waiting import wait_until
from tidemq.client import Producer, PullConsumer, SyncProducer, SyncPullConsumer
from tidemq.message import Message, Prop
from tidemq.remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode

TOPIC = "MetricsT"
GROUP = "metrics-g"


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def _flushed(samples, base: dict[str, str]):
    """``samples`` when they show the CommitLog flushed up to its end, else None."""
    flushed = value(samples, "tidemq_broker_commitlog_flushed_offset_bytes", **base)
    return samples if flushed == value(samples, "tidemq_broker_commitlog_max_offset_bytes", **base) else None


def value(samples, name: str, **labels: str) -> float:
    """The one sample of ``name`` whose labels include ``labels``."""
    found = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls)]
    assert len(found) == 1, (name, labels, found)
    return found[0]


async def _raw_requests(addr: str, metrics_url: str, base: dict[str, str]) -> tuple[list[int], float]:
    """The codes of an unsupported request and a pull of a missing topic, and the connection
    gauge scraped while this client is connected."""
    client = RemotingClient()
    try:
        codes = []
        unknown = RemotingCommand.request(9999, {})
        codes.append((await client.invoke(addr, unknown, 5)).code)
        pull = RemotingCommand.request(
            RequestCode.PULL_MESSAGE,
            {"consumerGroup": GROUP, "topic": "NoSuchTopic", "queueId": 0, "queueOffset": 0,
             "maxMsgNums": 1, "sysFlag": 0, "commitOffset": 0, "suspendTimeoutMillis": 0, "subVersion": 0},
        )
        codes.append((await client.invoke(addr, pull, 5)).code)
        samples = await asyncio.to_thread(scrape, metrics_url)
        return codes, value(samples, "tidemq_broker_connections", **base)
    finally:
        await client.close()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("metrics"), extra_broker_args=["--metrics-queue-lag"]).start()
    try:
        c.create_topic(TOPIC, queues=1)
        yield c
    finally:
        c.stop()


def test_code_labels():
    assert code_name(ResponseCode.TOPIC_NOT_EXIST) == "TOPIC_NOT_EXIST"
    assert code_name(54321) == "54321"
    assert ResponseCode.SUCCESS in NOT_ERRORS and ResponseCode.SYSTEM_ERROR not in NOT_ERRORS


async def test_metrics_follow_sends_pulls_commits_and_errors(broker):
    n, k = 5, 3
    base = {"cluster": broker.cluster_name, "broker": broker.broker_name}
    async with Producer("metrics-pg", broker.namesrv_addr) as producer, \
            PullConsumer(GROUP, broker.namesrv_addr) as consumer:
        for i in range(n):
            await producer.send(Message(TOPIC, b"hello"))
        await producer.send(Message(TOPIC, b"later", properties={Prop.DELAY: "5"}))  # delay level 5 = 1 min
        [mq] = await consumer.fetch_queues(TOPIC)
        got = await consumer.pull(mq, 0, max_nums=k)
        assert len(got.messages) == k
        await consumer.commit(mq, k)
    codes, connected = await _raw_requests(broker.broker_addr, broker.metrics_url, base)
    assert codes == [ResponseCode.REQUEST_CODE_NOT_SUPPORTED, ResponseCode.TOPIC_NOT_EXIST]
    assert connected >= 1  # the raw client's connection, open during that scrape

    async def scraped(check):
        """A wait_until check: ``check`` of a fresh scrape (urllib blocks: a thread runs it)."""
        return check(await asyncio.to_thread(scrape, broker.metrics_url))

    # The sends are flushed within the ASYNC_FLUSH interval: a flush round the test caused.
    s = await wait_until(lambda: scraped(lambda samples: _flushed(samples, base)),
                         "the CommitLog to be flushed up to its end", interval=0.1)
    t = {**base, "topic": TOPIC}
    # counted under the topic the producer named, the delayed one included (5-byte bodies)
    assert value(s, "tidemq_broker_messages_in_total", **t) == n + 1
    assert value(s, "tidemq_broker_bytes_in_total", **t) == 5 * (n + 1)
    assert value(s, "tidemq_broker_messages_out_total", **t) == k
    assert value(s, "tidemq_broker_bytes_out_total", **t) > 5 * k  # stored records, headers included
    lag = {**base, "group": GROUP, "topic": TOPIC}
    assert value(s, "tidemq_broker_consumer_lag_messages", **lag) == n - k
    assert value(s, "tidemq_broker_consumer_queue_lag_messages", **lag, queue="0") == n - k
    assert value(s, "tidemq_broker_delayed_messages", **base) == 1
    assert value(s, "tidemq_broker_half_messages", **base) == 0
    # send latency: one observation per send (5 plain + 1 delayed); pull: at least the one above
    assert value(s, "tidemq_broker_request_latency_seconds_count", **base, request="send") == n + 1
    assert value(s, "tidemq_broker_request_latency_seconds_count", **base, request="pull") >= 1
    assert value(s, "tidemq_broker_request_latency_seconds_bucket", **base, request="send", le="+Inf") == n + 1
    assert value(s, "tidemq_broker_errors_total", **base, code="REQUEST_CODE_NOT_SUPPORTED") == 1
    assert value(s, "tidemq_broker_errors_total", **base, code="TOPIC_NOT_EXIST") == 1
    assert not [ls for (name, ls) in s if name == "tidemq_broker_errors_total" and ("code", "SUCCESS") in ls]
    cmax = value(s, "tidemq_broker_commitlog_max_offset_bytes", **base)
    cmin = value(s, "tidemq_broker_commitlog_min_offset_bytes", **base)
    assert cmax > 0 and value(s, "tidemq_broker_commitlog_size_bytes", **base) == cmax - cmin
    assert 0 < value(s, "tidemq_broker_disk_usage_ratio", **base) <= 1
    assert value(s, "tidemq_broker_commitlog_flush_seconds_count", **base) >= 1
    assert value(s, "tidemq_broker_commitlog_flush_seconds_sum", **base) > 0
    # every client of this test is closed: their connections are gone from the gauge
    await wait_until(lambda: scraped(lambda samples: value(samples, "tidemq_broker_connections", **base) == 0),
                     "the connections gauge to drop to 0 once every client of this test closed", interval=0.1)
    assert value(s, "tidemq_broker_long_poll_waiters", **base) == 0


def test_long_poll_latency_is_measured_when_the_response_is_produced(broker):
    """A held pull is observed once it answers, so its latency covers the hold."""
    base = {"cluster": broker.cluster_name, "broker": broker.broker_name}
    before = scrape(broker.metrics_url)
    pulls_before = value(before, "tidemq_broker_request_latency_seconds_count", **base, request="pull")
    sum_before = value(before, "tidemq_broker_request_latency_seconds_sum", **base, request="pull")
    consumer = SyncPullConsumer(GROUP + "-lp", broker.namesrv_addr)
    consumer.start()
    try:
        [mq] = consumer.fetch_queues(TOPIC)
        tail = consumer.max_offset(mq)
        consumer.pull(mq, tail, suspend_ms=300)  # nothing new: held ~0.3 s, then PULL_NOT_FOUND
    finally:
        consumer.close()
    after = scrape(broker.metrics_url)
    assert value(after, "tidemq_broker_request_latency_seconds_count", **base, request="pull") == pulls_before + 1
    assert value(after, "tidemq_broker_request_latency_seconds_sum", **base, request="pull") - sum_before >= 0.25


def test_retry_messages_are_counted_per_group(broker):
    base = {"cluster": broker.cluster_name, "broker": broker.broker_name}
    producer = SyncProducer("metrics-retry-pg", broker.namesrv_addr)
    producer.start()
    try:
        broker.create_topic("%RETRY%metrics-r", queues=1)
        for _ in range(2):
            producer.send(Message("%RETRY%metrics-r", b"again"))
    finally:
        producer.close()
    s = scrape(broker.metrics_url)
    assert value(s, "tidemq_broker_retry_messages", **base, group="metrics-r") == 2


def test_docs_list_every_exported_metric(broker):
    docs = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    names = set()
    for url in (broker.metrics_url, f"http://127.0.0.1:{broker.namesrv_metrics_port}/metrics"):
        with urllib.request.urlopen(url, timeout=5) as r:
            for fam in text_string_to_metric_families(r.read().decode()):
                names.add(fam.name + ("_total" if fam.type == "counter" else ""))
    assert "tidemq_broker_consumer_queue_lag_messages" in names
    # prometheus_client adds a `<counter/histogram>_created` timestamp series (documented as a rule)
    missing = sorted(n for n in names if n.startswith("tidemq_") and not n.endswith("_created")
                     and f"`{n}`" not in docs)
    assert not missing, f"docs/metrics.md does not list {missing}"
