"""Rolling a managed Cluster one StatefulSet at a time: a pure decision function.

Given the desired objects (:func:`tidemq.operator.workloads.desired_objects`), the live
StatefulSets and what the previous pass remembered, :func:`plan` says which objects to apply now
and what the Cluster's conditions are. The operator calls it on every pass (create, update,
resume and a timer), so the rollout advances as pods become ready.

Stages, in order: the name servers (their Services, PDB and StatefulSet), then broker group 0,
1, ... (ConfigMap, Service, PDB, StatefulSet). Invariants:

- First install (no StatefulSet exists) applies every stage at once: there is nothing to roll.
  A stage whose StatefulSet does not exist yet (a new broker group) is always applied.
- A stage whose live StatefulSet carries another ``tidemq.io/spec-hash`` than the desired one is
  applied only when every earlier stage is *settled*; after it is applied, the later stages wait
  until it is settled again. So the name servers roll first, then group 0, then group 1 ...
- Settled = the StatefulSet controller observed the current generation and
  ``availableReplicas == updatedReplicas == status.replicas == spec.replicas`` (and
  ``currentRevision == updateRevision`` when both are reported). Available, not ready: a pod counts
  once it has been ready for the StatefulSet's minReadySeconds (a ready name server holds every
  live broker's routes: :mod:`tidemq.operator.workloads`, issue 18, item 10), so the brokers
  roll only after the rolled name servers have stayed ready that long. The ready counts in the
  status are available pods too. Within a StatefulSet the pods roll
  one at a time by themselves (RollingUpdate; brokers OrderedReady): the operator never deletes pods.
- A change of fields the API server refuses to patch
  (:func:`tidemq.operator.workloads.immutable_changes`, e.g. the storage size) is reported in
  ``blocked`` (Ready=False, ImmutableFieldChange) and not applied: the StatefulSet is sent with
  the live values of those fields, so the rest of the change (the image, say) still rolls, in
  order (issue 18, item 5).
- Drift repair (issue 18, item 3): ``refresh`` lists the objects every pass compares with the
  live ones and applies again when gone or changed (:func:`tidemq.operator.apply.refresh`): the
  Services, ConfigMaps and RBAC objects of the stages whose StatefulSet is in step with the spec,
  and each settled StatefulSet whose earlier stages are settled too (a template edited by hand
  goes back, one stage after the other). A StatefulSet whose spec.replicas differs from the
  spec while its hash is current (``kubectl scale``) is applied again at once (``repaired``; same template, nothing rolls) and counts as rolling until its pods
  are back, so the Cluster is not Ready meanwhile. Template changes only go through the stages.
  A stage waiting for its turn keeps its old objects until then.
- A lone broker group that becomes replicated (spec.brokers.replicas 1 -> N) is first restarted
  as a replica at its old size, then grown (:func:`lone_to_replicated`); a replicated group's
  pods are replaced one at a time by :mod:`tidemq.operator.grouproll` through the partition.
- Ready is True only when every StatefulSet is settled with the desired hash and nothing is
  blocked. Progressing is True while a stage is applied but not settled, or waits to be applied.
  Degraded is True when a StatefulSet that was settled with its current hash since it was last
  applied now has fewer ready replicas (``was_ready`` remembers that across passes).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tidemq.operator.workloads import SPEC_HASH_ANNOTATION, immutable_changes, spec_hash


@dataclass(frozen=True, slots=True)
class StsState:
    """What the live StatefulSet reports (None fields: not reported)."""

    name: str
    spec_hash: str | None
    replicas: int            # spec.replicas
    generation: int | None
    observed_generation: int | None
    status_replicas: int
    ready: int
    updated: int
    available: int = 0       # status.availableReplicas: ready for at least minReadySeconds
    current_revision: str | None = None
    update_revision: str | None = None

    @property
    def settled(self) -> bool:
        if self.generation is not None and (self.observed_generation or 0) < self.generation:
            return False
        if self.current_revision and self.update_revision and \
                self.current_revision != self.update_revision:
            return False
        return self.available == self.updated == self.status_replicas == self.replicas


def sts_state(obj: Mapping[str, Any]) -> StsState:
    """A StsState from a StatefulSet as JSON (camelCase, as the API serves it)."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    return StsState(
        name=meta.get("name", ""),
        spec_hash=(meta.get("annotations") or {}).get(SPEC_HASH_ANNOTATION),
        replicas=int(spec.get("replicas", 1) or 0),
        generation=meta.get("generation"),
        observed_generation=status.get("observedGeneration"),
        status_replicas=int(status.get("replicas") or 0),
        ready=int(status.get("readyReplicas") or 0),
        updated=int(status.get("updatedReplicas") or 0),
        # The API server leaves out a zero count: absent is 0, never "not reported".
        available=int(status.get("availableReplicas") or 0),
        current_revision=status.get("currentRevision"),
        update_revision=status.get("updateRevision"),
    )


