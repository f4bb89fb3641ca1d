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


def test_name_server_refuses_unsigned_writes_and_serves_reads(kube: Kube, tidemq: Deployed) -> None:
    """Issue 14, item 9: the operator turns on name-server write protection for the Clusters it
    creates; an anonymous client can still read routes but cannot delete or re-point them."""
    import asyncio

    from tidemq.remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode

    import time

    deadline = time.monotonic() + 180  # fresh install: Pending until the brokers' pods sign
    while (status := get_cluster(kube)["status"]).get("nameServerWriteProtection") != "Enforced":
        assert time.monotonic() < deadline, status
        time.sleep(2)

    async def go(addr: str):
        client = RemotingClient()
        try:
            delete = await client.invoke(addr, RemotingCommand.request(
                RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "TBW102"}), 10)
            info = await client.invoke(addr, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO), 10)
            return delete, info
        finally:
            await client.close()

    with port_forward(kube, f"svc/{tidemq.cluster}-namesrv", tidemq.namesrv_port) as port:
        delete, info = asyncio.run(go(f"127.0.0.1:{port}"))
    assert delete.code == ResponseCode.SYSTEM_ERROR and "AclException" in (delete.remark or ""), delete
    assert info.code == ResponseCode.SUCCESS
