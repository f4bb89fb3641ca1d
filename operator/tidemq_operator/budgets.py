"""A Cluster's PodDisruptionBudgets, kept exactly the desired ones on every pass (issue 18, item 11).

The rollout (:mod:`tidemq.operator.rollout`) applies a stage's objects only when its StatefulSet
changes, and never deletes anything. Budgets need more: which budgets a Cluster has depends on
spec.brokers.replicas (one over every lone broker, or one per replicated group:
:func:`tidemq.operator.workloads.desired_objects`), and the eviction API refuses to evict a pod
that two budgets select, so a budget left over from the other layout (or from an operator that
made one per lone broker group) would block every node drain.

So each pass, :func:`reconcile` lists the Cluster's budgets and
1. applies (server-side, :mod:`tidemq.operator.apply`) a desired budget that is missing or whose
   ``tidemq.io/spec-hash`` differs;
2. then deletes each budget the Cluster owns that is no longer desired.
Creating first means a pod may for a moment have two budgets (an eviction is refused and the drain
retries) rather than none (an eviction nothing would limit).

Invariants: only budgets carrying the Cluster's instance label and an owner reference to its uid
are ever deleted; a pass that finds everything in place writes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tidemq.operator.apply import apply_object
from tidemq.operator.workloads import MANAGED_BY, SPEC_HASH_ANNOTATION

log = logging.getLogger(__name__)

KIND = "PodDisruptionBudget"


@dataclass(frozen=True, slots=True)
class BudgetChanges:
    """What one pass does: budgets to create or patch (desired objects), names to delete."""

    apply: tuple[dict[str, Any], ...]
    delete: tuple[str, ...]


def _owned_by(obj: Mapping[str, Any], cluster_name: str, cluster_uid: str) -> bool:
    md = obj.get("metadata") or {}
    labels = md.get("labels") or {}
    return (labels.get("app.kubernetes.io/instance") == cluster_name
            and labels.get("app.kubernetes.io/managed-by") == MANAGED_BY
            and any(ref.get("uid") == cluster_uid for ref in md.get("ownerReferences") or ()))


def budget_changes(desired: Sequence[Mapping[str, Any]], live: Sequence[Mapping[str, Any]],
                   cluster_name: str, cluster_uid: str, keep: Collection[str] = ()) -> BudgetChanges:
    """Compare the desired objects' budgets with the live budgets of the namespace (as JSON).
    ``keep``: names not to delete although not desired (a group whose removal waits: its pods
    still run and keep their budget)."""
    want = {o["metadata"]["name"]: o for o in desired if o.get("kind") == KIND}
    have = {(o.get("metadata") or {}).get("name"): o for o in live}
    apply = []
    for name, obj in want.items():
        now = have.get(name)
        hash_now = (((now or {}).get("metadata") or {}).get("annotations") or {}).get(SPEC_HASH_ANNOTATION)
        if now is None or hash_now != obj["metadata"]["annotations"][SPEC_HASH_ANNOTATION]:
            apply.append(dict(obj))
    delete = sorted(n for n, o in have.items()
                    if n is not None and n not in want and n not in keep and _owned_by(o, cluster_name, cluster_uid))
    return BudgetChanges(tuple(apply), tuple(delete))


def reconcile(desired: Sequence[Mapping[str, Any]], namespace: str, cluster_name: str, cluster_uid: str,
              keep: Collection[str] = ()) -> list[str]:
    """Apply :func:`budget_changes` against the API server (blocking: run it in a worker thread).
    Returns what was done (``PodDisruptionBudget/<name>`` and ``deleted PodDisruptionBudget/<name>``)."""
    import kubernetes  # noqa: PLC0415 (optional dependency, only for managed clusters)

    client = kubernetes.client.ApiClient()
    api = kubernetes.client.PolicyV1Api(client)
    found = api.list_namespaced_pod_disruption_budget(
        namespace, label_selector=f"app.kubernetes.io/instance={cluster_name},app.kubernetes.io/managed-by={MANAGED_BY}")
    live = [client.sanitize_for_serialization(item) for item in found.items]
    changes = budget_changes(desired, live, cluster_name, cluster_uid, keep)
    done = []
    for obj in changes.apply:
        apply_object(client, obj, namespace)  # server-side apply: fields no longer desired go
        done.append(f"{KIND}/{obj['metadata']['name']}")
    for name in changes.delete:
        try:
            api.delete_namespaced_pod_disruption_budget(name, namespace)
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:  # already gone is what we wanted
                raise
        log.info("cluster %s: deleted PodDisruptionBudget %s/%s (no longer desired)", cluster_name, namespace, name)
        done.append(f"deleted {KIND}/{name}")
    return done
