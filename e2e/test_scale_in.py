"""Scale-in of broker groups on Kubernetes (issue 18, item 4): a second Cluster, ``scalein``, with
two lone broker groups next to the chart's Cluster, lowered to one.

While a producer sends with retries and no consumer has read anything yet:
1. ``brokers.groups: 1``: group 1 (``scalein-broker-1``) stops taking writes (its queues are routed
   read only, the producer moves to group 0 and nothing it sends fails for good), the Cluster is
   Degraded with reason ScalingIn naming the queues left, and group 1's StatefulSet stays;
2. a consumer group reads everything (what group 1 held included): group 1's StatefulSet,
   ConfigMap and Service are deleted, its PVC is kept (deleteClaim false), the Cluster is Ready
   again, ScaleIn Events mark the start and the end; no acknowledged message is lost.

The scenario has its own Cluster so that messages other scenarios left unconsumed on the chart's
Cluster (which would rightly hold its drain) do not matter, and the chart's Cluster keeps its groups.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from e2e import resources
from e2e.install import Deployed
from e2e.jobs import LoadJobs
from e2e.k8s import Kube, condition, pod_ready
from e2e.proc import NotYet, wait_for
from e2e.scenario import brief, lost, record, wait_topic
from e2e.settings import Settings

pytestmark = pytest.mark.e2e

NAME = "scalein"
RETIRING = f"{NAME}-broker-1"
CLAIM = f"data-{RETIRING}-0"
BROKERS = f"app.kubernetes.io/instance={NAME},app.kubernetes.io/component=broker"
NAMESRV = f"app.kubernetes.io/instance={NAME},app.kubernetes.io/component=namesrv"
READY_TIMEOUT = 600.0
DRAIN_TIMEOUT = 300.0  # the operator's drain grace (35 s) and timer (5 s in values-e2e.yaml) included
RATE = "50"


def two_group_cluster(image: str) -> dict[str, Any]:
    return {"apiVersion": resources.API_VERSION, "kind": "Cluster",
            "metadata": {"name": NAME, "labels": {"app.kubernetes.io/part-of": "tidemq-e2e"}},
            "spec": {"image": image, "imagePullPolicy": "IfNotPresent",
                     "nameServers": {"replicas": 1, "resources": {"requests": {"cpu": "50m", "memory": "96Mi"}}},
                     "brokers": {"groups": 2, "flushMode": "sync", "storage": {"size": "1Gi"},
                                 "resources": {"requests": {"cpu": "100m", "memory": "192Mi"},
                                               "limits": {"memory": "1Gi"}}}}}


def wait_ready(kube: Kube, groups: int) -> dict[str, Any]:
    def ready() -> dict[str, Any]:
        obj = kube.get_or_none(resources.CLUSTERS, NAME)
        resources.cluster_ready(obj)
        assert obj is not None
        pods = kube.items("pods", selector=BROKERS)
        if len(pods) != groups or not all(pod_ready(p) for p in pods):
            raise NotYet(f"broker pods: {[(p['metadata']['name'], pod_ready(p)) for p in pods]}")
        return obj

    return wait_for(ready, READY_TIMEOUT, f"Cluster {NAME}: Ready with {groups} broker group(s)", interval=3.0)


@pytest.fixture(scope="module")
def scalein(kube: Kube, tidemq: Deployed, tidemq_image: str) -> Iterator[LoadJobs]:
    """The two-group Cluster, and load Jobs pointed at its name servers."""
    kube.apply(two_group_cluster(tidemq_image))
    try:
        obj = wait_ready(kube, 2)
        jobs = LoadJobs(kube, tidemq_image, str(obj["status"]["nameServerAddress"]))
        jobs.install()
        yield jobs
    finally:
        kube.delete(resources.CLUSTERS, NAME, wait=True, timeout=300)
        for g in (0, 1):  # claims are kept: a later run starts empty
            kube.delete("pvc", f"data-{NAME}-broker-{g}-0")


def route(kube: Kube, topic: str) -> dict[str, Any]:
    """The topic's route as the Cluster's name server serves it."""
    pod = kube.items("pods", selector=NAMESRV)[0]["metadata"]["name"]
    return json.loads(kube.exec(pod, ["tidemq", "admin", "topicRoute", "-n", "127.0.0.1:9876", "-t", topic],
                                container="namesrv"))


def perms(kube: Kube, topic: str) -> dict[str, int]:
    return {q["brokerName"]: int(q["perm"]) for q in route(kube, topic).get("queueDatas") or []}


def events(kube: Kube, reason: str) -> list[str]:
    return [e.get("message", "") for e in kube.items("events")
            if (e.get("involvedObject") or {}).get("name") == NAME and e.get("reason") == reason]


def test_lowering_groups_drains_the_group_then_deletes_it_keeping_its_claim(
        kube: Kube, scalein: LoadJobs, settings: Settings, run_id: str) -> None:
    topic = f"e2e-scalein-{run_id}"
    kube.apply(resources.topic(topic, NAME, 4, 4))
    wait_topic(kube, topic, resources.topic_ready, 180.0, "Ready")
    job = scalein.start_producer(topic, run_id, 1_000_000, "--rate", RATE, "--concurrency", "8",
                                 "--retry-for", "120", "--stop-file", "/tmp/tmqload-stop", deadline=1800)
    scalein.wait_progress(job, "acked", 300, 300)  # messages on both groups, nobody reads them yet

    kube.patch(resources.CLUSTERS, NAME, {"spec": {"brokers": {"groups": 1}}})

    def draining() -> dict[str, Any]:
        obj = kube.get(resources.CLUSTERS, NAME)
        rows = (obj.get("status") or {}).get("scaleIn") or []
        degraded = condition(obj, "Degraded") or {}
        if [r.get("phase") for r in rows] != ["Draining"] or degraded.get("reason") != "ScalingIn":
            raise NotYet(f"scaleIn {rows}; Degraded {degraded}")
        return obj

    obj = wait_for(draining, 180.0, f"{RETIRING} draining", interval=2.0)
    message = (condition(obj, "Degraded") or {}).get("message", "")
    assert RETIRING in message and topic in message, message
    assert (condition(obj, "Ready") or {}).get("status") == "False"

    def read_only() -> dict[str, int]:
        seen = perms(kube, topic)
        if seen.get(RETIRING, 6) & 2:
            raise NotYet(f"route perms {seen}")
        return seen

    seen = wait_for(read_only, 120.0, f"{RETIRING}'s queues routed read only", interval=2.0)
    assert seen.get(f"{NAME}-broker-0") == 6, seen
    at = int((scalein.progress(job) or {}).get("acked", 0))
    scalein.wait_progress(job, "acked", at + 300, 300)  # producers carry on with group 0
    assert kube.get_or_none("statefulset", RETIRING) is not None  # nothing consumed yet: it stays
    assert any(RETIRING in m for m in events(kube, "ScaleIn"))
    scalein.stop(job)
    sent = scalein.result(job, 600)

    got = scalein.consume(topic, run_id, f"e2e-scalein-{run_id}", "--expect", str(sent["started"]))

    def removed() -> dict[str, Any]:
        if kube.get_or_none("statefulset", RETIRING) is not None:
            obj = kube.get(resources.CLUSTERS, NAME)
            raise NotYet(f"{RETIRING} still there: {(condition(obj, 'Degraded') or {}).get('message')}")
        return kube.get(resources.CLUSTERS, NAME)

    wait_for(removed, DRAIN_TIMEOUT, f"{RETIRING} removed once drained", interval=3.0)
    final = wait_ready(kube, 1)
    assert kube.get_or_none("configmap", f"{RETIRING}-config") is None
    assert kube.get_or_none("service", f"{RETIRING}-headless") is None
    assert kube.get_or_none("pvc", CLAIM) is not None  # deleteClaim false: kept
    assert not (final.get("status") or {}).get("scaleIn")
    assert (condition(final, "Degraded") or {}).get("status") == "False"
    assert any(CLAIM in m and "kept" in m for m in events(kube, "ScaleIn"))
    record(settings.artifacts, "scale-in", {"producer": brief(sent), "consumer": brief(got)})
    assert sent["gave_up"] == [], brief(sent)
    assert lost(sent, got) == [], brief(got)
