"""The operator's I/O for the scale-in of broker groups (issue 18, item 4): observe, then act.

Each pass of a managed Cluster lists its broker StatefulSets; those at or above spec.brokers.groups
retire (:mod:`tidemq.operator.scalein` plans each one's step). Per retiring group: find its master
(the group's pods; for a replicated group the replica that reports itself master with the highest
epoch), ask it through :class:`tidemq.client.admin.Admin` for its brokerPermission, topic table,
queue offsets, the consumer groups' committed offsets (a queue's offsets live on the queue's
broker) and the delivery progress of its delayed and timer messages, then carry the
step out: stop its writes (UPDATE_BROKER_CONFIG brokerPermission=4), or delete the StatefulSet,
ConfigMap, headless Service and budget (the pods stop; a broker unregisters from the name servers
when it stops) and, with spec.brokers.deleteClaim, the group's PVCs. A group the spec asks for
again gets its writes back.

Invariants:
- Only StatefulSets labelled as this Cluster's brokers and owned by it (its uid) retire, and only
  PVCs named ``data-<statefulset>-<ordinal>`` with the group's labels are deleted.
- Every broker call is bounded by ``timeout``; a master that cannot be asked makes its group wait
  (reported, never removed); a failed Kubernetes call is reported and retried next pass. Nothing
  here raises into the Cluster pass except a bug.
- Kubernetes calls run in a worker thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tidemq.client.admin import Admin
from tidemq.client.config import ClientConfig
from tidemq.errors import BrokerError, TideMQError
from tidemq.operator import adminpool, brokers, groupops, grouproll, rollout, scalein, workloads
from tidemq.operator.scalein import Action, GroupStep, Observation
from tidemq.remoting import ResponseCode
from tidemq.remoting.headers.admin import TRANSACTION_HALF_PROGRESS

log = logging.getLogger(__name__)

# (API class, list method, delete method) per kind the scale-in lists or deletes.
_KINDS = {
    "StatefulSet": ("AppsV1Api", "list_namespaced_stateful_set", "delete_namespaced_stateful_set"),
    "Pod": ("CoreV1Api", "list_namespaced_pod", None),
    "PersistentVolumeClaim": ("CoreV1Api", "list_namespaced_persistent_volume_claim",
                              "delete_namespaced_persistent_volume_claim"),
    "ConfigMap": ("CoreV1Api", None, "delete_namespaced_config_map"),
    "Service": ("CoreV1Api", None, "delete_namespaced_service"),
    "PodDisruptionBudget": ("PolicyV1Api", None, "delete_namespaced_pod_disruption_budget"),
}


@dataclass(slots=True)
class ScaleInReport:
    """One pass over the retiring groups of a Cluster."""

    steps: list[GroupStep] = field(default_factory=list)
    events: list[tuple[str, str]] = field(default_factory=list)  # (reason, message), Normal Events
    pending: list[dict[str, Any]] = field(default_factory=list)  # status rows kept for a retry

    @property
    def keep(self) -> tuple[str, ...]:
        """Budgets not to delete: a retiring group's pods still run."""
        return tuple(s.name for s in self.steps if s.action is not Action.REMOVE) + tuple(
            str(r["name"]) for r in self.pending if isinstance(r.get("name"), str))

    def status(self) -> list[dict[str, Any]] | None:
        """status.scaleIn (None: nothing retires, the field goes)."""
        rows = [s.status() for s in self.steps if s.action is not Action.REMOVE] + self.pending
        return rows or None

    def conditions(self, base: Sequence[tuple[str, bool, str, str]]) -> list[tuple[str, bool, str, str]]:
        return scalein.conditions(self.steps, base)


