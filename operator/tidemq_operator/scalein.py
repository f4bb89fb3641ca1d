"""Scale-in of a managed Cluster's broker groups (issue 18, item 4): the pure planning.

Lowering spec.brokers.groups retires the groups with the highest ordinals, the way RocketMQ users
retire a broker: stop its writes (``updateBrokerConfig brokerPermission=4``: the broker refuses
sends and registers its topics read-only, so the name servers route producers to the other
groups), wait until every consumer group has consumed what it holds, then delete it.
:mod:`tidemq.operator.scaleinops` observes and acts; this module decides, one step per retiring
group and pass (:func:`plan_group`):

- STOP_WRITES while the group's master still takes writes (a new group, or a broker restarted
  from its config file, which does not keep the runtime permission): the quiet period starts now.
- WAIT_DRAIN while a queue of a topic on the group holds messages some consumer group has not
  consumed (:func:`undrained`, the Topic shrink's rule: a queue with retained messages and no
  consumer group's offsets counts as undrained; retention or deleting the topic ends the wait), or
  the group still holds delayed or timer messages not delivered into their topic yet
  (:func:`undelivered`: they would be lost with it), or transactional messages not committed or
  rolled back yet (:func:`unresolved`: their commit and the check-back go to this group).
- WAIT_QUIET once drained, until ``grace`` seconds (--drain-grace, longer than a client's route
  refresh and its offset commit interval) have passed since writes stopped; the consumption
  check that lets the group go is the one made in that later pass.
- REMOVE: drained and quiet; the StatefulSet, its ConfigMap, Service and budget are deleted,
  and its PVCs when spec.brokers.deleteClaim is true (default false: kept, as Strimzi's).
- WAIT_OBSERVE while the group's master cannot be asked: nothing is deleted blindly.

Invariants:
- A group is retiring only while its StatefulSet exists (:func:`retiring_groups`); deleting it
  by hand ends the scale-in of that group (the escape when its messages may be given up).
- Nothing is removed in the pass that stopped the writes, nor without a drained check made at
  least ``grace`` seconds after the last time writes were stopped; a missing or unreadable
  record of that time starts the period again (it only waits longer).
- A group that the spec asks for again (groups raised during the drain) gets its writes back:
  :func:`cancelled` names the groups whose record remains but are desired.
- While any group retires the Cluster is Degraded (reason ScalingIn) with a message naming what
  each group waits for, not Ready, and Progressing (:func:`conditions`).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tidemq.operator.topics import format_since, since_from_status, undrained_queues

READ_ONLY = 4     # brokerPermission of a retiring group: reads only (RocketMQ PermName.PERM_READ)
READ_WRITE = 6    # brokerPermission restored when a scale-in is cancelled
WRITE = 2
INHERIT = 1       # perm bit of the topics a broker makes for itself (TBW102, cluster and broker names)
# Topics that hold no consumer's messages, or that no consumer group reads: not waited for.
SYSTEM_TOPICS = frozenset({
    "TBW102", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC",
    "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC",
})
SYSTEM_PREFIXES = ("rmq_sys_", "%DLQ%")
REPLY_TOPIC_SUFFIX = "_REPLY_TOPIC"  # request-reply answers, read by the requester only while it waits
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"  # delayed messages: queue level - 1, delivered into their topic when due
TIMER_TOPIC = "rmq_sys_wheel_timer"     # timer messages (a delivery time of their own): queue 0
HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"  # transactional messages not committed yet: queue 0
MAX_NAMED_TOPICS = 3  # topics a message names before "..."


class Action(enum.Enum):
    STOP_WRITES = "StoppingWrites"
    WAIT_DRAIN = "Draining"
    WAIT_QUIET = "Quiet"
    REMOVE = "Removing"
    WAIT_OBSERVE = "Unobserved"


@dataclass(frozen=True, slots=True)
class Observation:
    """What a pass learnt from a retiring group's master."""

    writable: bool                              # its brokerPermission has WRITE
    undrained: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # topic -> queue ids


@dataclass(frozen=True, slots=True)
class GroupStep:
    """The step for one retiring group (``name``: its broker name and StatefulSet)."""

    name: str
    action: Action
    since: float | None = None  # when its writes were stopped (epoch seconds), kept in status
    message: str = ""

    def status(self) -> dict[str, Any]:
        row: dict[str, Any] = {"name": self.name, "phase": self.action.value, "message": self.message}
        if self.since is not None:
            row["drainingSince"] = format_since(self.since)
        return row


