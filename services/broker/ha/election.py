"""Election of a broker group's master over the coordination store (issue 17, step 1).

Pure decisions first (who may campaign, the order candidates go in, the records a winner, a
shrinking or growing master and a hand-over write), then :class:`Elector`, one replica's async loop
that applies them to a :class:`~tidemq.broker.ha.coordination.CoordinationStore`.

How an election runs. The group record is written under its master's lease, so it reads as absent
once that master stops renewing. A replica that finds no live master and may campaign (it is in
the in-sync set of the last record it saw and holds at least that record's ``masterLogEnd``, or
unclean election is allowed explicitly) announces its log end under its own lease
(:func:`candidate_key`), reads the others' announcements, waits ``rank * backoff_step`` (the best
candidate, by in-sync first, then highest log end, then lowest replica id, waits nothing), reads
the record again and proposes itself by compare-and-swap at the revision it read. Only one
proposal per revision succeeds, so the ranking only decides who usually wins; if the best
candidate is gone, the next one wins a back-off later.

Invariants:
- Epochs only grow: a winner writes one more than the highest epoch it knows (the last record it
  saw, or its own log's epoch, :class:`ReplicaPosition`), so a lapsed record does not reset them.
- A master acknowledges (:meth:`Elector.may_acknowledge`) only until ``renewed_before + ttl -
  safety_margin``, where ``renewed_before`` is the clock before it sent its last successful
  grant or keep-alive: the store's expiry of its lease (and so any other winner) comes later. The
  lease is liveness; the epoch check in the data path is what fences.
- An out-of-sync replica never proposes itself unless ``allow_unclean``.
- Every store call has ``request_timeout``; every task is owned by the Elector and cancelled on
  :meth:`Elector.close`; time and sleeping come from an injected :class:`Clock`.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

from tidemq.errors import TideMQError

from .coordination import (
    MAX_REPLICAS,
    CoordinationError,
    CoordinationStore,
    GroupRecord,
    Lease,
    Versioned,
)

log = logging.getLogger(__name__)

T = TypeVar("T")


class ElectionError(TideMQError):
    """An election request that cannot be carried out (e.g. a hand-over to an out-of-sync replica)."""


# ---- pure decisions ---------------------------------------------------------------------------------

def may_campaign(record: GroupRecord | None, replica: int, in_sync: bool, log_end: int,
                 allow_unclean: bool) -> bool:
    """Whether ``replica`` may propose itself, given the ``record`` read now (None: absent).

    Never while the record names a master (its lease is live, else it would read as absent). An
    in-sync replica may when it holds at least the record's ``masterLogEnd``; any replica may when
    unclean election is allowed explicitly.
    """
    if record is not None and record.master is not None:
        return False
    if allow_unclean:
        return True
    floor = record.master_log_end if record is not None else 0
    return in_sync and log_end >= floor


def counts_as_in_sync(known: GroupRecord | None, replica: int, log_end: int) -> bool:
    """Whether ``replica`` is in sync by the last record it saw: named in its in-sync set and
    holding at least its ``masterLogEnd`` (a replica whose disk was emptied is named but is not).
    With no record ever seen, a group's first election, every replica is."""
    return known is None or (replica in known.in_sync and log_end >= known.master_log_end)


@dataclass(frozen=True, slots=True)
class Candidate:
    """One campaigning replica as announced: whether it is in sync, and its CommitLog end."""

    replica: int
    in_sync: bool
    log_end: int


def rank(me: Candidate, others: Mapping[int, Candidate]) -> int:
    """How many candidates go before ``me``: in-sync first, then highest log end, then lowest id."""
    def order(c: Candidate) -> tuple[bool, int, int]:
        return (not c.in_sync, -c.log_end, c.replica)
    return sum(1 for c in others.values() if c.replica != me.replica and order(c) < order(me))


def backoff(position: int, step: float) -> float:
    """Seconds a candidate of rank ``position`` waits before proposing (bounded: rank < 5)."""
    return min(position, MAX_REPLICAS - 1) * step


