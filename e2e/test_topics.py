"""Topics applied with kubectl: created on every broker, grown at once, shrunk only once drained."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from e2e import resources
from e2e.install import Deployed
from e2e.jobs import LoadJobs
from e2e.k8s import Kube, condition
from e2e.proc import NotYet, stays
from e2e.scenario import apply_topic, brief, lost, route, wait_route, wait_topic

pytestmark = pytest.mark.e2e


def test_topic_applied_with_kubectl_becomes_ready_on_every_broker(kube: Kube, tidemq: Deployed,
                                                                  run_id: str) -> None:
    name = f"e2e-ready-{run_id}"
    topic = apply_topic(kube, tidemq, name, queues=4)
    status = topic["status"]
    assert status["topicName"] == name
    assert resources.topic_queue_counts(topic) == {b: (4, 4) for b in tidemq.brokers}
    assert (status["readQueueNums"], status["writeQueueNums"]) == (4, 4)
    row = next(r for r in kube.table("tmqt") if r["NAME"] == name)
    assert (row["READ"], row["WRITE"], row["READY"], row["TOPIC"]) == ("4", "4", "True", name), row
    wait_route(kube, tidemq, name, {b: (4, 4) for b in tidemq.brokers})


def test_growing_a_topic_updates_its_status_and_route(kube: Kube, tidemq: Deployed, run_id: str) -> None:
    name = f"e2e-grow-{run_id}"
    apply_topic(kube, tidemq, name, queues=4)
    kube.patch(resources.TOPICS, name, {"spec": {"readQueueNums": 8, "writeQueueNums": 8}})

    def grown(obj: Mapping[str, Any] | None) -> bool:
        resources.topic_ready(obj)
        assert obj is not None
        counts = resources.topic_queue_counts(obj)
        if counts != {b: (8, 8) for b in tidemq.brokers}:
            raise NotYet(f"status.brokers {counts}")
        return True

    topic = wait_topic(kube, name, grown, 120, "grown to 8 queues")
    assert (topic["status"]["readQueueNums"], topic["status"]["writeQueueNums"]) == (8, 8)
    wait_route(kube, tidemq, name, {b: (8, 8) for b in tidemq.brokers})


def test_shrinking_with_pending_messages_drains_before_lowering_read_queues(
        kube: Kube, tidemq: Deployed, load: LoadJobs, run_id: str) -> None:
    """8 -> 4 queues with messages on queues 4..7: writes move off them at once (Draining), the
    read queues stay until a consumer group has consumed everything, then they go too."""
    name = f"e2e-shrink-{run_id}"
    apply_topic(kube, tidemq, name, queues=8)
    sent = load.produce(name, run_id, 800, "--concurrency", "8")
    assert sent["acked_count"] == 800, brief(sent)
    assert len(sent["by_broker"]) == len(tidemq.brokers), brief(sent)  # the queues that go hold messages

    kube.patch(resources.TOPICS, name, {"spec": {"readQueueNums": 4, "writeQueueNums": 4}})
    draining = wait_topic(kube, name, resources.topic_draining, 120, "Draining")
    ready = condition(draining, "Ready") or {}
    assert (ready.get("status"), ready.get("reason")) == ("False", "Draining"), ready
    # writes steered away, every queue still readable
    assert resources.topic_queue_counts(draining) == {b: (8, 4) for b in tidemq.brokers}
    wait_route(kube, tidemq, name, {b: (8, 4) for b in tidemq.brokers})
    # nobody consumed: it stays Draining across several operator passes (timerInterval 5 s)
    def still_draining() -> bool:
        obj = kube.get_or_none(resources.TOPICS, name)
        resources.topic_draining(obj)
        assert obj is not None
        if resources.topic_queue_counts(obj) != {b: (8, 4) for b in tidemq.brokers}:
            raise NotYet(f"status.brokers {resources.topic_queue_counts(obj)}")
        return True

    stays(still_draining, 30, f"Topic {name} Draining with 8 read and 4 write queues")
    assert resources.route_queue_counts(route(kube, tidemq, name)) == {b: (8, 4) for b in tidemq.brokers}

    got = load.consume(name, run_id, f"e2e-drain-{run_id}", "--expect", "800", "--idle-seconds", "60")
    assert lost(sent, got) == [], brief(got)

    done = wait_topic(kube, name, resources.topic_ready, 180, "Ready with 4 queues")
    assert resources.topic_queue_counts(done) == {b: (4, 4) for b in tidemq.brokers}
    assert (condition(done, "Draining") or {}).get("status") == "False"
    wait_route(kube, tidemq, name, {b: (4, 4) for b in tidemq.brokers})
