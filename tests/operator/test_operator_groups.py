"""ConsumerGroup status is written only when it changes (issue 18, item 12): the real operator
against kmock's emulator and a real TideMQ name server + broker, counting the status PATCH
requests the operator sends while its timer measures the lag every second.

The emulator, the operator process and the object helpers are those of
tests/operator/test_operator_integration.py (its docstring says how kmock is adapted); this
module starts its own emulator so that it can count the operator's requests.
"""

from __future__ import annotations

import collections
import re
import time
import uuid

import pytest

from tests.operator.test_operator_integration import (
    NS,
    OPERATOR_TOKEN,
    GenerateNameEmulator,
    Operator,
    build_emulator,
    condition,
    create,
    get,
    mount_master_key,
)
from tests.support.kube import ThreadedEmulator
from tidemq.client.route import MessageQueue
from tidemq.client.sync import SyncProducer, SyncPullConsumer
from tidemq.message import Message
from tidemq.operator.groups import status_changes

kubernetes = pytest.importorskip("kubernetes")

pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")


class CountingEmulator(GenerateNameEmulator):
    """Counts the operator's PATCH requests by path (kmock's own log keeps only the requests
    being served: tests/support/kube.py)."""

    async def _handle(self, request):
        if str(getattr(request.method, "value", request.method)) == "PATCH" and \
                request.headers.get("Authorization") == f"Bearer {OPERATOR_TOKEN}":
            patched = self.__dict__.setdefault("patched", collections.Counter())
            patched[request.url.path] += 1
        return await super()._handle(request)


class Emulator:
    """The emulator in its thread, with the emulator object kept for its counts."""

    def __init__(self) -> None:
        self.emu = None

        def build():
            self.emu = build_emulator(CountingEmulator)
            return self.emu
        self.thread = ThreadedEmulator(build, name="kmock-groups").start()
        self.url = self.thread.url

    def status_patches(self, plural: str, name: str) -> int:
        """PATCH requests of the operator to the status of ``plural``/``name`` so far."""
        return self.emu.__dict__.get("patched", {}).get(f"/apis/tidemq.io/v1alpha1/namespaces/{NS}/{plural}/{name}/status", 0)


@pytest.fixture(scope="module")
def emulator():
    e = Emulator()
    yield e
    e.thread.stop()


@pytest.fixture(scope="module")
def operator(emulator, cluster, kube, tmp_path_factory):
    op = Operator(tmp_path_factory.mktemp("operator-groups"), emulator.url).start()
    mount_master_key(kube, op)
    yield op
    op.stop()


def group_passes(op: Operator) -> float:
    """ConsumerGroup passes the operator counted as done (its Prometheus metrics)."""
    m = re.search(r'^tidemq_operator_reconciles_total\{kind="ConsumerGroup",result="ok"\} (\S+)$',
                  op.metrics(), re.M)
    return float(m.group(1)) if m else 0.0


@pytest.mark.slow  # ~11 s of timer passes: the default suite's 15-minute budget
def test_a_pass_that_measures_the_same_lag_writes_no_status(kube, operator, emulator, cluster):
    create(kube, "Cluster", "grp-ext", {"external": {"nameServers": [cluster.namesrv_addr]}})
    topic, group = "OpQuiet_" + uuid.uuid4().hex[:6], "op_quiet_" + uuid.uuid4().hex[:6]
    cluster.create_topic(topic, queues=1)
    q0 = MessageQueue(topic, cluster.broker_name, 0)
    with SyncProducer("op_quiet_pg", cluster.namesrv_addr) as producer, \
            SyncPullConsumer(group, cluster.namesrv_addr) as consumer:
        producer.send(Message(topic, b"first"), queue=q0)
        consumer.commit(q0, consumer.max_offset(q0))  # the group has offsets for the topic, lag 0
        create(kube, "ConsumerGroup", "op-quiet", {"clusterRef": {"name": "grp-ext"}, "groupName": group})
        first = operator.wait("the group's lag in its status",
                              lambda: (o := get(kube, "ConsumerGroup", "op-quiet")) and
                              condition(o, "Ready").get("status") == "True" and
                              o["status"].get("lag") == [{"topic": topic, "lag": 0}] and o)["status"]
        time.sleep(1.5)  # let the pass that wrote it finish
        patches, passes = emulator.status_patches("consumergroups", "op-quiet"), group_passes(operator)

        time.sleep(4)  # ~4 timer passes, each measuring the same lag
        assert group_passes(operator) >= passes + 3, operator.log()
        assert emulator.status_patches("consumergroups", "op-quiet") == patches
        assert get(kube, "ConsumerGroup", "op-quiet")["status"]["lastLagTime"] == first["lastLagTime"]

        for i in range(3):  # the lag changes: written (once per value a pass saw), with a new lastLagTime
            producer.send(Message(topic, f"more-{i}".encode()), queue=q0)
        now = operator.wait("the new lag in the status",
                            lambda: (s := get(kube, "ConsumerGroup", "op-quiet")["status"])["totalLag"] == 3 and s)
        assert now["lastLagTime"] > first["lastLagTime"]
        time.sleep(1.5)
        written = emulator.status_patches("consumergroups", "op-quiet")
        assert patches < written <= patches + 3
        time.sleep(3)  # and nothing more while the lag stays
        assert emulator.status_patches("consumergroups", "op-quiet") == written


def test_status_changes_keep_only_what_differs_and_move_last_lag_time_with_the_lag():
    stored = {"groupName": "g", "lag": [{"topic": "t", "lag": 0}], "totalLag": 0, "consumersOnline": 1,
              "lastLagTime": "2026-11-26T04:00:00Z"}
    same = {k: v for k, v in stored.items() if k != "lastLagTime"}
    assert status_changes(stored, same, "2026-11-26T05:00:00Z") == {}
    assert status_changes(stored, {**same, "consumersOnline": 0}, "T") == {"consumersOnline": 0}
    assert status_changes(stored, {**same, "lag": [{"topic": "t", "lag": 3}], "totalLag": 3}, "T") == {
        "lag": [{"topic": "t", "lag": 3}], "totalLag": 3, "lastLagTime": "T"}
    assert status_changes({}, same, "T") == {**same, "lastLagTime": "T"}  # the first pass


async def test_a_group_of_a_cluster_with_unusable_name_servers_is_not_ready_with_the_reason():
    """An external Cluster whose nameServers are not host:port strings: the pass said nothing and
    failed with the spec error's traceback (kopf retried it as an unexpected exception)."""
    import kopf  # noqa: PLC0415 (the module's other test runs kopf in a process)

    from tidemq.operator import handlers  # noqa: PLC0415
    from tidemq.operator.metrics import OperatorMetrics  # noqa: PLC0415

    body = kopf.Body({"apiVersion": "tidemq.io/v1alpha1", "kind": "ConsumerGroup",
                      "metadata": {"name": "g", "namespace": NS, "uid": "uid-g", "generation": 4},
                      "spec": {"clusterRef": {"name": "bad"}}, "status": {}})
    index = {(NS, "bad"): [{"spec": {"external": {"nameServers": [""]}}, "status": {},
                            "metadata": {"name": "bad", "namespace": NS}}]}
    patch = kopf.Patch()
    with pytest.raises(kopf.TemporaryError, match="nameServers"):
        await handlers.group_pass(handlers.OperatorConfig(), OperatorMetrics(), body, patch, index)
    ready = next(c for c in patch["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"], ready["observedGeneration"]) == ("False", "ClusterInvalid", 4)
