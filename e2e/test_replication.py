"""A replicated broker group on Kubernetes (issue 17): a second Cluster, ``repl``, with one broker
group of 3 replicas (minInSync 2, sync replication, a 5 s lease) next to the chart's Cluster.

1. The master's pod is deleted while a producer sends with retries: another replica is elected,
   the producer follows it, no acknowledged message is lost; the longest time without an
   acknowledgement (the last one from the old master to the first from the new) is printed and
   bounded by the lease + 10 s.
2. A new image rolls the group through the operator (followers first, the master after a
   switchover, never below minInSync) while a producer sends: not one send fails, even before the
   producer's own retries, and nothing acknowledged is lost.

The Cluster is made by the chart's operator from a Cluster object applied here, so this is the
operator's path too: Lease RBAC, the HA port, status.groups and the Replication printer column.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from e2e import kind, resources
from e2e.install import Deployed
from e2e.jobs import LoadJobs
from e2e.k8s import Kube, pod_ready
from e2e.proc import NotYet, wait_for
from e2e.scenario import brief, lost, record, wait_topic
from e2e.settings import IMAGE_NEXT, Settings

pytestmark = pytest.mark.e2e

NAME = "repl"
GROUP = f"{NAME}-broker-0"
SELECTOR = f"app.kubernetes.io/instance={NAME},app.kubernetes.io/component=broker"
LEASE = 5
READY_TIMEOUT = 600.0
RATE = "50"


def replicated_cluster(image: str) -> dict[str, Any]:
    return {"apiVersion": resources.API_VERSION, "kind": "Cluster",
            "metadata": {"name": NAME, "labels": {"app.kubernetes.io/part-of": "tidemq-e2e"}},
            "spec": {"image": image, "imagePullPolicy": "IfNotPresent",
                     "nameServers": {"replicas": 1, "resources": {"requests": {"cpu": "50m", "memory": "96Mi"}}},
                     "brokers": {"groups": 1, "replicas": 3, "minInSync": 2, "replication": "sync",
                                 "leaseSeconds": LEASE, "flushMode": "sync", "storage": {"size": "1Gi"},
                                 "resources": {"requests": {"cpu": "100m", "memory": "192Mi"},
                                               "limits": {"memory": "1Gi"}}}}}


def group_status(obj: dict[str, Any] | None) -> dict[str, Any]:
    """The group's status.groups entry once every replica is in sync (NotYet otherwise)."""
    if obj is None:
        raise NotYet(f"Cluster {NAME} does not exist")
    status = obj.get("status") or {}
    if status.get("replication") != "1/1 groups in sync":
        raise NotYet(f"replication: {status.get('replication')!r}; groups: {status.get('groups')}")
    return dict(status["groups"][0])


def wait_in_sync(kube: Kube, timeout: float = READY_TIMEOUT) -> dict[str, Any]:
    def ready() -> dict[str, Any]:
        obj = kube.get_or_none(resources.CLUSTERS, NAME)
        resources.cluster_ready(obj)
        pods = kube.items("pods", selector=SELECTOR)
        if len(pods) != 3 or not all(pod_ready(p) for p in pods):
            raise NotYet(f"broker pods: {[(p['metadata']['name'], pod_ready(p)) for p in pods]}")
        return group_status(obj)

    return wait_for(ready, timeout, f"Cluster {NAME}: Ready, 3 replicas in sync", interval=3.0)


@pytest.fixture(scope="module")
def repl(kube: Kube, tidemq: Deployed, tidemq_image: str) -> Iterator[LoadJobs]:
    """The replicated Cluster, and load Jobs pointed at its name servers."""
    kube.apply(replicated_cluster(tidemq_image))
    try:
        wait_in_sync(kube)
        obj = kube.get(resources.CLUSTERS, NAME)
        jobs = LoadJobs(kube, tidemq_image, str(obj["status"]["nameServerAddress"]))
        jobs.install()
        yield jobs
    finally:
        kube.delete(resources.CLUSTERS, NAME, wait=True, timeout=300)
        for i in range(3):  # the StatefulSet retains its claims: a later run starts empty
            kube.delete("pvc", f"data-{GROUP}-{i}")


def topic(kube: Kube, name: str) -> None:
    kube.apply(resources.topic(name, NAME, 4, 4))
    wait_topic(kube, name, resources.topic_ready, 180.0, "Ready")


