"""kopf handlers for the tidemq.io Cluster, Topic and ConsumerGroup resources.

Run with ``tidemq operator`` (which builds a registry with :func:`register` and its own
:class:`OperatorConfig`) or ``kopf run -m tidemq.operator`` (default config: the package imports
this module, which registers the handlers into kopf's default registry on import).

Invariants:
- Handlers are idempotent: each pass recomputes the desired state from the spec and what the
  brokers report; create, update, resume and a timer all run the same pass.
- Passes of one object never overlap (create/update/resume handlers, the timer, a Topic's
  deletion), and each acts on the object as a GET from the API returns it under that lock, never
  on the body a timer took before an update (:mod:`tidemq.operator.serial`).
- Broker and name-server calls go through one pooled Admin per Cluster; a Topic pass reads the
  masters and topic tables from copies shared by every Topic and refreshed at most once per
  ``timer_interval`` (:mod:`tidemq.operator.adminpool`). A pass writes only the status fields
  that changed, so a timer round over unchanged objects writes nothing.
- Broker calls are async (tidemq.client.Admin) and bounded by ``admin_timeout``; Kubernetes API
  calls of the Cluster handler run in a worker thread. Nothing blocks the event loop.
- Status is written only through kopf's ``patch`` (never a separate PATCH of the object).
- Status tells the truth: Ready=False always carries a reason (InvalidSpec, ClusterNotFound,
  BrokerUnavailable, Draining, Unreachable ...); there is no separate Error condition (one written
  by an older operator is dropped). Every condition carries the metadata.generation it was set for.
- Invalid specs raise kopf.PermanentError after a Ready=False (InvalidSpec) condition and a Warning
  Event; an unreachable or unknown cluster raises kopf.TemporaryError(delay).
- An external Cluster is Ready only while its name servers answer and know a broker.
- Topic deletion holds kopf's finalizer until the topic is gone from brokers and name servers,
  but at most ``delete_retries`` retries when the cluster is gone: then it is released with a
  Warning Event, so a Topic never hangs in Terminating forever.
- Managed Cluster: each pass reads the live StatefulSets (worker thread) and applies only what
  :func:`tidemq.operator.rollout.plan` says: name servers first, then broker group 0, 1, ...,
  each after the previous StatefulSet is ready and updated; the timer (``timer_interval``) moves
  the rollout and the status (ready counts, Ready/Progressing/Degraded) along as pods get ready.
  status.rollout keeps what the next pass needs (StatefulSets seen ready, blocked changes).
  Objects are written with server-side apply (:mod:`tidemq.operator.apply`); each pass also
  re-applies what is in step with the spec and puts back replicas changed by hand (drift repair).
  Immutable StatefulSet changes are not applied, the rest of the change is: a Warning Event and
  Ready=False (ImmutableFieldChange) say so.
- Name-server write protection (:mod:`tidemq.operator.clusterkey`): with a master key file, each
  managed Cluster pass creates the Cluster's key Secret once (never patched) before the
  workloads that use it; the name servers require signatures once every broker signs
  (status.nameServerWriteProtection: Pending, then Enforced). Topic deletion signs its
  name-server request with that key. The operator never reads a Secret.
- Replicated broker groups (spec.brokers.replicas > 1): each pass also observes them and takes
  at most one roll step per group (:mod:`tidemq.operator.groupops`): status.groups,
  status.replication, the ReplicasInSync condition, RollBlocked / ReplicaRoll Events; a group
  that shrinks is held back until its master has moved onto a replica that stays.
- HA: ``tidemq operator`` runs kopf (and so these handlers) only on the replica that holds the
  leader election's Lease (:mod:`tidemq.operator.leader`); the others stand by.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import kopf

from tidemq.client.config import ClientConfig
from tidemq.errors import ConfigError, TideMQError
from tidemq.operator import apply, brokers, brokerstatus, budgets, clusterkey, groupops, grouproll, rollout, workloads
from tidemq.operator import scaleinops
from tidemq.operator import adminpool, serial
from tidemq.operator.grouproll import FORCE_ANNOTATION
from tidemq.operator.groups import group_spec, status_changes
from tidemq.operator.metrics import METRICS, OperatorMetrics
from tidemq.operator.topics import ROUTE_GRACE, InvalidSpec, QuietPeriod, readiness, since_from_status, topic_spec

log = logging.getLogger(__name__)

GROUP = "tidemq.io"
VERSION = "v1alpha1"
FINALIZER = "tidemq.io/finalizer"
# The id of the index of Clusters: kopf passes it to every handler as a keyword argument of that
# name. Handlers read it from their **kwargs, since kopf's handler protocols (ChangingFn, TimerFn)
# do not name it and a parameter of its own would not type-check against them.
CLUSTER_INDEX = "cluster_index"


@dataclass(frozen=True, slots=True)
class OperatorConfig:
    timer_interval: float = 30.0   # seconds between periodic reconciles of every resource
    drain_grace: float = ROUTE_GRACE  # Topic shrink: seconds from steering writes away to lowering reads
    admin_timeout: float = 30.0    # bound of one pass of broker calls
    retry_delay: float = 10.0      # TemporaryError delay when the cluster is not ready
    delete_retries: int = 5        # Topic deletion retries while the cluster is gone
    apply_workloads: bool = True   # Cluster: create/patch StatefulSets, Services ...
    client_config: ClientConfig = ClientConfig()  # ACL credentials (an admin account) for brokers
    # Name-server write protection (tidemq.operator.clusterkey): the master key's file; None turns
    # it off (managed name servers then accept route changes from anyone, as RocketMQ's).
    cluster_key_file: str | None = None
    # Created (in `namespace`, the operator's own) with a new master key when the file is missing.
    cluster_key_secret: str | None = None
    namespace: str | None = None


_MASTER: dict[str, bytes] = {}


def master_key(config: OperatorConfig) -> bytes | None:
    """The master key (read once it is there), None while it is not mounted yet."""
    path = config.cluster_key_file
    if not path:
        return None
    if path not in _MASTER:
        key = clusterkey.read_master_key(path)
        if key is None:
            return None
        _MASTER[path] = key
    return _MASTER[path]


def namesrv_credentials(config: OperatorConfig, cluster: Mapping) -> tuple[str, str] | None:
    """The account a managed Cluster's name servers take writes from (None: external, or off)."""
    spec = cluster.get("spec") or {}
    key = master_key(config)
    if key is None or spec.get("external"):
        return None
    md = cluster.get("metadata") or {}
    return clusterkey.derive_credentials(key, md.get("namespace") or "default", md.get("name") or "")