def _list(kind: str, namespace: str, selector: Mapping[str, str]) -> list[dict[str, Any]]:
    """Objects of ``kind`` carrying every label of ``selector``, as API JSON (worker thread)."""
    import kubernetes  # noqa: PLC0415 (optional dependency, only for managed clusters)

    api_name, method, _ = _KINDS[kind]
    assert method is not None
    api = getattr(kubernetes.client, api_name)(kubernetes.client.ApiClient())
    label_selector = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
    resp = getattr(api, method)(namespace, label_selector=label_selector, _preload_content=False)
    items = json.loads(resp.data).get("items") or []
    # The selector again, here: a server (or emulator) that ignores it must not mix groups.
    return [i for i in items if selector.items() <= ((i.get("metadata") or {}).get("labels") or {}).items()]


def _delete(objects: Sequence[tuple[str, str]], namespace: str) -> list[str]:
    """Delete each (kind, name); one already gone counts as deleted (worker thread)."""
    import kubernetes  # noqa: PLC0415

    client = kubernetes.client.ApiClient()
    done = []
    for kind, name in objects:
        api_name, _, method = _KINDS[kind]
        assert method is not None
        try:
            getattr(getattr(kubernetes.client, api_name)(client), method)(name, namespace)
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise
        done.append(f"{kind}/{name}")
    return done


