"""The Cluster the chart created: ready, every broker registered, reachable as NOTES.txt says."""

from __future__ import annotations

import pytest

from e2e.install import BROKER_SELECTOR, Deployed, get_cluster
from e2e.k8s import Kube, port_forward
from tidemq.client.sync import SyncAdmin

pytestmark = pytest.mark.e2e

BROKER_GROUPS = 2  # cluster.brokers.groups in e2e/values-e2e.yaml


def test_cluster_is_ready_with_every_broker_and_name_server(kube: Kube, tidemq: Deployed) -> None:
    cluster = get_cluster(kube)
    assert cluster is not None
    status = cluster["status"]
    assert status["readyBrokers"] == BROKER_GROUPS
    assert status["readyNameServers"] == 2
    assert tidemq.brokers == tuple(f"{tidemq.cluster}-broker-{g}" for g in range(BROKER_GROUPS))
    # the printer columns of `kubectl get tmqc`
    row = next(r for r in kube.table("tmqc") if r["NAME"] == tidemq.cluster)
    assert row["READY"] == "True" and row["BROKERS"] == str(BROKER_GROUPS), row
    assert row["NAME SERVERS"] == status["nameServerAddress"]
    # each broker pod has its own PersistentVolumeClaim, bound
    for pod in kube.items("pods", selector=BROKER_SELECTOR):
        claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"]
                  if "persistentVolumeClaim" in v]
        assert claims == [f"data-{pod['metadata']['name']}"], claims
        assert kube.get("pvc", claims[0])["status"]["phase"] == "Bound"


def test_name_server_port_forward_lists_the_brokers(kube: Kube, tidemq: Deployed) -> None:
    """NOTES.txt: `kubectl port-forward svc/<cluster>-namesrv 9876` reaches a name server from
    outside the cluster (enough for cluster info and routes; brokers need in-cluster clients)."""
    with (port_forward(kube, f"svc/{tidemq.cluster}-namesrv", tidemq.namesrv_port) as port,
          SyncAdmin(f"127.0.0.1:{port}") as admin):
        info = admin.cluster_info()
    masters = info.master_addrs(tidemq.cluster)
    assert sorted(masters) == list(tidemq.brokers)
    for name, addr in masters.items():
        # the advertised address is the pod's stable DNS name on the headless Service
        assert addr == f"{name}-0.{name}-headless.{tidemq.namespace}.svc:{tidemq.broker_port}", addr