# conditions ------------------------------------------------------------------------------------
def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# Conditions this operator once wrote and no longer does: dropped from any status it rewrites.
_RETIRED_CONDITIONS = frozenset({"Error"})  # Ready=False with a reason says the same


def set_condition(conditions: list[dict] | None, ctype: str, status: bool, reason: str,
                  message: str = "", now: str | None = None, generation: int | None = None) -> list[dict]:
    """A new conditions list with ``ctype`` set; lastTransitionTime moves only on a change.
    ``generation`` is the metadata.generation the condition describes (observedGeneration)."""
    value = "True" if status else "False"
    out = [dict(c) for c in conditions or []
           if c.get("type") != ctype and c.get("type") not in _RETIRED_CONDITIONS]
    old = next((c for c in conditions or [] if c.get("type") == ctype), None)
    since = now or _now()
    if old is not None and old.get("status") == value:
        since = old.get("lastTransitionTime", since)
    cond: dict[str, Any] = {"type": ctype, "status": value, "reason": reason, "message": message,
            "lastTransitionTime": since}
    if generation is not None:
        cond["observedGeneration"] = generation
    out.append(cond)
    return sorted(out, key=lambda c: c["type"])


def _conditions(patch: kopf.Patch, body: kopf.Body, *items: tuple[str, bool, str, str]) -> None:
    """Set ``items`` on the body's conditions, each stamped with the body's generation (the
    generation of every condition is rewritten: the pass judged them all for this spec)."""
    gen = body.metadata.get("generation")
    conds = list(body.status.get("conditions") or [])
    now = _now()
    for ctype, ok, reason, message in items:
        conds = set_condition(conds, ctype, ok, reason, message, now, gen)
    if gen is not None:
        conds = [{**c, "observedGeneration": gen} for c in conds]
    patch.status["conditions"] = conds


def _invalid(kind: str, body: kopf.Body, patch: kopf.Patch, exc: Exception,
             metrics: OperatorMetrics) -> kopf.PermanentError:
    message = str(exc)
    _conditions(patch, body, ("Ready", False, "InvalidSpec", message))
    kopf.warn(body, reason="InvalidSpec", message=message)
    metrics.result(kind, "invalid", "InvalidSpec")
    return kopf.PermanentError(f"invalid {kind} spec: {message}")


def _cluster(index: kopf.Index, namespace: str | None, name: str) -> Mapping | None:
    for found in index.get((namespace, name), []):
        return found
    return None


def _write_changes(patch: kopf.Patch, body: kopf.Body) -> None:
    """Keep in ``patch`` only the status fields that differ from the body's (issue 18, item 12):
    a pass that finds what is stored writes nothing (kopf sends no PATCH for an empty patch)."""
    new = patch.pop("status", None) or {}
    changed = {k: v for k, v in new.items() if body.status.get(k) != v}
    if changed:
        patch["status"] = changed