def winner_record(known: GroupRecord | None, replica: int, in_sync: bool, log_end: int,
                  epoch_floor: int, min_in_sync: int) -> GroupRecord:
    """The record ``replica`` writes when it wins: one more than any epoch it knows, itself as
    master from ``log_end``. A clean winner keeps the in-sync set it knew without the master it
    replaces (whose lease lapsed: it follows no one, and a write waiting for it would wait until
    the new master drops it; Kafka's controller removes a failed leader from the ISR the same
    way; it rejoins once caught up); an unclean or first winner starts one of itself alone."""
    epoch = max(known.epoch if known is not None else 0, epoch_floor) + 1
    members = tuple(r for r in known.in_sync if r == replica or r != known.master) \
        if known is not None and in_sync and replica in known.in_sync else (replica,)
    return GroupRecord(epoch=epoch, master=replica, in_sync=members,
                       min_in_sync=known.min_in_sync if known is not None else min_in_sync,
                       master_log_end=log_end)


def _without(members: tuple[int, ...], replica: int | None) -> tuple[int, ...]:
    return tuple(r for r in members if r != replica)


def shrink_record(record: GroupRecord, replica: int) -> GroupRecord:
    """The master's record without ``replica`` in sync (the master itself stays)."""
    if replica == record.master:
        raise ElectionError(f"replica {replica} is the master of epoch {record.epoch}: hand "
                            "mastership over before taking it out of the in-sync set")
    return replace(record, in_sync=_without(record.in_sync, replica))


def grow_record(record: GroupRecord, replica: int) -> GroupRecord:
    """The master's record with ``replica`` (caught up) in sync."""
    if replica in record.in_sync:
        return record
    return replace(record, in_sync=tuple(sorted((*record.in_sync, replica))))


def deposed_record(record: GroupRecord) -> GroupRecord:
    """The record without its master, which an in-sync follower proved gone: the same epoch (the
    next winner writes one more), the in-sync set without the gone master (it rejoins once caught
    up, as after a lapsed lease), no hand-over."""
    if record.master is None:
        raise ElectionError(f"epoch {record.epoch} has no master to depose")
    return replace(record, master=None, handed_over_by=None,
                   in_sync=_without(record.in_sync, record.master))


def handover_record(record: GroupRecord, to: int, log_end: int, leaving: bool = False) -> GroupRecord:
    """The record moving mastership to the in-sync replica ``to`` at epoch + 1; ``leaving`` (the
    master is stopping) takes the master out of the in-sync set too, so that the new master's
    writes do not wait for it until its lag shows."""
    if record.master is None:
        raise ElectionError(f"epoch {record.epoch} has no master to hand over from")
    if to == record.master:
        raise ElectionError(f"replica {to} is already the master of epoch {record.epoch}")
    if to not in record.in_sync:
        raise ElectionError(f"replica {to} is not in sync ({list(record.in_sync)}): wait until it "
                            "has caught up, or name an in-sync replica")
    in_sync = _without(record.in_sync, record.master) if leaving else record.in_sync
    return replace(record, epoch=record.epoch + 1, master=to, master_log_end=log_end,
                   handed_over_by=record.master, in_sync=in_sync)


def _why(exc: BaseException) -> str:
    """An exception as a log phrase: a bare TimeoutError's str() is empty."""
    return str(exc) or f"{type(exc).__name__}: no answer within the request timeout"


def last_key(key: str) -> str:
    """Where a master keeps a copy of the group record that outlives its lease (no lease): what a
    replica that lost its disk and its memory reads, so that it is not "in sync" with nothing."""
    return f"{key}/last"


def candidate_key(key: str, replica: int) -> str:
    """Where ``replica`` of the group at ``key`` announces its candidacy (under its own lease)."""
    return f"{key}/candidate-{replica}"


def announcement(candidate: Candidate, epoch: int) -> GroupRecord:
    """A candidacy in the record's shape: master = the candidate, in_sync = it if in sync."""
    return GroupRecord(epoch=epoch, master=candidate.replica,
                       in_sync=(candidate.replica,) if candidate.in_sync else (), min_in_sync=1,
                       master_log_end=candidate.log_end)


# ---- roles, clock, configuration --------------------------------------------------------------------

class RoleKind(enum.Enum):
    NONE = "none"
    MASTER = "master"
    FOLLOWER = "follower"


@dataclass(frozen=True, slots=True)
class Role:
    """What a replica is: master of ``epoch``, follower of ``master`` at ``epoch``, or none."""

    kind: RoleKind
    epoch: int = 0
    master: int | None = None


NO_ROLE = Role(RoleKind.NONE)


class Clock(Protocol):
    """Monotonic seconds and sleeping; tests drive a fake one."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class LoopClock:
    """The running loop's monotonic clock."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