def test_deleting_the_master_pod_loses_no_acknowledged_message(
        kube: Kube, repl: LoadJobs, settings: Settings, run_id: str) -> None:
    name = f"e2e-repl-kill-{run_id}"
    topic(kube, name)
    master = wait_in_sync(kube)["master"]
    job = repl.start_producer(name, run_id, 1_000_000, "--rate", RATE, "--concurrency", "8",
                              "--retry-for", "120", "--stop-file", "/tmp/tmqload-stop", deadline=1200)
    repl.wait_progress(job, "acked", 500, 300)
    kube.delete("pod", f"{GROUP}-{master}")

    def new_master() -> int:
        group = (kube.get(resources.CLUSTERS, NAME).get("status") or {}).get("groups") or [{}]
        if group[0].get("master") in (None, master):
            raise NotYet(f"master still {group[0].get('master')}")
        return int(group[0]["master"])

    elected = wait_for(new_master, 120.0, "another replica to become master", interval=1.0)
    at = int((repl.progress(job) or {}).get("acked", 0))
    repl.wait_progress(job, "acked", at + 300, 300)  # acknowledged by the new master
    after = wait_in_sync(kube)  # the deleted pod came back and caught up
    repl.stop(job)
    sent = repl.result(job, 600)
    got = repl.consume(name, run_id, f"e2e-repl-kill-{run_id}", "--expect", str(sent["started"]))
    gap = float(sent["max_ack_gap_seconds"])
    print(f"\nmaster pod {GROUP}-{master} deleted: replica {elected} elected (epoch {after['epoch']}); "
          f"longest time without an acknowledgement {gap:.2f} s (lease {LEASE} s)")
    record(settings.artifacts, "replication-master-deleted", {
        "producer": brief(sent), "consumer": brief(got), "old_master": master, "new_master": elected,
        "max_ack_gap_seconds": gap})
    assert sent["gave_up"] == [], brief(sent)
    assert lost(sent, got) == [], brief(got)
    assert gap <= LEASE + 10, f"{gap:.2f} s without an acknowledgement"


def test_rolling_image_change_of_three_replicas_fails_no_send(
        kube: Kube, repl: LoadJobs, settings: Settings, run_id: str) -> None:
    kind.docker_tag(repl.image, IMAGE_NEXT)
    kind.load_image(settings.cluster_name, IMAGE_NEXT)
    current = kube.get(resources.CLUSTERS, NAME)["spec"]["image"]
    new_image = IMAGE_NEXT if current != IMAGE_NEXT else repl.image
    name = f"e2e-repl-roll-{run_id}"
    topic(kube, name)
    wait_in_sync(kube)
    old_uids = {p["metadata"]["uid"] for p in kube.items("pods", selector=SELECTOR)}
    job = repl.start_producer(name, run_id, 1_000_000, "--rate", RATE, "--concurrency", "8",
                              "--retry-for", "120", "--stop-file", "/tmp/tmqload-stop", deadline=2400)
    repl.wait_progress(job, "acked", 200, 300)
    kube.patch(resources.CLUSTERS, NAME, {"spec": {"image": new_image}})
    most_unready = 0

    def rolled() -> dict[str, Any]:
        nonlocal most_unready
        pods = kube.items("pods", selector=SELECTOR)
        most_unready = max(most_unready, sum(not pod_ready(p) for p in pods))
        stale = sorted(p["metadata"]["name"] for p in pods
                       if p["spec"]["containers"][0]["image"] != new_image or not pod_ready(p))
        if stale or old_uids & {p["metadata"]["uid"] for p in pods}:
            raise NotYet(f"not rolled yet: {stale}")
        return group_status(kube.get(resources.CLUSTERS, NAME))

    final = wait_for(rolled, 1200.0, f"group {GROUP} to roll to {new_image}", interval=1.0)
    at = int((repl.progress(job) or {}).get("acked", 0))
    repl.wait_progress(job, "acked", at + 200, 300)
    repl.stop(job)
    sent = repl.result(job, 600)
    got = repl.consume(name, run_id, f"e2e-repl-roll-{run_id}", "--expect", str(sent["started"]))
    events = [e for e in kube.items("events") if (e.get("involvedObject") or {}).get("name") == NAME
              and e.get("reason") == "ReplicaRoll"]
    print(f"\nrolled {GROUP} to {new_image}: master now {final['master']} (epoch {final['epoch']}), "
          f"{len(events)} roll steps, send failures {sent['send_failures']}, "
          f"longest time without an acknowledgement {float(sent['max_ack_gap_seconds']):.2f} s")
    record(settings.artifacts, "replication-rollout", {
        "producer": brief(sent), "consumer": brief(got), "most_unready": most_unready,
        "steps": [e.get("message") for e in events]})
    assert most_unready <= 1, f"{most_unready} replicas were unready at once"
    assert any("switchover" in (e.get("message") or "") for e in events), "the master was not switched over"
    assert sent["send_failures"] == 0, brief(sent)  # not one send failed, before any retry of ours
    assert sent["gave_up"] == [], brief(sent)
    assert lost(sent, got) == [], brief(got)