# passes ---------------------------------------------------------------------------------------
async def topic_pass(config: OperatorConfig, metrics: OperatorMetrics, body: kopf.Body,
                     patch: kopf.Patch, clusters: kopf.Index, timer: bool = False,
                     pool: adminpool.AdminPool | None = None) -> None:
    meta, spec, status = body.metadata, body.spec, body.status
    kind = "Topic"
    with metrics.timed(kind):
        try:
            tspec = topic_spec(meta.name or "", spec)
            used = status.get("topicName")
            if used and used != tspec.topic_name:
                raise InvalidSpec(f"spec.topicName cannot change (was {used!r}, now "
                                  f"{tspec.topic_name!r}); create a new Topic instead")
        except InvalidSpec as exc:
            if timer:
                return
            raise _invalid(kind, body, patch, exc, metrics) from None
        cluster = _cluster(clusters, meta.namespace, tspec.cluster)
        if cluster is None:
            return _not_ready(kind, patch, body, config, metrics, "ClusterNotFound",
                              f"Cluster {tspec.cluster!r} not found in namespace {meta.namespace}")
        try:
            servers = brokers.name_servers_of(cluster)
        except InvalidSpec as exc:
            return _not_ready(kind, patch, body, config, metrics, "ClusterInvalid", str(exc))
        if not servers:
            return _not_ready(kind, patch, body, config, metrics, "ClusterNotReady",
                              f"Cluster {tspec.cluster!r} has no name-server address yet")
        try:
            async with adminpool.borrow(pool, servers, config.client_config) as view:
                quiet = QuietPeriod(time.time(), config.drain_grace, since_from_status(body.status.get("brokers")))
                # what the brokers hold, read at most once per timer interval for all Topics
                report = await asyncio.wait_for(
                    brokers.reconcile_topic(view, tspec, quiet, config.timer_interval), config.admin_timeout)
        except (TideMQError, TimeoutError) as exc:
            return _not_ready(kind, patch, body, config, metrics, "BrokerUnavailable",
                              f"cluster {tspec.cluster!r}: {exc or 'timed out'}")
        patch.status["topicName"] = tspec.topic_name
        patch.status["observedGeneration"] = meta.get("generation")
        patch.status["brokers"] = report.brokers
        patch.status["readQueueNums"] = min((b["readQueueNums"] for b in report.brokers), default=0)
        patch.status["writeQueueNums"] = min((b["writeQueueNums"] for b in report.brokers), default=0)
        ready, reason, message = readiness(report.steps)
        if draining := report.draining:
            msg = "; ".join(f"{b}: queues {list(q)} still hold unconsumed messages" if q else
                            f"{b}: writes moved off the queues that go away"
                            for b, q in sorted(draining.items()))
            _conditions(patch, body, ("Ready", False, "Draining", msg), ("Draining", True, "Draining", msg))
            metrics.result(kind, "draining")
        else:
            _conditions(patch, body, ("Ready", ready, reason, message), ("Draining", False, "None", ""))
            metrics.result(kind, "ok" if ready else "retry", None if ready else reason)
        _write_changes(patch, body)
        metrics.track(kind, meta.uid or meta.name or "")


def _not_ready(kind: str, patch: kopf.Patch, body: kopf.Body, config: OperatorConfig,
               metrics: OperatorMetrics, reason: str, message: str) -> None:
    _conditions(patch, body, ("Ready", False, reason, message))
    _write_changes(patch, body)
    metrics.result(kind, "retry", reason)
    raise kopf.TemporaryError(message, delay=config.retry_delay)


async def topic_delete(config: OperatorConfig, metrics: OperatorMetrics, body: kopf.Body,
                       clusters: kopf.Index, retry: int, pool: adminpool.AdminPool | None = None) -> None:
    meta, spec, status = body.metadata, body.spec, body.status
    metrics.track("Topic", meta.uid or meta.name or "", present=False)
    try:
        tspec = topic_spec(meta.name or "", spec)
    except InvalidSpec:
        if not status.get("topicName"):
            return  # never created anything
        cluster_name = (spec.get("clusterRef") or {}).get("name", "")
        topic = status["topicName"]
    else:
        cluster_name, topic = tspec.cluster, status.get("topicName") or tspec.topic_name
    cluster = _cluster(clusters, meta.namespace, cluster_name)
    problem = None
    servers: list[str] = []
    if cluster is None:
        problem = f"Cluster {cluster_name!r} not found"
    else:
        try:
            servers = brokers.name_servers_of(cluster)
        except InvalidSpec as exc:
            problem = str(exc)
    if servers:
        try:
            async with adminpool.borrow(pool, servers, config.client_config,
                                        namesrv_credentials(config, cluster or {})) as view:
                done = await asyncio.wait_for(brokers.delete_topic(view.admin, topic),
                                              config.admin_timeout)
                view.deleted(topic)
            log.info("deleted topic %s from %s and the name servers", topic, done)
            metrics.result("Topic", "deleted")
            return
        except (TideMQError, TimeoutError) as exc:
            problem = f"cannot delete topic {topic}: {exc or 'timed out'}"
    if retry < config.delete_retries:
        metrics.result("Topic", "retry", "DeleteFailed")
        raise kopf.TemporaryError(f"{problem} (retry {retry + 1} of {config.delete_retries})",
                                  delay=config.retry_delay)
    kopf.warn(body, reason="FinalizerReleased",
              message=f"{problem}; gave up after {retry} retries, the topic may remain on brokers")
    metrics.result("Topic", "error", "FinalizerReleased")