def group_ordinal(cluster_name: str, sts_name: str) -> int | None:
    """The group ordinal of a broker StatefulSet ``<cluster>-broker-<n>`` (None for other names)."""
    m = re.fullmatch(re.escape(cluster_name) + r"-broker-(0|[1-9][0-9]*)", sts_name)
    return int(m.group(1)) if m else None


def retiring_groups(cluster_name: str, groups: int, live_statefulsets: Iterable[str]) -> list[int]:
    """Ordinals of the broker groups that exist (live StatefulSet names) but are at or above
    ``groups`` (spec.brokers.groups), lowest first."""
    found = (group_ordinal(cluster_name, n) for n in live_statefulsets)
    return sorted(g for g in found if g is not None and g >= groups)


def cancelled(cluster_name: str, groups: int, rows: object) -> list[str]:
    """Broker names of status.scaleIn rows whose group the spec asks for again (writes to restore)."""
    out = []
    for row in rows if isinstance(rows, list) else []:
        name = row.get("name") if isinstance(row, Mapping) else None
        g = group_ordinal(cluster_name, name) if isinstance(name, str) else None
        if g is not None and g < groups:
            out.append(str(name))
    return sorted(out)


def drains(topic: str, config: Mapping[str, Any]) -> bool:
    """Whether a retiring group waits for ``topic`` (a topic's TopicConfig JSON as its broker has
    it): every topic consumers read, retry topics included; not the broker's own topics, holding
    topics, dead-letter topics (no consumer group reads them) or request-reply answers."""
    if topic in SYSTEM_TOPICS or topic.startswith(SYSTEM_PREFIXES) or topic.endswith(REPLY_TOPIC_SUFFIX):
        return False
    return not int(config.get("perm", 6)) & INHERIT


def queue_ids(config: Mapping[str, Any]) -> range:
    """Every queue a topic has on its broker (read or write)."""
    return range(max(int(config.get("readQueueNums", 0)), int(config.get("writeQueueNums", 0))))


def undrained(configs: Mapping[str, Mapping[str, Any]], ranges: Mapping[str, Mapping[int, tuple[int, int]]],
              committed: Mapping[str, Mapping[str, Mapping[int, int]]]) -> dict[str, tuple[int, ...]]:
    """topic -> queue ids still holding messages some consumer group has not consumed, over the
    topics :func:`drains` keeps. ``ranges``: topic -> queue -> (min, max offset); ``committed``:
    topic -> group -> queue -> committed offset (all from the group's master)."""
    out = {}
    for topic in sorted(configs):
        if not drains(topic, configs[topic]):
            continue
        r = ranges.get(topic) or {}
        going = tuple(queue_ids(configs[topic]))
        left = undrained_queues(going, {q: lo for q, (lo, _hi) in r.items()},
                                {q: hi for q, (_lo, hi) in r.items()}, committed.get(topic) or {})
        if left:
            out[topic] = left
    return out


def undelivered(levels: Mapping[int, int], level_max: Mapping[int, int], timer: int | None,
                timer_max: int) -> dict[str, tuple[int, ...]]:
    """The held-for-later queues of a broker still holding messages not delivered into their
    topic (delivered ones land in a topic queue and are waited for there): ``levels`` and
    ``timer`` are its delivery progress (GET_ALL_DELAY_OFFSET: level -> next offset, the timer's
    lowest undelivered offset, None when not reported), ``level_max`` / ``timer_max`` the max
    offsets of ``SCHEDULE_TOPIC_XXXX`` queue ``level - 1`` and of the timer queue."""
    out: dict[str, tuple[int, ...]] = {}
    late = tuple(sorted(lv - 1 for lv, hi in level_max.items() if hi > levels.get(lv, 0)))
    if late:
        out[SCHEDULE_TOPIC] = late
    if timer is not None and timer_max > timer:
        out[TIMER_TOPIC] = (0,)
    return out


def unresolved(half_progress: int | None, half_max: int) -> dict[str, tuple[int, ...]]:
    """The half queue of a broker still holding transactional messages its producers have not
    committed or rolled back (their commit or the broker's check-back needs this broker):
    ``half_progress`` is its transaction checker's progress (every half message below it is
    resolved; None when not reported), ``half_max`` the half queue's max offset."""
    if half_progress is not None and half_max > half_progress:
        return {HALF_TOPIC: (0,)}
    return {}


