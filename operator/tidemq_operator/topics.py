"""Topic custom resources -> desired topic configs, and the safe-shrink state machine (pure).

Invariants:
- ``topic_spec`` either returns a fully validated :class:`TopicSpec` or raises
  :class:`InvalidSpec` naming the field; nothing here talks to a broker or to Kubernetes.
- Shrinking never drops unconsumed messages: read queues are only lowered once every queue that
  goes away is drained (``undrained_queues`` is empty). Before that, writes are steered away from
  those queues (write count lowered first, read count kept) and the topic is *Draining*.
- While draining, the write count is ``min(desired write, desired read)`` so that no producer
  keeps feeding a queue that is about to disappear; the final step applies the desired counts.
- A queue with retained messages that no consumer group has offsets for counts as undrained:
  the operator cannot know nobody will read it, so it waits (deleting the Topic is the escape).
- Read queues are lowered only after a quiet period (:func:`hold_for_routes`): at least
  ``QuietPeriod.grace`` seconds (ROUTE_GRACE, longer than a client's 30 s route refresh) since the
  broker's writes were steered away, and with the queues found drained in that same pass. Until
  then a producer with a stale route may still write to a queue that goes away (RocketMQ 4.x
  brokers accept any queue below max(read, write); ours refuse it), and a consumer may not have
  seen that message yet. Without a record of when writes were steered away the period starts now.
- ``messageType`` is the topic attribute ``message.type`` (RocketMQ 5) on every broker; a broker
  that reports none has NORMAL (RocketMQ's default), so a broker without attributes (RocketMQ 4)
  is in sync for NORMAL topics and gets the attribute re-sent, harmlessly, for the others.
- A Topic is Ready when, after the pass, every broker has it as specified: a broker found ready
  and one just updated to the desired counts count alike (:func:`readiness`).
"""

from __future__ import annotations

import datetime
import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from tidemq.errors import ConfigError

MIN_QUEUES = 1
MAX_QUEUES = 1024
DEFAULT_QUEUES = 8
PERMS = {"R": 4, "W": 2, "RW": 6}
MESSAGE_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION")
MESSAGE_TYPE_ATTRIBUTE = "message.type"  # RocketMQ 5's topic attribute name
DEFAULT_MESSAGE_TYPE = "NORMAL"           # what RocketMQ reads when a topic has no message.type
_TOPIC_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789%|-_")
MAX_TOPIC_LENGTH = 127


class InvalidSpec(ConfigError):
    """A custom resource's spec cannot be reconciled as written (the user must fix it)."""


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """What a Topic resource asks for, validated."""

    cluster: str
    topic_name: str
    read_queues: int
    write_queues: int
    perm: int
    order: bool
    message_type: str


@dataclass(frozen=True, slots=True)
class BrokerQueues:
    """What one broker currently has for the topic."""

    read: int
    write: int
    perm: int = 6
    order: bool = False
    message_type: str = DEFAULT_MESSAGE_TYPE


class Action(enum.Enum):
    READY = "Ready"              # nothing to do
    APPLY = "Apply"              # create or update with read/write as planned
    SHRINK_WRITE = "ShrinkWrite"  # lower write first, keep read: Draining
    WAIT_DRAIN = "WaitDrain"      # writes already steered away, queues still hold messages
    WAIT_QUIET = "WaitQuiet"      # drained, but stale client routes may still write: Draining
    SHRINK_READ = "ShrinkRead"    # drained: apply the desired (smaller) read count


@dataclass(frozen=True, slots=True)
class Step:
    """The next action for one broker, with the counts to send when the action writes."""

    action: Action
    read: int
    write: int
    perm: int
    draining: tuple[int, ...] = ()  # queue ids that go away and still hold messages
    # While draining: when this broker's writes were steered off the queues that go away (epoch
    # seconds), for the caller to keep until the next pass (QuietPeriod.since).
    quiet_since: float | None = None
    quiet_until: float | None = None  # WAIT_QUIET: when read queues may be lowered (epoch seconds)

    @property
    def writes(self) -> bool:
        return self.action in (Action.APPLY, Action.SHRINK_WRITE, Action.SHRINK_READ)

    @property
    def is_draining(self) -> bool:
        return self.action in (Action.SHRINK_WRITE, Action.WAIT_DRAIN, Action.WAIT_QUIET)