async def group_pass(config: OperatorConfig, metrics: OperatorMetrics, body: kopf.Body,
                     patch: kopf.Patch, clusters: kopf.Index, timer: bool = False,
                     pool: adminpool.AdminPool | None = None) -> None:
    meta, spec = body.metadata, body.spec
    kind = "ConsumerGroup"
    with metrics.timed(kind):
        try:
            gspec = group_spec(meta.name or "", spec)
        except InvalidSpec as exc:
            if timer:
                return
            raise _invalid(kind, body, patch, exc, metrics) from None
        cluster = _cluster(clusters, meta.namespace, gspec.cluster)
        if cluster is None:
            return _not_ready(kind, patch, body, config, metrics, "ClusterNotFound",
                              f"Cluster {gspec.cluster!r} not found in namespace {meta.namespace}")
        try:
            servers = brokers.name_servers_of(cluster)
        except InvalidSpec as exc:
            return _not_ready(kind, patch, body, config, metrics, "ClusterInvalid", str(exc))
        try:
            async with adminpool.borrow(pool, servers, config.client_config) as view:
                async def both() -> tuple[list[str], tuple[dict[str, int], list[str]]]:
                    done = await brokers.update_group(view, gspec, config.timer_interval)
                    return done, await brokers.group_lag(view, gspec.group_name, config.timer_interval)
                done, (lag, online) = await asyncio.wait_for(both(), config.admin_timeout)
        except (TideMQError, TimeoutError) as exc:
            return _not_ready(kind, patch, body, config, metrics, "BrokerUnavailable",
                              f"cluster {gspec.cluster!r}: {exc or 'timed out'}")
        patch.status["groupName"] = gspec.group_name
        patch.status["observedGeneration"] = meta.get("generation")
        patch.status["lag"] = [{"topic": t, "lag": n} for t, n in sorted(lag.items())]
        patch.status["totalLag"] = sum(lag.values())
        patch.status["consumersOnline"] = len(online)
        _conditions(patch, body, ("Ready", True, "Reconciled", f"{len(done)} broker(s)"))
        # Only what changed is written (issue 18): a pass that found what is stored writes nothing.
        changed = status_changes(body.status, patch.pop("status"), _now())
        if changed:
            patch["status"] = changed
        metrics.result(kind, "ok")
        metrics.track(kind, meta.uid or meta.name or "")


# Cluster --------------------------------------------------------------------------------------
# Server-side apply of the owned objects, create-once Secrets (tidemq.operator.apply)
_apply_objects, _create_once = apply.apply_objects, apply.create_once


