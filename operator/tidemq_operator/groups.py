"""ConsumerGroup custom resources -> subscription group settings, and their status (pure).

Invariants:
- ``group_spec`` returns validated settings whose defaults match RocketMQ's
  SubscriptionGroupConfig (consume enabled, broadcast enabled, 16 retries, 1 retry queue,
  consume from min enabled), or raises InvalidSpec naming the field.
- A pass writes only the status fields that changed (:func:`status_changes`): every pass
  measures the lag, and with every timer pass of every group writing a fresh timestamp, the API
  server's load grew with the number of groups for nothing. ``lastLagTime`` is therefore when
  the lag last changed, not when it was last measured.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from tidemq.operator.topics import InvalidSpec, cluster_ref

MAX_GROUP_LENGTH = 255
_GROUP_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789%|-_")


class GroupSettings(TypedDict):
    """The keyword arguments of ``Admin.update_subscription_group`` besides the group and where to
    send it (a TypedDict, so that the type checker matches ``**settings`` to that signature)."""

    consume_enable: bool
    consume_broadcast_enable: bool
    retry_max_times: int
    retry_queue_nums: int
    consume_from_min_enable: bool


@dataclass(frozen=True, slots=True)
class GroupSpec:
    cluster: str
    group_name: str
    consume_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_max_times: int = 16
    retry_queue_nums: int = 1
    consume_from_min_enable: bool = True

    def admin_kwargs(self) -> GroupSettings:
        """Keyword arguments of ``Admin.update_subscription_group`` (besides the group)."""
        return {
            "consume_enable": self.consume_enable,
            "consume_broadcast_enable": self.consume_broadcast_enable,
            "retry_max_times": self.retry_max_times,
            "retry_queue_nums": self.retry_queue_nums,
            "consume_from_min_enable": self.consume_from_min_enable,
        }


def _bool(spec: Mapping, key: str, default: bool) -> bool:
    value = spec.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidSpec(f"spec.{key} must be a boolean, got {value!r}")
    return value


def _int(spec: Mapping, key: str, default: int, lo: int, hi: int) -> int:
    value = spec.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidSpec(f"spec.{key} must be an integer between {lo} and {hi}, got {value!r}")
    return value


def group_spec(name: str, spec: Mapping) -> GroupSpec:
    """Validate a ConsumerGroup's spec (``name`` is metadata.name, the default group name)."""
    cluster = cluster_ref(spec)
    group = spec.get("groupName") or name
    if not isinstance(group, str) or not group:
        raise InvalidSpec(f"spec.groupName must be a non-empty string, got {group!r}")
    if len(group) > MAX_GROUP_LENGTH:
        raise InvalidSpec(f"group name {group!r} is longer than {MAX_GROUP_LENGTH} characters")
    bad = sorted(set(group) - _GROUP_CHARS)
    if bad:
        raise InvalidSpec(f"group name {group!r} contains {''.join(bad)!r}; "
                          "allowed are letters, digits, %|-_")
    return GroupSpec(
        cluster=cluster,
        group_name=group,
        consume_enable=_bool(spec, "consumeEnable", True),
        consume_broadcast_enable=_bool(spec, "consumeBroadcastEnable", True),
        retry_max_times=_int(spec, "retryMaxTimes", 16, -1, 10_000),
        retry_queue_nums=_int(spec, "retryQueueNums", 1, 0, 1024),
        consume_from_min_enable=_bool(spec, "consumeFromMinEnable", True),
    )


# The status fields that measure the lag: lastLagTime moves when one of them does.
_LAG_FIELDS = ("lag", "totalLag")


def status_changes(old: Mapping[str, Any], new: Mapping[str, Any], now: str) -> dict[str, Any]:
    """The fields of ``new`` (a pass's ConsumerGroup status) that differ from ``old`` (the stored
    status), with ``lastLagTime`` = ``now`` when the lag changed or none was written yet. Empty
    when the pass changed nothing: then no status is written."""
    changed = {k: v for k, v in new.items() if old.get(k) != v}
    if any(k in changed for k in _LAG_FIELDS) or not old.get("lastLagTime"):
        changed["lastLagTime"] = now
    return changed
