"""A replicated broker group's health and its rolling restart: pure functions (issue 17).

Inputs are what the operator observed: each replica's ``ha*`` keys of GET_BROKER_RUNTIME_INFO
(:func:`replica_view`), each pod's readiness and revision (:class:`PodView`) and the StatefulSet's
RollingUpdate ``partition``. Outputs are values: :class:`GroupHealth` (status.groups) and the one
next :class:`RollStep` of a rollout. The handlers fetch, call these and carry the step out.

How a replicated group rolls. The StatefulSet's partition starts at ``replicas`` when its template
changes (tidemq.operator.replication), so the controller replaces no pod by itself; each step lowers
it by one, and the controller then replaces the pod with the ordinal = the new partition (pods roll
from the highest ordinal down). Before that pod ``k`` goes:

1. every pod already on the new revision is ready and back in the in-sync set (one pod away at a
   time; a replica that has not caught up yet is waited for, not rolled past);
2. the group has a master (a group without one is left to elect; its pods are not restarted,
   except pod ``k`` itself when it is not ready: it serves nothing);
3. restarting ``k`` leaves at least ``minInSync`` replicas in sync (Strimzi refuses to roll a
   broker that would drop a partition below its min ISR; so do we: the step is Blocked with a
   reason, never forced);
4. if ``k`` is the master it first hands over (SWITCHOVER) to an in-sync follower, preferably one
   already on the new revision (so it is not switched again), else the lowest ordinal (the last
   to roll), and the roll waits until the replicas report the new master. Before the first
   restart a master on another ordinal than 0 moves to 0 (in sync and ready), so the usual roll
   is: followers n-1 .. 1, switchover 0 -> an updated follower, then 0.

Followers therefore go first and the master last, moved by a planned switchover rather than a
failover: no acknowledged send is lost and sends fail over within one route refresh.

Invariants: at most one pod of a group is away because of the operator; the partition only goes
down by one per step (or straight to 0 when every pod is already on the new revision, which
restarts nothing); a step is a pure function of its inputs.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tidemq.remoting.headers import replica as keys


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """One replica's report of itself and (as master) of its group."""

    replica_id: int
    role: str                  # master | follower | none
    epoch: int
    master: int | None         # the master it knows of
    in_sync: tuple[int, ...]
    min_in_sync: int
    replication: str
    high_water: int
    log_end: int
    follower_lag: tuple[tuple[int, int], ...]  # (replica id, bytes behind), master only
    failovers: int
    last_failover_seconds: float | None


def _int(info: Mapping[str, str], key: str, default: int | None = None) -> int | None:
    text = info.get(key, "")
    if text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{key} {text[:32]!r} is not an integer") from None


def replica_view(info: Mapping[str, str]) -> ReplicaView | None:
    """The ``ha*`` keys of one GET_BROKER_RUNTIME_INFO table; None for a broker that is no replica.
    ValueError naming the key when a value does not parse."""
    if keys.HA_ROLE not in info:
        return None
    last = info.get(keys.HA_LAST_FAILOVER_SECONDS, "")
    try:
        last_s = float(last) if last else None
    except ValueError:
        raise ValueError(f"{keys.HA_LAST_FAILOVER_SECONDS} {last[:32]!r} is not a number") from None
    return ReplicaView(
        replica_id=_int(info, keys.HA_REPLICA_ID, 0) or 0,
        role=info[keys.HA_ROLE],
        epoch=_int(info, keys.HA_EPOCH, 0) or 0,
        master=_int(info, keys.HA_MASTER),
        in_sync=keys.parse_id_list(info.get(keys.HA_IN_SYNC, "")),
        min_in_sync=_int(info, keys.HA_MIN_IN_SYNC, 1) or 1,
        replication=info.get(keys.HA_REPLICATION, ""),
        high_water=_int(info, keys.HA_HIGH_WATER, 0) or 0,
        log_end=_int(info, keys.HA_LOG_END, 0) or 0,
        follower_lag=keys.parse_lag_list(info.get(keys.HA_FOLLOWER_LAG, "")),
        failovers=_int(info, keys.HA_FAILOVERS, 0) or 0,
        last_failover_seconds=last_s,
    )


class Health(enum.StrEnum):
    IN_SYNC = "InSync"                    # every replica in sync
    UNDER_REPLICATED = "UnderReplicated"  # fewer than replicas, at least minInSync
    BELOW_MIN_IN_SYNC = "BelowMinInSync"  # writes are refused
    NO_MASTER = "NoMaster"                # replicas answer, none is master
    UNKNOWN = "Unknown"                   # no replica answered


# Worst first: a group nobody answers for, then one without a master, one refusing writes ...
SEVERITY = (Health.UNKNOWN, Health.NO_MASTER, Health.BELOW_MIN_IN_SYNC, Health.UNDER_REPLICATED, Health.IN_SYNC)