@dataclass(frozen=True, slots=True)
class Stage:
    """The objects applied together; ``sts`` is the StatefulSet among them."""

    component: str          # "namesrv" or "broker"
    objects: tuple[dict[str, Any], ...]
    sts: dict[str, Any]

    @property
    def name(self) -> str:
        return self.sts["metadata"]["name"]

    @property
    def spec_hash(self) -> str | None:
        return (self.sts["metadata"].get("annotations") or {}).get(SPEC_HASH_ANNOTATION)


def stages(desired: Sequence[dict[str, Any]]) -> list[Stage]:
    """Split desired objects (in apply order) into stages, each ending at its StatefulSet."""
    out, pending = [], []
    for obj in desired:
        pending.append(obj)
        if obj.get("kind") == "StatefulSet":
            component = (obj["metadata"].get("labels") or {}).get(
                "app.kubernetes.io/component", "broker")
            out.append(Stage(component, tuple(pending), obj))
            pending = []
    if pending and out:  # trailing objects (none today) go with the last stage
        last = out[-1]
        out[-1] = Stage(last.component, last.objects + tuple(pending), last.sts)
    return out


def is_replicated(sts: Mapping[str, Any]) -> bool:
    """Whether a (live or desired) broker StatefulSet runs its pods as replicas (--coordination)."""
    pod = ((sts.get("spec") or {}).get("template") or {}).get("spec") or {}
    return any("--coordination" in (c.get("args") or []) for c in pod.get("containers") or [])


def lone_to_replicated(desired: Sequence[dict[str, Any]], live: Mapping[str, Mapping[str, Any] | None]
                       ) -> list[dict[str, Any]]:
    """``desired`` with a lone broker group that becomes replicated taken in two steps.

    Growing a lone group's StatefulSet straight to N pods would start the new pods on the *old*
    (lone) revision, below the partition: more lone brokers under the same broker name. So first
    only its existing pods are restarted as replicas (the desired StatefulSet at the live size,
    partition 0): pod 0 keeps its data and is elected master of a group of one. The next pass sees
    the size differ and applies the full object; the new pods start on the replica revision, which
    is the current one by then, and join as followers."""
    out = []
    for obj in desired:
        now = live.get(obj["metadata"]["name"]) if obj.get("kind") == "StatefulSet" else None
        if now is not None and is_replicated(obj) and not is_replicated(now) and \
                int((now.get("spec") or {}).get("replicas") or 1) < int(obj["spec"]["replicas"]):
            step = copy.deepcopy(obj)
            step["spec"]["replicas"] = int((now.get("spec") or {}).get("replicas") or 1)
            step["spec"]["updateStrategy"] = {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}
            step["metadata"]["annotations"][SPEC_HASH_ANNOTATION] = spec_hash(step)
            obj = step
        out.append(obj)
    return out


@dataclass(frozen=True, slots=True)
class Plan:
    apply: tuple[dict[str, Any], ...]       # objects to create or patch now, in order
    applied_stages: tuple[str, ...]         # StatefulSet names applied now
    waiting: tuple[str, ...]                # StatefulSets with a change that waits its turn
    rolling: tuple[str, ...]                # StatefulSets applied but not settled
    blocked: Mapping[str, tuple[str, ...]]  # StatefulSet -> immutable fields it would change
    degraded: tuple[str, ...]
    was_ready: tuple[str, ...]              # remember for the next pass
    ready: bool
    progressing: bool
    ready_name_servers: int
    ready_brokers: int
    counts: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    # drift repair (issue 18, item 3): the objects of the stages in step with the spec, compared
    # with the live ones every pass and applied again when gone or changed (apply.refresh: a
    # deleted Service/ConfigMap comes back; a settled StatefulSet after the earlier stages, so a
    # template edited by hand goes back), and the StatefulSets whose replicas were changed by
    # hand, put back in this pass (in ``apply``)
    refresh: tuple[dict[str, Any], ...] = ()
    repaired: tuple[str, ...] = ()

    def conditions(self) -> list[tuple[str, bool, str, str]]:
        """(type, status, reason, message) for Ready, Progressing and Degraded."""
        if self.blocked:
            what = "; ".join(f"{n}: {', '.join(f)}" for n, f in sorted(self.blocked.items()))
            ready = (False, "ImmutableFieldChange",
                     f"cannot patch immutable StatefulSet fields ({what}); the rest of the change "
                     "is applied; revert these fields or recreate the StatefulSet")
        elif self.repaired:
            ready = (False, "ReplicasRestored",
                     f"replicas changed outside the Cluster spec, put back: {', '.join(self.repaired)}")
        elif self.ready:
            ready = (True, "AllReady", "every StatefulSet is ready and up to date")
        else:
            ready = (False, "WaitingForPods",
                     "waiting for " + ", ".join(self.rolling + self.waiting or ("pods",)))
        if self.rolling or self.waiting:
            prog = (True, "RollingUpdate",
                    f"rolling {', '.join(self.rolling) or '-'}; next {', '.join(self.waiting) or '-'}")
        else:
            prog = (False, "Idle", "")
        if self.degraded:
            deg = (True, "ReplicasNotReady",
                   f"fewer ready replicas than desired: {', '.join(self.degraded)}")
        else:
            deg = (False, "None", "")
        return [("Ready", *ready), ("Progressing", *prog), ("Degraded", *deg)]