def _int(spec: Mapping, key: str, default: int) -> int:
    value = spec.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSpec(f"spec.{key} must be an integer, got {value!r}")
    if not MIN_QUEUES <= value <= MAX_QUEUES:
        raise InvalidSpec(f"spec.{key} must be between {MIN_QUEUES} and {MAX_QUEUES}, got {value}")
    return value


def check_topic_name(name: str) -> None:
    if not name:
        raise InvalidSpec("the topic name is empty")
    if len(name) > MAX_TOPIC_LENGTH:
        raise InvalidSpec(f"topic name {name!r} is longer than {MAX_TOPIC_LENGTH} characters")
    bad = sorted(set(name) - _TOPIC_CHARS)
    if bad:
        raise InvalidSpec(
            f"topic name {name!r} contains {''.join(bad)!r}; allowed are letters, digits, %|-_"
        )


def cluster_ref(spec: Mapping) -> str:
    ref = spec.get("clusterRef") or {}
    name = ref.get("name") if isinstance(ref, Mapping) else None
    if not isinstance(name, str) or not name:
        raise InvalidSpec("spec.clusterRef.name is required")
    return name


def topic_spec(name: str, spec: Mapping) -> TopicSpec:
    """Validate a Topic's spec (``name`` is metadata.name, the default topic name)."""
    cluster = cluster_ref(spec)
    topic = spec.get("topicName") or name
    if not isinstance(topic, str):
        raise InvalidSpec(f"spec.topicName must be a string, got {topic!r}")
    check_topic_name(topic)
    write = _int(spec, "writeQueueNums", DEFAULT_QUEUES)
    read = _int(spec, "readQueueNums", DEFAULT_QUEUES)
    perm_name = spec.get("perm") or "RW"
    if perm_name not in PERMS:
        raise InvalidSpec(f"spec.perm must be one of R, W, RW, got {perm_name!r}")
    message_type = spec.get("messageType") or "NORMAL"
    if message_type not in MESSAGE_TYPES:
        raise InvalidSpec(f"spec.messageType must be one of {', '.join(MESSAGE_TYPES)}, "
                          f"got {message_type!r}")
    order = spec.get("order", False)
    if not isinstance(order, bool):
        raise InvalidSpec(f"spec.order must be a boolean, got {order!r}")
    if order and message_type in ("DELAY", "TRANSACTION"):
        raise InvalidSpec("order: true cannot be combined with messageType DELAY or TRANSACTION")
    return TopicSpec(cluster, topic, read, write, PERMS[perm_name],
                     order or message_type == "FIFO", message_type)


def undrained_queues(
    going: range | tuple[int, ...],
    min_offsets: Mapping[int, int],
    max_offsets: Mapping[int, int],
    committed: Mapping[str, Mapping[int, int]],
) -> tuple[int, ...]:
    """Queue ids among ``going`` that still hold messages some group has not consumed.

    ``committed`` maps each consumer group with offsets for the topic (on this broker) to its
    committed offset per queue. With no group at all, a queue holding messages is undrained.
    """
    out = []
    for q in going:
        hi = max_offsets.get(q, 0)
        lo = min_offsets.get(q, 0)
        if hi <= lo:
            continue  # nothing retained
        if not committed:
            out.append(q)
        elif any(offsets.get(q, 0) < hi for offsets in committed.values()):
            out.append(q)
    return tuple(out)


def plan(desired: TopicSpec, current: BrokerQueues | None,
         undrained: tuple[int, ...] = ()) -> Step:
    """The next step for one broker given what it has (None: topic absent there).

    ``undrained`` is what :func:`undrained_queues` says about the queues
    ``range(desired.read_queues, current.read)``; it only matters when read shrinks.
    """
    r, w, p = desired.read_queues, desired.write_queues, desired.perm
    if current is None:
        return Step(Action.APPLY, r, w, p)
    if r >= current.read:
        if (current.read, current.write, current.perm, current.order, current.message_type) == \
                (r, w, p, desired.order, desired.message_type):
            return Step(Action.READY, r, w, p)
        return Step(Action.APPLY, r, w, p)
    # Read shrinks: steer writes away first, keep every readable queue until drained.
    draining_write = min(w, r)
    if (current.write > draining_write or current.perm != p or current.order != desired.order
            or current.message_type != desired.message_type):
        return Step(Action.SHRINK_WRITE, current.read, draining_write, p,
                    tuple(range(r, current.read)))
    if undrained:
        return Step(Action.WAIT_DRAIN, current.read, current.write, p, tuple(undrained))
    return Step(Action.SHRINK_READ, r, w, p)


