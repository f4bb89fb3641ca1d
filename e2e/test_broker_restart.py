"""A broker pod deleted while a producer sends: the StatefulSet brings it back on the same
PersistentVolumeClaim, and no acknowledged message is lost (brokers flush synchronously)."""

from __future__ import annotations

import pytest

from e2e.install import Deployed
from e2e.jobs import LoadJobs
from e2e.k8s import Kube, pod_ready
from e2e.proc import NotYet, wait_for
from e2e.scenario import apply_topic, brief, lost, record
from e2e.settings import Settings

pytestmark = pytest.mark.e2e

RATE = "100"          # messages per second while the broker goes away and comes back
BEFORE = 1000         # acknowledged before the pod is deleted
AFTER = 500           # more acknowledged after it is ready again
RESTART_TIMEOUT = 420.0


def test_deleted_broker_pod_returns_with_its_volume_and_keeps_acknowledged_messages(
        kube: Kube, tidemq: Deployed, load: LoadJobs, settings: Settings, run_id: str) -> None:
    topic = f"e2e-restart-{run_id}"
    apply_topic(kube, tidemq, topic, queues=8)
    victim_broker = tidemq.brokers[0]
    pod_name = f"{victim_broker}-0"
    claim = f"data-{pod_name}"
    old_pod = kube.get("pod", pod_name)
    old_claim = kube.get("pvc", claim)

    job = load.start_producer(topic, run_id, 1_000_000, "--rate", RATE, "--concurrency", "8",
                              "--retry-for", "300", "--stop-file", "/tmp/tmqload-stop", deadline=1500)
    load.wait_progress(job, "acked", BEFORE, 300)
    kube.delete("pod", pod_name)  # graceful: preStop, then SIGTERM (the broker flushes and unregisters)

    def replaced() -> dict:
        pod = kube.get_or_none("pod", pod_name)
        if pod is None or pod["metadata"]["uid"] == old_pod["metadata"]["uid"]:
            raise NotYet("the old pod is still there" if pod else "no pod yet")
        if not pod_ready(pod):
            raise NotYet(f"new pod {pod['status'].get('phase')}, not ready")
        return pod

    new_pod = wait_for(replaced, RESTART_TIMEOUT, f"StatefulSet to recreate {pod_name}", interval=2.0)
    acked_at_return = int((load.progress(job) or {}).get("acked", 0))
    load.wait_progress(job, "acked", acked_at_return + AFTER, 300)
    load.stop(job)
    sent = load.result(job, 600)

    # the same claim (same uid), bound to the same volume, mounted by the new pod
    new_claim = kube.get("pvc", claim)
    assert new_claim["metadata"]["uid"] == old_claim["metadata"]["uid"]
    assert new_claim["spec"]["volumeName"] == old_claim["spec"]["volumeName"]
    assert [v["persistentVolumeClaim"]["claimName"] for v in new_pod["spec"]["volumes"]
            if "persistentVolumeClaim" in v] == [claim]

    # every id the producer started was acknowledged or given up (a given-up one may be stored)
    got = load.consume(topic, run_id, f"e2e-restart-{run_id}", "--expect", str(sent["started"]))
    record(settings.artifacts, "broker-restart", {"producer": brief(sent), "consumer": brief(got)})
    assert sent["gave_up"] == [], brief(sent)
    assert lost(sent, got) == [], brief(got)
    # what the restarted broker acknowledged (before and after) is all readable from it
    assert got["by_broker"].get(victim_broker, 0) >= sent["by_broker"].get(victim_broker, 0) > 0