def plan(desired: Sequence[dict[str, Any]], live: Mapping[str, Mapping[str, Any] | None],
         was_ready: Sequence[str] = ()) -> Plan:
    """Decide what to apply now.

    ``live`` maps a StatefulSet name to the live object as JSON (None or absent: not created).
    ``was_ready`` is :attr:`Plan.was_ready` of the previous pass (names settled since their last
    apply).
    """
    all_stages = stages(lone_to_replicated(desired, live))
    first_install = all(live.get(s.name) is None for s in all_stages)
    apply: list[dict[str, Any]] = []
    applied, waiting, rolling, degraded, remembered = [], [], [], [], []
    blocked: dict[str, tuple[str, ...]] = {}
    refresh: list[dict[str, Any]] = []
    repaired: list[str] = []
    ready_ns = ready_br = 0
    counts: dict[str, dict[str, int]] = {}
    earlier_settled = True
    for st in all_stages:
        obj = live.get(st.name)
        if obj is None:
            apply.extend(st.objects)
            applied.append(st.name)
            if not first_install:
                earlier_settled = False
            rolling.append(st.name)
            continue
        state = sts_state(obj)
        counts[st.name] = {"replicas": st.sts["spec"].get("replicas", 0), "ready": state.ready,
                           "available": state.available, "updated": state.updated}
        if st.component == "namesrv":
            ready_ns += state.available
        else:
            ready_br += state.available
        fields = tuple(immutable_changes(dict(obj), st.sts))
        if fields:  # reported, not applied; the rest of the change goes on (issue 18, item 5)
            blocked[st.name] = fields
            st = _with_live_fields(st, obj, fields)
        if state.spec_hash != st.spec_hash:
            if earlier_settled:
                apply.extend(st.objects)
                applied.append(st.name)
                rolling.append(st.name)
                earlier_settled = False
            else:
                waiting.append(st.name)
            continue
        # In step with the spec: re-applied each pass to repair drift (SSA: a no-op when in place).
        refresh.extend(o for o in st.objects if o.get("kind") not in _NOT_REFRESHED)
        if state.replicas != int(st.sts["spec"].get("replicas", 1)):  # scaled by hand: put back
            apply.append(_reapplied(st.sts, obj))
            applied.append(st.name)
            repaired.append(st.name)
            rolling.append(st.name)
            earlier_settled = False
            continue
        if state.settled:
            remembered.append(st.name)
            if earlier_settled:  # a template edited by hand goes back (a no-op when in place)
                refresh.append(_reapplied(st.sts, obj))
            continue
        earlier_settled = False
        rolling_now = (state.updated < state.replicas or
                       (state.generation is not None and
                        (state.observed_generation or 0) < state.generation) or
                       bool(state.current_revision and state.update_revision and
                            state.current_revision != state.update_revision))
        if st.name in was_ready and not rolling_now:
            degraded.append(st.name)
            remembered.append(st.name)
        else:
            rolling.append(st.name)
    ready = not applied and not waiting and not rolling and not blocked and not degraded
    return Plan(
        apply=tuple(apply), applied_stages=tuple(applied), waiting=tuple(waiting),
        rolling=tuple(rolling), blocked=blocked, degraded=tuple(degraded),
        was_ready=tuple(remembered), ready=ready, progressing=bool(rolling or waiting),
        ready_name_servers=ready_ns, ready_brokers=ready_br, counts=counts,
        refresh=tuple(refresh), repaired=tuple(repaired),
    )


# Not refreshed with the other objects of a stage: its StatefulSet (only once settled, after the
# earlier stages: _reapplied) and budgets (budgets.reconcile keeps them exact on every pass).
_NOT_REFRESHED = frozenset({"StatefulSet", "PodDisruptionBudget"})


def _with_live_fields(st: Stage, live: Mapping[str, Any], fields: Sequence[str]) -> Stage:
    """``st`` with its StatefulSet sending the live values of the immutable ``fields``
    (``spec.<name>``): the API server refuses to change them, and with server-side apply a field
    left out would be given up, so they go out as they are while the rest of the change applies."""
    sts = copy.deepcopy(st.sts)
    for f in fields:
        name = f.removeprefix("spec.")
        sts["spec"][name] = copy.deepcopy((live.get("spec") or {})[name])
    return Stage(st.component, tuple(sts if o is st.sts else o for o in st.objects), sts)


def _reapplied(desired: dict[str, Any], live: Mapping[str, Any]) -> dict[str, Any]:
    """The desired StatefulSet of a stage in step with the spec, applied again to undo changes
    made by hand (its replicas, its template). A replicated group keeps its live updateStrategy:
    its partition belongs to the group roll (tidemq.operator.grouproll) between template changes."""
    out = copy.deepcopy(desired)
    strategy = (live.get("spec") or {}).get("updateStrategy")
    if is_replicated(desired) and strategy:
        out["spec"]["updateStrategy"] = copy.deepcopy(strategy)
    return out