@dataclass(frozen=True, slots=True)
class GroupHealth:
    """What status.groups says of one replicated group."""

    name: str
    health: Health
    master: int | None = None
    epoch: int = 0
    in_sync: tuple[int, ...] = ()
    min_in_sync: int = 1
    replication: str = ""
    lag: tuple[tuple[int, int], ...] = ()
    failovers: int = 0
    last_failover_seconds: float | None = None
    message: str = ""

    @property
    def healthy(self) -> bool:
        return self.health is Health.IN_SYNC

    def status(self) -> dict[str, Any]:
        """The status.groups entry (camelCase; absent values left out)."""
        out: dict[str, Any] = {"name": self.name, "health": self.health.value}
        if self.master is not None:
            out.update(master=self.master, epoch=self.epoch, inSync=list(self.in_sync),
                       minInSync=self.min_in_sync, replication=self.replication,
                       lagBytes=[{"replica": r, "bytes": b} for r, b in self.lag],
                       failovers=self.failovers)
            if self.last_failover_seconds is not None:
                out["lastFailoverSeconds"] = self.last_failover_seconds
        if self.message:
            out["message"] = self.message
        return out


def group_health(name: str, replicas: int, views: Mapping[int, ReplicaView | None],
                 problems: Mapping[int, str] | None = None) -> GroupHealth:
    """A group's health from its replicas' views (None: it did not answer; ``problems`` says why).

    The master is the replica that reports itself master at the highest epoch (a stale master
    that has not yet noticed its lapsed lease reports a lower one); its in-sync set and lags are
    the group's."""
    answered = {r: v for r, v in views.items() if v is not None}
    unreachable = "; ".join(f"replica {r}: {p}" for r, p in sorted((problems or {}).items()))
    if not answered:
        return GroupHealth(name, Health.UNKNOWN, message=unreachable or "no replica answered")
    masters = [v for v in answered.values() if v.role == "master"]
    if not masters:
        epoch = max(v.epoch for v in answered.values())
        return GroupHealth(name, Health.NO_MASTER, epoch=epoch,
                           message=f"no replica is master (epoch {epoch}); the group is electing one"
                                   + (f"; {unreachable}" if unreachable else ""))
    m = max(masters, key=lambda v: (v.epoch, v.replica_id))
    if len(m.in_sync) < m.min_in_sync:
        health = Health.BELOW_MIN_IN_SYNC
    elif len(m.in_sync) < replicas:
        health = Health.UNDER_REPLICATED
    else:
        health = Health.IN_SYNC
    return GroupHealth(name, health, m.replica_id, m.epoch, m.in_sync, m.min_in_sync, m.replication,
                       m.follower_lag, m.failovers, m.last_failover_seconds, unreachable)


def summary(groups: list[GroupHealth]) -> str:
    """status.replication (the printer column): "2/3 groups in sync"."""
    return f"{sum(g.healthy for g in groups)}/{len(groups)} groups in sync"


# -- rolling -------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class PodView:
    """A pod of the group's StatefulSet: ready (its Ready condition) and updated (its
    ``controller-revision-hash`` is the StatefulSet's updateRevision)."""

    ordinal: int
    ready: bool
    updated: bool


class Action(enum.Enum):
    IDLE = "idle"              # nothing to roll
    WAIT = "wait"              # a pod is on its way back, or the group is electing
    SWITCHOVER = "switchover"  # hand the master role to ``to`` first
    PARTITION = "partition"    # set the partition to ``partition`` (the controller replaces a pod)
    BLOCKED = "blocked"        # rolling on would break minInSync or has no target


@dataclass(frozen=True, slots=True)
class RollStep:
    action: Action
    reason: str = ""            # a CamelCase reason for the status
    message: str = ""
    partition: int | None = None
    switch_from: int | None = None
    to: int | None = None


def _ids(ids: tuple[int, ...] | list[int] | set[int]) -> str:
    return ",".join(str(i) for i in sorted(ids)) or "none"


FORCE_ANNOTATION = "tidemq.io/roll-below-min-in-sync"


