"""Installing TideMQ with its Helm chart into the kind cluster and waiting until it serves.

Invariants:
- ``helm upgrade --install`` (idempotent: a reused cluster gets the same release back) of
  charts/tidemq with e2e/values-e2e.yaml; the wait covers the operator Deployment only, the
  Cluster custom resource is then awaited through its Ready condition (see e2e/resources.py).
  Helm 3's ``--wait`` is that wait; Helm 4 made a bare ``--wait`` the kstatus watcher (which also
  waits on custom resources), so with Helm 4 the suite asks for ``--wait=legacy``
  (:func:`wait_flag`). The workflow pins Helm 3.
- Every wait here has a bound; a timeout names what was awaited and the last status seen.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e import resources
from e2e.k8s import Kube, pod_ready
from e2e.proc import NotYet, wait_for
from e2e.settings import CHART, CLUSTER, RELEASE, VALUES

log = logging.getLogger(__name__)

HELM_TIMEOUT = 600.0
CLUSTER_READY_TIMEOUT = 600.0
BROKER_SELECTOR = f"app.kubernetes.io/instance={CLUSTER},app.kubernetes.io/component=broker"
NAMESRV_SELECTOR = f"app.kubernetes.io/instance={CLUSTER},app.kubernetes.io/component=namesrv"


@dataclass(frozen=True, slots=True)
class Deployed:
    """The TideMQ installation the scenarios use."""

    namespace: str
    release: str
    cluster: str
    name_servers: str      # ADDR;ADDR as Cluster status.nameServerAddress says
    brokers: tuple[str, ...]  # broker names (RocketMQ brokerName), e.g. tidemq-broker-0
    metrics_port: int      # brokers' /metrics port
    namesrv_metrics_port: int
    namesrv_port: int
    broker_port: int


def wait_flag(version: str) -> str:
    """The flag that makes ``helm`` of ``version`` (``helm version --template {{.Version}}``,
    e.g. ``v3.19.5``) wait for Deployments and pods as Helm 3's ``--wait`` does."""
    major = version.strip().lstrip("v").split(".", 1)[0]
    return "--wait=legacy" if major.isdigit() and int(major) >= 4 else "--wait"


def helm_wait_flag(kube: Kube) -> str:
    return wait_flag(kube.helm("version", "--template", "{{.Version}}", timeout=60).stdout)


def helm_install(kube: Kube, artifacts: Path) -> None:
    log.info("helm upgrade --install %s into namespace %s", RELEASE, kube.namespace)
    kube.helm("upgrade", "--install", RELEASE, str(CHART), "--namespace", kube.namespace,
              "--create-namespace", "--values", str(VALUES), helm_wait_flag(kube), "--timeout", "8m",
              timeout=HELM_TIMEOUT, log_file=artifacts / "helm-install.log")


def get_cluster(kube: Kube) -> dict[str, Any] | None:
    return kube.get_or_none(resources.CLUSTERS, CLUSTER)


def wait_cluster_ready(kube: Kube, timeout: float = CLUSTER_READY_TIMEOUT) -> dict[str, Any]:
    """The Cluster once Ready for its generation and every broker and name-server pod is ready."""
    def ready() -> dict[str, Any]:
        obj = get_cluster(kube)
        resources.cluster_ready(obj)
        assert obj is not None
        for selector in (BROKER_SELECTOR, NAMESRV_SELECTOR):
            pods = kube.items("pods", selector=selector)
            waiting = [p["metadata"]["name"] for p in pods if not pod_ready(p)]
            if not pods or waiting:
                raise NotYet(f"pods not ready: {waiting or selector}")
        return obj

    log.info("waiting (up to %.0fs) for Cluster %s to be Ready", timeout, CLUSTER)
    return wait_for(ready, timeout, f"Cluster {CLUSTER} to be Ready", interval=3.0)


def deployed(kube: Kube, cluster: Mapping[str, Any]) -> Deployed:
    spec, status = cluster.get("spec") or {}, cluster.get("status") or {}
    brokers = tuple(sorted({b["name"] for b in status.get("brokers") or []}))
    return Deployed(
        namespace=kube.namespace, release=RELEASE, cluster=CLUSTER,
        name_servers=str(status["nameServerAddress"]), brokers=brokers,
        metrics_port=int((spec.get("metrics") or {}).get("port", 9878)),
        namesrv_metrics_port=int((spec.get("nameServers") or {}).get("metricsPort", 9877)),
        namesrv_port=int((spec.get("nameServers") or {}).get("port", 9876)),
        broker_port=int((spec.get("brokers") or {}).get("port", 10911)),
    )
