"""Status that tells the truth (issue 18, items 8 and 9): the Topic and Cluster passes run here
without kopf (kopf.Body in, kopf.Patch out) against a real name server and two real brokers.

- A Topic is Ready once every broker has it as specified, whether a broker was ready already or
  the pass just updated it (a mix of the two read as not Ready).
- Every condition carries observedGeneration; no Error condition is written, and one an older
  operator wrote is dropped (Ready=False with a reason is the convention).
- messageType reaches every broker as the topic attribute message.type and is read back: a broker
  whose message.type differs from the spec is updated.
- An external Cluster whose name servers do not answer is Ready=False (Unreachable).
- A managed Cluster's status.brokers lists the pods its live StatefulSets have, not the spec's.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

kopf = pytest.importorskip("kopf")

from tests.procs import Cluster, ServerProcess, free_port, tidemq_cmd  # noqa: E402
from tests.support.waiting import wait_until_sync  # noqa: E402
from tidemq.client.admin import Admin  # noqa: E402
from tidemq.operator import brokers, brokerstatus, handlers  # noqa: E402
from tidemq.operator.metrics import OperatorMetrics  # noqa: E402
from tidemq.operator.topics import (  # noqa: E402
    Action,
    BrokerQueues,
    Step,
    plan,
    readiness,
    topic_spec,
)

NS = "default"
pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")


# pure -------------------------------------------------------------------------------------------
def test_a_broker_found_ready_and_one_just_updated_make_a_ready_topic():
    steps = {"broker-a": Step(Action.READY, 4, 4, 6), "broker-b": Step(Action.APPLY, 4, 4, 6)}
    assert readiness(steps) == (True, "Reconciled", "2 broker(s)")
    assert readiness({"broker-a": Step(Action.SHRINK_READ, 2, 2, 6)})[0] is True
    draining = {"broker-a": Step(Action.READY, 4, 4, 6), "broker-b": Step(Action.WAIT_DRAIN, 6, 4, 6, (4, 5))}
    assert readiness(draining)[:2] == (False, "Draining")
    assert readiness({})[:2] == (False, "NoBroker")


def test_a_broker_with_another_message_type_is_updated():
    fifo = topic_spec("t", {"clusterRef": {"name": "c"}, "readQueueNums": 4, "writeQueueNums": 4,
                            "messageType": "FIFO"})
    assert plan(fifo, BrokerQueues(4, 4, 6, True, "FIFO")).action is Action.READY
    assert plan(fifo, BrokerQueues(4, 4, 6, True, "NORMAL")).action is Action.APPLY
    normal = topic_spec("t", {"clusterRef": {"name": "c"}, "readQueueNums": 4, "writeQueueNums": 4})
    assert plan(normal, BrokerQueues(4, 4, 6)).action is Action.READY  # none reported reads as NORMAL
    # while shrinking, the type goes out with the write step (it needs no draining)
    step = plan(topic_spec("t", {"clusterRef": {"name": "c"}, "readQueueNums": 2, "writeQueueNums": 2,
                                 "messageType": "DELAY"}), BrokerQueues(4, 2, 6, False, "NORMAL"))
    assert step.action is Action.SHRINK_WRITE


def _sts(name: str, image: str, pods: int, updated: int, replicated: bool = False) -> dict:
    args = ["broker", "--coordination", "kubernetes"] if replicated else ["broker"]
    return {"metadata": {"name": name},
            "spec": {"replicas": pods, "template": {"spec": {"containers": [
                {"name": "broker", "image": image, "args": args}]}}},
            "status": {"replicas": pods, "updatedReplicas": updated}}


def _managed(groups: int) -> dict:
    return {"metadata": {"name": "demo", "namespace": NS}, "spec": {"brokers": {"groups": groups}}}


def test_managed_cluster_brokers_are_the_pods_that_exist():
    addr = "demo-broker-{g}-{i}.demo-broker-{g}-headless.default.svc:10911"
    # group 1 was never created, group 2 was scaled to 0 by hand: neither has a row
    live = {"demo-broker-0": _sts("demo-broker-0", "reg/tidemq:2", 1, 1), "demo-broker-1": None,
            "demo-broker-2": _sts("demo-broker-2", "reg/tidemq:2", 0, 0)}
    assert brokerstatus.live_brokers(_managed(3), live) == [
        {"name": "demo-broker-0", "brokerId": 0, "address": addr.format(g=0, i=0), "version": "2"}]
    assert brokerstatus.live_brokers(_managed(3), {}) == []


def test_pods_not_updated_yet_keep_the_version_they_run():
    addr = "demo-broker-0-{i}.demo-broker-0-headless.default.svc:10911"
    before = [{"address": addr.format(i=i), "version": "1"} for i in range(3)]
    live = {"demo-broker-0": _sts("demo-broker-0", "tidemq:2", 3, 1, replicated=True)}  # ordinal 2 rolled
    rows = brokerstatus.live_brokers(_managed(1), live, {"demo-broker-0": 1}, before)
    assert [(r["brokerId"], r["version"]) for r in rows] == [(1, "1"), (0, "1"), (3, "2")]


# real processes ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_brokers(tmp_path_factory):
    """A name server with broker-a (tests.procs.Cluster) and a second master, broker-b."""
    root = tmp_path_factory.mktemp("status")
    c = Cluster(root).start()
    port, metrics_port = free_port(), free_port()
    b = ServerProcess(tidemq_cmd(
        "broker", "--namesrv", c.namesrv_addr, "--listen", f"127.0.0.1:{port}",
        "--store", str(root / "store-b"), "--cluster", c.cluster_name, "--broker-name", "broker-b",
        "--metrics-listen", f"127.0.0.1:{metrics_port}",
    ), root / "broker-b.log", f"http://127.0.0.1:{metrics_port}/readyz")
    try:
        b.start()

        async def both_known() -> bool:
            async with Admin(c.namesrv_addr) as admin:
                return len(await brokers.masters(admin)) == 2

        wait_until_sync(lambda: asyncio.run(both_known()), "both brokers registered", timeout=20)
        yield c, f"127.0.0.1:{port}"
    finally:
        b.stop()
        c.stop()


def _cluster_index(name: str, servers: list[str]) -> dict:
    return {(NS, name): [{"spec": {"external": {"nameServers": servers}}, "status": {},
                          "metadata": {"name": name, "namespace": NS}}]}


def _topic_body(topic: str, spec: dict, generation: int, status: dict | None = None) -> kopf.Body:
    return kopf.Body({"apiVersion": "tidemq.io/v1alpha1", "kind": "Topic",
                      "metadata": {"name": topic.lower().replace("_", "-"), "namespace": NS,
                                   "uid": f"uid-{topic}", "generation": generation},
                      "spec": {"clusterRef": {"name": "ext"}, "topicName": topic, **spec},
                      "status": status or {}})


async def _topic_on(c: Cluster, addr: str, topic: str) -> dict | None:
    async with Admin(c.namesrv_addr) as admin:
        return (await admin.broker_topic_configs(addr)).get(topic)


def _condition(patch: kopf.Patch, ctype: str) -> dict:
    return next((c for c in patch.status["conditions"] if c["type"] == ctype), {})


async def test_topic_ready_on_one_broker_and_created_on_the_other_is_ready(two_brokers):
    c, addr_b = two_brokers
    topic = "StatusMixed_" + uuid.uuid4().hex[:6]
    async with Admin(c.namesrv_addr) as admin:  # broker-a has it as specified, broker-b not at all
        await admin.create_topic(topic, 4, 4, 6, True, broker_addr=c.broker_addr,
                                 attributes={"message.type": "FIFO"})
    stale = {"conditions": [{"type": "Error", "status": "True", "reason": "BrokerUnavailable",
                             "message": "old", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    patch = kopf.Patch()
    body = _topic_body(topic, {"readQueueNums": 4, "writeQueueNums": 4, "messageType": "FIFO"}, 3, stale)
    await handlers.topic_pass(handlers.OperatorConfig(), OperatorMetrics(), body, patch,
                              _cluster_index("ext", [c.namesrv_addr]))
    ready = _condition(patch, "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "Reconciled"), ready
    types = {x["type"] for x in patch.status["conditions"]}
    assert types == {"Ready", "Draining"}  # the Error condition of an older operator is gone
    assert all(x["observedGeneration"] == 3 for x in patch.status["conditions"])
    on_b = await _topic_on(c, addr_b, topic)
    assert on_b is not None and (on_b["readQueueNums"], on_b["writeQueueNums"], on_b["order"]) == (4, 4, True)
    assert on_b["attributes"] == {"message.type": "FIFO"}


async def test_message_type_is_sent_and_a_changed_one_is_read_back_and_repaired(two_brokers):
    c, addr_b = two_brokers
    topic = "StatusType_" + uuid.uuid4().hex[:6]
    spec = {"readQueueNums": 2, "writeQueueNums": 2, "messageType": "DELAY"}
    config, clusters = handlers.OperatorConfig(), _cluster_index("ext", [c.namesrv_addr])
    await handlers.topic_pass(config, OperatorMetrics(), _topic_body(topic, spec, 1), kopf.Patch(), clusters)
    for addr in (c.broker_addr, addr_b):
        assert (await _topic_on(c, addr, topic))["attributes"] == {"message.type": "DELAY"}
    # someone changes it by hand on broker-a: the next pass sees it and puts it back
    async with Admin(c.namesrv_addr) as admin:
        await admin.create_topic(topic, 2, 2, 6, False, broker_addr=c.broker_addr,
                                 attributes={"message.type": "NORMAL"})
    patch = kopf.Patch()
    await handlers.topic_pass(config, OperatorMetrics(), _topic_body(topic, spec, 1), patch, clusters)
    assert (await _topic_on(c, c.broker_addr, topic))["attributes"] == {"message.type": "DELAY"}
    assert _condition(patch, "Ready")["message"] == "2 broker(s)"


async def test_an_unreachable_external_cluster_is_not_ready():
    body = kopf.Body({"apiVersion": "tidemq.io/v1alpha1", "kind": "Cluster",
                      "metadata": {"name": "gone", "namespace": NS, "uid": "uid-gone", "generation": 2},
                      "spec": {"external": {"nameServers": [f"127.0.0.1:{free_port()}"]}},
                      "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "External",
                                                 "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})
    patch = kopf.Patch()
    await handlers.cluster_pass(handlers.OperatorConfig(admin_timeout=5.0), OperatorMetrics(), body, patch)
    ready = _condition(patch, "Ready")
    assert (ready["status"], ready["reason"], ready["observedGeneration"]) == ("False", "Unreachable", 2)
    assert "spec.external.nameServers" in ready["message"]
    assert ready["lastTransitionTime"] != "2026-01-01T00:00:00Z"  # it changed from True
    assert patch.status["brokers"] == [] and patch.status["readyBrokers"] == 0


async def test_a_reachable_external_cluster_is_ready_with_its_brokers(two_brokers):
    c, addr_b = two_brokers
    body = kopf.Body({"apiVersion": "tidemq.io/v1alpha1", "kind": "Cluster",
                      "metadata": {"name": "ext", "namespace": NS, "uid": "uid-ext", "generation": 1},
                      "spec": {"external": {"nameServers": [c.namesrv_addr]}}, "status": {}})
    patch = kopf.Patch()
    await handlers.cluster_pass(handlers.OperatorConfig(), OperatorMetrics(), body, patch)
    assert (_condition(patch, "Ready")["status"], _condition(patch, "Ready")["reason"]) == ("True", "External")
    assert sorted(b["address"] for b in patch.status["brokers"]) == sorted([c.broker_addr, addr_b])