def readiness(steps: Mapping[str, Step]) -> tuple[bool, str, str]:
    """The Ready condition (status, reason, message) of a pass that took ``steps`` (broker name ->
    step). A broker that was ready and one the pass updated to the desired counts are both done;
    a draining broker is not (nor is a pass that saw no broker). The message states what is,
    not what the pass did (each write is logged): a later pass that finds the same writes no
    status."""
    if not steps:
        return False, "NoBroker", "the cluster has no master broker"
    draining = sorted(b for b, s in steps.items() if s.is_draining)
    if draining:
        return False, "Draining", f"waiting for consumers on {', '.join(draining)}"
    return True, "Reconciled", f"{len(steps)} broker(s)"


# Seconds between steering writes away and lowering read queues: longer than a client's route
# refresh (RocketMQ's pollNameServerInterval, ours route_refresh_interval: 30 s).
ROUTE_GRACE = 35.0


@dataclass(frozen=True, slots=True)
class QuietPeriod:
    """The quiet period of one reconcile pass: the pass's clock, the grace, and what earlier
    passes recorded (broker name -> when its writes were steered away, epoch seconds)."""

    now: float
    grace: float = ROUTE_GRACE
    since: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.grace >= 0:
            raise ConfigError(f"the drain grace must be 0 or more seconds, got {self.grace!r}")


def hold_for_routes(step: Step, broker: str, current: BrokerQueues | None,
                    quiet: QuietPeriod) -> Step:
    """``step`` (what :func:`plan` says for ``broker``) under the quiet period.

    SHRINK_WRITE starts the period now; WAIT_DRAIN keeps the recorded start; SHRINK_READ becomes
    WAIT_QUIET until ``quiet.grace`` seconds have passed since the start (a start in the future,
    another replica's clock, counts as now). Since the caller computes ``undrained`` afresh every
    pass, the SHRINK_READ that passes is always based on a consumption check made after the
    grace. Other steps are returned unchanged."""
    now = quiet.now
    if step.action is Action.SHRINK_WRITE:
        return replace(step, quiet_since=now)
    if step.action not in (Action.WAIT_DRAIN, Action.SHRINK_READ) or current is None:
        return step
    since = min(quiet.since.get(broker, now), now)
    if step.action is Action.WAIT_DRAIN:
        return replace(step, quiet_since=since)
    if now - since >= quiet.grace:
        return step
    return Step(Action.WAIT_QUIET, current.read, current.write, current.perm,
                quiet_since=since, quiet_until=since + quiet.grace)


def format_since(t: float) -> str:
    """``t`` (epoch seconds) as a status timestamp, rounded up to the second: a period read back
    from it never ends early."""
    return datetime.datetime.fromtimestamp(math.ceil(t), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def since_from_status(rows: object) -> dict[str, float]:
    """broker name -> drainingSince (epoch seconds) of a Topic's status.brokers rows, as written
    from :attr:`Step.quiet_since`. A row without a readable time is left out: its period starts
    again, which only waits longer."""
    out: dict[str, float] = {}
    if not isinstance(rows, list):
        return out
    for row in rows:
        if not isinstance(row, Mapping):
            continue
        name, since = row.get("name"), row.get("drainingSince")
        if not isinstance(name, str) or not isinstance(since, str):
            continue
        try:
            out[name] = datetime.datetime.strptime(since, "%Y-%m-%dT%H:%M:%SZ").replace(
                tzinfo=datetime.UTC).timestamp()
        except ValueError:
            continue
    return out


def perm_name(perm: int) -> str:
    return {4: "R", 2: "W", 6: "RW"}.get(perm & 6, str(perm))
