"""The operator keeps a Cluster's objects as declared on a real API server (issue 18, items 2
and 3): a Cluster of its own, ``drift`` (one name server, one lone broker group), next to the
chart's, so that its rolls and deliberate damage leave the other scenarios alone.

1. Server-side apply: with ``metrics.enabled`` and a CPU limit, then both dropped from the spec,
   the StatefulSets lose the ``prometheus.io/*`` pod annotations and the limit (with the former
   create-or-merge-patch they stayed), while an annotation set with ``kubectl annotate`` (another
   field manager) stays; ``--show-managed-fields`` names ``tidemq-operator`` as an Apply manager.
2. Drift repair: the broker group's headless Service deleted by hand comes back; ``kubectl scale
   sts drift-broker-0 --replicas=0`` is put back (a ``ReplicasRestored`` Warning Event), the
   Cluster is not Ready until the broker pod is back, then Ready again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from e2e import resources
from e2e.install import Deployed
from e2e.k8s import Kube, condition, pod_ready
from e2e.proc import NotYet, wait_for

pytestmark = pytest.mark.e2e

NAME = "drift"
BROKER = f"{NAME}-broker-0"
NAMESRV = f"{NAME}-namesrv"
BROKERS = f"app.kubernetes.io/instance={NAME},app.kubernetes.io/component=broker"
READY_TIMEOUT = 600.0
REPAIR_TIMEOUT = 120.0  # the operator's timer runs every 5 s (values-e2e.yaml)


def drift_cluster(image: str) -> dict[str, Any]:
    return {"apiVersion": resources.API_VERSION, "kind": "Cluster",
            "metadata": {"name": NAME, "labels": {"app.kubernetes.io/part-of": "tidemq-e2e"}},
            "spec": {"image": image, "imagePullPolicy": "IfNotPresent",
                     "metrics": {"enabled": True},
                     "nameServers": {"replicas": 1, "resources": {"requests": {"cpu": "50m", "memory": "96Mi"},
                                                                  "limits": {"cpu": "1"}}},
                     "brokers": {"groups": 1, "flushMode": "sync", "storage": {"size": "1Gi"},
                                 "resources": {"requests": {"cpu": "100m", "memory": "192Mi"},
                                               "limits": {"cpu": "1", "memory": "1Gi"}}}}}


def wait_ready(kube: Kube, what: str) -> dict[str, Any]:
    """The Cluster Ready for its current generation with its broker pod ready."""
    def ready() -> dict[str, Any]:
        obj = kube.get_or_none(resources.CLUSTERS, NAME)
        resources.cluster_ready(obj)
        assert obj is not None
        pods = kube.items("pods", selector=BROKERS)
        if len(pods) != 1 or not pod_ready(pods[0]):
            raise NotYet(f"broker pods: {[(p['metadata']['name'], pod_ready(p)) for p in pods]}")
        return obj

    return wait_for(ready, READY_TIMEOUT, f"Cluster {NAME}: Ready ({what})", interval=3.0)


@pytest.fixture(scope="module")
def drift(kube: Kube, tidemq: Deployed, tidemq_image: str) -> Iterator[None]:
    kube.apply(drift_cluster(tidemq_image))
    try:
        wait_ready(kube, "created")
        yield
    finally:
        kube.delete(resources.CLUSTERS, NAME, wait=True, timeout=300)
        kube.delete("pvc", f"data-{BROKER}-0")  # claims are kept: a later run starts empty


def _template(kube: Kube, sts: str) -> dict[str, Any]:
    return kube.get("statefulset", sts)["spec"]["template"]


def _events(kube: Kube, reason: str) -> list[str]:
    return [e.get("message", "") for e in kube.items("events")
            if (e.get("involvedObject") or {}).get("name") == NAME and e.get("reason") == reason]


def test_fields_dropped_from_the_cluster_leave_the_statefulsets(kube: Kube, drift: None) -> None:
    for sts in (NAMESRV, BROKER):
        pod = _template(kube, sts)
        assert "prometheus.io/scrape" in pod["metadata"]["annotations"], sts
        assert pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "1", sts
    kube.kubectl("annotate", "statefulset", BROKER, "example.com/team=e2e", "--overwrite")

    kube.patch(resources.CLUSTERS, NAME, {"spec": {
        "metrics": {"enabled": False},
        "nameServers": {"resources": {"limits": {"cpu": None}}},
        "brokers": {"resources": {"limits": {"cpu": None}}}}})

    def lean() -> dict[str, Any]:
        left = {}
        for sts in (NAMESRV, BROKER):
            pod = _template(kube, sts)
            scrape = [k for k in pod["metadata"].get("annotations") or {} if k.startswith("prometheus.io/")]
            limits = pod["spec"]["containers"][0].get("resources", {}).get("limits", {})
            if scrape or "cpu" in limits:
                left[sts] = {"annotations": scrape, "limits": limits}
        if left:
            raise NotYet(f"still on the StatefulSets: {left}")
        return kube.get("statefulset", BROKER)

    broker = wait_for(lean, READY_TIMEOUT, "the metrics annotations and CPU limits to go", interval=3.0)
    assert broker["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {"memory": "1Gi"}
    assert broker["metadata"]["annotations"]["example.com/team"] == "e2e"  # kubectl's field stays
    fields = kube.kubectl("get", "statefulset", BROKER, "--show-managed-fields", "-o",
                          "jsonpath={range .metadata.managedFields[*]}{.manager}:{.operation}{'\\n'}{end}").stdout
    assert "tidemq-operator:Apply" in fields.split(), fields
    wait_ready(kube, "rolled without metrics and CPU limits")


def test_a_deleted_service_and_a_scaled_statefulset_are_put_back(kube: Kube, drift: None) -> None:
    service = f"{BROKER}-headless"
    old_uid = kube.get("service", service)["metadata"]["uid"]
    kube.delete("service", service, wait=True)

    def recreated() -> dict[str, Any]:
        obj = kube.get_or_none("service", service)
        if obj is None or obj["metadata"]["uid"] == old_uid:
            raise NotYet(f"Service {service} not recreated yet")
        return obj

    wait_for(recreated, REPAIR_TIMEOUT, f"Service {service} recreated", interval=2.0)

    generation = int(kube.get(resources.CLUSTERS, NAME)["metadata"]["generation"])
    kube.kubectl("scale", "statefulset", BROKER, "--replicas=0")
    not_ready: list[str] = []  # the Cluster's Ready while the broker is away (sampled every second)

    def ready_now() -> dict[str, Any]:
        obj = kube.get(resources.CLUSTERS, NAME)
        ready = condition(obj, "Ready") or {}
        if ready.get("status") != "True" and (ready.get("observedGeneration") or 0) >= generation:
            not_ready.append(f"{ready.get('reason')}: {ready.get('message')}")
        return ready

    def restored() -> None:
        ready = ready_now()
        replicas = kube.get("statefulset", BROKER)["spec"]["replicas"]
        if replicas != 1 or not _events(kube, "ReplicasRestored"):
            raise NotYet(f"{BROKER} at {replicas} replicas; Ready {ready}")

    wait_for(restored, REPAIR_TIMEOUT, f"{BROKER} scaled back to 1", interval=1.0)

    def back() -> None:  # the pod terminates (its grace period), then starts again
        ready = ready_now()
        pods = kube.items("pods", selector=BROKERS)
        if ready.get("status") != "True" or len(pods) != 1 or not pod_ready(pods[0]):
            raise NotYet(f"Ready {ready}; broker pods {[(p['metadata']['name'], pod_ready(p)) for p in pods]}")

    wait_for(back, READY_TIMEOUT, f"Cluster {NAME} Ready with its broker back", interval=1.0)
    assert not_ready, "the Cluster stayed Ready while its broker was scaled to 0"
    assert any(r.startswith(("ReplicasRestored", "WaitingForPods")) for r in not_ready), not_ready
    assert any(BROKER in m for m in _events(kube, "ReplicasRestored"))