async def cluster_pass(config: OperatorConfig, metrics: OperatorMetrics, body: kopf.Body,
                       patch: kopf.Patch, pool: adminpool.AdminPool | None = None) -> None:
    meta, spec, status = body.metadata, body.spec, body.status
    kind = "Cluster"
    with metrics.timed(kind):
        external = (spec.get("external") or {}).get("nameServers")
        cluster = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Cluster",
                   "metadata": dict(meta), "spec": dict(spec), "status": dict(status)}
        if external:
            try:
                servers = brokers.name_servers_of(cluster)
            except InvalidSpec as exc:
                raise _invalid(kind, body, patch, exc, metrics) from None
            patch.status["nameServerAddress"] = ";".join(servers)
            patch.status["observedGeneration"] = meta.get("generation")
            try:
                async with adminpool.borrow(pool, servers, config.client_config) as view:
                    info = await asyncio.wait_for(view.admin.cluster_info(), config.admin_timeout)
            except (TideMQError, TimeoutError) as exc:
                log.info("external cluster %s not reachable: %s", meta.name, exc)
                patch.status["brokers"], patch.status["readyBrokers"] = [], 0
                ready = (False, "Unreachable", f"no name server of {', '.join(servers)} answered "
                         f"({exc or 'timed out'}); check spec.external.nameServers and the network")
            else:
                patch.status["brokers"] = [
                    {"name": n, "brokerId": bid, "address": addr}
                    for n, bd in sorted(info.broker_addr_table.items())
                    for bid, addr in sorted(bd.broker_addrs.items())
                ]
                patch.status["readyBrokers"] = len(patch.status["brokers"])
                ready = ((True, "External", "external cluster: topics and groups only")
                         if info.all_master_addrs() else
                         (False, "NoBroker", "the name servers answer but know no master broker yet"))
            _conditions(patch, body, ("Ready", *ready), ("Progressing", False, "None", ""),
                        ("Degraded", False, "None", ""))
            metrics.result(kind, "ok" if ready[0] else "retry", None if ready[0] else ready[1])
            metrics.track(kind, meta.uid or meta.name or "")
            return
        if not config.apply_workloads:
            _conditions(patch, body, ("Ready", False, "NotManaged",
                                        "this operator build does not create workloads"))
            metrics.result(kind, "error", "NotManaged")
            return
        namespace = meta.namespace or "default"
        creds = namesrv_credentials(config, cluster)
        if config.cluster_key_file and creds is None:
            msg = (f"waiting for the operator's master key at {config.cluster_key_file} (the Secret "
                   f"{config.cluster_key_secret or '?'} mounted by the chart; it appears within a minute or two)")
            _conditions(patch, body, ("Ready", False, "WaitingForClusterKey", msg))
            metrics.result(kind, "retry", "WaitingForClusterKey")
            raise kopf.TemporaryError(msg, delay=config.retry_delay)
        signing = creds is not None

        def desired(namesrv_acl: bool) -> list[dict]:
            objs = workloads.desired_objects(cluster, namesrv_acl=namesrv_acl, broker_signing=signing)
            for obj in objs:
                obj.setdefault("metadata", {}).setdefault("namespace", namespace)
                if not obj["metadata"].get("ownerReferences"):
                    kopf.adopt(obj, owner=body)
            return objs

        try:
            objs = desired(True)
            address = workloads.name_server_address(cluster)
            secret = clusterkey.cluster_key_secret(cluster, creds) if creds else None
        except (ConfigError, ValueError, KeyError, TypeError) as exc:
            raise _invalid(kind, body, patch, exc, metrics) from None
        sts_names = [o["metadata"]["name"] for o in objs if o["kind"] == "StatefulSet"]
        try:
            if secret is not None and await asyncio.to_thread(_create_once, secret, namespace):
                log.info("cluster %s: created the cluster key Secret %s", meta.name, secret["metadata"]["name"])
            live = await asyncio.to_thread(_read_statefulsets, sts_names, namespace)
            enforced = signing and clusterkey.namesrv_acl_ready(meta.name or "", live)
            if signing and not enforced:  # brokers first: no registration may be refused
                objs = desired(False)
            was_ready = list((status.get("rollout") or {}).get("wasReady") or [])
            decision = rollout.plan(objs, live, was_ready)
            to_apply = list(decision.apply)
            holds = await _scale_down_holds(config, body, cluster, namespace, to_apply, live, pool)
            if holds:  # the shrinking groups' stages wait; the others go on
                to_apply = [o for st in rollout.stages(to_apply) if st.name not in holds for o in st.objects]
            # broker groups above spec.brokers.groups drain, then go (tidemq.operator.scalein)
            scale = await scaleinops.scale_in(cluster, namespace, config.client_config,
                                              min(config.admin_timeout, 10.0), config.drain_grace, pool)
            applied = (await asyncio.to_thread(_apply_objects, to_apply, namespace) if to_apply else [])
            # drift repair: what is in step with the spec but differs or is gone is applied again
            repaired = await asyncio.to_thread(apply.refresh, list(decision.refresh), namespace, live)
            # budgets are kept exact on every pass, not only with their stage (tidemq.operator.budgets)
            applied += await asyncio.to_thread(budgets.reconcile, objs, namespace, meta.name or "",
                                               meta.uid or "", tuple(holds) + scale.keep)
        except Exception as exc:  # noqa: BLE001 (any API failure: retry with a delay)
            metrics.result(kind, "retry", "ApplyFailed")
            raise kopf.TemporaryError(f"applying workloads failed: {exc}",
                                      delay=config.retry_delay) from None
        repl = await _replication_pass(config, body, cluster, namespace, live, decision, pool)
        if repl is not None:
            repl.groups += [h for h in holds.values() if h.name not in repl.masters]
        patch.status["nameServerWriteProtection"] = (
            clusterkey.ENFORCED if enforced else clusterkey.PENDING if signing else clusterkey.OFF)
        if applied:
            log.info("cluster %s: applied %s", meta.name, ", ".join(applied))
        if repaired:
            log.info("cluster %s: repaired drift of %s", meta.name, ", ".join(repaired))
        for sts_name in decision.repaired:
            kopf.warn(body, reason="ReplicasRestored",
                      message=f"StatefulSet {sts_name}: spec.replicas was changed outside the Cluster; put "
                              "back to the Cluster's count (change the Cluster spec to scale)")
        known = {f"{n}:{','.join(f)}" for n, f in
                 ((status.get("rollout") or {}).get("blocked") or {}).items()}
        for sts_name, fields in sorted(decision.blocked.items()):
            if f"{sts_name}:{','.join(fields)}" not in known:  # one Event per distinct change
                kopf.warn(body, reason="ImmutableFieldChange",
                          message=f"StatefulSet {sts_name}: cannot change {', '.join(fields)} in "
                                  "place (the rest of the change is applied); revert it or delete the "
                                  "StatefulSet (its PVCs are retained) so the operator recreates it")
        patch.status["nameServerAddress"] = address
        patch.status["observedGeneration"] = meta.get("generation")
        patch.status["readyNameServers"] = decision.ready_name_servers
        patch.status["readyBrokers"] = decision.ready_brokers
        patch.status["brokers"] = brokerstatus.live_brokers(cluster, live, repl.masters if repl else None,
                                                            status.get("brokers") or ())
        patch.status["statefulSets"] = [{"name": n, **c} for n, c in sorted(decision.counts.items())]
        group_blocked = {g.name: f"{g.step.reason}: {g.step.message}" for g in (repl.blocked if repl else [])}
        for name, message in sorted(group_blocked.items()):
            if ((status.get("rollout") or {}).get("groupBlocked") or {}).get(name) != message:
                kopf.warn(body, reason="RollBlocked", message=f"broker group {name}: {message}")
        patch.status["rollout"] = {"wasReady": list(decision.was_ready),
                                   "rolling": list(decision.rolling),
                                   "waiting": list(decision.waiting),
                                   "blocked": {n: list(f) for n, f in decision.blocked.items()},
                                   "groupBlocked": group_blocked}
        conditions = decision.conditions()
        if repl is not None and repl.groups:
            groups, summary = repl.status()
            patch.status["groups"], patch.status["replication"] = groups, summary
            conditions.append(repl.condition())
            if group_blocked:
                conditions = [("Progressing", True, "RollBlocked", "; ".join(
                    f"{n}: {m}" for n, m in sorted(group_blocked.items()))) if c[0] == "Progressing" else c
                    for c in conditions]
        elif repl is not None and (status.get("groups") or status.get("replication")):
            patch.status["groups"] = patch.status["replication"] = None  # no replicated group any more
        conditions = scale.conditions(conditions)
        patch.status["scaleIn"] = scale.status()
        for reason, message in scale.events:
            kopf.info(body, reason=reason, message=message)
        _conditions(patch, body, *conditions)
        if decision.blocked:
            metrics.result(kind, "error", "ImmutableFieldChange")
        else:
            metrics.result(kind, "ok" if decision.ready else "progressing")
        metrics.track(kind, meta.uid or meta.name or "")


