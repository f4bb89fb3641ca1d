"""Scale-in of broker groups (issue 18, item 4).

The pure planning (tidemq.operator.scalein) with a fake clock, then the real operator (``tidemq
operator`` = kopf in a subprocess, as tests/operator/test_operator_integration.py runs it) against
kmock's emulator and two real brokers standing in for the pods of groups 0 and 1 of a managed
Cluster: each listens on its own loopback address (the pod IP the test gives its Pod object) on
the Cluster's broker port, and registers with a real name server that the test's producers and
consumers use. The test plays the StatefulSet controller (status) and the PVC controller (the
group's claims exist as objects); kmock runs no garbage collector, so a deleted StatefulSet's
broker keeps running, which only matters for the cancelled scale-in, where it is raised again.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from tidemq.operator import scalein
from tidemq.operator.scalein import Action, GroupStep, Observation

GRACE = 35.0
T0 = 1_800_000_000.0


# the pure planning --------------------------------------------------------------------------------
def test_retiring_groups_are_the_existing_ones_at_or_above_the_spec():
    names = ["demo-namesrv", "demo-broker-0", "demo-broker-1", "demo-broker-3", "demo-broker-x",
             "demo-broker-01", "other-broker-5", "demo-broker-2-config"]
    assert scalein.retiring_groups("demo", 1, names) == [1, 3]
    assert scalein.retiring_groups("demo", 4, names) == []
    assert scalein.group_ordinal("demo", "demo-broker-12") == 12
    assert scalein.group_ordinal("demo", "demo-broker-01") is None


def test_writes_stop_first_and_nothing_goes_in_that_pass():
    step = scalein.plan_group("demo-broker-1", T0, GRACE, None, Observation(True, {}))
    assert step.action is Action.STOP_WRITES and step.since == T0
    # a broker restarted from its config file takes writes again: they stop again, the period restarts
    step = scalein.plan_group("demo-broker-1", T0 + 100, GRACE, T0, Observation(True, {}))
    assert step.action is Action.STOP_WRITES and step.since == T0 + 100


def test_a_group_waits_for_every_queue_then_the_grace_then_goes():
    left = {"Orders": (0, 3), "%RETRY%billing": (0,)}
    step = scalein.plan_group("demo-broker-1", T0 + 100, GRACE, T0, Observation(False, left))
    assert step.action is Action.WAIT_DRAIN and step.since == T0
    assert "3 queue(s) of 2 topic(s) not consumed yet" in step.message and "Orders [0, 3]" in step.message
    # drained before the grace has passed since writes stopped: quiet
    step = scalein.plan_group("demo-broker-1", T0 + 10, GRACE, T0, Observation(False, {}))
    assert step.action is Action.WAIT_QUIET and "drain grace 35 s" in step.message
    step = scalein.plan_group("demo-broker-1", T0 + GRACE, GRACE, T0, Observation(False, {}))
    assert step.action is Action.REMOVE


def test_a_lost_record_or_one_from_the_future_only_waits_longer():
    assert scalein.plan_group("g", T0, GRACE, None, Observation(False, {})).action is Action.WAIT_QUIET
    step = scalein.plan_group("g", T0, GRACE, T0 + 3600, Observation(False, {}))
    assert step.action is Action.WAIT_QUIET and step.since == T0


def test_an_unreachable_master_makes_its_group_wait_and_says_what_to_do():
    step = scalein.plan_group("demo-broker-1", T0 + 999, GRACE, T0, None, "ConnectError: refused")
    assert step.action is Action.WAIT_OBSERVE and step.since == T0
    assert "refused" in step.message and "delete its StatefulSet" in step.message


def test_status_rows_round_trip_the_start_of_the_grace():
    step = scalein.plan_group("demo-broker-1", T0 + 0.2, GRACE, None, Observation(True, {}))
    rows = [step.status()]
    assert rows[0]["phase"] == "StoppingWrites"
    since = scalein.since_of(rows)["demo-broker-1"]
    assert T0 + 0.2 <= since <= T0 + 1  # rounded up: the period never ends early


def test_which_topics_are_waited_for():
    user = {"perm": 6, "readQueueNums": 4, "writeQueueNums": 4}
    assert scalein.drains("Orders", user) and scalein.drains("%RETRY%billing", user)
    for topic in ("TBW102", "SCHEDULE_TOPIC_XXXX", "rmq_sys_TIDEMQ_METADATA", "%DLQ%billing", "demo_REPLY_TOPIC"):
        assert not scalein.drains(topic, user), topic
    assert not scalein.drains("demo-broker-1", {"perm": 7})  # the broker's own topics inherit (perm bit 1)


def test_undrained_counts_read_and_write_queues_and_every_group():
    configs = {"Orders": {"perm": 6, "readQueueNums": 3, "writeQueueNums": 2},
               "Quiet": {"perm": 6, "readQueueNums": 1, "writeQueueNums": 1},
               "Nobody": {"perm": 6, "readQueueNums": 1, "writeQueueNums": 1},
               "SCHEDULE_TOPIC_XXXX": {"perm": 6, "readQueueNums": 18, "writeQueueNums": 18}}
    ranges = {"Orders": {0: (0, 5), 1: (0, 0), 2: (0, 4)}, "Quiet": {0: (0, 2)}, "Nobody": {0: (3, 9)}}
    committed = {"Orders": {"a": {0: 5, 2: 4}, "b": {0: 4, 2: 4}}, "Quiet": {"a": {0: 2}}}
    # Orders 0: group b is behind; 1: empty; 2: both done. Nobody: messages, no group's offsets
    assert scalein.undrained(configs, ranges, committed) == {"Nobody": (0,), "Orders": (0,)}


def test_delayed_and_timer_messages_not_delivered_yet_hold_the_group():
    levels = {1: 5, 2: 0, 4: 7}
    highs = {1: 5, 2: 0, 4: 9}  # level 4 (queue 3): 2 messages still held
    assert scalein.undelivered(levels, highs, 12, 12) == {scalein.SCHEDULE_TOPIC: (3,)}
    assert scalein.undelivered(levels, highs, 12, 13) == {scalein.SCHEDULE_TOPIC: (3,), scalein.TIMER_TOPIC: (0,)}
    assert scalein.undelivered({1: 5}, {1: 5}, None, 99) == {}  # a broker that reports no timer (RocketMQ's)
    assert scalein.undelivered({}, {3: 1}, None, 0) == {scalein.SCHEDULE_TOPIC: (2,)}  # no progress: none delivered


def test_open_transactions_hold_the_group():
    assert scalein.unresolved(4, 5) == {scalein.HALF_TOPIC: (0,)}  # a half message the checker cannot pass
    assert scalein.unresolved(5, 5) == {}
    assert scalein.unresolved(0, 0) == {}  # never had a transaction
    assert scalein.unresolved(None, 9) == {}  # a broker that does not report its progress (older TideMQ)


def test_conditions_while_scaling_in():
    base = [("Ready", True, "AllReady", ""), ("Progressing", False, "Idle", ""),
            ("Degraded", True, "ReplicasNotReady", "fewer ready replicas than desired: demo-broker-0")]
    steps = [GroupStep("demo-broker-1", Action.WAIT_DRAIN, T0, "group demo-broker-1: 2 queue(s) ...")]
    out = {c[0]: c for c in scalein.conditions(steps, base)}
    assert out["Degraded"][1:3] == (True, "ScalingIn")
    assert "demo-broker-1: 2 queue(s)" in out["Degraded"][3] and "demo-broker-0" in out["Degraded"][3]
    assert out["Ready"][1:3] == (False, "ScalingIn") and out["Progressing"][1:3] == (True, "ScalingIn")
    # a group removed in this pass no longer degrades anything
    gone = [GroupStep("demo-broker-1", Action.REMOVE, T0, "removing")]
    assert scalein.conditions(gone, base) == base


def test_cancelled_groups_and_what_their_writes_become():
    rows = [{"name": "demo-broker-1"}, {"name": "demo-broker-2"}, {"name": 5}, "junk"]
    assert scalein.cancelled("demo", 2, rows) == ["demo-broker-1"]
    assert scalein.cancelled("demo", 2, None) == []
    assert scalein.restored_permission({"brokers": {}}) == "6"
    assert scalein.restored_permission({"brokers": {"config": {"brokerPermission": "4"}}}) == "4"


def test_a_replicated_group_is_drained_through_its_newest_master():
    assert scalein.master_of({0: ("follower", 3), 1: ("master", 3), 2: None}) == 1
    assert scalein.master_of({0: ("master", 2), 1: ("master", 3), 2: ("follower", 3)}) == 1  # 0 was deposed
    assert scalein.master_of({0: ("follower", 3), 1: None}) is None


def test_only_the_statefulsets_claims_are_its_claims():
    claims = ["data-demo-broker-1-0", "data-demo-broker-1-1", "data-demo-broker-10-0", "data-demo-broker-1-x",
              "other-demo-broker-1-0"]
    assert scalein.claim_names("demo-broker-1", claims) == ["data-demo-broker-1-0", "data-demo-broker-1-1"]
    assert scalein.delete_claim({"brokers": {"deleteClaim": True}})
    assert not scalein.delete_claim({"brokers": {}})


def test_the_crd_defaults_delete_claim_to_false_and_refuses_other_types():
    from tidemq.operator import crds  # noqa: PLC0415

    obj = {"apiVersion": crds.API_VERSION, "kind": "Cluster", "metadata": {"name": "demo"},
           "spec": {"brokers": {"groups": 2}}}
    admitted, errors = crds.admit(obj)
    assert errors == [] and admitted["spec"]["brokers"]["deleteClaim"] is False
    obj["spec"]["brokers"]["deleteClaim"] = "yes"
    assert crds.admit(obj)[1]


# the real operator, the emulator and real brokers ----------------------------------------------------
kmock = pytest.importorskip("kmock")
kubernetes = pytest.importorskip("kubernetes")
pytest.importorskip("kopf")

from tests.charts.test_chart import helm_python, kubeconfig, render  # noqa: E402,F401 (fixtures)
from tests.operator.test_operator_integration import (  # noqa: E402
    NS,
    OPERATOR_USED,
    Operator,
    build_emulator,
    condition,
    create,
    get,
    mark_ready,
    mount_master_key,
    patch_spec,
)
from tests.procs import ServerProcess, free_port, tidemq_cmd  # noqa: E402
from tests.support import rbac  # noqa: E402
from tests.support.kube import ThreadedEmulator  # noqa: E402
from tidemq.client.admin import Admin  # noqa: E402
from tidemq.client.route import MessageQueue, Perm  # noqa: E402
from tidemq.client import ClientConfig, LocalTransactionState, SyncTransactionProducer  # noqa: E402
from tidemq.client.sync import SyncPullConsumer, SyncProducer  # noqa: E402
from tidemq.message import Message  # noqa: E402
from tidemq.operator import workloads  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")

CLUSTER = "si"
RETIRING = f"{CLUSTER}-broker-1"
CLAIM = f"data-{RETIRING}-0"
# Open transactions are checked back 1 s after their half message, every 0.3 s (RocketMQ: 6 s, 60 s).
TX_ARGS = ("--transaction-timeout", "1", "--transaction-check-interval", "0.3")


class Brokers:
    """A real name server and the brokers of groups 0 and 1 (pod IPs 127.0.0.2 and .3, one port)."""

    def __init__(self, root) -> None:
        ns_port, ns_metrics = free_port(), free_port()
        self.namesrv_addr = f"127.0.0.1:{ns_port}"
        self.namesrv = ServerProcess(tidemq_cmd("namesrv", "--listen", self.namesrv_addr,
                                                "--metrics-listen", f"127.0.0.1:{ns_metrics}"),
                                     root / "namesrv.log", f"http://127.0.0.1:{ns_metrics}/readyz")
        self.port = free_port()
        self.procs = []
        for g in (0, 1):
            ip, metrics = self.ip(g), free_port()
            self.procs.append(ServerProcess(tidemq_cmd(
                "broker", "-n", self.namesrv_addr, "--listen", f"{ip}:{self.port}", "--store", str(root / f"store-{g}"),
                "--cluster", CLUSTER, "--broker-name", workloads.broker_name(CLUSTER, g),
                "--metrics-listen", f"{ip}:{metrics}", *TX_ARGS), root / f"broker-{g}.log",
                f"http://{ip}:{metrics}/readyz"))

    @staticmethod
    def ip(group: int) -> str:
        return f"127.0.0.{group + 2}"

    def addr(self, group: int) -> str:
        return f"{self.ip(group)}:{self.port}"

    def call(self, fn):
        async def go():
            async with Admin(self.namesrv_addr) as admin:
                return await fn(admin)
        return asyncio.run(go())

    def permission(self, group: int) -> str:
        return self.call(lambda a: a.broker_config(self.addr(group)))["brokerPermission"]

    def route_writable(self, topic: str, group: int) -> bool:
        route = self.call(lambda a: a.topic_route(topic))
        return any(q.perm & Perm.WRITE for q in route.queue_datas if q.broker_name == workloads.broker_name(CLUSTER, group))


@pytest.fixture(scope="module")
def brokers(tmp_path_factory):
    b = Brokers(tmp_path_factory.mktemp("scalein"))
    try:
        b.namesrv.start()
        for p in b.procs:
            p.start()
        yield b
    finally:
        for p in b.procs:
            p.stop()
        b.namesrv.stop()


@pytest.fixture(scope="module")
def emulator():
    emu = ThreadedEmulator(build_emulator).start()
    yield emu
    emu.stop()


@pytest.fixture(scope="module")
def operator(emulator, kube, tmp_path_factory):
    op = Operator(tmp_path_factory.mktemp("operator"), emulator.url).start()
    op.master_key = mount_master_key(kube, op)
    yield op
    op.stop()


def put_group(core, brokers: Brokers, group: int) -> None:
    """Play the StatefulSet controller and the kubelet: group ``group``'s pod (the real broker's
    address as pod IP) and its PVC."""
    labels = workloads.broker_selector(CLUSTER, group)
    sts = workloads.broker_name(CLUSTER, group)
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": f"{sts}-0", "namespace": NS, "labels": {**labels, "apps.kubernetes.io/pod-index": "0"}},
           "spec": {"containers": [{"name": "broker", "image": "tidemq"}]},
           "status": {"podIP": brokers.ip(group), "conditions": [{"type": "Ready", "status": "True"}]}}
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": f"data-{sts}-0", "namespace": NS, "labels": dict(labels)},
             "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}}}
    for make, obj in ((core.create_namespaced_pod, pod), (core.create_namespaced_persistent_volume_claim, claim)):
        try:
            make(NS, obj)
        except kubernetes.client.ApiException as exc:
            if exc.status != 409:
                raise


def exists(read, name: str) -> bool:
    try:
        read(name, NS)
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def events(core, reason: str) -> list[str]:
    return [e.message for e in core.list_namespaced_event(NS).items
            if e.involved_object.name == CLUSTER and e.reason == reason]


def lag_on_retiring(brokers: Brokers, topic: str, group: str, consumed: dict[int, bool]) -> None:
    """One message on each of the retiring broker's queues; ``group`` commits past it where
    ``consumed`` says so, and on the other queues stays behind."""
    with SyncProducer(f"si_pg_{uuid.uuid4().hex[:6]}", brokers.namesrv_addr) as p:
        for q in consumed:
            p.send(Message(topic, f"m{q}".encode()), queue=MessageQueue(topic, RETIRING, q))
    commit(brokers, topic, group, [q for q, done in consumed.items() if done])


def commit(brokers: Brokers, topic: str, group: str, queues: list[int]) -> None:
    with SyncPullConsumer(group, brokers.namesrv_addr) as c:
        for q in queues:
            mq = MessageQueue(topic, RETIRING, q)
            c.commit(mq, c.max_offset(mq))


def two_groups(kube, operator, brokers: Brokers, **brokers_spec) -> None:
    """The Cluster with groups 0 and 1 running and Ready (created, or raised again to 2)."""
    _, api = kube
    apps, core = kubernetes.client.AppsV1Api(api), kubernetes.client.CoreV1Api(api)
    spec = {"groups": 2, "port": brokers.port, **brokers_spec}
    try:
        current = get(kube, "Cluster", CLUSTER)
    except kubernetes.client.ApiException as exc:
        if exc.status != 404:
            raise
        create(kube, "Cluster", CLUSTER, {"nameServers": {"replicas": 1}, "brokers": spec})
    else:
        patch_spec(kube, "Cluster", CLUSTER, {"brokers": {**current["spec"]["brokers"], **spec}})
    operator.wait("both broker groups", lambda: exists(apps.read_namespaced_stateful_set, RETIRING))
    if brokers.permission(1) != "6":  # a new pod of the group: the broker starts from its config file
        brokers.procs[1].stop()
        brokers.procs[1].start()
    for g in (0, 1):
        put_group(core, brokers, g)
    operator.wait("the Cluster Ready with two groups", lambda: cluster_ready(kube, apps))


def lower_to_one(kube) -> None:
    patch_spec(kube, "Cluster", CLUSTER, {"brokers": {**get(kube, "Cluster", CLUSTER)["spec"]["brokers"], "groups": 1}})


def cluster_ready(kube, apps) -> bool:
    for sts in (f"{CLUSTER}-namesrv", f"{CLUSTER}-broker-0", RETIRING):
        if exists(apps.read_namespaced_stateful_set, sts):
            mark_ready(apps, sts)
    return condition(get(kube, "Cluster", CLUSTER), "Ready").get("status") == "True"


def test_a_lowered_group_stops_writes_drains_then_goes_keeping_its_claim(kube, operator, brokers):
    _, api = kube
    apps, core = kubernetes.client.AppsV1Api(api), kubernetes.client.CoreV1Api(api)
    two_groups(kube, operator, brokers)
    topic, group = f"Scale_{uuid.uuid4().hex[:6]}", f"si_cg_{uuid.uuid4().hex[:6]}"
    brokers.call(lambda a: a.create_topic(topic, 2, 2, cluster=CLUSTER))
    operator.wait("the topic routed on both groups", lambda: brokers.route_writable(topic, 1))
    lag_on_retiring(brokers, topic, group, {0: True, 1: False})

    lower_to_one(kube)
    operator.wait("the retiring group read-only", lambda: brokers.permission(1) == "4")
    assert brokers.permission(0) == "6"
    operator.wait("producers routed elsewhere", lambda: not brokers.route_writable(topic, 1))
    obj = operator.wait("Draining, Degraded ScalingIn naming the queue left",
                        lambda: (o := get(kube, "Cluster", CLUSTER)) and
                        [r.get("phase") for r in o["status"].get("scaleIn") or ()] == ["Draining"] and o)
    assert "1 queue(s) of 1 topic(s)" in condition(obj, "Degraded")["message"]
    assert condition(obj, "Degraded")["reason"] == "ScalingIn" and condition(obj, "Degraded")["status"] == "True"
    assert f"{topic} [1]" in condition(obj, "Degraded")["message"] and RETIRING in condition(obj, "Degraded")["message"]
    assert condition(obj, "Ready")["status"] == "False"
    assert obj["status"]["scaleIn"][0]["name"] == RETIRING and obj["status"]["scaleIn"][0]["drainingSince"]
    assert any(RETIRING in m and "PVCs are then kept" in m for m in events(core, "ScaleIn"))
    time.sleep(2.5)  # timer passes well past the 1 s drain grace: the lagging group holds it
    assert exists(apps.read_namespaced_stateful_set, RETIRING), operator.log()

    commit(brokers, topic, group, [1])
    # one pass deletes them in turn (StatefulSet first): wait for the last, not the first
    operator.wait("the drained group's StatefulSet, ConfigMap and Service deleted",
                  lambda: not exists(apps.read_namespaced_stateful_set, RETIRING)
                  and not exists(core.read_namespaced_config_map, workloads.broker_config_name(CLUSTER, 1))
                  and not exists(core.read_namespaced_service, workloads.broker_headless_name(CLUSTER, 1)))
    assert exists(core.read_namespaced_persistent_volume_claim, CLAIM)  # deleteClaim false: kept
    assert exists(apps.read_namespaced_stateful_set, f"{CLUSTER}-broker-0")
    obj = operator.wait("Ready again", lambda: (o := get(kube, "Cluster", CLUSTER)) and
                        condition(o, "Ready").get("status") == "True" and o)
    assert condition(obj, "Degraded")["status"] == "False" and not obj["status"].get("scaleIn")
    assert any(f"{CLAIM}" in m and "PVCs kept" in m for m in events(core, "ScaleIn"))


class Answer:
    """A transaction listener whose local transaction is open until ``state`` says otherwise."""

    def __init__(self) -> None:
        self.state = LocalTransactionState.UNKNOW
        self.checks = 0

    def execute_local_transaction(self, msg, arg) -> LocalTransactionState:
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, msg) -> LocalTransactionState:
        self.checks += 1
        return self.state


@pytest.mark.slow  # ~10 s; the default suite covers the drain of topic queues
def test_an_open_transaction_holds_the_retiring_group_until_it_is_resolved(kube, operator, brokers):
    """A transactional producer's half message on the retiring group: its commit or the broker's
    check-back need that group, so it stays until the transaction is resolved."""
    _, api = kube
    apps = kubernetes.client.AppsV1Api(api)
    two_groups(kube, operator, brokers)
    topic = f"ScaleTx_{uuid.uuid4().hex[:6]}"
    brokers.call(lambda a: a.create_topic(topic, 1, 1, broker_addr=brokers.addr(1)))  # only on the retiring group
    operator.wait("the topic routed on the retiring group", lambda: brokers.route_writable(topic, 1))
    answer = Answer()
    with SyncTransactionProducer(f"si_tx_{uuid.uuid4().hex[:6]}", answer,
                                 config=ClientConfig(name_servers=brokers.namesrv_addr)) as p:
        p.send_message_in_transaction(Message(topic, b"open"))
        lower_to_one(kube)
        obj = operator.wait("Draining, naming the half queue", lambda: (o := get(kube, "Cluster", CLUSTER)) and
                            [r.get("phase") for r in o["status"].get("scaleIn") or ()] == ["Draining"] and o)
        assert "RMQ_SYS_TRANS_HALF_TOPIC [0]" in condition(obj, "Degraded")["message"], condition(obj, "Degraded")
        operator.wait("the transaction checked back", lambda: answer.checks > 0)
        time.sleep(2.5)  # well past the 1 s drain grace: the open transaction holds the group
        assert exists(apps.read_namespaced_stateful_set, RETIRING), operator.log()
        answer.state = LocalTransactionState.ROLLBACK_MESSAGE
        operator.wait("the group deleted once the transaction is rolled back",
                      lambda: not exists(apps.read_namespaced_stateful_set, RETIRING))


@pytest.mark.slow  # ~11 s; the default suite covers the drain and a kept claim
def test_raising_groups_during_the_drain_gives_writes_back_and_delete_claim_deletes_the_claim(kube, operator, brokers):
    _, api = kube
    apps, core = kubernetes.client.AppsV1Api(api), kubernetes.client.CoreV1Api(api)
    two_groups(kube, operator, brokers, deleteClaim=True)
    assert brokers.permission(1) == "6"

    topic, group = f"Cancel_{uuid.uuid4().hex[:6]}", f"si_cg_{uuid.uuid4().hex[:6]}"
    brokers.call(lambda a: a.create_topic(topic, 1, 1, cluster=CLUSTER))
    operator.wait("the topic routed", lambda: brokers.route_writable(topic, 1))
    lag_on_retiring(brokers, topic, group, {0: False})
    lower_to_one(kube)
    operator.wait("draining", lambda: condition(get(kube, "Cluster", CLUSTER), "Degraded").get("reason") == "ScalingIn")
    assert brokers.permission(1) == "4"

    patch_spec(kube, "Cluster", CLUSTER, {"brokers": {**get(kube, "Cluster", CLUSTER)["spec"]["brokers"], "groups": 2}})
    operator.wait("writes back", lambda: brokers.permission(1) == "6")
    operator.wait("a ScaleInCancelled event", lambda: any(RETIRING in m for m in events(core, "ScaleInCancelled")))
    operator.wait("not scaling in", lambda: (o := get(kube, "Cluster", CLUSTER)) and not o["status"].get("scaleIn")
                  and condition(o, "Degraded").get("reason") != "ScalingIn")
    assert exists(apps.read_namespaced_stateful_set, RETIRING)

    commit(brokers, topic, group, [0])
    lower_to_one(kube)
    operator.wait("the drained group deleted", lambda: not exists(apps.read_namespaced_stateful_set, RETIRING))
    operator.wait("its claim deleted too", lambda: not exists(core.read_namespaced_persistent_volume_claim, CLAIM))
    assert exists(core.read_namespaced_persistent_volume_claim, f"data-{CLUSTER}-broker-0-0")


def test_the_chart_grants_what_the_scale_in_used(request, kube, operator):
    """What the operator asked of the emulator in this module (recorded by the integration
    module's emulator) is granted by the chart's RBAC, the deletes of a scale-in included."""
    objs = render(request.getfixturevalue("helm_python"), request.getfixturevalue("kubeconfig"), "rbac", {})
    granted = rbac.granted(rule for o in objs if o["kind"] in ("Role", "ClusterRole") for rule in o.get("rules", []))
    used = set(OPERATOR_USED)
    assert not used - granted, sorted(used - granted)
    ran = {i.originalname for i in request.session.items}
    if "test_a_lowered_group_stops_writes_drains_then_goes_keeping_its_claim" not in ran:
        pytest.skip("the scale-in test did not run")
    assert {("apps", "statefulsets", "list"), ("apps", "statefulsets", "delete"), ("", "configmaps", "delete"),
            ("", "services", "delete"), ("", "persistentvolumeclaims", "list")} <= used
    if "test_raising_groups_during_the_drain_gives_writes_back_and_delete_claim_deletes_the_claim" in ran:
        assert ("", "persistentvolumeclaims", "delete") in used
