"""The operator's I/O for replicated broker groups (issue 17): observe, then carry out one step.

Per replicated group of a managed Cluster, each pass: read the group's pods from the API (a worker
thread), ask every replica for its runtime info through :class:`tidemq.client.admin.Admin`, compute
health and the next roll step with the pure :mod:`tidemq.operator.grouproll`, and do that step:
patch the StatefulSet's partition, or ask the master for a SWITCHOVER. What a group reports goes
into status.groups; a Blocked step becomes a Warning Event once per distinct message. Before a
replicated group's StatefulSet is shrunk, :func:`scale_down_holds` keeps it back until its master
is on a replica that stays and the kept replicas hold minInSync.

Invariants:
- One step per group per pass, and none for a group whose StatefulSet was applied in this pass or
  still waits its turn (the live object read before the apply is stale for it).
- A replica is asked at its pod IP (what the API server says now, no DNS record of a pod that
  just moved), or at its stable DNS name when the Cluster's remoting uses TLS (certificates name
  the pod DNS names). Every broker call is bounded by ``timeout``; one replica that does not
  answer makes its view None and its reason part of the group's message, never the pass fail.
- Kubernetes calls run in a worker thread; nothing here blocks the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tidemq.client.admin import Admin
from tidemq.errors import TideMQError
from tidemq.operator import grouproll, replication, rollout, workloads
from tidemq.operator.grouproll import Action, GroupHealth, PodView, RollStep

log = logging.getLogger(__name__)

REVISION_LABEL = "controller-revision-hash"


@dataclass(frozen=True, slots=True)
class Pod:
    """What the operator needs of one pod of a group."""

    ordinal: int
    ready: bool
    revision: str
    ip: str


@dataclass(slots=True)
class GroupReport:
    """One pass over one replicated group."""

    name: str
    health: GroupHealth
    step: RollStep
    done: str = ""              # what the pass did ("partition 1", "switchover 0 -> 2"), or ""
    error: str = ""             # why the step failed (retried next pass)

    def status(self) -> dict[str, Any]:
        out = self.health.status()
        notes = [n for n in (self.health.message, self.error or
                             (self.step.message if self.step.action is not Action.IDLE else "")) if n]
        if notes:
            out["message"] = "; ".join(notes)
        else:
            out.pop("message", None)
        return out


@dataclass(slots=True)
class ClusterReplication:
    groups: list[GroupReport] = field(default_factory=list)

    @property
    def masters(self) -> dict[str, int | None]:
        return {g.name: g.health.master for g in self.groups}

    @property
    def blocked(self) -> list[GroupReport]:
        return [g for g in self.groups if g.step.action is Action.BLOCKED]

    def status(self) -> tuple[list[dict[str, Any]], str]:
        return [g.status() for g in self.groups], grouproll.summary([g.health for g in self.groups])

    def condition(self) -> tuple[str, bool, str, str]:
        """ReplicasInSync: True when every replicated group has every replica in sync; else the
        worst group's health as the reason."""
        behind = [g for g in self.groups if not g.health.healthy]
        if not behind:
            return ("ReplicasInSync", True, "InSync", self.status()[1])
        worst = min(behind, key=lambda g: grouproll.SEVERITY.index(g.health.health)).health.health.value
        return ("ReplicasInSync", False, worst, "; ".join(
            f"{g.name}: {g.health.health.value}" + (f" ({g.health.message})" if g.health.message else "")
            for g in behind))


def parse_pod(obj: Mapping[str, Any]) -> Pod | None:
    """A Pod from the API's JSON (None when it has no ordinal, e.g. not a StatefulSet pod)."""
    md = obj.get("metadata") or {}
    labels = md.get("labels") or {}
    index = labels.get(replication.POD_INDEX_LABEL) or str(md.get("name", "")).rpartition("-")[2]
    if not index.isdigit():
        return None
    status = obj.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    if md.get("deletionTimestamp"):
        ready = False  # terminating: it is going away
    return Pod(int(index), ready, labels.get(REVISION_LABEL, ""), status.get("podIP") or "")