async def _replication_pass(config: OperatorConfig, body: kopf.Body, cluster: dict, namespace: str,
                            live: Mapping[str, Mapping | None], decision: rollout.Plan,
                            pool: adminpool.AdminPool | None = None) -> groupops.ClusterReplication | None:
    """Observe the replicated broker groups and take one roll step each (tidemq.operator.groupops).
    None when it could not run (logged; the rest of the pass goes on, the next pass retries)."""
    if not groupops.replicated(cluster):
        return groupops.ClusterReplication()
    untouchable = set(decision.applied_stages) | set(decision.waiting) | set(decision.blocked)
    allow = (body.metadata.annotations or {}).get(FORCE_ANNOTATION, "").lower() == "true"
    try:
        async with adminpool.borrow(pool, brokers.name_servers_of(cluster), config.client_config) as view:
            repl = await groupops.reconcile(cluster, namespace, live, untouchable, view.admin,
                                            min(config.admin_timeout, 10.0), allow)
    except Exception as exc:  # noqa: BLE001 (API or broker failure: report, retry next pass)
        log.warning("cluster %s: cannot observe its replicated broker groups: %s", body.metadata.name, exc)
        return None
    for g in repl.groups:
        if g.done:
            kopf.info(body, reason="ReplicaRoll", message=f"broker group {g.name}: {g.done}")
    return repl


async def _scale_down_holds(config: OperatorConfig, body: kopf.Body, cluster: dict, namespace: str,
                            to_apply: list[dict], live: Mapping[str, Mapping | None],
                            pool: adminpool.AdminPool | None = None) -> dict[str, groupops.GroupReport]:
    """Replicated groups whose shrink must wait (tidemq.operator.groupops.scale_down_holds); when
    they cannot be observed, every shrinking replicated group waits (never shrink blindly)."""
    shrinking = [o["metadata"]["name"] for o in to_apply if o.get("kind") == "StatefulSet"
                 and rollout.is_replicated(live.get(o["metadata"]["name"]) or {})
                 and int(o["spec"]["replicas"]) < int(((live.get(o["metadata"]["name"]) or {}).get("spec") or {})
                                                      .get("replicas") or 1)]
    if not shrinking:
        return {}
    try:
        async with adminpool.borrow(pool, brokers.name_servers_of(cluster), config.client_config) as view:
            holds = await groupops.scale_down_holds(cluster, namespace, to_apply, live, view.admin,
                                                    min(config.admin_timeout, 10.0))
    except Exception as exc:  # noqa: BLE001 (cannot observe: hold the shrink, retry next pass)
        log.warning("cluster %s: cannot observe the shrinking groups %s, holding them: %s",
                    body.metadata.name, shrinking, exc)
        health = grouproll.GroupHealth("", grouproll.Health.UNKNOWN, message=str(exc))
        step = grouproll.RollStep(grouproll.Action.WAIT, "ScaleDown", f"cannot observe the group: {exc}")
        return {n: groupops.GroupReport(n, replace(health, name=n), step) for n in shrinking}
    for h in holds.values():
        if h.done:
            kopf.info(body, reason="ReplicaRoll", message=f"broker group {h.name}: {h.done}")
    return holds


