"""Messages end to end: a producer Job sends 10 000 messages, a consumer Job receives them all."""

from __future__ import annotations

import pytest

from e2e.install import Deployed
from e2e.jobs import LoadJobs
from e2e.k8s import Kube
from e2e.scenario import apply_topic, brief, lost, record
from e2e.settings import Settings

pytestmark = pytest.mark.e2e

COUNT = 10_000


def test_ten_thousand_messages_from_a_producer_job_reach_a_consumer_job(
        kube: Kube, tidemq: Deployed, load: LoadJobs, settings: Settings, run_id: str) -> None:
    topic = f"e2e-msgs-{run_id}"
    apply_topic(kube, tidemq, topic, queues=8)
    sent = load.produce(topic, run_id, COUNT, "--concurrency", "32")
    assert sent["acked_count"] == COUNT and sent["gave_up"] == [], brief(sent)
    # messages went to both broker groups (the producer round-robins over their queues)
    assert sorted(sent["by_broker"]) == list(tidemq.brokers), brief(sent)

    got = load.consume(topic, run_id, f"e2e-msgs-{run_id}", "--expect", str(COUNT))
    record(settings.artifacts, "messages", {"producer": brief(sent), "consumer": brief(got)})
    assert lost(sent, got) == [], brief(got)
    assert got["distinct"] == COUNT and got["reason"] == "expected", brief(got)
    if sent["send_failures"] == 0:  # a retried send may have been stored twice; else exact
        assert got["by_broker"] == sent["by_broker"], (brief(sent), brief(got))
        assert got["duplicates"] == 0, brief(got)
