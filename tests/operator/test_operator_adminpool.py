"""The operator's admin pool and Cluster view (issue 18, item 12), against a real name server and
broker: one Admin per (name servers, account), closed when idle, when its Cluster goes or at the
end; copies of the masters and topic tables fetched at most once per age a reader accepts, kept
in step with the operator's own writes and dropped when a call fails. test_operator_scale_topics
shows what this saves over many Topics."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.operator.test_operator_scale_topics import Clock, CountingProxy
from tests.procs import free_port
from tests.support.waiting import wait_until
from tidemq.client.admin import Admin
from tidemq.client.config import ClientConfig
from tidemq.errors import TideMQError
from tidemq.operator.adminpool import AdminPool, borrow
from tidemq.remoting import RequestCode

CONFIG = ClientConfig()


def _closed(view) -> bool:
    return view.admin._instance is None


async def test_one_admin_per_cluster_and_account_closed_when_idle_gone_or_at_the_end(cluster):
    clock = Clock()
    pool = AdminPool(idle=60.0, clock=clock)
    servers = [cluster.namesrv_addr]
    try:
        async with pool.use(servers, CONFIG) as a:
            assert await a.masters(0.0) == {cluster.broker_name: cluster.broker_addr}
        async with pool.use(servers, CONFIG) as b, pool.use(servers, CONFIG, ("ak", "sk")) as signed:
            assert b is a and signed is not a  # the name-server account is part of the key
        assert len(pool) == 2

        clock.now += 59.0
        assert await pool.sweep() == 0
        async with pool.use(servers, CONFIG) as again:  # a borrow keeps it alive
            assert again is a
        clock.now += 30.0
        assert await pool.sweep() == 1 and _closed(signed) and not _closed(a)  # idle 89 s and 30 s
        clock.now += 60.0
        async with pool.use(servers, CONFIG) as fresh:  # the borrow sweeps first, then reopens
            assert fresh is not a and _closed(a)
            assert await fresh.masters(0.0) == {cluster.broker_name: cluster.broker_addr}
            assert await pool.discard(servers) == 1  # the Cluster is deleted while a pass runs
            assert not _closed(fresh) and len(pool) == 0
        assert _closed(fresh)  # closed when that pass is done

        async with pool.use(servers, CONFIG) as last:
            pass
    finally:
        await pool.close()
    assert _closed(last) and len(pool) == 0


async def test_copies_are_shared_kept_in_step_with_writes_and_dropped_on_failure(cluster_factory):
    port = free_port()
    c = cluster_factory(extra_broker_args=["--advertise", f"127.0.0.1:{port}"])
    broker = await CountingProxy(c.broker_addr).start(port)
    addr, topic = f"127.0.0.1:{port}", "Pool_" + uuid.uuid4().hex[:6]
    clock = Clock()
    pool = AdminPool(clock=clock)

    def fetches() -> int:
        return broker.requests[RequestCode.GET_ALL_TOPIC_CONFIG]

    try:
        async def registered() -> bool:
            async with Admin(c.namesrv_addr) as admin:
                return bool((await admin.cluster_info()).all_master_addrs())
        await wait_until(registered, "the broker registered")
        async with pool.use([c.namesrv_addr], CONFIG) as view:
            tables = await asyncio.gather(*(view.topic_configs(addr, 30.0) for _ in range(20)))
            assert fetches() == 1 and all(t is tables[0] for t in tables)  # one fetch for all
            assert topic not in tables[0]

            await view.admin.create_topic(topic, 2, 2, broker_addr=addr)
            view.wrote(addr, topic, {"topicName": topic, "readQueueNums": 2, "writeQueueNums": 2})
            clock.now += 29.0
            assert (await view.topic_configs(addr, 30.0))[topic]["writeQueueNums"] == 2
            assert fetches() == 1
            clock.now += 1.0  # 30 s old: the next reader fetches
            assert (await view.topic_configs(addr, 30.0))[topic]["readQueueNums"] == 2
            assert fetches() == 2
            assert (await view.topic_configs(addr, 0.0)) and fetches() == 3  # age 0: always now
            view.deleted(topic)
            assert topic not in await view.topic_configs(addr, 30.0)

        with pytest.raises(TideMQError):
            async with pool.use([c.namesrv_addr], CONFIG) as view:
                await view.admin.broker_topic_configs(f"127.0.0.1:{free_port()}")  # nothing there
        async with pool.use([c.namesrv_addr], CONFIG) as view:
            await view.topic_configs(addr, 30.0)
            assert fetches() == 4  # the failure dropped the copies
    finally:
        await pool.close()
        await broker.close()


async def test_a_pass_without_a_pool_gets_a_connection_of_its_own(cluster):
    async with borrow(None, [cluster.namesrv_addr], CONFIG) as view:
        assert await view.masters(0.0) == {cluster.broker_name: cluster.broker_addr}
    assert _closed(view)


async def test_the_passes_of_many_groups_ask_the_name_servers_for_the_cluster_once_a_round(cluster):
    """Before, each ConsumerGroup pass asked for the cluster info (GET_BROKER_CLUSTER_INFO) to
    find the masters it updates: one request per group per round."""
    import kopf  # noqa: PLC0415 (the other tests need no kopf)

    from tidemq.operator import handlers  # noqa: PLC0415
    from tidemq.operator.metrics import OperatorMetrics  # noqa: PLC0415

    port = free_port()
    namesrv = await CountingProxy(cluster.namesrv_addr).start(port)
    clock = Clock()
    pool = AdminPool(clock=clock)
    index = {("default", "ext"): [{"spec": {"external": {"nameServers": [f"127.0.0.1:{port}"]}}, "status": {},
                                   "metadata": {"name": "ext", "namespace": "default"}}]}
    config = handlers.OperatorConfig(timer_interval=30.0)
    prefix = "pool_g_" + uuid.uuid4().hex[:6]

    async def one(i: int) -> kopf.Patch:
        body = kopf.Body({"apiVersion": "tidemq.io/v1alpha1", "kind": "ConsumerGroup",
                          "metadata": {"name": f"g{i}", "namespace": "default", "uid": f"uid-{prefix}-{i}",
                                       "generation": 1},
                          "spec": {"clusterRef": {"name": "ext"}, "groupName": f"{prefix}_{i}"}, "status": {}})
        patch = kopf.Patch()
        await handlers.group_pass(config, OperatorMetrics(), body, patch, index, pool=pool)
        return patch

    try:
        for _ in range(2):  # two rounds in one timer interval, then one in the next
            patches = await asyncio.gather(*(one(i) for i in range(20)))
            assert all(p["status"]["conditions"][0]["reason"] == "Reconciled" for p in patches)
        assert namesrv.requests[RequestCode.GET_BROKER_CLUSTER_INFO] == 1
        clock.now += 30.0
        await asyncio.gather(*(one(i) for i in range(20)))
        assert namesrv.requests[RequestCode.GET_BROKER_CLUSTER_INFO] == 2
        assert namesrv.connections == 1
    finally:
        await pool.close()
        await namesrv.close()