def _read_statefulsets(names: list[str], namespace: str) -> dict[str, dict | None]:
    """The live StatefulSets as API JSON (camelCase), None when missing (runs in a worker thread).

    Only 404 NotFound means missing: any other error raises, so the pass retries later and
    applies nothing (a StatefulSet taken for missing would be applied out of its turn, and with
    every read failing all broker groups would roll at once)."""
    import kubernetes  # noqa: PLC0415 (optional dependency, only for managed clusters)

    client = kubernetes.client.ApiClient()
    apps = kubernetes.client.AppsV1Api(client)
    out: dict[str, dict | None] = {}
    for name in names:
        try:
            # raw JSON: no client-side model validation of a partly filled status
            resp = apps.read_namespaced_stateful_set(name, namespace, _preload_content=False)
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise
            out[name] = None
            continue
        # unpreloaded, the call returns urllib3's response, not the model its annotation names
        out[name] = json.loads(resp.data)  # type: ignore[attr-defined]
    return out


def _ensure_master_key(config: OperatorConfig) -> None:
    """First start: create the master key Secret the chart mounts (never replaced). Runs in a
    worker thread; failures are logged (Cluster passes then wait for the key)."""
    if not config.cluster_key_file or master_key(config) is not None:
        return
    if not (config.cluster_key_secret and config.namespace):
        log.error("the master key file %s is missing and no --cluster-key-secret (with $POD_NAMESPACE) "
                  "to create it: managed Clusters wait", config.cluster_key_file)
        return
    obj = clusterkey.master_key_secret(config.cluster_key_secret, config.namespace)
    try:
        created = _create_once(obj, config.namespace)
    except Exception as exc:  # noqa: BLE001 (API refused: say so, the passes retry)
        log.error("cannot create the master key Secret %s/%s: %s", config.namespace,
                  config.cluster_key_secret, exc)
        return
    log.info("%s the master key Secret %s/%s; managed Clusters wait until it is mounted at %s",
             "created" if created else "found", config.namespace, config.cluster_key_secret,
             config.cluster_key_file)


