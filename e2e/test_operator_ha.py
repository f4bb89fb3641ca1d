"""Two operator replicas on kind (issue 18, item 1): one leads on the Lease, the other stands by
(Ready too: every replica that could act is Ready, so rollouts finish); deleting the leader pod hands the Lease over and the other reconciles a new Topic;
a forced delete (no release, like a crash) hands it over once the lease expired.

The chart's Deployment is scaled to 2 with kubectl, then `kubectl rollout status` must finish (it
never did while standbys were not Ready), and back to 1 at the end, so the other scenarios keep
one operator.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from e2e import resources
from e2e.install import Deployed
from e2e.k8s import Kube, pod_ready
from e2e.proc import NotYet, wait_for
from e2e.scenario import apply_topic

pytestmark = pytest.mark.e2e

LEASE_DURATION = 15.0  # the chart's operator.leaderElection.leaseDuration
TAKEOVER_TIMEOUT = 120.0  # a replacement pod may need scheduling and an image already on the node


def _selector(tidemq: Deployed) -> str:
    return f"app.kubernetes.io/instance={tidemq.release},app.kubernetes.io/component=operator"


def _deployment(kube: Kube, tidemq: Deployed) -> dict[str, Any]:
    [deployment] = kube.items("deployment", _selector(tidemq))
    return deployment


def _running(kube: Kube, tidemq: Deployed) -> list[dict[str, Any]]:
    return [p for p in kube.items("pod", _selector(tidemq))
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]


def _holder(kube: Kube, lease: str) -> str:
    obj = kube.get_or_none("lease", lease)
    return ((obj or {}).get("spec") or {}).get("holderIdentity") or ""


def _held_by(kube: Kube, lease: str, pod: str) -> bool:
    holder = _holder(kube, lease)
    if holder != pod:
        raise NotYet(f"Lease {lease} held by {holder!r}")
    return True


def _one_ready(kube: Kube, tidemq: Deployed) -> bool:
    pods = _running(kube, tidemq)
    if len(pods) != 1 or not pod_ready(pods[0]):
        raise NotYet(f"operator pods running: {[p['metadata']['name'] for p in pods]}")
    return True


def _one_leader(kube: Kube, tidemq: Deployed, lease: str, not_this: str | None = None) -> tuple[str, str]:
    """(leader pod, standby pod) once two pods run, both Ready, and one of them holds the Lease."""
    pods = _running(kube, tidemq)
    if len(pods) != 2:
        raise NotYet(f"{len(pods)} operator pods running")
    names = [p["metadata"]["name"] for p in pods]
    ready = [p["metadata"]["name"] for p in pods if pod_ready(p)]
    if len(ready) != 2:
        raise NotYet(f"ready operator pods: {ready}")
    leader = _holder(kube, lease)
    if leader not in names:
        raise NotYet(f"Lease {lease} held by {leader!r}, not by a running pod ({names})")
    if leader == not_this:
        raise NotYet(f"{leader} still leads")
    standby = next(n for n in names if n != leader)
    return leader, standby


def test_a_standby_operator_takes_over_and_reconciles_a_new_topic(kube: Kube, tidemq: Deployed,
                                                                  run_id: str) -> None:
    deployment = _deployment(kube, tidemq)
    name = deployment["metadata"]["name"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    lease = next(a.split("=", 1)[1] for a in args if a.startswith("--leader-lease="))
    kube.kubectl("scale", "deployment", name, "--replicas=2")
    try:
        kube.kubectl("rollout", "status", f"deployment/{name}", f"--timeout={int(TAKEOVER_TIMEOUT)}s")
        leader, standby = wait_for(lambda: _one_leader(kube, tidemq, lease), TAKEOVER_TIMEOUT,
                                   "two operator pods, one leading")
        # graceful delete: kopf stops, the Lease is released, the standby leads at its next retry
        kube.delete("pod", leader)
        t0 = time.monotonic()
        wait_for(lambda: _held_by(kube, lease, standby), TAKEOVER_TIMEOUT, f"{standby} to take the Lease",
                 interval=1.0)
        # released: well within the lease duration (the pod's grace period and kopf's stop aside)
        assert time.monotonic() - t0 < TAKEOVER_TIMEOUT
        topic = f"e2e-ha-{run_id}"
        apply_topic(kube, tidemq, topic, queues=4)  # reconciled by the new leader

        # forced delete (no SIGTERM handling, no release): the next leader waits for the expiry
        new_leader, next_standby = wait_for(lambda: _one_leader(kube, tidemq, lease, not_this=leader),
                                            TAKEOVER_TIMEOUT, "the replacement pod standing by")
        assert new_leader == standby
        kube.kubectl("delete", "pod", new_leader, "--grace-period=0", "--force", "--wait=false")
        t0 = time.monotonic()
        wait_for(lambda: _held_by(kube, lease, next_standby), TAKEOVER_TIMEOUT,
                 f"{next_standby} to take the expired Lease", interval=1.0)
        assert time.monotonic() - t0 >= LEASE_DURATION / 2  # not released: it had to expire
        second = f"e2e-ha2-{run_id}"
        apply_topic(kube, tidemq, second, queues=2)
        for t in (topic, second):
            kube.delete(resources.TOPICS, t)
    finally:
        kube.kubectl("scale", "deployment", name, "--replicas=1")
        wait_for(lambda: _one_ready(kube, tidemq), TAKEOVER_TIMEOUT + LEASE_DURATION, "one Ready operator pod")