def pod_views(pods: Sequence[Pod], update_revision: str | None) -> dict[int, PodView]:
    return {p.ordinal: PodView(p.ordinal, p.ready, bool(update_revision) and p.revision == update_revision)
            for p in pods}


def _read_pods(namespace: str, selector: Mapping[str, str]) -> list[Pod]:
    """The group's pods (runs in a worker thread)."""
    import json  # noqa: PLC0415

    import kubernetes  # noqa: PLC0415 (optional dependency, only for managed clusters)

    core = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient())
    label_selector = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
    resp = core.list_namespaced_pod(namespace, label_selector=label_selector, _preload_content=False)
    items = json.loads(resp.data).get("items") or []  # type: ignore[attr-defined]
    # The selector again, here: a server (or emulator) that ignores it must not mix groups.
    mine = [i for i in items if selector.items() <= ((i.get("metadata") or {}).get("labels") or {}).items()]
    return [p for p in (parse_pod(i) for i in mine) if p is not None]


def _patch_partition(name: str, namespace: str, partition: int) -> None:
    """Set the StatefulSet's RollingUpdate partition (runs in a worker thread)."""
    import kubernetes  # noqa: PLC0415

    apps = kubernetes.client.AppsV1Api(kubernetes.client.ApiClient())
    apps.patch_namespaced_stateful_set(name, namespace, {"spec": {"updateStrategy": {
        "type": "RollingUpdate", "rollingUpdate": {"partition": partition}}}})


def live_partition(sts: Mapping[str, Any]) -> int:
    spec = sts.get("spec") or {}
    strategy = (spec.get("updateStrategy") or {}).get("rollingUpdate") or {}
    return int(strategy.get("partition") or 0)


async def _views(admin: Admin, addrs: Mapping[int, str], timeout: float
                 ) -> tuple[dict[int, grouproll.ReplicaView | None], dict[int, str]]:
    async def one(addr: str) -> dict[str, str]:
        return await asyncio.wait_for(admin.get_broker_runtime_info(addr), timeout)

    ordinals = sorted(addrs)
    answers = await asyncio.gather(*(one(addrs[o]) for o in ordinals), return_exceptions=True)
    views: dict[int, grouproll.ReplicaView | None] = {}
    problems: dict[int, str] = {}
    for o, ans in zip(ordinals, answers, strict=True):
        if isinstance(ans, BaseException):
            if not isinstance(ans, (TideMQError, TimeoutError, OSError)):
                raise ans
            views[o], problems[o] = None, f"{ans.__class__.__name__}: {ans}" if str(ans) else "timed out"
            continue
        try:
            views[o] = grouproll.replica_view(ans)
        except ValueError as exc:
            views[o], problems[o] = None, f"runtime info not understood: {exc}"
            continue
        if views[o] is None:
            problems[o] = "answers as a broker without --coordination (not restarted as a replica yet)"
    return views, problems


def replicated(cluster: dict[str, Any]) -> bool:
    """Whether a Cluster runs replicated broker groups (managed, spec.brokers.replicas > 1)."""
    spec = workloads.cluster_with_defaults(cluster)["spec"]
    return not spec.get("external") and replication.replication_spec(spec["brokers"]).replicated


async def _observe(c: dict[str, Any], group: int, namespace: str, replicas: int, admin: Admin, timeout: float
                   ) -> tuple[list[Pod], dict[int, str], GroupHealth]:
    """A group's pods, the address each replica is asked at, and the group's health."""
    spec = c["spec"]
    name = c["metadata"]["name"]
    tls = ((spec.get("tls") or {}).get("mode") or "disabled") != "disabled"
    pods = await asyncio.to_thread(_read_pods, namespace, workloads.broker_selector(name, group))
    addrs = {p.ordinal: (workloads.broker_pod_address(c, group, p.ordinal) if tls or not p.ip else
                         f"{p.ip}:{spec['brokers']['port']}") for p in pods}
    views, problems = await _views(admin, addrs, timeout)
    return pods, addrs, grouproll.group_health(workloads.broker_name(name, group), replicas, views, problems)