@dataclass(frozen=True, slots=True)
class ReplicaPosition:
    """Where this replica's log stands: its CommitLog end and the highest epoch it holds."""

    log_end: int
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class ElectionConfig:
    """``lease_seconds``: the lease TTL (``--lease-seconds``); ``safety_margin``: seconds before
    the lease's own expiry at which a master stops acknowledging; ``backoff_step``: seconds of
    wait per rank; ``gather``: seconds between announcing and reading the other candidates;
    ``poll``: seconds between reads of the record besides the watch (a Kubernetes Lease runs out
    without an event); ``request_timeout``: seconds for one store call."""

    lease_seconds: float = 10.0
    safety_margin: float = 1.0
    allow_unclean: bool = False
    min_in_sync: int = 1
    backoff_step: float = 0.5
    gather: float = 0.3
    poll: float = 1.0
    request_timeout: float = 5.0

    def __post_init__(self) -> None:
        if not 0 <= self.safety_margin < self.lease_seconds:
            raise ValueError(f"safety_margin {self.safety_margin} must be in 0..lease_seconds "
                             f"({self.lease_seconds}): shorten the margin or lengthen the lease")


# ---- the elector ------------------------------------------------------------------------------------

class Elector:
    """One replica's part in its group's election (see the module docstring).

    ``position`` gives the replica's log end and epoch when asked (the store's, later); role
    changes go to ``on_role`` and to :meth:`roles`. Start with :meth:`start`, end with :meth:`close`.
    """

    def __init__(self, store: CoordinationStore, key: str, replica: int,
                 position: Callable[[], ReplicaPosition], config: ElectionConfig = ElectionConfig(),
                 clock: Clock | None = None, on_role: Callable[[Role], None] | None = None) -> None:
        if not 0 <= replica < MAX_REPLICAS:
            raise ValueError(f"replica id {replica} is outside 0..{MAX_REPLICAS - 1}")
        self.store, self.key, self.replica = store, key, replica
        self.position, self.config = position, config
        self.clock: Clock = clock or LoopClock()
        self.on_role = on_role
        self.role = NO_ROLE
        self.known: GroupRecord | None = None  # the last record seen (its epoch and in-sync set)
        self._lease: Lease | None = None
        self._renewed_before = float("-inf")  # clock before the last successful grant/keep-alive
        # The epoch this replica is master of under its current lease (a revision would not do:
        # a Kubernetes keep-alive writes the Lease, so it moves the revision too).
        self._mastered_epoch: int | None = None
        self._handed_over_at: float | None = None
        self._role_changed = asyncio.Event()
        self._wake = asyncio.Event()
        self._tasks: dict[str, asyncio.Task[None]] = {}

    # -- the data path's questions --
    def may_acknowledge(self, now: float) -> bool:
        """True while this replica is master and its renewal deadline has not passed."""
        # A float compare on the send path; the deadline moves only on keep-alive.
        return self.role.kind is RoleKind.MASTER and \
            now < self._renewed_before + self._ttl() - self.config.safety_margin

    def _ttl(self) -> float:
        return self._lease.ttl if self._lease is not None else self.config.lease_seconds

    # -- life cycle --
    async def start(self) -> None:
        last = await self._call(self.store.get(last_key(self.key)))
        if last is not None and (self.known is None or last.record.epoch > self.known.epoch):
            self.known = last.record
        await self._new_lease()
        self._tasks = {name: asyncio.create_task(coro, name=f"elector-{self.replica}-{name}")
                       for name, coro in (("keep-alive", self._keep_alive_loop()),
                                          ("watch", self._watch_loop()),
                                          ("campaign", self._campaign_loop()))}

    async def close(self) -> None:
        """Stop every task and revoke the lease (a master's record goes with it)."""
        pending = set(self._tasks.values())
        while pending:
            # Cancelled again if still running: a wait_for inside a store call (3.11) can swallow
            # a cancellation that arrives just as its inner call completes.
            for task in pending:
                task.cancel()
            _done, pending = await asyncio.wait(pending, timeout=1.0)
        self._tasks = {}
        if self._lease is not None:
            try:
                await self._call(self.store.revoke(self._lease))
            except (CoordinationError, TimeoutError) as exc:
                # Not fatal: the lease runs out by itself within its TTL.
                log.warning("replica %d: could not revoke lease %s on close (%s); it runs out "
                            "within %g s", self.replica, self._lease.id, exc, self._lease.ttl)
            self._lease = None
        self._set_role(NO_ROLE)

    async def roles(self) -> AsyncIterator[Role]:
        """The current role, then each change (intermediate ones may be coalesced)."""
        seen: Role | None = None
        while True:
            changed = self._role_changed
            if self.role != seen:
                seen = self.role
                yield seen
            await changed.wait()

    # -- master's operations --
    async def shrink(self, replica: int) -> bool:
        """As master, take ``replica`` out of the in-sync set; False if no longer master."""
        return await self._rewrite(lambda r: shrink_record(r, replica))

    async def grow(self, replica: int) -> bool:
        """As master, add the caught-up ``replica`` to the in-sync set; False if no longer master."""
        return await self._rewrite(lambda r: grow_record(r, replica))

    async def set_min_in_sync(self, n: int) -> bool:
        """As master, write ``n`` as the group's minInSync (a changed ``--min-in-sync`` takes
        effect once a replica started with it is master); False if no longer master."""
        return await self._rewrite(lambda r: replace(r, min_in_sync=n))

    async def hand_over(self, to: int, leaving: bool = False) -> bool:
        """As master, move mastership to in-sync ``to`` at epoch + 1 (a planned switchover).

        This replica stops acknowledging at once; ``to`` rewrites the record under its own lease
        when it sees it. If it does not within a lease, this replica lets the record lapse so that
        the group elects normally."""
        log_end = self.position().log_end
        done = await self._rewrite(lambda r: handover_record(r, to, log_end, leaving))
        if done:
            self._handed_over_at = self.clock.now()
        return done

    async def depose(self, epoch: int, master: int) -> bool:
        """As an in-sync follower, end ``master``'s mastership of ``epoch`` without waiting for its
        lease: the caller has proof that it is gone (its replication address, which welcomed this
        replica at ``epoch``, now refuses connections: the process died, or it left the master
        role). Writes :func:`deposed_record` at the revision read, under this replica's lease, and
        campaigns at once. False (nothing written) unless the record still names ``master`` at
        ``epoch`` and this replica is in sync by it.

        Safe without the lease: the record's in-sync set names this replica, so the old master
        acknowledges nothing more unless this replica acks it or it first takes this replica out
        of the set, a compare-and-swap that this one's makes fail (or that makes this one fail:
        then this replica is no longer in sync and does not depose). So every write the old
        master acknowledged is on every replica of the deposed record's in-sync set, and the next
        winner is one of them, as after a lapsed lease. An old master that is still running
        learns it from the record (watch or poll) and stops. That argument needs sync
        acknowledgement: the replica service deposes only with ``--replication sync``."""
        if self._lease is None:
            return False
        current = await self._call(self.store.get(self.key))
        if current is None or current.record.master != master or current.record.epoch != epoch \
                or master == self.replica:
            return False
        if not counts_as_in_sync(current.record, self.replica, self.position().log_end):
            return False
        written = await self._call(self.store.compare_and_swap(
            self.key, deposed_record(current.record), current.revision, lease=self._lease))
        if written is None:
            return False
        log.warning("replica %d: deposed replica %d, master of epoch %d, without waiting for its "
                    "lease (its replication address refuses connections); electing", self.replica,
                    master, epoch)
        self.known = written.record
        self._wake.set()
        return True

    async def resign(self) -> bool:
        """As master, give mastership up with no successor named: this replica cannot serve as
        one (its replication listener did not start, so no follower can reach it). Writes
        :func:`deposed_record` (no master, this replica out of the in-sync set until it has caught
        up again) under this replica's lease, and the group elects among the others. Safe: this
        replica acknowledged nothing at the epoch, and every other in-sync replica holds what
        earlier masters acknowledged. Raises ElectionError, writing nothing, when no other replica
        is in sync (the group would have none to elect); False when no longer master."""
        def change(record: GroupRecord) -> GroupRecord:
            if not _without(record.in_sync, self.replica):
                raise ElectionError(f"replica {self.replica} is the only in-sync replica of epoch "
                                    f"{record.epoch}: no other may be elected")
            return deposed_record(record)

        done = await self._rewrite(change)
        if done:
            self._wake.set()  # the campaign loop sees the masterless record and drops the role
        return done

    async def _rewrite(self, change: Callable[[GroupRecord], GroupRecord]) -> bool:
        if self.role.kind is not RoleKind.MASTER or self._lease is None:
            return False
        current = await self._call(self.store.get(self.key))
        if current is None or current.record.master != self.replica or \
                current.record.epoch != self._mastered_epoch:
            return False
        written = await self._call(self.store.compare_and_swap(
            self.key, change(current.record), current.revision, lease=self._lease))
        if written is None:
            return False
        if written.record.master != self.replica:
            self._mastered_epoch = None  # handed over
        self._observe(written.record)
        await self._keep_last(written.record)
        return True

    async def _keep_last(self, record: GroupRecord) -> None:
        """Copy ``record`` to :func:`last_key` (best effort: an older copy only makes a replica
        without a disk wait for a master, never elect itself)."""
        key = last_key(self.key)
        try:
            current = await self._call(self.store.get(key))
            if current is None or current.record.epoch <= record.epoch:
                await self._call(self.store.compare_and_swap(key, record, current.revision if current else 0))
        except (CoordinationError, TimeoutError) as exc:
            log.warning("replica %d: could not keep a copy of the group record (%s)", self.replica, exc)

    # -- internals --
    async def _call(self, request: Awaitable[T]) -> T:
        # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation that arrives
        # as the request completes, and close() would then wait on a loop that never ends.
        async with asyncio.timeout(self.config.request_timeout):
            return await request

    async def _new_lease(self) -> None:
        before = self.clock.now()
        self._lease = await self._call(self.store.grant(self.config.lease_seconds))
        self._renewed_before = before
        self._mastered_epoch = None

    async def _keep_alive_loop(self) -> None:
        while True:
            await self.clock.sleep(self._ttl() / 3)
            lease = self._lease
            if lease is None:
                continue
            before = self.clock.now()
            try:
                alive = await self._call(self.store.keep_alive(lease))
            except (CoordinationError, TimeoutError) as exc:
                log.warning("replica %d: keep-alive of lease %s failed (%s); retrying",
                            self.replica, lease.id, _why(exc))
                continue
            if alive:
                self._renewed_before = before
                continue
            log.warning("replica %d: lease %s ran out; granting a new one", self.replica, lease.id)
            if self.role.kind is RoleKind.MASTER:
                self._set_role(NO_ROLE)
            try:
                await self._new_lease()
            except (CoordinationError, TimeoutError) as exc:
                log.warning("replica %d: granting a new lease failed (%s); retrying",
                            self.replica, _why(exc))
            self._wake.set()

    async def _watch_loop(self) -> None:
        while True:
            try:
                async for _change in self.store.watch(self.key):
                    self._wake.set()
            except (CoordinationError, TimeoutError) as exc:
                # The campaign loop still polls; the watch only makes it react sooner.
                log.warning("replica %d: watch of %s failed (%s); reopening", self.replica,
                            self.key, _why(exc))
                await self.clock.sleep(self.config.poll)

    async def _campaign_loop(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self._step()
            except (CoordinationError, TimeoutError) as exc:
                log.warning("replica %d: election step failed (%s); retrying", self.replica, _why(exc))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.poll):
                    await self._wake.wait()

    async def _step(self) -> None:
        current = await self._call(self.store.get(self.key))
        if current is not None and current.record.master is not None:
            await self._follow(current)
            return
        if self.role.kind is not RoleKind.NONE:
            self._set_role(NO_ROLE)
        if current is not None:
            self.known = current.record  # no master, but its epoch and in-sync set still count
        me = self._candidate()
        if self._lease is None or not may_campaign(current.record if current else None, self.replica,
                                                   me.in_sync, me.log_end, self.config.allow_unclean):
            return
        base = max(self.known.epoch if self.known else 0, self.position().epoch)
        await self._announce(me, base)
        await self.clock.sleep(self.config.gather)
        others = await self._candidates(base)
        if not self.config.allow_unclean and any(c.in_sync and c.log_end > me.log_end for c in others.values()):
            # An in-sync replica holding more is campaigning: never race it (a replica whose
            # disk was emptied could otherwise win and cut the others' logs); if it fails, its
            # announcement lapses with its lease and the next round goes on without it.
            return
        # Wait for this candidate's turn; a record written meanwhile is read at once (the watch),
        # or within ``poll`` (a missed event), so a candidate that waits its turn follows the
        # winner without sleeping out its turn.
        turn = self.clock.now() + backoff(rank(me, others), self.config.backoff_step)
        while True:
            if (left := turn - self.clock.now()) > 0:
                self._wake.clear()
                await self._sleep_unless_woken(min(left, self.config.poll))
            current = await self._call(self.store.get(self.key))
            if current is not None and current.record.master is not None:
                await self._follow(current)
                return
            if self.clock.now() >= turn:
                break
        me = self._candidate()  # the log end may have moved while waiting
        if not may_campaign(current.record if current else None, self.replica, me.in_sync,
                            me.log_end, self.config.allow_unclean):
            return
        proposal = winner_record(self.known, self.replica, me.in_sync, me.log_end,
                                 self.position().epoch, self.config.min_in_sync)
        written = await self._call(self.store.compare_and_swap(
            self.key, proposal, current.revision if current else 0, lease=self._lease))
        if written is not None:
            log.info("replica %d: elected master of epoch %d (log end %d)", self.replica,
                     proposal.epoch, proposal.master_log_end)
            self._mastered_epoch = proposal.epoch
            self._observe(written.record)
            await self._keep_last(written.record)

    async def _sleep_unless_woken(self, seconds: float) -> None:
        """``clock.sleep(seconds)``, ended early by a wake (the watch saw the record change)."""
        sleeper = asyncio.ensure_future(self.clock.sleep(seconds))
        woken = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait((sleeper, woken), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in (sleeper, woken):
                waiter.cancel()
            await asyncio.gather(sleeper, woken, return_exceptions=True)

    def _candidate(self) -> Candidate:
        log_end = self.position().log_end
        return Candidate(self.replica, counts_as_in_sync(self.known, self.replica, log_end), log_end)

    async def _announce(self, me: Candidate, epoch: int) -> None:
        key = candidate_key(self.key, self.replica)
        current = await self._call(self.store.get(key))
        await self._call(self.store.compare_and_swap(
            key, announcement(me, epoch), current.revision if current else 0, lease=self._lease))

    async def _candidates(self, epoch: int) -> dict[int, Candidate]:
        """The other replicas announcing in this round (epoch ``epoch``), by replica id."""
        found = {}
        for replica in range(MAX_REPLICAS):
            if replica == self.replica:
                continue
            got = await self._call(self.store.get(candidate_key(self.key, replica)))
            if got is not None and got.record.epoch == epoch:
                found[replica] = Candidate(replica, bool(got.record.in_sync),
                                           got.record.master_log_end)
        return found

    async def _follow(self, current: Versioned) -> None:
        record = current.record
        if record.master == self.replica and record.epoch != self._mastered_epoch:
            position = self.position()
            # Named master of a new epoch by a hand-over, under the old master's lease: take the
            # record under ours. Not a record this replica wrote itself as master before a
            # restart (no hand-over names it; with a lost disk nothing else would tell), nor of
            # an epoch this log already holds, nor one it lacks data for.
            if record.handed_over_by in (None, self.replica) or record.epoch <= position.epoch or \
                    position.log_end < record.master_log_end:
                return
            # Taken, the record no longer names a hand-over: a restart of this replica must
            # not take it again.
            taken = replace(record, handed_over_by=None)
            written = await self._call(self.store.compare_and_swap(
                self.key, taken, current.revision, lease=self._lease))
            if written is None:
                return
            self._mastered_epoch = record.epoch
            self._observe(taken)
            await self._keep_last(taken)
            return
        elif self._handed_over_at is not None and \
                self.clock.now() - self._handed_over_at > self._ttl():
            # A lease after handing over, this replica leaves its old lease: if the target took
            # the record, it lives under the target's lease and nothing changes; if it did not,
            # the record lapses and the group elects normally.
            old = self._lease
            await self._new_lease()
            if old is not None:
                await self._call(self.store.revoke(old))
            self._handed_over_at = None
        self._observe(record)

    def _observe(self, record: GroupRecord) -> None:
        self.known = record
        if record.master == self.replica and record.epoch == self._mastered_epoch:
            self._set_role(Role(RoleKind.MASTER, record.epoch, record.master))
        elif record.master is not None and record.master != self.replica:
            self._set_role(Role(RoleKind.FOLLOWER, record.epoch, record.master))

    def _set_role(self, role: Role) -> None:
        if role == self.role:
            return
        log.info("replica %d: %s", self.replica, role)
        self.role = role
        changed, self._role_changed = self._role_changed, asyncio.Event()
        changed.set()
        if self.on_role is not None:
            self.on_role(role)


__all__ = ["Candidate", "Clock", "ElectionConfig", "ElectionError", "Elector", "LoopClock",
           "ReplicaPosition", "Role", "RoleKind", "announcement", "backoff", "candidate_key", "last_key",
           "counts_as_in_sync", "deposed_record",
           "grow_record", "handover_record", "may_campaign", "rank", "shrink_record", "winner_record"]
