"""The broker as one replica of its group (issue 17, step 4a): election wired to replication and
to registration with the name servers.

:class:`ReplicaService` starts the coordination store and the :class:`~.election.Elector`, then
follows its roles one at a time:

- **master** of epoch E: serves the CommitLog on ``--ha-listen`` (:class:`ReplicationMaster`,
  its epoch history starting E at the log end of the moment) and registers with the name servers
  as brokerId 0 at once, so clients route sends to it at their next route read;
- **follower**: registers as brokerId ``replica_id + 1`` (RocketMQ: slaves have brokerId > 0);
  each answer of a name server names the master's HA address (RocketMQ's RegisterBrokerResult
  ``haServerAddr``, which the master registered), and the replication follower streams from it,
  restarted whenever that address changes;
- **none** (no live master, or this replica's lease is lost): neither.

The in-sync set (Kafka's ISR) is kept by the master through the record: a follower joins it
(``Elector.grow``) once it has acked the master's log end of one check earlier, and leaves it
(``Elector.shrink``) at once when its session ends (its process stopped or died, the connection
broke: writes do not wait for it meanwhile) or when it has not caught up for :data:`LAG_SECONDS`.

**Acknowledgement** (``--replication sync``): a write is answered SEND_OK only when every member
of the record's in-sync set has acked it and the set has at least ``minInSync`` members
(:meth:`replicated`, a future per waiting write, resolved from the followers' acks); a write
that waits longer than :data:`ACK_TIMEOUT` is answered FLUSH_SLAVE_TIMEOUT, and one that finds
(or is left with) fewer than ``minInSync`` members SLAVE_NOT_AVAILABLE, RocketMQ's codes for
"stored on the master, not confirmed on its slaves", so clients retry (a duplicate, never a
loss). The **high-water mark** (:meth:`high_water`) is the lowest offset the in-sync followers
acked; consumers read below it only (the store's ``visible_end``), and their long polls are woken
for a record once it is below it (:meth:`defer`). ``--replication async`` acknowledges after the
local write (RocketMQ's ASYNC_MASTER) and may lose the last moments on failover.

The epoch history (ha/epochs.py) is on disk: a master records its new epoch before it
acknowledges a write of it, a follower adopts its master's before it appends, and the last
group record seen survives a restart.

Invariants:
- :meth:`may_write` is True only while this replica is master and the Elector says it may
  acknowledge (its lease renewal deadline has not passed), so a master that lost its lease stops
  acknowledging at the next send, before any other replica can win; a waiting write is answered
  SEND_OK only under the same condition.
- The in-sync set the acknowledgement rule reads is the record's as last written (the
  Elector's ``known``): a follower leaves it in the store before any write is acknowledged
  without it, so every replica that may be elected holds every acknowledged write.
- Only one role is applied at a time (one task reads ``Elector.roles()``), and the previous
  role's master or follower is closed before the next one starts; leaving the master role
  answers every waiting write FLUSH_SLAVE_TIMEOUT.
- The HA address is found through the name servers, not a new coordination-store key: the
  store's values are group records only.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tidemq.errors import BrokerError
from tidemq.remoting.codes import ResponseCode

from tidemq.broker.config import ReplicaConfig, ReplicationMode
from tidemq.broker.store.config import FlushMode
from tidemq.broker.store.store import MessageStore
from tidemq.broker.store.tasks import cancel_and_wait

from .coordination import MAX_REPLICAS, CoordinationError, CoordinationStore, group_key
from .election import ElectionConfig, ElectionError, Elector, ReplicaPosition, Role, RoleKind
from .epochs import EpochHistory
from .etcd import EtcdConfig, EtcdStore
from .kubernetes import KubernetesLeaseStore
from .replication import ReplicationConfig, ReplicationFollower, ReplicationMaster

log = logging.getLogger(__name__)

# A follower re-reads the master's HA address from the name servers (by registering) until it has
# acked a frame from it: the first answer may still name the old master when the new one has not
# registered yet. The waits double from RESOLVE_FIRST to RESOLVE_INTERVAL (seconds), so that a
# failover's new master is found within ~0.1 s of registering (a few registrations more in a
# failover's first second); once streaming, it re-checks at the slower interval.
RESOLVE_FIRST = 0.05
RESOLVE_INTERVAL = 0.5
RESOLVE_STREAMING_INTERVAL = 5.0
# A master checks its followers' acked offsets this often (seconds) to grow and shrink the
# in-sync set, and answers waiting writes past their deadline.
IN_SYNC_INTERVAL = 0.1
# An in-sync follower that has not acked the master's log end of some moment within this many
# seconds (or whose session ended) leaves the in-sync set (Kafka: replica.lag.time.max.ms).
LAG_SECONDS = 2.0
# A write waits at most this long for the in-sync followers' acks, then is answered
# FLUSH_SLAVE_TIMEOUT: longer than LAG_SECONDS, so that a stalled follower is usually dropped from
# the set first and the write acknowledged; shorter than clients' 3 s send timeout.
ACK_TIMEOUT = 2.5
# A planned switchover waits this long for its target to hold the master's log end.
SWITCHOVER_CATCH_UP = 5.0
# s: at most this long a stopping master spends handing over (then the group elects)
STOP_HANDOVER_SECONDS = 8.0
# s: an elected replica whose --ha-listen did not bind, alone in sync, tries it again this often
HA_LISTEN_RETRY = 1.0
# s: a master whose disk refuses a write hands mastership over at most this often (when every
# replica's disk is full, mastership must not circle the group)
DISK_HANDOVER_INTERVAL = 30.0

_SUCCESS = int(ResponseCode.SUCCESS)
_FLUSH_SLAVE_TIMEOUT = int(ResponseCode.FLUSH_SLAVE_TIMEOUT)
_SLAVE_NOT_AVAILABLE = int(ResponseCode.SLAVE_NOT_AVAILABLE)


@dataclass(frozen=True, slots=True)
class FollowerLag:
    replica_id: int
    acked: int  # CommitLog offset it has acked
    lag_bytes: int  # the master's log end minus that


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    """This replica as admin requests, metrics and the operator see it."""

    replica_id: int
    role: str  # "master" | "follower" | "none"
    epoch: int
    master: int | None
    in_sync: tuple[int, ...]
    min_in_sync: int
    replication: str  # "sync" | "async"
    log_end: int
    high_water: int
    followers: tuple[FollowerLag, ...]  # as master: the connected followers
    failovers: int  # times this replica became master by an election
    last_failover_seconds: float | None  # no live master seen -> this replica master
    switchovers: int  # planned hand-overs this replica made as master
    deposed: int = 0  # masters this replica deposed, their replication address refusing (Elector.depose)


def open_store(config: ReplicaConfig) -> CoordinationStore:
    """The coordination store ``--coordination`` names."""
    if isinstance(config.coordination, EtcdConfig):
        return EtcdStore(config.coordination)
    return KubernetesLeaseStore(config.coordination)


def parse_addr(addr: str) -> tuple[str, int] | None:
    host, sep, port = addr.rpartition(":")
    return (host.strip("[]"), int(port)) if sep and host and port.isdigit() else None


class ReplicaService:
    """This broker's part in its replicated group (see the module docstring).

    ``register`` registers with every name server and returns the master's HA address the
    answers named ("" when none did); ``store_factory`` is a test seam for the coordination store.
    """

    def __init__(self, config: ReplicaConfig, *, cluster: str, broker_name: str, store: MessageStore,
                 register: Callable[[], Awaitable[str]],
                 store_factory: Callable[[ReplicaConfig], CoordinationStore] = open_store) -> None:
        self.config = config
        self.store = store
        self._register = register
        self._coordination = store_factory(config)
        self._replication = ReplicationConfig(cluster, broker_name)
        self.elector = Elector(
            self._coordination, group_key(cluster, broker_name), config.replica_id, self._position,
            ElectionConfig(lease_seconds=config.lease_seconds, allow_unclean=config.allow_unclean_election,
                           min_in_sync=config.min_in_sync))
        self.history = EpochHistory(store.config.root)
        # How a follower cuts a diverged tail; the broker adds undoing its metadata changes.
        self.truncate: Callable[[int], Awaitable[None]] = store.truncate
        self.role: Role = self.elector.role
        self.epoch = 0  # the highest epoch this replica has seen
        self.master: ReplicationMaster | None = None
        self.follower: ReplicationFollower | None = None
        self._roles_task: asyncio.Task[None] | None = None
        self._resolve_task: asyncio.Task[None] | None = None
        self._in_sync_task: asyncio.Task[None] | None = None
        self._expire_task: asyncio.Task[None] | None = None
        self._depose_task: asyncio.Task[None] | None = None
        self._disk_task: asyncio.Task[None] | None = None  # a hand-over after a refused write
        self._disk_handover_at = float("-inf")
        self._deposed = 0  # masters this replica deposed (their address refused)
        self._sync = config.replication is ReplicationMode.SYNC
        # Acknowledgement (master, sync): writes waiting for acks, by end offset; the high-water
        # mark; long-poll wake-ups held until their record is below it.
        self._waiters: list[tuple[int, int, float, Callable[[int], None]]] = []
        self._seq = itertools.count()
        self._high_water = 0
        self._deferred: deque[tuple[int, Callable[[], None]]] = deque()
        self._caught_up_at: dict[int, float] = {}
        self._handing_over = False
        self._stopping = False  # a graceful stop has begun: no write is stored any more
        self._leaderless_since: float | None = None
        self._failovers = 0
        self._last_failover: float | None = None
        self._switchovers = 0

    @property
    def broker_id(self) -> int:
        """The brokerId to register: 0 as master, ``replica_id + 1`` otherwise (RocketMQ: slaves > 0)."""
        return 0 if self.role.kind is RoleKind.MASTER else self.config.replica_id + 1

    def may_write(self) -> bool:
        """True while this replica may store and acknowledge a send (the send path asks)."""
        return self.role.kind is RoleKind.MASTER and \
            self.elector.may_acknowledge(asyncio.get_running_loop().time())

    def master_refusal(self) -> tuple[int, str] | None:
        """Why this replica may not store a write now (not the acknowledging master, handing
        over, or stopping): (SERVICE_NOT_AVAILABLE, remark), or None."""
        if self._stopping:
            return (int(ResponseCode.SERVICE_NOT_AVAILABLE),
                    f"replica {self.config.replica_id} is stopping: refresh the route and send to brokerId 0")
        if not self.may_write():
            return (int(ResponseCode.SERVICE_NOT_AVAILABLE),
                    f"replica {self.config.replica_id} is not the master of its group "
                    f"({self.role.kind.value}): refresh the route and send to brokerId 0")
        if self._handing_over:
            return (int(ResponseCode.SERVICE_NOT_AVAILABLE),
                    f"replica {self.config.replica_id} is handing mastership over (switchover): "
                    "refresh the route and send to the new brokerId 0")
        return None

    def write_refusal(self) -> tuple[int, str] | None:
        """Why a change must be refused before it is made: :meth:`master_refusal`, or too few
        replicas in sync (SLAVE_NOT_AVAILABLE). Sends are stored and answered SLAVE_NOT_AVAILABLE
        instead (RocketMQ's answer carries the send header its clients decode)."""
        refusal = self.master_refusal()
        if refusal is not None:
            return refusal
        known = self.elector.known
        if self._sync and known is not None and len(known.in_sync) < known.min_in_sync:
            return (_SLAVE_NOT_AVAILABLE,
                    f"only {len(known.in_sync)} replica(s) in sync ({_ids(known.in_sync)}), fewer than "
                    f"minInSync {known.min_in_sync}: not stored; retry when a follower has caught up")
        return None

    def replicated(self, end_offset: int) -> "asyncio.Future[int] | None":
        """The acknowledgement gate for a write stored up to ``end_offset`` (see the docstring):
        None when it is acknowledged already, else a future of SUCCESS, FLUSH_SLAVE_TIMEOUT or
        SLAVE_NOT_AVAILABLE."""
        if self.master is not None and not self._sync:
            return None
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        code = self.when_replicated(end_offset, functools.partial(_resolve, fut))
        if code == _SUCCESS:
            return None
        if code is not None:
            fut.set_result(code)
        return fut

    def when_replicated(self, end_offset: int, callback: Callable[[int], None]) -> int | None:
        """:meth:`replicated` as a callback (hot path: sends): the answer's code now (SUCCESS:
        acknowledged already; FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE: refused at once), or
        None, and ``callback(code)`` is called once the group's rule holds it, or at the
        deadline, in the step that learns it (an ack's, the expiry's): no loop turn between the
        follower's ack and the send's answer."""
        if self.master is None:  # the role changed while the write was prepared
            return _FLUSH_SLAVE_TIMEOUT
        # No wake here: the store woke the streams when the write entered the CommitLog
        # (store.on_commit, set with the master).
        if not self._sync:
            return _SUCCESS
        if end_offset > self._high_water and self._solo():
            self._advance()  # alone in sync: its own write is the mark
        if end_offset <= self._high_water and self._acknowledging():
            return _SUCCESS
        known = self.elector.known
        if known is not None and len(known.in_sync) < known.min_in_sync:
            return _SLAVE_NOT_AVAILABLE  # fails fast: clients send it again elsewhere
        deadline = asyncio.get_running_loop().time() + ACK_TIMEOUT
        heapq.heappush(self._waiters, (end_offset, next(self._seq), deadline, callback))
        return None

    def high_water(self) -> int:
        """CommitLog offset below which every record is acknowledged by the group's rule; consumers
        read below it only. A master computes it, a follower learns its master's from the
        replication frames (a follower serves reads below it), a replica between roles keeps the
        last it knew. Without sync replication: this log's end."""
        end = self.store.commitlog_max_offset
        if not self._sync:
            return end
        if self.master is not None and end > self._high_water and self._solo():
            self._advance()
        return min(self._high_water, end)

    def defer(self, wake: Callable[[], None]) -> None:
        """Run ``wake`` (a long-poll notification of the record just stored) once that record is
        below the high-water mark: at once without sync replication."""
        if not self._sync:
            wake()
            return
        end = self.store.commitlog_max_offset
        if end > self._high_water and self.master is not None and self._solo():
            self._advance()
        if end <= self._high_water:
            wake()
        else:
            self._deferred.append((end, wake))

    def _solo(self) -> bool:
        known = self.elector.known
        return known is not None and known.in_sync == (self.config.replica_id,)

    def _raise_mark(self, mark: int) -> None:
        """The high-water mark moved up to ``mark``: wake the long polls waiting below it."""
        if mark > self._high_water:
            self._high_water = mark
            deferred = self._deferred
            while deferred and deferred[0][0] <= mark:
                deferred.popleft()[1]()

    def _learn_mark(self, mark: int) -> None:
        """As follower: the master's mark, as far as this log holds it."""
        self._raise_mark(min(mark, self.store.commitlog_max_offset))

    def status(self) -> ReplicaStatus:
        known = self.elector.known
        end = self.store.commitlog_max_offset
        master = self.master
        followers = () if master is None else tuple(
            FollowerLag(r, st.acked, max(0, end - st.acked)) for r, st in sorted(master.followers().items()))
        return ReplicaStatus(
            replica_id=self.config.replica_id, role=self.role.kind.value, epoch=self.epoch,
            master=known.master if known is not None else None,
            in_sync=tuple(sorted(known.in_sync)) if known is not None else (),
            min_in_sync=known.min_in_sync if known is not None else self.config.min_in_sync,
            replication=self.config.replication.value, log_end=end, high_water=self.high_water(),
            followers=followers, failovers=self._failovers, last_failover_seconds=self._last_failover,
            switchovers=self._switchovers, deposed=self._deposed)

    async def switchover(self, to: int | None, leaving: bool = False) -> int:
        """A planned hand-over to in-sync follower ``to`` (None: the one that acked the most).

        New writes are refused (SERVICE_NOT_AVAILABLE: clients refresh and retry on the new
        master) while the target catches up to this log's end and waiting writes are answered;
        then the record names the target at epoch + 1. Raises BrokerError when it cannot."""
        master, known = self.master, self.elector.known
        me = self.config.replica_id
        if master is None or known is None or not self.may_write():
            raise _refusal(ResponseCode.SERVICE_NOT_AVAILABLE,
                           f"replica {me} is not the master of its group: send the switchover to brokerId 0")
        if self._handing_over:
            raise _refusal(ResponseCode.SYSTEM_ERROR, f"replica {me} is already handing over")
        candidates = {r: st.acked for r, st in master.followers().items() if r in known.in_sync and r != me}
        if to is None:
            if not candidates:
                raise _refusal(ResponseCode.SYSTEM_ERROR, f"no follower of replica {me} is in sync ({_ids(known.in_sync)}): "
                                  "wait until one has caught up")
            to = max(candidates, key=lambda r: (candidates[r], -r))
        elif to == me:
            raise _refusal(ResponseCode.SYSTEM_ERROR, f"replica {to} is the master already")
        elif to not in candidates:
            raise _refusal(ResponseCode.SYSTEM_ERROR, f"replica {to} is not an in-sync follower connected to this master "
                              f"(in sync: {_ids(known.in_sync)}); choose one of those or wait")
        self._handing_over = True
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + SWITCHOVER_CATCH_UP
            while True:
                end = self.store.commitlog_max_offset
                state = master.followers().get(to)
                if state is not None and state.acked >= end and not self._waiters:
                    break
                if loop.time() > deadline:
                    raise _refusal(ResponseCode.SYSTEM_ERROR, f"replica {to} did not catch up to offset {end} within "
                                      f"{SWITCHOVER_CATCH_UP:g} s; nothing changed, try again")
                master.wake()
                await asyncio.sleep(0.01)
            if not await self.elector.hand_over(to, leaving):
                raise _refusal(ResponseCode.SYSTEM_ERROR, f"replica {me} could not write the hand-over (no longer master?)")
        finally:
            self._handing_over = False
        self._switchovers += 1
        log.warning("replica %d handed mastership of epoch %d over to replica %d", me, self.epoch, to)
        return to

    def _write_failed(self, exc: OSError) -> None:
        """As master: a put could not make a store file it needs (a full or failing disk; Kafka
        moves leadership off a failed log directory too). Hand mastership over to the in-sync
        follower furthest ahead, as a planned switchover does (nothing acknowledged is lost;
        clients wait for the new master), at most once per DISK_HANDOVER_INTERVAL. Without such a
        follower this replica stays master and refuses writes until it can write again."""
        loop = asyncio.get_running_loop()
        if self._handing_over or self._stopping or (self._disk_task is not None and not self._disk_task.done()) \
                or loop.time() - self._disk_handover_at < DISK_HANDOVER_INTERVAL:
            return
        self._disk_handover_at = loop.time()
        self._disk_task = asyncio.create_task(self._hand_over_for_disk(exc), name="replica-disk-handover")

    async def _hand_over_for_disk(self, exc: OSError) -> None:
        me = self.config.replica_id
        try:
            to = await self.switchover(None)
        except (BrokerError, CoordinationError, TimeoutError) as err:
            log.error("replica %d cannot write to its store (%s) and cannot hand mastership over (%s): "
                      "writes are refused until it can; free space under its --store", me, exc, err)
            return
        log.error("replica %d handed mastership over to replica %d: its store refused a write (%s). It "
                  "follows from now on and rejoins the in-sync set once it can write again: free space "
                  "under its --store", me, to, exc)

    def _acknowledging(self) -> bool:
        known = self.elector.known
        return known is not None and len(known.in_sync) >= known.min_in_sync and self.may_write()

    def _advance(self) -> None:
        """Recompute the high-water mark from the in-sync followers' acks; answer waiting writes."""
        master, known = self.master, self.elector.known
        me = self.config.replica_id
        if master is None or known is None or known.master != me:
            return
        hw = self.store.commitlog_max_offset
        followers = master.followers()
        for r in known.in_sync:
            if r != me:
                state = followers.get(r)
                hw = min(hw, state.acked if state is not None else -1)
        self._raise_mark(hw)
        waiters = self._waiters
        if not waiters:
            return
        if len(known.in_sync) < known.min_in_sync:
            self._answer_all(_SLAVE_NOT_AVAILABLE)
            return
        if not self.may_write():
            return  # answered FLUSH_SLAVE_TIMEOUT at their deadline, or when the role goes
        while waiters and waiters[0][0] <= self._high_water:
            _answer(heapq.heappop(waiters)[3], _SUCCESS)

    def _answer_all(self, code: int) -> None:
        waiters, self._waiters = self._waiters, []
        for _end, _seq, _deadline, callback in waiters:
            _answer(callback, code)

    def _expire(self, now: float) -> None:
        """Answer FLUSH_SLAVE_TIMEOUT to the writes waiting past their deadline."""
        if not self._waiters or min(w[2] for w in self._waiters) > now:
            return
        keep = []
        for w in self._waiters:
            if w[2] <= now:
                _answer(w[3], _FLUSH_SLAVE_TIMEOUT)
            else:
                keep.append(w)
        heapq.heapify(keep)
        self._waiters = keep

    def _position(self) -> ReplicaPosition:
        return ReplicaPosition(self.store.commitlog_max_offset, max(self.epoch, self.history.last_epoch))

    def _on_role(self, role: Role) -> None:
        """Elector callback: remember the record, time a failover from a lapsed master."""
        known = self.elector.known
        if known is not None:
            self.history.remember(known)
        now = asyncio.get_running_loop().time()
        if role.kind is RoleKind.NONE:
            if self._leaderless_since is None:
                self._leaderless_since = now
        elif role.kind is RoleKind.MASTER and self._leaderless_since is not None:
            self._failovers += 1
            self._last_failover = now - self._leaderless_since
            self._leaderless_since = None
        else:
            self._leaderless_since = None

    async def start(self) -> None:
        self.history.load(self.store.commitlog_max_offset)
        if self.history.record is not None:
            self.elector.known = self.history.record
            self.epoch = self.history.record.epoch
        self.elector.on_role = self._on_role
        await self.elector.start()
        self._roles_task = asyncio.create_task(self._follow_roles(), name="replica-roles")
        log.info("replica %d of %s/%s: election started (lease %g s, %s replication, min in-sync %d)",
                 self.config.replica_id, self._replication.cluster, self._replication.broker_name,
                 self.config.lease_seconds, self.config.replication.value, self.config.min_in_sync)

    async def prepare_stop(self) -> None:
        """The first step of a graceful stop (Kafka's controlled shutdown): no write is stored
        from now on; a master hands mastership over to its best in-sync follower, leaving the
        in-sync set with it, and waits (bounded) until the follower has taken the record, so
        that clients find the new master before this one unregisters. Best effort: when no
        follower can take over, the group elects once this replica's lease is revoked."""
        me = self.config.replica_id
        if self.role.kind is RoleKind.MASTER and self.master is not None:
            loop = asyncio.get_running_loop()
            started = loop.time()
            try:
                async with asyncio.timeout(STOP_HANDOVER_SECONDS):
                    to = await self.switchover(None, leaving=True)
                    while not ((k := self.elector.known) is not None and k.master == to
                               and k.handed_over_by is None):
                        await asyncio.sleep(0.01)
                log.warning("replica %d stopping: replica %d took mastership over in %.2f s", me, to,
                            loop.time() - started)
            except (BrokerError, CoordinationError, TimeoutError) as exc:
                log.warning("replica %d stopping without a hand-over (%s): the group elects once its "
                            "lease is revoked", me, exc)
        self._stopping = True

    async def stop(self) -> None:
        self._stopping = True
        await cancel_and_wait(self._roles_task, self._depose_task, self._disk_task)
        await self._leave_role()
        for _end, wake in self._deferred:
            wake()
        self._deferred.clear()
        await self.elector.close()  # revokes the lease: the others elect without waiting for it
        self.role = self.elector.role
        await self._coordination.close()

    async def _follow_roles(self) -> None:
        async for role in self.elector.roles():
            try:
                await self._apply(role)
            except (OSError, asyncio.TimeoutError) as exc:
                log.error("replica %d could not become %s of epoch %d: %s", self.config.replica_id,
                          role.kind.value, role.epoch, exc)
                if role.kind is RoleKind.MASTER:
                    await self._cannot_serve(role)

    async def _cannot_serve(self, role: Role) -> None:
        """Elected, but the replication listener did not start (``--ha-listen`` in use, or not an
        address of this host): no follower can reach this replica, and it refuses writes. It
        gives mastership up for another in-sync replica to take (:meth:`Elector.resign`); alone
        in sync, it tries the listener again each second while it is master."""
        me = self.config.replica_id
        cfg = self.config
        said = False
        while self.elector.role == role:
            try:
                if await self.elector.resign():
                    log.error("replica %d gave mastership of epoch %d up: it cannot listen for its followers "
                              "on %s:%d (--ha-listen); another in-sync replica is elected. Free that address "
                              "or change --ha-listen, then restart this replica", me, role.epoch,
                              cfg.ha_host, cfg.ha_port)
                    return
            except ElectionError as exc:
                if not said:
                    log.error("replica %d keeps trying to listen on %s:%d each second (%s); it refuses "
                              "writes until then", me, cfg.ha_host, cfg.ha_port, exc)
                    said = True
            except (CoordinationError, TimeoutError) as exc:
                log.warning("replica %d could not give mastership up (%s); retrying", me, exc)
            await asyncio.sleep(HA_LISTEN_RETRY)
            if self.elector.role != role:
                return
            try:
                await self._apply(role)
                log.warning("replica %d listens for its followers on %s:%d at last", me, cfg.ha_host, cfg.ha_port)
                return
            except (OSError, asyncio.TimeoutError):
                pass

    async def _apply(self, role: Role) -> None:
        await self._leave_role()
        self.epoch = max(self.epoch, role.epoch)
        cfg = self.config
        if role.kind is RoleKind.MASTER:
            await self.store.finish_cut()  # a cut it made as follower and could not finish: first
            start = self.store.commitlog_max_offset
            if role.epoch > self.history.last_epoch:  # on disk before any write of the epoch
                self.history.begin(role.epoch, start)
            master = ReplicationMaster(self.store, self._replication, role.epoch, self.history.entries,
                                       on_change=self._advance, high_water=self.high_water)
            await master.start(cfg.ha_host, cfg.ha_port)
            self.master = master
            self.store.on_commit = master.wake  # frames leave before the master dispatches a put
            self.store.on_write_failed = self._write_failed
            # The mark stays what this replica last knew (its old master's, learnt as follower):
            # the tail of its log past it may be missing on other in-sync replicas, so the
            # in-sync followers' acks raise it from there (at once when alone in sync).
            self._high_water = min(self._high_water, start)
            self._caught_up_at = {r: asyncio.get_running_loop().time() for r in range(MAX_REPLICAS)}
            self.role = role
            log.warning("replica %d is MASTER of epoch %d (log end %d); registering as brokerId 0",
                        cfg.replica_id, role.epoch, start)
            self._in_sync_task = asyncio.create_task(self._keep_in_sync(master), name="replica-in-sync")
            self._expire_task = asyncio.create_task(self._expire_waiting(), name="replica-ack-deadlines")
            self._advance()
            await self._register()
        elif role.kind is RoleKind.FOLLOWER:
            self.role = role
            log.warning("replica %d FOLLOWS replica %s at epoch %d; registering as brokerId %d",
                        cfg.replica_id, role.master, role.epoch, self.broker_id)
            self._resolve_task = asyncio.create_task(self._resolve_master(role), name="replica-resolve")
        else:
            self.role = role
            log.warning("replica %d has no role (no live master, or its lease is lost): refusing sends",
                        cfg.replica_id)
            with contextlib.suppress(Exception):  # best effort: the periodic round retries
                await self._register()

    async def _resolve_master(self, role: Role) -> None:
        """As follower: register, learn the master's HA address from the answers, follow it."""
        following = ""
        wait = RESOLVE_FIRST
        while True:
            try:
                addr = await self._register()
            except Exception:  # noqa: BLE001 (a failed round is logged by the registrar; retried)
                log.exception("replica %d: registration failed", self.config.replica_id)
                addr = ""
            target = parse_addr(addr) if addr and addr != self.config.ha_advertise else None
            if target is not None and addr != following:
                if self.follower is not None:
                    await self.follower.close()
                self.follower = ReplicationFollower(
                    self.store, self._replication, self.config.replica_id, max(role.epoch, self.epoch), target,
                    history=self.history, ack_flushed=self.store.config.flush_mode is FlushMode.SYNC,
                    on_high_water=self._learn_mark, truncate=self.truncate,
                    on_refused=functools.partial(self._master_refused, role))
                self.follower.start()
                following = addr
                log.info("replica %d replicates from the master's HA address %s (epoch %d)",
                         self.config.replica_id, addr, role.epoch)
            if self.follower is not None and self.follower.acked >= 0:  # streaming
                await asyncio.sleep(RESOLVE_STREAMING_INTERVAL)
            else:
                await asyncio.sleep(wait)
                wait = min(2 * wait, RESOLVE_INTERVAL)

    def _master_refused(self, role: Role, welcomed: int) -> None:
        """As follower of ``role``: the master's replication address, which welcomed this replica
        at epoch ``welcomed``, refuses connections. When that is the epoch followed, the master of
        it is gone (its listener closes only with its process or its role): depose it rather than
        wait out its lease (:meth:`Elector.depose`)."""
        # Sync replication only: its acknowledgement rule is what makes a deposition safe
        # without the lease (Elector.depose); an async master acknowledges alone, and only its
        # lease stops it before another replica wins.
        if not self._sync or welcomed != role.epoch or role.master is None or self.role != role or \
                (self._depose_task is not None and not self._depose_task.done()):
            return
        self._depose_task = asyncio.create_task(self._depose(role), name="replica-depose")

    async def _depose(self, role: Role) -> None:
        assert role.master is not None
        try:
            if await self.elector.depose(role.epoch, role.master):
                self._deposed += 1
        except (CoordinationError, TimeoutError) as exc:
            log.warning("replica %d could not depose replica %d (master of epoch %d) after its "
                        "address refused (%s); its lease runs out instead", self.config.replica_id,
                        role.master, role.epoch, exc)

    async def _expire_waiting(self) -> None:
        """As master: answer waiting writes FLUSH_SLAVE_TIMEOUT at their deadline, and all of them
        once this replica may no longer acknowledge (its lease renewal deadline passed). Its own
        task: a shrink or grow waiting on an unreachable coordination store must not hold them."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(IN_SYNC_INTERVAL)
            if self._waiters and not self.may_write():
                self._answer_all(_FLUSH_SLAVE_TIMEOUT)
            self._expire(loop.time())

    async def _keep_in_sync(self, master: ReplicationMaster) -> None:
        """As master: grow and shrink the in-sync set (see the docstring)."""
        loop = asyncio.get_running_loop()
        me = self.config.replica_id
        end = self.store.commitlog_max_offset
        while True:
            await asyncio.sleep(IN_SYNC_INTERVAL)
            now = loop.time()
            known = self.elector.known
            in_sync = known.in_sync if known is not None else ()
            followers = master.followers()
            ended = master.ended()
            for r, state in followers.items():
                if state.acked >= end:
                    self._caught_up_at[r] = now
            for r in in_sync:
                if r != me and r in ended:
                    await self._change_in_sync(self.elector.shrink, r, "left the in-sync set: its session ended")
                elif r != me and now - self._caught_up_at.get(r, now) > LAG_SECONDS:
                    await self._change_in_sync(self.elector.shrink, r, "left the in-sync set: "
                                               + ("no session" if r not in followers else
                                                  f"not caught up for {LAG_SECONDS:g} s"))
            for r, state in followers.items():
                if r not in in_sync and state.acked >= end:
                    await self._change_in_sync(self.elector.grow, r, f"is in sync at offset {state.acked}")
            if known is not None and known.min_in_sync != self.config.min_in_sync:
                await self._adopt_min_in_sync(known.min_in_sync)
            self._advance()
            end = self.store.commitlog_max_offset

    async def _change_in_sync(self, change: Callable[[int], Awaitable[bool]], replica: int, what: str) -> None:
        try:
            if await change(replica):
                log.warning("replica %d %s (epoch %d)", replica, what, self.epoch)
                self._advance()
        except (CoordinationError, TimeoutError) as exc:
            log.warning("replica %d could not record that replica %d %s (%s); retrying",
                        self.config.replica_id, replica, what, exc)

    async def _adopt_min_in_sync(self, was: int) -> None:
        """Write this replica's ``--min-in-sync`` into the record (an operator changed it)."""
        n = self.config.min_in_sync
        try:
            if await self.elector.set_min_in_sync(n):
                log.warning("the group's minInSync is now %d (was %d): --min-in-sync of its master", n, was)
                self._advance()
        except (CoordinationError, TimeoutError) as exc:
            log.warning("replica %d could not write minInSync %d (%s); retrying", self.config.replica_id, n, exc)

    async def _leave_role(self) -> None:
        await cancel_and_wait(self._resolve_task, self._in_sync_task, self._expire_task)
        self._resolve_task = self._in_sync_task = self._expire_task = None
        follower, self.follower = self.follower, None
        if follower is not None:
            self.epoch = max(self.epoch, follower.epoch)
            await follower.close()
        master, self.master = self.master, None
        if master is not None:
            self.store.on_commit = self.store.on_write_failed = None
            self._answer_all(_FLUSH_SLAVE_TIMEOUT)
            for _end, wake in self._deferred:  # a consumer then finds nothing new, or its record
                wake()
            self._deferred.clear()
            await master.close()


def _answer(callback: Callable[[int], None], code: int) -> None:
    """Tell a waiting write its code; a failing callback is the caller's bug, logged, and must
    not keep the others (or the ack being read) from going on."""
    try:
        callback(code)
    except Exception:
        log.exception("answering a replicated write failed")


def _resolve(fut: "asyncio.Future[int]", code: int) -> None:
    if not fut.done():  # its awaiting task may have been cancelled
        fut.set_result(code)


def _ids(replicas: tuple[int, ...]) -> str:
    return ",".join(map(str, sorted(replicas))) or "none"


def _refusal(code: ResponseCode, remark: str) -> BrokerError:
    return BrokerError(remark, int(code))