async def _switchover(admin: Admin, addrs: Mapping[int, str], group: str, step: RollStep, timeout: float) -> str:
    assert step.switch_from is not None
    got = await asyncio.wait_for(admin.switchover(addrs[step.switch_from], group, step.to), timeout)
    return f"switchover {step.switch_from} -> {got}: {step.message}"


async def scale_down_holds(cluster: dict[str, Any], namespace: str, to_apply: Sequence[Mapping[str, Any]],
                           live: Mapping[str, Mapping[str, Any] | None], admin: Admin, timeout: float
                           ) -> dict[str, GroupReport]:
    """Replicated groups among the StatefulSets about to be applied that would shrink now but may
    not yet (tidemq.operator.grouproll.plan_scale_down): name -> report. A master that would go
    away is asked to hand over here; the shrink is applied on a later pass."""
    c = workloads.cluster_with_defaults(cluster)
    name = c["metadata"]["name"]
    index = {workloads.broker_name(name, g): g for g in range(c["spec"]["brokers"]["groups"])}
    holds: dict[str, GroupReport] = {}
    for obj in to_apply:
        sts_name = obj["metadata"]["name"]
        now = live.get(sts_name)
        if obj.get("kind") != "StatefulSet" or sts_name not in index or now is None or not rollout.is_replicated(now):
            continue
        old, new = int((now.get("spec") or {}).get("replicas") or 1), int(obj["spec"]["replicas"])
        if new >= old:
            continue
        pods, addrs, health = await _observe(c, index[sts_name], namespace, old, admin, timeout)
        step = grouproll.plan_scale_down(new, pod_views(pods, (now.get("status") or {}).get("updateRevision")), health)
        if step.action is Action.IDLE:
            continue
        report = holds[sts_name] = GroupReport(sts_name, health, step)
        if step.action is Action.SWITCHOVER:
            try:
                report.done = await _switchover(admin, addrs, sts_name, step, timeout)
            except (TideMQError, TimeoutError, OSError) as exc:
                report.error = f"switchover failed: {exc or 'timed out'} (retried next pass)"
    return holds


async def reconcile(cluster: dict[str, Any], namespace: str, live: Mapping[str, Mapping[str, Any] | None],
                    untouchable: set[str], admin: Admin, timeout: float, allow_below_min: bool) -> ClusterReplication:
    """Observe every replicated group of a managed Cluster and take at most one roll step each.

    ``live``: the StatefulSets as read before this pass's apply; ``untouchable``: the names of
    those applied in this pass, waiting their turn or blocked (no step for them)."""
    out = ClusterReplication()
    if not replicated(cluster):
        return out
    c = workloads.cluster_with_defaults(cluster)
    spec = c["spec"]
    name = c["metadata"]["name"]
    for g in range(spec["brokers"]["groups"]):
        sts_name = workloads.broker_name(name, g)
        sts = live.get(sts_name)
        replicas = int(((sts or {}).get("spec") or {}).get("replicas") or spec["brokers"]["replicas"])
        pods, addrs, health = await _observe(c, g, namespace, replicas, admin, timeout)
        if sts is None or sts_name in untouchable:
            out.groups.append(GroupReport(sts_name, health, RollStep(Action.WAIT, "Applying", "")))
            continue
        update_revision = (sts.get("status") or {}).get("updateRevision")
        step = grouproll.plan_roll(replicas, live_partition(sts), pod_views(pods, update_revision), health,
                                   allow_below_min)
        report = GroupReport(sts_name, health, step)
        out.groups.append(report)
        try:
            if step.action is Action.PARTITION and step.partition is not None:
                await asyncio.to_thread(_patch_partition, sts_name, namespace, step.partition)
                report.done = f"partition {step.partition}: {step.message}"
            elif step.action is Action.SWITCHOVER:
                report.done = await _switchover(admin, addrs, sts_name, step, timeout)
        except (TideMQError, TimeoutError, OSError) as exc:
            report.error = f"{step.action.value} failed: {exc or 'timed out'} (retried next pass)"
            log.warning("group %s: %s", sts_name, report.error)
        if report.done:
            log.info("group %s: %s", sts_name, report.done)
    return out