def _owned(obj: Mapping[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in (obj.get("metadata") or {}).get("ownerReferences") or ())


async def _master(c: dict[str, Any], group: int, namespace: str, replicated: bool, admin: Admin,
                  timeout: float) -> str:
    """The address of a group's master: its pod 0 for a lone broker, for a replicated group the
    replica that reports itself master. TideMQError when there is none to ask."""
    spec, name = c["spec"], c["metadata"]["name"]
    tls = ((spec.get("tls") or {}).get("mode") or "disabled") != "disabled"
    items = await asyncio.to_thread(_list, "Pod", namespace, workloads.broker_selector(name, group))
    pods = sorted((p for p in map(groupops.parse_pod, items) if p is not None), key=lambda p: p.ordinal)
    addrs = {p.ordinal: (workloads.broker_pod_address(c, group, p.ordinal) if tls or not p.ip else
                         f"{p.ip}:{spec['brokers']['port']}") for p in pods}
    if not replicated:
        if 0 not in addrs:
            raise TideMQError("its pod does not exist")
        return addrs[0]
    problems = []
    roles: dict[int, tuple[str, int] | None] = {}
    for ordinal, addr in sorted(addrs.items()):
        try:
            view = grouproll.replica_view(await asyncio.wait_for(admin.get_broker_runtime_info(addr), timeout))
        except (TideMQError, TimeoutError, OSError, ValueError) as exc:
            problems.append(f"replica {ordinal}: {exc or 'timed out'}")
            view = None
        roles[ordinal] = None if view is None else (view.role, view.epoch)
    master = scalein.master_of(roles)
    if master is None:
        raise TideMQError("no replica reports itself master" + (f" ({'; '.join(problems)})" if problems else ""))
    return addrs[master]


async def _observe(admin: Admin, addr: str) -> Observation:
    """A retiring group's master: writable or not, and what it still holds unconsumed."""
    config = await admin.broker_config(addr)
    try:
        writable = bool(int(config.get("brokerPermission", str(scalein.READ_WRITE))) & scalein.WRITE)
    except ValueError:
        raise TideMQError(f"brokerPermission {config.get('brokerPermission')!r} is not a number") from None
    topics = {t: tc for t, tc in (await admin.broker_topic_configs(addr)).items() if scalein.drains(t, tc)}
    ranges: dict[str, dict[int, tuple[int, int]]] = {}
    for topic, tc in sorted(topics.items()):
        ids = scalein.queue_ids(tc)
        got = await asyncio.gather(*(admin.queue_offset_range(addr, topic, q) for q in ids))
        ranges[topic] = dict(zip(ids, got, strict=True))
    committed = await admin.broker_consumer_offsets(addr)  # after the offsets: never newer than them
    left = scalein.undrained(topics, ranges, committed)
    return Observation(writable, {**left, **await _undelivered(admin, addr), **await _unresolved(admin, addr)})


async def _undelivered(admin: Admin, addr: str) -> dict[str, tuple[int, ...]]:
    """The group's delayed and timer messages not delivered into their topic yet (progress read
    before the max offsets: never ahead of them)."""
    try:
        levels, timer = await admin.broker_delay_progress(addr)
    except BrokerError as exc:
        if exc.code != ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
            raise
        log.warning("broker %s does not report the progress of its delayed messages (older TideMQ): the "
                    "scale-in cannot wait for them", addr)
        return {}
    level_max = {lv: (await admin.queue_offset_range(addr, scalein.SCHEDULE_TOPIC, lv - 1))[1] for lv in levels}
    timer_max = (await admin.queue_offset_range(addr, scalein.TIMER_TOPIC, 0))[1] if timer is not None else 0
    return scalein.undelivered(levels, level_max, timer, timer_max)


async def _unresolved(admin: Admin, addr: str) -> dict[str, tuple[int, ...]]:
    """The group's transactional messages not committed or rolled back yet (the checker's
    progress read before the half queue's max offset: never ahead of it)."""
    progress = (await admin.get_broker_runtime_info(addr)).get(TRANSACTION_HALF_PROGRESS)
    if progress is None:
        log.warning("broker %s does not report its transaction check progress (older TideMQ): the scale-in "
                    "cannot wait for its open transactions", addr)
        return {}
    try:
        done = int(progress)
    except ValueError:
        raise TideMQError(f"{TRANSACTION_HALF_PROGRESS} {progress!r} is not a number") from None
    return scalein.unresolved(done, (await admin.queue_offset_range(addr, scalein.HALF_TOPIC, 0))[1])


async def _retire(c: dict[str, Any], group: int, namespace: str, replicated: bool, since: float | None,
                  known: bool, admin: Admin, timeout: float, grace: float, now: float, report: ScaleInReport) -> None:
    name = c["metadata"]["name"]
    sts = workloads.broker_name(name, group)
    claims = "deleted" if scalein.delete_claim(c["spec"]) else "kept"
    if not known:
        report.events.append(("ScaleIn", f"broker group {sts} retires (spec.brokers.groups is "
                              f"{c['spec']['brokers']['groups']}): its writes stop, and it is deleted once every "
                              f"consumer group has consumed what it holds (its PVCs are then {claims})"))
    seen: Observation | None = None
    problem = addr = ""
    try:
        addr = await _master(c, group, namespace, replicated, admin, timeout)
        seen = await asyncio.wait_for(_observe(admin, addr), timeout)
    except Exception as exc:  # noqa: BLE001 (broker or API failure: the group waits, retried next pass)
        problem = f"{exc.__class__.__name__}: {exc}" if str(exc) else "timed out"
    step = scalein.plan_group(sts, now, grace, since, seen, problem)
    try:
        if step.action is Action.STOP_WRITES:
            await asyncio.wait_for(admin.update_broker_config(addr, {"brokerPermission": str(scalein.READ_ONLY)}),
                                   timeout)
            log.info("cluster %s: stopped the writes of retiring broker group %s (%s)", name, sts, addr)
        elif step.action is Action.REMOVE:
            items = await asyncio.to_thread(_list, "PersistentVolumeClaim", namespace,
                                            workloads.broker_selector(name, group))
            pvcs = scalein.claim_names(sts, ((i.get("metadata") or {}).get("name", "") for i in items))
            objects = [("StatefulSet", sts), ("ConfigMap", workloads.broker_config_name(name, group)),
                       ("Service", workloads.broker_headless_name(name, group)), ("PodDisruptionBudget", sts)]
            if claims == "deleted":
                objects += [("PersistentVolumeClaim", p) for p in pvcs]
            done = await asyncio.to_thread(_delete, objects, namespace)
            log.info("cluster %s: removed drained broker group %s: %s", name, sts, ", ".join(done))
            report.events.append(("ScaleIn", f"broker group {sts} drained and removed; PVCs {claims}"
                                  + (f": {', '.join(pvcs)}" if pvcs else "")))
    except Exception as exc:  # noqa: BLE001 (broker or API refusal: reported, retried next pass)
        log.warning("cluster %s: %s of broker group %s failed: %s", name, step.action.value, sts, exc)
        step = GroupStep(sts, step.action if step.action is not Action.REMOVE else Action.WAIT_QUIET,
                         since, f"{step.message}; {step.action.value} failed: {exc or 'timed out'} (retried next pass)")
    report.steps.append(step)


async def _restore(c: dict[str, Any], sts: str, namespace: str, replicated: bool, admin: Admin, timeout: float,
                   rows: object, report: ScaleInReport) -> None:
    name = c["metadata"]["name"]
    group = scalein.group_ordinal(name, sts)
    assert group is not None
    perm = scalein.restored_permission(c["spec"])
    try:
        addr = await _master(c, group, namespace, replicated, admin, timeout)
        await asyncio.wait_for(admin.update_broker_config(addr, {"brokerPermission": perm}), timeout)
    except Exception as exc:  # noqa: BLE001 (broker or API failure: retried next pass)
        log.warning("cluster %s: cannot give broker group %s its writes back yet: %s", name, sts, exc)
        if isinstance(rows, list):  # the row stays, so the next pass tries again
            report.pending += [dict(r) for r in rows if isinstance(r, Mapping) and r.get("name") == sts]
        return
    log.info("cluster %s: broker group %s stays, its writes are back (brokerPermission %s)", name, sts, perm)
    report.events.append(("ScaleInCancelled", f"broker group {sts} stays (spec.brokers.groups is "
                          f"{c['spec']['brokers']['groups']} again): its writes are back (brokerPermission {perm})"))


async def scale_in(cluster: dict[str, Any], namespace: str, client_config: ClientConfig, timeout: float,
                   grace: float, pool: adminpool.AdminPool | None = None,
                   clock: Callable[[], float] = time.time) -> ScaleInReport:
    """One scale-in pass over a managed Cluster (its body as a mapping, status included), through
    the Cluster's pooled admin connection (``pool``; None: one of its own); ``clock`` gives the
    epoch seconds the drain grace is measured in."""
    report = ScaleInReport()
    c = workloads.cluster_with_defaults(cluster)
    spec = c["spec"]
    if spec.get("external"):
        return report
    name, uid = c["metadata"]["name"], (c["metadata"].get("uid") or "")
    groups = int(spec["brokers"]["groups"])
    rows = (cluster.get("status") or {}).get("scaleIn")
    try:
        found = await asyncio.to_thread(_list, "StatefulSet", namespace, _brokers(name))
    except Exception as exc:  # noqa: BLE001 (API failure: keep what status says, retry next pass)
        log.warning("cluster %s: cannot list its broker StatefulSets: %s", name, exc)
        report.pending = list(rows) if isinstance(rows, list) else []
        return report
    live = {i["metadata"]["name"]: i for i in found if _owned(i, uid)}
    retiring = scalein.retiring_groups(name, groups, live)
    restore = scalein.cancelled(name, groups, rows)
    if not retiring and not restore:
        return report
    known = {r.get("name") for r in rows if isinstance(r, Mapping)} if isinstance(rows, list) else set()
    since = scalein.since_of(rows)
    async with adminpool.borrow(pool, brokers.name_servers_of(cluster), client_config) as view:
        admin = view.admin
        for sts in restore:
            replicated = rollout.is_replicated(live.get(sts) or {})
            await _restore(c, sts, namespace, replicated, admin, timeout, rows, report)
        for g in retiring:
            sts = workloads.broker_name(name, g)
            await _retire(c, g, namespace, rollout.is_replicated(live[sts]), since.get(sts), sts in known,
                          admin, timeout, grace, clock(), report)
    return report


def _brokers(cluster_name: str) -> dict[str, str]:
    """The labels every broker StatefulSet of a Cluster carries."""
    sel = workloads.broker_selector(cluster_name, 0)
    sel.pop(workloads.BROKER_GROUP_LABEL)
    return sel