def _what_is_left(left: Mapping[str, tuple[int, ...]]) -> str:
    queues = sum(len(q) for q in left.values())
    named = ", ".join(f"{t} {list(q)}" for t, q in sorted(left.items())[:MAX_NAMED_TOPICS])
    more = ", ..." if len(left) > MAX_NAMED_TOPICS else ""
    return f"{queues} queue(s) of {len(left)} topic(s) not consumed yet ({named}{more})"


def plan_group(name: str, now: float, grace: float, since: float | None, seen: Observation | None,
               problem: str = "") -> GroupStep:
    """The step for retiring group ``name``. ``since``: when its writes were stopped as recorded
    (None: no record); ``seen``: what its master reported (None: it could not be asked, and
    ``problem`` says why)."""
    if seen is None:
        return GroupStep(name, Action.WAIT_OBSERVE, since,
                         f"group {name}: cannot ask its master ({problem or 'no pod'}); bring its pod back, "
                         "or raise spec.brokers.groups to keep it, or delete its StatefulSet to give up "
                         "what it holds")
    if seen.writable:
        return GroupStep(name, Action.STOP_WRITES, now,
                         f"group {name}: writes stopped (brokerPermission {READ_ONLY}); "
                         + (_what_is_left(seen.undrained) if seen.undrained else "waiting for the drain grace"))
    start = now if since is None else min(since, now)  # a record in the future (another clock) counts as now
    if seen.undrained:
        return GroupStep(name, Action.WAIT_DRAIN, start, f"group {name}: {_what_is_left(seen.undrained)}")
    if now - start < grace:
        return GroupStep(name, Action.WAIT_QUIET, start,
                         f"group {name}: drained; removed {format_since(start + grace)} at the earliest "
                         f"(drain grace {grace:g} s after writes stopped)")
    return GroupStep(name, Action.REMOVE, start, f"group {name}: drained, removing it")


def master_of(roles: Mapping[int, tuple[str, int] | None]) -> int | None:
    """The replica of a replicated group to make read only: of the replicas' reports (ordinal ->
    (role, epoch), None when it did not answer), the one that is master with the highest epoch (a
    deposed master may still say master for a moment during a failover). None when none is."""
    masters = [(r[1], o) for o, r in roles.items() if r is not None and r[0] == "master"]
    return max(masters)[1] if masters else None


def since_of(rows: object) -> dict[str, float]:
    """broker name -> when its writes were stopped, from status.scaleIn rows."""
    return since_from_status(rows)


def conditions(steps: Sequence[GroupStep], base: Sequence[tuple[str, bool, str, str]]
               ) -> list[tuple[str, bool, str, str]]:
    """``base`` (the rollout's Ready / Progressing / Degraded) while ``steps`` retire groups: Degraded
    (ScalingIn, what each group waits for, then any other degradation), not Ready, Progressing."""
    waiting = [s for s in steps if s.action is not Action.REMOVE]
    if not waiting:
        return list(base)
    msg = "scaling in: " + "; ".join(s.message for s in waiting)
    out = []
    for ctype, ok, reason, message in base:
        if ctype == "Degraded":
            out.append((ctype, True, "ScalingIn", msg + (f"; {message}" if ok and message else "")))
        elif ctype == "Ready" and ok:
            out.append((ctype, False, "ScalingIn", msg))
        elif ctype == "Progressing" and not ok:
            out.append((ctype, True, "ScalingIn", msg))
        else:
            out.append((ctype, ok, reason, message))
    return out


def delete_claim(spec: Mapping[str, Any]) -> bool:
    """spec.brokers.deleteClaim (default false: a removed group's PVCs are kept)."""
    return bool((spec.get("brokers") or {}).get("deleteClaim", False))


def restored_permission(spec: Mapping[str, Any]) -> str:
    """The brokerPermission a group gets back when its scale-in is cancelled: what the Cluster's
    broker config sets, else read and write."""
    return str(((spec.get("brokers") or {}).get("config") or {}).get("brokerPermission", READ_WRITE))


def claim_names(sts_name: str, claims: Iterable[str]) -> list[str]:
    """The PVCs of StatefulSet ``sts_name`` among ``claims`` (``data-<sts>-<ordinal>``)."""
    return sorted(c for c in claims if re.fullmatch(re.escape(f"data-{sts_name}-") + r"[0-9]+", c))