def plan_roll(replicas: int, partition: int, pods: Mapping[int, PodView], health: GroupHealth,
              allow_below_min: bool = False) -> RollStep:
    """The next step of rolling a replicated group (see the module docstring).

    ``allow_below_min`` (the Cluster annotation ``tidemq.io/roll-below-min-in-sync: "true"``) lets a
    restart leave fewer than minInSync in sync: the only way to roll a group whose minInSync equals
    its replicas, at the price of writes refused while each pod restarts."""
    missing = [o for o in range(replicas) if o not in pods]
    if missing:
        return RollStep(Action.WAIT, "WaitingForPods", f"pods {_ids(missing)} do not exist yet")
    if all(p.updated for p in pods.values()):
        if partition == 0:
            return RollStep(Action.IDLE)
        return RollStep(Action.PARTITION, "Updated", "every pod runs the new revision", partition=0)
    partition = min(partition, replicas)
    done = [o for o in range(partition, replicas)]
    away = [o for o in done if not (pods[o].updated and pods[o].ready)]
    if away:
        return RollStep(Action.WAIT, "RestartingReplica", f"replica {_ids(away)} is restarting")
    if partition == 0:  # every ordinal released, a pod not updated yet: the controller is on it
        return RollStep(Action.WAIT, "RestartingReplica", "the StatefulSet controller is replacing pods")
    k = partition - 1
    if pods[k].updated:  # created on the new revision already: nothing to restart
        return RollStep(Action.PARTITION, "Updated", f"replica {k} runs the new revision", partition=k)
    if health.master is None:
        if not pods[k].ready:  # it serves nothing: replacing it cannot make the group worse
            return RollStep(Action.PARTITION, "RestartingReplica", f"replica {k} is not ready; replacing it",
                            partition=k)
        return RollStep(Action.WAIT, "NoMaster", f"{health.message or 'the group has no master'}; "
                        "no replica is restarted until it has one")
    catching_up = [o for o in done if o not in health.in_sync]
    if catching_up:
        return RollStep(Action.WAIT, "CatchingUp",
                        f"replica {_ids(catching_up)} is back but not in sync yet (in sync: {_ids(health.in_sync)})")
    in_sync = set(health.in_sync)
    if partition == replicas and health.master not in (None, 0) and 0 in in_sync and pods[0].ready:
        # Before the first restart: the master moves to ordinal 0, which rolls last, so that every
        # follower restarts before it and it restarts once, after one more switchover.
        return RollStep(Action.SWITCHOVER, "Switchover",
                        f"replica {health.master} is master: moving it to replica 0, the last to restart",
                        switch_from=health.master, to=0)
    left = in_sync - {k}
    if k in in_sync and len(left) < health.min_in_sync and not allow_below_min:
        return RollStep(Action.BLOCKED, "BelowMinInSync",
                        f"restarting replica {k} would leave {len(left)} replica(s) in sync ({_ids(left)}), "
                        f"fewer than minInSync {health.min_in_sync}, and the group would refuse writes; the "
                        f"rollout waits until more replicas are in sync, or annotate the Cluster "
                        f"{FORCE_ANNOTATION}=true to accept that while each pod restarts")
    if health.master == k:
        lag = dict(health.lag)
        targets = [o for o in sorted(left) if o in pods and pods[o].ready]
        if not targets and allow_below_min and not left:  # nobody to hand over to: a failover it is
            return RollStep(Action.PARTITION, "RestartingReplica",
                            f"restarting master {k} with no in-sync follower ({FORCE_ANNOTATION})", partition=k)
        if not targets:
            return RollStep(Action.BLOCKED, "NoSwitchoverTarget",
                            f"replica {k} is master and no other ready replica is in sync ({_ids(in_sync)})")
        updated = [o for o in targets if pods[o].updated]
        to = min(updated, key=lambda o: (lag.get(o, 0), o)) if updated else min(targets)
        return RollStep(Action.SWITCHOVER, "Switchover",
                        f"replica {k} is master: handing over to replica {to} before restarting it",
                        switch_from=k, to=to)
    return RollStep(Action.PARTITION, "RestartingReplica",
                    f"restarting replica {k} ({len(left)} of {replicas} stay in sync, minInSync {health.min_in_sync})",
                    partition=k)


def plan_scale_down(new_replicas: int, pods: Mapping[int, PodView], health: GroupHealth) -> RollStep:
    """Before a replicated group shrinks to ``new_replicas`` pods (the controller removes the
    highest ordinals): the master moves onto a kept replica, and the kept ones must hold minInSync.
    IDLE when the new StatefulSet size may be applied now."""
    kept_in_sync = {o for o in health.in_sync if o < new_replicas}
    if health.master is None:
        return RollStep(Action.WAIT, "NoMaster", "the group has no master; it shrinks once it has one")
    if len(kept_in_sync) < min(health.min_in_sync, new_replicas):
        return RollStep(Action.BLOCKED, "BelowMinInSync",
                        f"only replicas {_ids(kept_in_sync)} of the {new_replicas} kept are in sync, fewer than "
                        f"minInSync {health.min_in_sync}; the group shrinks once they have caught up")
    if health.master >= new_replicas:
        ready = [o for o in sorted(kept_in_sync) if o in pods and pods[o].ready]
        if not ready:
            return RollStep(Action.BLOCKED, "NoSwitchoverTarget",
                            f"replica {health.master} is master and goes away; no kept replica is ready and in sync")
        lag = dict(health.lag)
        to = min(ready, key=lambda o: (lag.get(o, 0), o))
        return RollStep(Action.SWITCHOVER, "Switchover",
                        f"replica {health.master} goes away with the scale-down: handing over to replica {to}",
                        switch_from=health.master, to=to)
    return RollStep(Action.IDLE)