# registration ---------------------------------------------------------------------------------
def register(registry: kopf.OperatorRegistry, config: OperatorConfig = OperatorConfig(),
             metrics: OperatorMetrics = METRICS) -> kopf.OperatorRegistry:
    """Register every handler of the operator into ``registry`` (bound to ``config``)."""
    reg: dict[str, Any] = {"registry": registry}
    # One admin connection per Cluster for every pass (tidemq.operator.adminpool), and one pass at
    # a time per object on the object as the API has it now (tidemq.operator.serial).
    pool = adminpool.AdminPool(idle=max(10 * config.timer_interval, 60.0))
    serializer = serial.Serializer(serial.kube_reader(GROUP, VERSION))

    @contextlib.asynccontextmanager
    async def current(plural: str, body: kopf.Body, timer: bool = False) -> AsyncIterator[kopf.Body | None]:
        try:
            async with serializer.current(plural, body, timer) as now:
                yield now
        except serial.ReadFailed as exc:
            raise kopf.TemporaryError(str(exc), delay=config.retry_delay) from None

    @kopf.on.startup(**reg)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = FINALIZER
        settings.posting.level = logging.INFO
        settings.watching.server_timeout = 300
        if config.apply_workloads:
            try:
                import kubernetes  # noqa: PLC0415

                try:
                    kubernetes.config.load_incluster_config()
                except kubernetes.config.ConfigException:
                    kubernetes.config.load_kube_config()
            except Exception as exc:  # noqa: BLE001 (no kubernetes client: external only)
                log.warning("kubernetes client not configured (%s); managed clusters will fail",
                            exc)
            else:
                await asyncio.to_thread(_ensure_master_key, config)
        if not config.cluster_key_file:
            log.warning("no --cluster-key-file: the name servers of managed Clusters accept route "
                        "changes (REGISTER_BROKER, DELETE_TOPIC_IN_NAMESRV ...) from anyone")

    @kopf.on.login(**reg)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        """A fresh registry has no fallback login: in-cluster service account, else kubeconfig."""
        return (kopf.login_with_service_account(**kwargs)
                or kopf.login_with_kubeconfig(**kwargs))

    @kopf.index(GROUP, VERSION, "clusters", id=CLUSTER_INDEX, **reg)
    def cluster_index(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict:
        return {(namespace, name): {"spec": dict(body.spec), "status": dict(body.status),
                                    "metadata": {"name": name, "namespace": namespace}}}

    # Cluster
    @kopf.on.resume(GROUP, VERSION, "clusters", **reg)
    @kopf.on.create(GROUP, VERSION, "clusters", **reg)
    @kopf.on.update(GROUP, VERSION, "clusters", **reg)
    async def cluster_changed(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        async with current("clusters", body) as now:
            if now is not None:
                await cluster_pass(config, metrics, now, patch, pool)

    @kopf.timer(GROUP, VERSION, "clusters", interval=config.timer_interval,
                initial_delay=config.timer_interval,
                backoff=config.retry_delay, **reg)
    async def cluster_timer(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        async with current("clusters", body, timer=True) as now:
            if now is not None:
                await cluster_pass(config, metrics, now, patch, pool)

    @kopf.on.event(GROUP, VERSION, "clusters", **reg)
    async def cluster_gone(type: str, body: kopf.Body, **_: Any) -> None:
        """A deleted Cluster's admin connections close at once (not only when idle)."""
        if type != "DELETED":
            return
        try:
            servers = brokers.name_servers_of({"spec": dict(body.spec), "metadata": dict(body.metadata)})
        except InvalidSpec:
            return  # never had a connection
        if await pool.discard(servers):
            log.info("cluster %s deleted: its admin connections closed", body.metadata.name)

    @kopf.on.cleanup(**reg)
    async def close_pool(**_: Any) -> None:
        await pool.close()

    # Topic
    @kopf.on.resume(GROUP, VERSION, "topics", **reg)
    @kopf.on.create(GROUP, VERSION, "topics", **reg)
    @kopf.on.update(GROUP, VERSION, "topics", **reg)
    async def topic_changed(body: kopf.Body, patch: kopf.Patch, **kwargs: Any) -> None:
        async with current("topics", body) as now:
            if now is not None:
                await topic_pass(config, metrics, now, patch, kwargs[CLUSTER_INDEX], pool=pool)

    @kopf.timer(GROUP, VERSION, "topics", interval=config.timer_interval,
                initial_delay=config.timer_interval,
                backoff=config.retry_delay, **reg)
    async def topic_timer(body: kopf.Body, patch: kopf.Patch, **kwargs: Any) -> None:
        if body.metadata.get("deletionTimestamp"):
            return
        try:
            async with current("topics", body, timer=True) as now:
                if now is not None:
                    await topic_pass(config, metrics, now, patch, kwargs[CLUSTER_INDEX], timer=True, pool=pool)
        except kopf.TemporaryError as exc:
            log.info("topic %s: %s", body.metadata.name, exc)

    @kopf.on.delete(GROUP, VERSION, "topics", **reg)
    async def topic_deleted(body: kopf.Body, retry: int, **kwargs: Any) -> None:
        async with serializer.lock(body):  # no timer pass may re-create it meanwhile
            await topic_delete(config, metrics, body, kwargs[CLUSTER_INDEX], retry, pool)

    # ConsumerGroup
    @kopf.on.resume(GROUP, VERSION, "consumergroups", **reg)
    @kopf.on.create(GROUP, VERSION, "consumergroups", **reg)
    @kopf.on.update(GROUP, VERSION, "consumergroups", **reg)
    async def group_changed(body: kopf.Body, patch: kopf.Patch, **kwargs: Any) -> None:
        async with current("consumergroups", body) as now:
            if now is not None:
                await group_pass(config, metrics, now, patch, kwargs[CLUSTER_INDEX], pool=pool)

    @kopf.timer(GROUP, VERSION, "consumergroups", interval=config.timer_interval,
                initial_delay=config.timer_interval,
                backoff=config.retry_delay, **reg)
    async def group_timer(body: kopf.Body, patch: kopf.Patch, **kwargs: Any) -> None:
        try:
            async with current("consumergroups", body, timer=True) as now:
                if now is not None:
                    await group_pass(config, metrics, now, patch, kwargs[CLUSTER_INDEX], timer=True, pool=pool)
        except kopf.TemporaryError as exc:
            log.info("consumer group %s: %s", body.metadata.name, exc)

    @kopf.on.delete(GROUP, VERSION, "consumergroups", optional=True, **reg)
    async def group_deleted(body: kopf.Body, **_: Any) -> None:
        metrics.track("ConsumerGroup", body.metadata.uid or body.metadata.name or "",
                      present=False)

    return registry


def _register_default() -> None:
    """``kopf run -m tidemq.operator``: default config into the default registry."""
    register(kopf.get_default_registry())


if __name__ != "__main__":
    _register_default()
