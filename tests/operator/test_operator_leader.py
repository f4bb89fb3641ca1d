"""Leader election between operator replicas (tidemq.operator.leader; issue 18, item 1).

Before: with ``operator.replicas > 1`` the chart gave every pod the same kopf peering priority and
kopf paused all of them (HA reconciled nothing). Now replicas elect a leader on a Lease.

- The state machine's pure parts with values (who may claim, what a claim and a release write).
- The elector with its real Kubernetes store against kmock (tests/support/kube_cas.py adds the
  resourceVersion compare-and-swap the API server has), on a fake clock: two racers for a free
  Lease, takeover only after expiry, a leader seeing another holder steps down, release hands over
  at once; on real time: a leader whose API server is gone cancels its work within the deadline.
- Two and three real ``tidemq operator`` processes (each with its own token, so the emulator
  tells who wrote what): only the leader patches Topics, the standby only reads the Lease;
  SIGTERM releases (takeover well within the lease duration), SIGKILL does not (takeover after
  expiry); a leader that finds another holder in its Lease exits with status 1.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

kmock = pytest.importorskip("kmock")
kubernetes = pytest.importorskip("kubernetes")
pytest.importorskip("kopf")

from tests.charts import test_chart  # noqa: E402
from tests.procs import free_port, tidemq_cmd  # noqa: E402
from tests.support.kube import ThreadedEmulator  # noqa: E402
from tests.support.kube_cas import build_cas_emulator, kubeconfig_text  # noqa: E402
from tests.support.waiting import wait_until_sync  # noqa: E402
from tidemq.operator import crds  # noqa: E402
from tidemq.operator.leader import (  # noqa: E402
    KubernetesLeaseStore,
    LeaderConfig,
    LeaderElector,
    LeadershipLost,
    LeaseRecord,
    claim,
    may_claim,
    released,
)

pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")
helm_python, kubeconfig = test_chart.helm_python, test_chart.kubeconfig  # the Helm fixtures, shared

NS = "default"
WALL = datetime.datetime(2026, 11, 26, 7, 0, tzinfo=datetime.UTC)


# the state machine, pure -------------------------------------------------------------------------
def test_who_may_claim_a_lease():
    held = LeaseRecord(holder="a", lease_duration=15, renew_time="t0")
    assert may_claim(None, "b", 0.0, 0.0)  # no Lease yet
    assert may_claim(LeaseRecord(holder="", lease_duration=1), "b", 0.0, 0.0)  # released
    assert may_claim(held, "a", 0.0, 1.0)  # our own: a renewal
    assert not may_claim(held, "b", observed_at=100.0, now=114.9)
    assert may_claim(held, "b", observed_at=100.0, now=115.0)  # unchanged for the lease duration


def test_a_claim_keeps_or_starts_the_tenure():
    first = claim(None, "a", 15, "t0")
    assert (first.holder, first.acquire_time, first.renew_time, first.transitions) == ("a", "t0", "t0", 0)
    renewed = claim(first, "a", 15, "t1")
    assert (renewed.acquire_time, renewed.renew_time, renewed.transitions) == ("t0", "t1", 0)
    taken = claim(renewed, "b", 15, "t2")
    assert (taken.holder, taken.acquire_time, taken.transitions) == ("b", "t2", 1)
    gone = released(taken, "t3")
    assert (gone.holder, gone.lease_duration, gone.transitions) == ("", 1, 1)
    assert not gone.same_claim(taken) and taken.same_claim(claim(taken, "b", 15, "t2"))


@pytest.mark.parametrize("timings", [(15, 15.0, 2.0), (15, 10.0, 10.0), (5, 10.0, 2.0), (15, 10.0, 0.0)])
def test_unsafe_timings_are_refused(timings):
    duration, deadline, retry = timings
    with pytest.raises(ValueError, match="retry period .* < renew deadline .* < lease duration"):
        LeaderConfig("l", NS, "me", lease_duration=duration, renew_deadline=deadline, retry_period=retry)
    with pytest.raises(ValueError, match="POD_NAME"):
        LeaderConfig("l", NS, "")


# the elector against the emulator -----------------------------------------------------------------
class Emulator:
    def __init__(self) -> None:
        self.emu = None
        self.threaded = ThreadedEmulator(self._build, name="kmock-leader")

    def _build(self):
        self.emu = build_cas_emulator()
        return self.emu

    def start(self) -> "Emulator":
        self.threaded.start()
        return self

    @property
    def url(self) -> str:
        return self.threaded.url

    def writes(self):
        return list(self.emu.writes)

    def client(self, token: str = "test"):
        cfg = kubernetes.client.Configuration()
        cfg.host = self.url
        cfg.api_key = {"BearerToken": token}
        cfg.api_key_prefix = {"BearerToken": "Bearer"}
        return kubernetes.client.ApiClient(cfg)


@pytest.fixture(scope="module")
def emulator():
    emu = Emulator().start()
    yield emu
    emu.threaded.stop()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


def elector(emulator: Emulator, lease: str, who: str, clock: Clock, **timings) -> LeaderElector:
    cfg = LeaderConfig(lease, NS, who, **timings)
    store = KubernetesLeaseStore(emulator.client(who), lease, NS, cfg.request_timeout)
    return LeaderElector(cfg, store, clock=clock, wall=lambda: WALL + datetime.timedelta(seconds=clock.now),
                         sleep=clock.sleep)


def read_lease(emulator: Emulator, name: str) -> dict:
    api = kubernetes.client.CoordinationV1Api(emulator.client())
    return emulator.client().sanitize_for_serialization(api.read_namespaced_lease(name, NS))


async def test_of_two_racers_for_a_free_lease_exactly_one_wins(emulator):
    clock = Clock()
    for round_ in range(5):
        a, b = (elector(emulator, f"race-{round_}", who, clock) for who in ("a", "b"))
        won = await asyncio.gather(a.try_acquire_or_renew(), b.try_acquire_or_renew())  # both create
        assert sorted(won) == [False, True]
        await (a if won[0] else b).release()
        won = await asyncio.gather(a.try_acquire_or_renew(), b.try_acquire_or_renew())  # both patch
        assert sorted(won) == [False, True]
        spec = read_lease(emulator, f"race-{round_}")["spec"]
        assert spec["holderIdentity"] == ("a" if won[0] else "b") and spec["leaseTransitions"] == 1


async def test_a_standby_takes_over_only_after_the_lease_expired_and_the_old_leader_steps_down(emulator):
    clock = Clock()
    a, b = (elector(emulator, "expiry", who, clock, lease_duration=15, renew_deadline=10, retry_period=2)
            for who in ("a", "b"))
    await a.acquire()
    assert a.leading and not await b.try_acquire_or_renew() and b.holder == "a"
    clock.now += 5
    assert await a.try_acquire_or_renew()  # a renewal: b sees a new record ...
    clock.now += 5
    assert not await b.try_acquire_or_renew()
    clock.now += 14.9  # ... and counts the lease duration from when it saw it
    assert not await b.try_acquire_or_renew()
    clock.now += 0.1
    assert await b.try_acquire_or_renew()
    spec = read_lease(emulator, "expiry")["spec"]
    assert (spec["holderIdentity"], spec["leaseTransitions"], spec["leaseDurationSeconds"]) == ("b", 1, 15)
    assert not await a.try_acquire_or_renew() and a.holder == "b"


async def test_a_leader_that_reads_another_holder_steps_down_at_its_next_renewal(emulator):
    clock = Clock()
    a = elector(emulator, "taken", "a", clock, lease_duration=15, renew_deadline=10, retry_period=2)
    await a.acquire()
    api = kubernetes.client.CoordinationV1Api(emulator.client())
    version = read_lease(emulator, "taken")["metadata"]["resourceVersion"]
    api.patch_namespaced_lease("taken", NS, {"metadata": {"resourceVersion": version}, "spec": {"holderIdentity": "x"}},
                               _content_type="application/merge-patch+json")
    t0 = clock.now
    with pytest.raises(LeadershipLost, match="x holds it"):
        await a.hold()
    assert clock.now - t0 == 2 and not a.leading  # one retry period, not the renew deadline


async def test_a_release_lets_the_standby_in_at_once(emulator):
    clock = Clock()
    a, b = (elector(emulator, "release", who, clock) for who in ("a", "b"))
    await a.acquire()
    assert not await b.try_acquire_or_renew()
    await a.release()
    assert read_lease(emulator, "release")["spec"]["holderIdentity"] in ("", None)
    assert await b.try_acquire_or_renew()  # the clock did not move


async def test_a_standby_is_ready_while_it_reads_the_lease_and_not_once_the_api_is_out_of_reach():
    emu = Emulator().start()
    clock = Clock()
    try:
        a, b = (elector(emu, "standby", who, clock, lease_duration=15, renew_deadline=10, retry_period=2)
                for who in ("a", "b"))
        assert not b.standing_by()  # never read the Lease: starting
        await a.acquire()
        assert not await b.try_acquire_or_renew()
        assert b.standing_by() and not b.leading
        clock.now += 10
        assert b.standing_by()
    finally:
        await asyncio.to_thread(emu.threaded.stop)
    clock.now += 2
    with pytest.raises(Exception):  # noqa: B017 (whatever the client raises for a refused connection)
        await b.try_acquire_or_renew()
    clock.now += 0.1  # 12.1 s since the last read: past the renew deadline
    assert not b.standing_by()


async def test_a_leader_cut_off_from_the_api_cancels_its_work_within_the_renew_deadline():
    emu = Emulator().start()
    cfg = LeaderConfig("cut", NS, "a", lease_duration=3, renew_deadline=1.0, retry_period=0.2)
    el = LeaderElector(cfg, KubernetesLeaseStore(emu.client("a"), "cut", NS, cfg.request_timeout))
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def work() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    runner = asyncio.ensure_future(el.run(work))
    await asyncio.wait_for(started.wait(), 10)
    assert el.leading
    await asyncio.sleep(0.5)  # a few renewals succeed
    assert not runner.done()
    await asyncio.to_thread(emu.threaded.stop)
    t0 = time.monotonic()
    with pytest.raises(LeadershipLost, match="renew deadline"):
        await asyncio.wait_for(runner, 10)
    assert time.monotonic() - t0 < cfg.renew_deadline + 1.0  # lease 3 s: before any standby could lead
    await asyncio.wait_for(cancelled.wait(), 1)
    assert not el.leading


# real operator processes -----------------------------------------------------------------------
LEASE_DURATION, RENEW_DEADLINE, RETRY = 4, 3.0, 0.5


class OperatorProc:
    def __init__(self, root: Path, emulator: Emulator, name: str, lease: str) -> None:
        self.name, self.emulator = name, emulator
        (root / name).mkdir(parents=True, exist_ok=True)
        self.kubeconfig = root / name / "kubeconfig"
        self.kubeconfig.write_text(kubeconfig_text(emulator.url, name))
        self.log = root / name / "operator.log"
        self.port = free_port()
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(tidemq_cmd(
                "operator", "--all-namespaces", "--leader-lease", lease, "--leader-lease-namespace", NS,
                "--leader-identity", name, "--lease-duration", str(LEASE_DURATION),
                "--renew-deadline", str(RENEW_DEADLINE), "--retry-period", str(RETRY),
                "--liveness", f"http://127.0.0.1:{self.port}/healthz", "--metrics-listen", "",
                "--timer-interval", "1", "--retry-delay", "1",
            ), stdout=out, stderr=subprocess.STDOUT,
                env=dict(os.environ, KUBECONFIG=str(self.kubeconfig), PYTHONUNBUFFERED="1"))

    def probe(self, path: str) -> int | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=1) as r:
                return r.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return None

    def wait_alive(self) -> None:
        wait_until_sync(lambda: self.proc.poll() is not None or self.probe("/healthz") == 200,
                        f"{self.name}'s /healthz", timeout=60, interval=0.2)
        assert self.proc.poll() is None, self.log.read_text()

    def leads(self) -> bool:
        return self.probe("/leaderz") == 200

    def writes(self) -> list:
        return [w for w in self.emulator.writes() if w.token == self.name]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def create_topic(emulator: Emulator, name: str) -> None:
    obj = {"apiVersion": crds.API_VERSION, "kind": "Topic", "metadata": {"name": name, "namespace": NS},
           "spec": {"clusterRef": {"name": "nowhere"}}}
    obj, problems = crds.admit(obj)
    assert problems == []
    kubernetes.client.CustomObjectsApi(emulator.client()).create_namespaced_custom_object(
        crds.GROUP, crds.VERSION, NS, "topics", obj)


def writers(emulator: Emulator, topic: str) -> set[str]:
    """The tokens that patched the Topic (kopf's finalizer and progress annotations, its status)."""
    return {w.token for w in emulator.writes() if w.plural == "topics" and w.name == topic and w.action == "UPDATE"}


def test_only_the_leader_reconciles_and_a_standby_takes_over_after_sigterm_and_sigkill(emulator, tmp_path):
    procs = {n: OperatorProc(tmp_path, emulator, n, "ha") for n in ("op-a", "op-b")}
    try:
        for p in procs.values():
            p.wait_alive()
        leader = wait_until_sync(lambda: [p for p in procs.values() if p.leads()], "a leader", timeout=30)
        assert len(leader) == 1
        first = leader[0]
        standby = next(p for p in procs.values() if p is not first)
        # every healthy replica is Ready (rollouts finish); /leaderz names the one that acts
        assert standby.probe("/leaderz") == 503 and standby.probe("/healthz") == 200
        wait_until_sync(lambda: standby.probe("/readyz") == 200, "the standby Ready", timeout=10, interval=0.2)
        assert first.probe("/readyz") == 200
        create_topic(emulator, "t1")
        wait_until_sync(lambda: writers(emulator, "t1"), "t1 reconciled", timeout=30)
        time.sleep(2 * RETRY)
        assert writers(emulator, "t1") == {first.name}
        # the standby wrote nothing but (attempts at) the Lease, and only once it was expired
        assert {w.plural for w in standby.writes()} <= {"leases"}
        assert not standby.leads()

        # SIGTERM: kopf stops, the Lease is released, the standby leads at its next retry
        first.proc.send_signal(signal.SIGTERM)
        assert first.proc.wait(30) == 0, first.log.read_text()
        exited = time.monotonic()
        wait_until_sync(standby.leads, f"{standby.name} leading", timeout=LEASE_DURATION + 10, interval=0.1)
        assert time.monotonic() - exited < LEASE_DURATION - RETRY, "the released Lease was not taken at once"
        assert "released Lease default/ha" in first.log.read_text()
        create_topic(emulator, "t2")
        assert wait_until_sync(lambda: writers(emulator, "t2"), "t2 reconciled", timeout=30) == {standby.name}

        # SIGKILL: nothing released; a third replica takes over once the lease expired
        third = procs["op-c"] = OperatorProc(tmp_path, emulator, "op-c", "ha")
        third.wait_alive()
        wait_until_sync(lambda: "stands by" in third.log.read_text(), "op-c standing by", timeout=30)
        assert not third.leads()
        standby.proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        wait_until_sync(third.leads, "op-c leading", timeout=LEASE_DURATION + 15, interval=0.1)
        took = time.monotonic() - killed
        assert LEASE_DURATION - 2 * RETRY <= took <= LEASE_DURATION + 8, took
        create_topic(emulator, "t3")
        assert wait_until_sync(lambda: writers(emulator, "t3"), "t3 reconciled", timeout=30) == {"op-c"}
        spec = read_lease(emulator, "ha")["spec"]
        assert spec["holderIdentity"] == "op-c" and spec["leaseTransitions"] >= 2
    finally:
        for p in procs.values():
            p.stop()


def test_a_leader_that_finds_another_holder_exits_at_once(emulator, tmp_path):
    op = OperatorProc(tmp_path, emulator, "op-d", "stolen")
    try:
        op.wait_alive()
        wait_until_sync(op.leads, "op-d leading", timeout=30)
        api = kubernetes.client.CoordinationV1Api(emulator.client())
        lease = emulator.client().sanitize_for_serialization(api.read_namespaced_lease("stolen", NS))
        api.patch_namespaced_lease("stolen", NS, {"metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]},
                                                  "spec": {"holderIdentity": "intruder"}},
                                   _content_type="application/merge-patch+json")
        t0 = time.monotonic()
        assert op.proc.wait(10) == 1
        assert time.monotonic() - t0 < RENEW_DEADLINE
        log = op.log.read_text()
        assert "op-d lost Lease default/stolen: intruder holds it" in log and "Traceback" not in log, log
    finally:
        op.stop()


def test_the_chart_grants_exactly_the_lease_calls_the_operators_made(emulator, request):
    """The operator processes above (tokens op-*) asked for leases: exactly what the chart's
    leader election Role grants (create; get and patch of its Lease by name)."""
    from tests.charts.test_chart_hooks import render_with_hooks  # noqa: PLC0415 (needs the Helm fixtures)
    from tests.support import rbac  # noqa: PLC0415

    used = {rbac.permission(method, path, query) for token, method, path, query in emulator.emu.seen
            if token.startswith("op-")}
    used = {p for p in used if p is not None and p[0] == "coordination.k8s.io"}
    if not used:
        pytest.skip("the operator processes of this module did not run")
    objs, _hooks = render_with_hooks(request.getfixturevalue("helm_python"), request.getfixturevalue("kubeconfig"),
                                     "leaserbac", {"cluster": {"enabled": False}})
    [role] = [o for o in objs if o["kind"] == "Role" and o["metadata"]["name"].endswith("-leader-election")]
    assert rbac.granted(role["rules"]) == used == {("coordination.k8s.io", "leases", v) for v in ("get", "create", "patch")}
