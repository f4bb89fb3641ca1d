"""Rolling updates under load.

- A change of the name servers alone rolls them one pod at a time, and clients always find the
  topic's route (issue 18, item 10): a new name-server pod is ready only once a broker
  registration period has passed since it started and a broker registered with it, and the
  StatefulSet controller replaces the next pod only then, so the old pods are never all gone
  before the new ones hold routes.
- A new image in the Cluster spec rolls the name servers, then broker group 0, then group 1, one
  pod at a time, while a producer keeps sending with retries: no acknowledged message is lost.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import pytest

from e2e import kind, resources
from e2e.install import BROKER_SELECTOR, NAMESRV_SELECTOR, Deployed, get_cluster
from e2e.jobs import STOP_FILE, LoadJobs
from e2e.k8s import Kube, condition, pod_ready
from e2e.proc import NotYet, wait_for
from e2e.scenario import answers_without_routes_once_ready, apply_topic, brief, lost, record
from e2e.settings import IMAGE_NEXT, Settings

pytestmark = pytest.mark.e2e

RATE = "50"
ROLL_TIMEOUT = 900.0
SAMPLE_EVERY = 1.0


def _time(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)  # Python 3.11+ reads the trailing Z


def _ready_since(pod: Mapping[str, Any]) -> dt.datetime:
    cond = condition(pod, "Ready")
    assert cond is not None and cond["status"] == "True", pod["metadata"]["name"]
    return _time(cond["lastTransitionTime"])


def _image_of(pod: Mapping[str, Any]) -> str:
    return str(pod["spec"]["containers"][0]["image"])


def test_rolling_the_name_servers_keeps_routes(
        kube: Kube, tidemq: Deployed, load: LoadJobs, settings: Settings, run_id: str) -> None:
    topic = f"e2e-nsroll-{run_id}"
    apply_topic(kube, tidemq, topic, queues=4)
    watcher = load.start("routes", run_id, ["--topic", topic, "--interval", "0.5", "--stop-file", STOP_FILE],
                         deadline=2400)
    producer = load.start_producer(topic, run_id, 1_000_000, "--rate", "20", "--concurrency", "4",
                                   "--retry-for", "300", "--stop-file", STOP_FILE, deadline=2400)
    load.wait_progress(producer, "acked", 50, 300)
    load.wait_progress(watcher, "samples", 5, 300)
    old_uids = {p["metadata"]["uid"] for p in kube.items("pods", selector=NAMESRV_SELECTOR)}
    cluster = get_cluster(kube)
    assert cluster is not None
    requests = ((cluster["spec"].get("nameServers") or {}).get("resources") or {}).get("requests") or {}
    memory = "97Mi" if requests.get("memory") != "97Mi" else "96Mi"  # a reused cluster may hold either
    kube.patch(resources.CLUSTERS, tidemq.cluster,
               {"spec": {"nameServers": {"resources": {"requests": {"memory": memory}}}}})
    generation = int(kube.get(resources.CLUSTERS, tidemq.cluster)["metadata"]["generation"])

    def rolled() -> list[dict[str, Any]]:
        pods = kube.items("pods", selector=NAMESRV_SELECTOR)
        stale = sorted(p["metadata"]["name"] for p in pods if p["metadata"]["uid"] in old_uids or not pod_ready(p))
        ready = condition(get_cluster(kube) or {}, "Ready") or {}
        if stale or ready.get("status") != "True" or (ready.get("observedGeneration") or 0) < generation:
            raise NotYet(f"not rolled yet: {stale}; Ready={ready.get('status')} ({ready.get('message')})")
        return pods

    pods = wait_for(rolled, ROLL_TIMEOUT, "the name servers to roll", interval=SAMPLE_EVERY)
    acked_after = int((load.progress(producer) or {}).get("acked", 0))
    load.wait_progress(producer, "acked", acked_after + 50, 300)  # still sending after the roll
    load.stop(watcher)
    load.stop(producer)
    routes = load.result(watcher, 300)
    sent = load.result(producer, 600)
    ready_since = {p["metadata"]["name"]: _ready_since(p).timestamp() for p in pods}
    late = answers_without_routes_once_ready(routes, ready_since)
    record(settings.artifacts, "namesrv-roll", {
        "routes": {k: v for k, v in routes.items() if k != "none_at"}, "none_after_ready": late,
        "ready_since": ready_since, "producer": brief(sent)})

    assert routes["empty"] == 0, f"no name server served a route at {routes['empty_at']} ({routes['counts']})"
    assert not late, f"ready name servers answered without a route: {late}"
    assert all(c["route"] > 0 for c in routes["counts"].values()), routes["counts"]
    assert routes["most_brokers"] == len(tidemq.brokers), routes
    assert sent["gave_up"] == [], brief(sent)
    got = load.consume(topic, run_id, f"e2e-nsroll-{run_id}", "--expect", str(sent["started"]))
    assert lost(sent, got) == [], brief(got)


def test_image_change_rolls_brokers_one_at_a_time_without_losing_messages(
        kube: Kube, tidemq: Deployed, load: LoadJobs, settings: Settings, run_id: str) -> None:
    kind.docker_tag(load.image, IMAGE_NEXT)
    kind.load_image(settings.cluster_name, IMAGE_NEXT)
    cluster = get_cluster(kube)
    assert cluster is not None
    old_image = cluster["spec"]["image"]
    new_image = IMAGE_NEXT if old_image != IMAGE_NEXT else load.image  # a reused cluster may hold e2e-2
    old_uids = {p["metadata"]["uid"] for p in kube.items("pods", selector=BROKER_SELECTOR)}

    topic = f"e2e-roll-{run_id}"
    apply_topic(kube, tidemq, topic, queues=8)
    job = load.start_producer(topic, run_id, 1_000_000, "--rate", RATE, "--concurrency", "8",
                              "--retry-for", "300", "--stop-file", "/tmp/tmqload-stop", deadline=2400)
    load.wait_progress(job, "acked", 200, 300)
    kube.patch(resources.CLUSTERS, tidemq.cluster, {"spec": {"image": new_image}})
    generation = int(kube.get(resources.CLUSTERS, tidemq.cluster)["metadata"]["generation"])

    most_unready = 0

    def rolled() -> bool:
        nonlocal most_unready
        brokers = kube.items("pods", selector=BROKER_SELECTOR)
        most_unready = max(most_unready, sum(not pod_ready(p) for p in brokers))
        obj = get_cluster(kube)
        pods = brokers + kube.items("pods", selector=NAMESRV_SELECTOR)
        stale = sorted(p["metadata"]["name"] for p in pods if _image_of(p) != new_image or not pod_ready(p))
        ready = condition(obj or {}, "Ready") or {}
        if stale or ready.get("status") != "True" or (ready.get("observedGeneration") or 0) < generation:
            raise NotYet(f"not rolled yet: {stale}; Ready={ready.get('status')} ({ready.get('message')})")
        return True

    wait_for(rolled, ROLL_TIMEOUT, f"the Cluster to roll to {new_image}", interval=SAMPLE_EVERY)
    acked_after = int((load.progress(job) or {}).get("acked", 0))
    load.wait_progress(job, "acked", acked_after + 200, 300)  # still sending on the new brokers
    load.stop(job)
    sent = load.result(job, 600)

    namesrv = sorted(kube.items("pods", selector=NAMESRV_SELECTOR), key=lambda p: p["metadata"]["name"])
    brokers = sorted(kube.items("pods", selector=BROKER_SELECTOR), key=lambda p: p["metadata"]["name"])
    assert not old_uids & {p["metadata"]["uid"] for p in brokers}, "a broker pod was not replaced"
    # order: every name server ready before broker group 0's new pod was created, which was ready
    # before group 1's new pod was created (the operator applies a group after the previous settled)
    stage, previous_ready = "the name servers", max(_ready_since(p) for p in namesrv)
    for pod in brokers:
        created = _time(pod["metadata"]["creationTimestamp"])
        assert created >= previous_ready, (
            f"{pod['metadata']['name']} was created at {created}, before {stage} were ready at {previous_ready}")
        stage, previous_ready = pod["metadata"]["name"], _ready_since(pod)
    assert most_unready <= 1, f"{most_unready} broker pods were unready at the same time"
    final = get_cluster(kube)
    assert final is not None
    versions = {b["name"]: b["version"] for b in final["status"]["brokers"]}
    assert set(versions.values()) == {new_image.rsplit(":", 1)[1]}, versions

    # every id the producer started was acknowledged or given up (a given-up one may be stored)
    got = load.consume(topic, run_id, f"e2e-roll-{run_id}", "--expect", str(sent["started"]))
    record(settings.artifacts, "rollout", {"producer": brief(sent), "consumer": brief(got),
                                           "most_unready_brokers": most_unready})
    assert sent["gave_up"] == [], brief(sent)
    assert lost(sent, got) == [], brief(got)
