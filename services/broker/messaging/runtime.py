"""The broker's runtime family: what it reports about itself (GET_BROKER_RUNTIME_INFO, read by
``tidemq admin clusterList``, RocketMQ's mqadmin and the operator) and the planned hand-over of a
replicated group's mastership (SWITCHOVER, issue 17).

Invariants:
- Only values the broker can honestly give are reported: counters since it started, the store's
  offsets and disk ratio, and, for a replica, its :class:`~tidemq.broker.ha.replica.ReplicaStatus`
  read at the moment of the request. RocketMQ's rates and "yesterday"/"this morning" totals need a
  sampler this broker does not run, so they are absent, not invented.
- A switchover is only ever asked of this broker's own group (a request naming another group is
  refused, so a stale address cannot move the wrong group) and only of a replica; what the replica
  refuses (not master, target not in sync, no in-sync follower) is answered with its code and
  sentence unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from tidemq import __version__
from tidemq.broker.messaging.context import refused
from tidemq.remoting.codes import ResponseCode

if TYPE_CHECKING:
    from tidemq.broker.ha.replica import ReplicaStatus
    from tidemq.broker.store.store import MessageStore


class Replica(Protocol):
    """What this family uses of :class:`tidemq.broker.ha.replica.ReplicaService`."""

    def status(self) -> ReplicaStatus: ...

    async def switchover(self, to: int | None) -> int: ...


@dataclass(frozen=True, slots=True)
class BrokerRuntime:
    """GET_BROKER_RUNTIME_INFO: the broker at the moment of the request."""

    version: str  # TideMQ's release
    boot_ms: int  # when this broker was built (ms since the epoch)
    messages_in: int  # messages stored since it started
    messages_out: int  # messages returned to pulls since it started
    commitlog_min_offset: int
    commitlog_max_offset: int
    unflushed_bytes: int  # CommitLog bytes written but not known to be on disk yet
    disk_usage_ratio: float
    replica: ReplicaStatus | None  # None: not a replica (no --coordination)
    # The transaction checker's progress in the half queue: every half message below it is
    # committed, rolled back or discarded (the scale-in waits until it reaches the queue's end).
    transaction_half_progress: int = 0


class RuntimeService:
    """``totals`` gives (messages stored, messages served) since the broker started; ``replica``
    is the broker's ReplicaService, or None without ``--coordination``; ``half_progress`` the
    transaction checker's progress offset in the half queue."""

    def __init__(self, *, broker_name: str, store: MessageStore, totals: Callable[[], tuple[int, int]],
                 replica: Replica | None, clock: Callable[[], float],
                 half_progress: Callable[[], int] = lambda: 0) -> None:
        self._broker_name = broker_name
        self._store = store
        self._totals = totals
        self._replica = replica
        self._half_progress = half_progress
        self._boot_ms = int(clock() * 1000)

    def runtime(self) -> BrokerRuntime:
        stats = self._store.stats()
        max_offset = int(stats["commitlog_max_offset"])
        messages_in, messages_out = self._totals()
        return BrokerRuntime(
            version=__version__,
            boot_ms=self._boot_ms,
            messages_in=messages_in,
            messages_out=messages_out,
            commitlog_min_offset=int(stats["commitlog_min_offset"]),
            commitlog_max_offset=max_offset,
            unflushed_bytes=max(0, max_offset - int(stats["flushed_offset"])),
            disk_usage_ratio=float(stats["disk_usage_ratio"]),
            replica=None if self._replica is None else self._replica.status(),
            transaction_half_progress=self._half_progress(),
        )

    async def switchover(self, broker_name: str, to: int | None) -> int:
        """Hand this group's mastership to replica ``to`` (None: the in-sync follower furthest
        ahead); the id of the replica that takes over. Raises the refusal to answer with."""
        if broker_name != self._broker_name:
            raise refused(ResponseCode.SYSTEM_ERROR,
                          f"this broker belongs to group {self._broker_name}, not {broker_name or '(none named)'}: "
                          f"send the switchover to the master (brokerId 0) of {broker_name or 'the group'}")
        if self._replica is None:
            raise refused(ResponseCode.SYSTEM_ERROR,
                          f"broker {self._broker_name} runs alone (no --coordination): it has no replica "
                          "to hand mastership to; run the group's brokers with --coordination and --replica-id")
        return await self._replica.switchover(to)
