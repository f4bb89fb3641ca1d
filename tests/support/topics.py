"""Creating test topics on a running cluster, returning only once producers can be routed to them.

A topic is created on every master of the cluster (mqadmin's ``updateTopic -c``) with as many read
as write queues; the helpers return after the name server routes all its queues (see routes.py),
so the test's first send never races the broker's registration.
"""

from __future__ import annotations

from tests.procs import Cluster
from tests.support.routes import wait_for_route, wait_for_route_sync
from tidemq.client import Admin
from tidemq.client.sync import SyncAdmin


async def create_topic(cluster: Cluster, topic: str, queues: int = 4, *,
                       admin: Admin | None = None) -> str:
    """Create ``topic`` with ``queues`` queues and wait for its route; returns ``topic``.

    ``admin`` is an open Admin to use (else one is opened against the cluster's name server).
    """
    if admin is None:
        async with Admin(cluster.namesrv_addr) as own:
            return await create_topic(cluster, topic, queues, admin=own)
    updated = await admin.create_topic(topic, read_queues=queues, write_queues=queues,
                                       cluster=cluster.cluster_name)
    assert updated == [cluster.broker_addr], f"topic {topic} was created on {updated}, not on the broker"
    await wait_for_route(admin, topic, queues)
    return topic


def create_topic_sync(cluster: Cluster, topic: str, queues: int = 4) -> str:
    """Blocking `create_topic`, for tests that are not async."""
    with SyncAdmin(cluster.namesrv_addr) as admin:
        updated = admin.create_topic(topic, read_queues=queues, write_queues=queues,
                                     cluster=cluster.cluster_name)
        assert updated == [cluster.broker_addr], f"topic {topic} was created on {updated}, not on the broker"
        wait_for_route_sync(admin, topic, queues)
    return topic
