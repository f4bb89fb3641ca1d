"""Election (issue 17, step 1): the pure decisions, then Electors on a real store.

The Elector tests run on both backends (a real etcd on loopback, the Kubernetes emulator) through
test_store's ``backend`` fixture, with a 2 s lease (etcd's minimum rounds up to that).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.broker.ha.coordination import (
    MAX_REPLICAS,
    Change,
    CoordinationError,
    CoordinationStore,
    GroupRecord,
    Lease,
    Versioned,
)
from tidemq.broker.ha.election import (
    Candidate,
    ElectionConfig,
    ElectionError,
    Elector,
    ReplicaPosition,
    Role,
    RoleKind,
    backoff,
    counts_as_in_sync,
    deposed_record,
    grow_record,
    handover_record,
    last_key,
    may_campaign,
    rank,
    shrink_record,
    winner_record,
)

# The store tests' fixtures: a client factory per backend, a fresh group key per test.
from .test_store import backend, emulator, key  # noqa: F401

Factory = Callable[[], CoordinationStore]
FAST = ElectionConfig(lease_seconds=2, safety_margin=0.5, backoff_step=0.3, gather=0.2, poll=0.25,
                      request_timeout=3)


def rec(epoch: int = 1, master: int | None = 0, in_sync: tuple[int, ...] = (0, 1, 2),
        log_end: int = 0) -> GroupRecord:
    return GroupRecord(epoch=epoch, master=master, in_sync=in_sync, min_in_sync=2,
                       master_log_end=log_end)


# ---- pure decisions -------------------------------------------------------------------------------

@pytest.mark.parametrize("record, in_sync, log_end, unclean, expected", [
    (rec(master=0), True, 10, False, False),    # a live master: nobody campaigns
    (rec(master=0), True, 10, True, False),     # not even unclean
    (None, True, 0, False, True),               # absent record, in sync
    (rec(master=None, log_end=5), True, 5, False, True),
    (rec(master=None, log_end=5), True, 4, False, False),  # lacks what the last master had
    (None, False, 99, False, False),            # out of sync
    (None, False, 0, True, True),               # unclean election allowed explicitly
])
def test_who_may_campaign(record: GroupRecord | None, in_sync: bool, log_end: int, unclean: bool,
                          expected: bool) -> None:
    assert may_campaign(record, 1, in_sync, log_end, unclean) is expected


@pytest.mark.parametrize("known, replica, log_end, expected", [
    (None, 3, 0, True),                          # a group's first election
    (rec(in_sync=(0, 1), log_end=50), 1, 50, True),
    (rec(in_sync=(0, 1), log_end=50), 1, 49, False),  # named, but its disk lost data
    (rec(in_sync=(0, 1), log_end=50), 2, 99, False),  # not named
])
def test_who_counts_as_in_sync(known: GroupRecord | None, replica: int, log_end: int,
                               expected: bool) -> None:
    assert counts_as_in_sync(known, replica, log_end) is expected


def test_rank_puts_in_sync_then_highest_log_end_then_lowest_id_first() -> None:
    everyone = {c.replica: c for c in [Candidate(0, True, 10), Candidate(1, True, 20),
                                       Candidate(2, True, 20), Candidate(3, False, 99)]}
    assert [rank(everyone[r], everyone) for r in range(4)] == [2, 0, 1, 3]
    assert rank(everyone[0], {}) == 0  # alone: goes at once
    assert backoff(0, 0.5) == 0 and backoff(2, 0.5) == 1.0 and backoff(99, 0.5) == 2.0


def test_a_winner_writes_the_next_epoch_with_itself_as_master() -> None:
    known = rec(epoch=4, master=0, in_sync=(0, 1, 2))
    # The replaced master (its lease lapsed) leaves the in-sync set: it rejoins once caught up.
    assert winner_record(known, 1, True, 700, 0, 1) == \
        GroupRecord(epoch=5, master=1, in_sync=(1, 2), min_in_sync=2, master_log_end=700)
    assert winner_record(known, 1, True, 7, 9, 1).epoch == 10  # its log knows a later epoch
    # An unclean winner, or the first one, starts an in-sync set of itself.
    assert winner_record(known, 3, False, 7, 0, 1).in_sync == (3,)
    assert winner_record(None, 2, True, 0, 0, 2) == \
        GroupRecord(epoch=1, master=2, in_sync=(2,), min_in_sync=2, master_log_end=0)


def test_shrink_grow_and_hand_over_records() -> None:
    record = rec(epoch=3, master=0, in_sync=(0, 1, 2), log_end=50)
    assert shrink_record(record, 2).in_sync == (0, 1)
    assert grow_record(shrink_record(record, 2), 2).in_sync == (0, 1, 2)
    assert grow_record(record, 1) == record
    with pytest.raises(ElectionError, match="hand mastership over"):
        shrink_record(record, 0)
    moved = handover_record(record, 1, 80)
    assert (moved.epoch, moved.master, moved.master_log_end, moved.in_sync) == (4, 1, 80, (0, 1, 2))
    with pytest.raises(ElectionError, match="not in sync"):
        handover_record(shrink_record(record, 2), 2, 80)
    with pytest.raises(ElectionError, match="already the master"):
        handover_record(record, 0, 80)
    with pytest.raises(ElectionError, match="no master"):
        handover_record(rec(master=None), 1, 80)


replica_ids = st.integers(0, MAX_REPLICAS - 1)
# One step of a group's life: the master dies and a random set campaigns (with its log ends), a
# hand-over, or the master shrinks/grows the in-sync set.
events = st.one_of(
    st.tuples(st.just("fail"), st.dictionaries(replica_ids, st.integers(0, 1000), min_size=1)),
    st.tuples(st.just("hand_over"), replica_ids),
    st.tuples(st.just("shrink"), replica_ids),
    st.tuples(st.just("grow"), replica_ids),
)


@given(st.lists(events, max_size=30), st.booleans())
def test_elections_keep_one_master_per_epoch_and_growing_epochs(
        steps: list[tuple[str, object]], unclean: bool) -> None:
    """A model of the store (one record, compare-and-swap by revision) driven by the pure
    decisions in rank order: every write names one master per epoch, epochs only grow, and an
    out-of-sync replica wins only with unclean election allowed."""
    record: GroupRecord | None = None  # as stored: None while no master holds a lease
    known: GroupRecord | None = None   # what the replicas saw last
    revision = 0
    masters: dict[int, int] = {}
    last_epoch = 0

    def write(new: GroupRecord) -> None:
        nonlocal record, known, revision, last_epoch
        assert new.epoch >= last_epoch
        if new.master is not None:
            assert masters.setdefault(new.epoch, new.master) == new.master
        record, known, revision, last_epoch = new, new, revision + 1, new.epoch

    for kind, arg in steps:
        if kind == "fail":
            assert isinstance(arg, dict)
            record = None  # the master's lease ran out
            cands = {r: Candidate(r, counts_as_in_sync(known, r, end), end)
                     for r, end in arg.items()}
            read_at = revision
            for me in sorted(cands.values(), key=lambda c: rank(c, cands)):
                if not may_campaign(record, me.replica, me.in_sync, me.log_end, unclean):
                    continue
                if revision != read_at:
                    break  # compare-and-swap at the revision read fails for the rest
                new = winner_record(known, me.replica, me.in_sync, me.log_end, 0, 2)
                assert me.in_sync or unclean
                write(new)
        elif record is not None and isinstance(arg, int):
            try:
                if kind == "hand_over":
                    write(handover_record(record, arg, record.master_log_end))
                elif kind == "shrink":
                    write(shrink_record(record, arg))
                else:
                    write(grow_record(record, arg))
            except ElectionError:
                pass


def test_a_deposed_record_keeps_its_epoch_without_the_master_in_or_out_of_sync() -> None:
    record = dataclasses.replace(rec(epoch=4, master=1, in_sync=(0, 1, 2), log_end=70), handed_over_by=0)
    deposed = deposed_record(record)
    assert (deposed.epoch, deposed.master, deposed.in_sync, deposed.master_log_end, deposed.handed_over_by) \
        == (4, None, (0, 2), 70, None)
    # The next winner writes one more epoch and keeps the survivors in sync.
    won = winner_record(deposed, 2, True, 90, 4, 2)
    assert (won.epoch, won.master, won.in_sync) == (5, 2, (0, 2))
    with pytest.raises(ElectionError, match="no master to depose"):
        deposed_record(rec(master=None))


def test_election_config_refuses_a_margin_longer_than_the_lease() -> None:
    with pytest.raises(ValueError, match="shorten the margin"):
        ElectionConfig(lease_seconds=2, safety_margin=2)


# ---- Electors on a real store ---------------------------------------------------------------------

class Group:
    """Electors of one group, each with its own store client, closed at the end."""

    def __init__(self, clients: Factory, group_key: str) -> None:
        self.backend, self.key = clients, group_key
        self.electors: dict[int, Elector] = {}

    async def seed(self, in_sync: tuple[int, ...], log_end: int = 0) -> None:
        """A record with no master yet, naming the in-sync set (as a first master would grow it)."""
        assert await self.backend().compare_and_swap(
            self.key, GroupRecord(epoch=0, master=None, in_sync=in_sync, min_in_sync=1,
                                  master_log_end=log_end), 0) is not None

    def make(self, replica: int, log_end: int = 100, config: ElectionConfig = FAST,
             on_role: Callable[[Role], None] | None = None) -> Elector:
        elector = Elector(self.backend(), self.key, replica,
                          lambda: ReplicaPosition(log_end=log_end), config, on_role=on_role)
        self.electors[replica] = elector
        return elector

    async def three(self) -> None:
        """Replicas 0, 1 and 2, all in sync, started together."""
        await self.seed((0, 1, 2))
        for replica in range(3):
            self.make(replica)
        await self.start(0, 1, 2)

    async def start(self, *replicas: int) -> None:
        await asyncio.gather(*(self.electors[r].start() for r in replicas))

    def masters(self) -> list[int]:
        return [r for r, e in self.electors.items() if e.role.kind is RoleKind.MASTER]

    async def settled(self, within: float, exclude: tuple[int, ...] = ()) -> Role:
        """Waits until exactly one master exists and every other live elector follows it."""
        deadline = time.monotonic() + within
        while True:
            live = {r: e for r, e in self.electors.items() if r not in exclude}
            masters = [e.role for e in live.values() if e.role.kind is RoleKind.MASTER]
            if len(masters) == 1 and all(
                    e.role == masters[0] or e.role == Role(RoleKind.FOLLOWER, masters[0].epoch,
                                                           masters[0].master)
                    for e in live.values()):
                return masters[0]
            assert len(masters) <= 1, {r: e.role for r, e in live.items()}
            assert time.monotonic() < deadline, {r: e.role for r, e in live.items()}
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        for elector in self.electors.values():
            await elector.close()


def crash(elector: Elector) -> None:
    """Stops every task of ``elector`` without revoking its lease, as a killed process would."""
    for task in elector._tasks.values():
        task.cancel()


@pytest.fixture
async def group(backend: Factory, key: str) -> AsyncIterator[Group]:  # noqa: F811
    made = Group(backend, key)
    yield made
    await made.close()


async def test_three_electors_elect_exactly_one_master(group: Group) -> None:
    await group.three()
    role = await group.settled(within=10)
    assert role.epoch == 1
    current = await group.backend().get(group.key)
    assert current is not None and current.record.master == role.master
    await asyncio.sleep(1)  # and it stays so
    assert group.masters() == [role.master]


# Tests that wait out leases (2-5 s each): their Kubernetes runs are in the slow set. The election
# above the store interface is the same on both; tests/broker/ha/test_store.py runs the Lease
# store's own tests (compare-and-swap, leases, watch) on both in the default suite.
LEASE_TIMED = pytest.mark.parametrize(
    "backend", [pytest.param("etcd", id="etcd"), pytest.param("kubernetes", id="kubernetes", marks=pytest.mark.slow)],
    indirect=True)


@LEASE_TIMED
async def test_a_crashed_master_is_replaced_within_the_lease_with_the_next_epoch(group: Group) -> None:
    await group.three()
    first = await group.settled(within=10)
    assert first.master is not None
    crash(group.electors[first.master])
    crashed = time.monotonic()
    second = await group.settled(within=FAST.lease_seconds + 4, exclude=(first.master,))
    print(f"failover after {time.monotonic() - crashed:.2f} s")
    assert second.master != first.master and second.epoch == first.epoch + 1


async def test_the_replica_with_the_highest_log_end_wins_when_all_start_together(group: Group) -> None:
    await group.seed((0, 1, 2))
    for replica, log_end in ((0, 100), (1, 300), (2, 200)):
        group.make(replica, log_end=log_end)
    await group.start(0, 1, 2)
    assert (await group.settled(within=10)).master == 1


@LEASE_TIMED
async def test_an_out_of_sync_replica_does_not_win(group: Group) -> None:
    await group.seed((0, 1))
    group.make(2, log_end=999)
    await group.start(2)
    await asyncio.sleep(2)
    assert group.electors[2].role.kind is RoleKind.NONE
    current = await group.backend().get(group.key)
    assert current is not None and current.record.master is None
    group.make(0, log_end=10)  # an in-sync one with less data wins
    await group.start(0)
    assert (await group.settled(within=10)).master == 0


async def test_an_out_of_sync_replica_wins_when_unclean_election_is_allowed(group: Group) -> None:
    await group.seed((0, 1))
    group.make(2, config=dataclasses.replace(FAST, allow_unclean=True))
    await group.start(2)
    role = await group.settled(within=10)
    assert role.master == 2
    current = await group.backend().get(group.key)
    assert current is not None and current.record.in_sync == (2,)


@LEASE_TIMED
async def test_a_stalled_master_stops_acknowledging_before_its_lease_runs_out(group: Group) -> None:
    await group.seed((0, 1))
    for replica in range(2):
        group.make(replica)
    await group.start(0, 1)
    role = await group.settled(within=10)
    assert role.master is not None
    master = group.electors[role.master]
    loop = asyncio.get_running_loop()
    assert master.may_acknowledge(loop.time())
    master._tasks["keep-alive"].cancel()  # stalled: no renewal, no revoke
    while master.may_acknowledge(loop.time()):
        await asyncio.sleep(0.02)
    # It has stopped acknowledging while the store still holds its record: nobody else can win yet.
    current = await group.backend().get(group.key)
    assert current is not None and current.record.master == role.master
    assert all(e.role.kind is not RoleKind.MASTER for r, e in group.electors.items() if r != role.master)
    crash(master)
    second = await group.settled(within=FAST.lease_seconds + 4, exclude=(role.master,))
    assert second.epoch == role.epoch + 1


@LEASE_TIMED
async def test_hand_over_moves_mastership_with_the_next_epoch(group: Group) -> None:
    await group.three()
    first = await group.settled(within=10)
    assert first.master is not None
    old = group.electors[first.master]
    target = (first.master + 1) % 3
    assert await old.hand_over(target)
    assert not old.may_acknowledge(asyncio.get_running_loop().time())  # at once
    second = await group.settled(within=5)
    assert (second.master, second.epoch) == (target, first.epoch + 1)
    # The record now lives under the new master's lease: the old one's leaving changes nothing.
    await old.close()
    del group.electors[first.master]
    await asyncio.sleep(FAST.lease_seconds + 1)
    assert (await group.settled(within=1)) == second


async def test_the_master_shrinks_and_grows_the_in_sync_set(group: Group) -> None:
    await group.three()
    role = await group.settled(within=10)
    assert role.master is not None
    master, other = group.electors[role.master], (role.master + 1) % 3
    assert await master.shrink(other)
    current = await group.backend().get(group.key)
    assert current is not None and other not in current.record.in_sync
    assert current.record.epoch == role.epoch
    assert await master.grow(other)
    current = await group.backend().get(group.key)
    assert current is not None and other in current.record.in_sync
    assert not await group.electors[other].shrink(role.master)  # a follower cannot


async def test_role_changes_reach_the_callback_and_the_iterator(group: Group) -> None:
    await group.seed((0,))
    called: list[Role] = []
    elector = group.make(0, on_role=called.append)
    roles = elector.roles()
    assert await anext(roles) == Role(RoleKind.NONE)
    await group.start(0)
    master = Role(RoleKind.MASTER, 1, 0)
    assert await asyncio.wait_for(anext(roles), 10) == master
    await elector.close()
    assert await asyncio.wait_for(anext(roles), 1) == Role(RoleKind.NONE)
    assert called == [master, Role(RoleKind.NONE)]
    await roles.aclose()


# ---- the fencing deadline by a fake clock ---------------------------------------------------------

class FakeClock:
    """Time moves only by ``advance``; a sleeper wakes when its time has come."""

    def __init__(self) -> None:
        self.t = 1000.0
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            return
        wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((self.t + seconds, wake))
        await wake

    async def advance(self, seconds: float) -> None:
        self.t += seconds
        for when, wake in list(self._sleepers):
            if when <= self.t:
                self._sleepers.remove((when, wake))
                if not wake.done():  # a sleep cut short (a wake) was cancelled
                    wake.set_result(None)
        for _ in range(50):  # let the woken tasks run their (immediate) store calls
            await asyncio.sleep(0)


class SlowRenewalStore:
    """An in-memory store whose keep-alive takes 3 s of the fake clock (or fails when told)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock, self.failing = clock, False
        self.records: dict[str, Versioned] = {}

    async def get(self, name: str) -> Versioned | None:
        return self.records.get(name)

    async def compare_and_swap(self, name: str, record: GroupRecord, revision: int,
                               lease: Lease | None = None) -> Versioned | None:
        current = self.records.get(name)
        if (current.revision if current else 0) != revision:
            return None
        self.records[name] = Versioned(record, revision + 1)
        return self.records[name]

    async def grant(self, ttl: float) -> Lease:
        return Lease("1", ttl)

    async def keep_alive(self, lease: Lease) -> bool:
        if self.failing:
            raise CoordinationError("etcd did not answer")
        self.clock.t += 3
        return True

    async def revoke(self, lease: Lease) -> None:
        pass

    async def watch(self, name: str, after: int = 0) -> AsyncIterator[Change]:
        await asyncio.Event().wait()
        yield Change(None, 0)

    async def close(self) -> None:
        pass


async def test_a_master_acknowledges_until_ttl_minus_margin_after_it_sent_its_last_renewal() -> None:
    clock = FakeClock()
    store = SlowRenewalStore(clock)
    config = ElectionConfig(lease_seconds=9, safety_margin=1, gather=0, poll=0.01)
    elector = Elector(store, "/tidemq/test/fake/group", 0, lambda: ReplicaPosition(0), config, clock)
    await elector.start()  # granted at 1000
    try:
        while elector.role.kind is not RoleKind.MASTER:
            await asyncio.sleep(0.01)
        assert elector.may_acknowledge(1007.9) and not elector.may_acknowledge(1008)
        await clock.advance(3)  # the keep-alive is sent at 1003 and answered at 1006
        assert clock.t == 1006
        assert elector.may_acknowledge(1010.9) and not elector.may_acknowledge(1011)
        store.failing = True  # renewals stop getting through: the deadline stays
        await clock.advance(3)
        await clock.advance(3)
        assert elector.role.kind is RoleKind.MASTER and not elector.may_acknowledge(clock.t)
    finally:
        await elector.close()


@LEASE_TIMED
async def test_a_replica_without_disk_or_memory_does_not_win_after_the_record_lapsed(group: Group) -> None:
    # Replica 0 was master with 500 bytes, in sync with 1; then it died and its leased record
    # lapsed. Replica 2 starts with an empty disk and no memory of any record: only the lease-free
    # copy (last_key) tells it that it is not in sync, so it waits rather than electing itself.
    group.make(0, log_end=500)
    await group.start(0)
    assert (await group.settled(within=10)).master == 0
    assert await group.electors[0].grow(1)
    last = await group.backend().get(last_key(group.key))
    assert last is not None and last.record.in_sync == (0, 1) and last.record.master_log_end == 500
    crash(group.electors[0])
    del group.electors[0]
    group.make(2, log_end=0)
    await group.start(2)
    await asyncio.sleep(FAST.lease_seconds + 2)  # the old record lapses; 2 may not campaign
    assert group.electors[2].role.kind is RoleKind.NONE
    group.make(1, log_end=500)  # the in-sync survivor wins, and 2 follows it
    await group.start(1)
    assert (await group.settled(within=10)).master == 1


@LEASE_TIMED
async def test_a_master_restarted_empty_within_its_lease_does_not_take_back_its_own_record(group: Group) -> None:
    # Replica 0 was elected on an empty log (masterLogEnd 0), replica 1 then copied 300 bytes of it.
    group.make(0, log_end=0)
    await group.start(0)
    first = await group.settled(within=10)
    assert first.master == 0 and await group.electors[0].grow(1)
    crash(group.electors[0])  # killed, its disk emptied, restarted at once: the record is still live
    group.make(0, log_end=0)
    group.make(1, log_end=300)
    await group.start(0, 1)
    second = await group.settled(within=FAST.lease_seconds + 5)
    assert second.master == 1 and second.epoch == first.epoch + 1


async def test_a_hand_over_is_taken_once(group: Group) -> None:
    await group.seed((0, 1))
    group.make(0, log_end=100)
    group.make(1, log_end=100)
    await group.start(0, 1)
    first = await group.settled(within=10)
    to = 1 - first.master
    assert await group.electors[first.master].hand_over(to)
    second = await group.settled(within=10)
    current = await group.backend().get(group.key)
    # Taken by the target under its own lease, the record no longer names a hand-over.
    assert second.master == to and current is not None and current.record.handed_over_by is None
    assert second.epoch == first.epoch + 1


async def test_the_master_writes_a_changed_min_in_sync(group: Group) -> None:
    await group.seed((0, 1))
    group.make(0)
    group.make(1)
    await group.start(0, 1)
    role = await group.settled(within=10)
    assert role.master is not None
    assert await group.electors[role.master].set_min_in_sync(2)
    current = await group.backend().get(group.key)
    assert current is not None and current.record.min_in_sync == 2 and current.record.epoch == role.epoch
    assert not await group.electors[1 - role.master].set_min_in_sync(1)  # a follower cannot


# ---- deposing a master proven gone -----------------------------------------------------------------

# A lease far longer than the tests' waits: a new master within them is the deposition's doing.
LONG = dataclasses.replace(FAST, lease_seconds=30, safety_margin=1)


async def three_with_a_long_lease(group: Group) -> tuple[Role, int]:
    """Replicas 0-2 in sync with LONG leases, settled: the master's role and one follower's id."""
    await group.seed((0, 1, 2))
    for replica in range(3):
        group.make(replica, config=LONG)
    await group.start(0, 1, 2)
    first = await group.settled(within=10)
    assert first.master is not None
    return first, next(r for r in range(3) if r != first.master)


async def test_a_follower_deposes_a_crashed_master_and_the_group_elects_without_its_lease(group: Group) -> None:
    first, follower = await three_with_a_long_lease(group)
    assert first.master is not None
    crash(group.electors[first.master])
    started = time.monotonic()
    assert await group.electors[follower].depose(first.epoch, first.master)
    second = await group.settled(within=5, exclude=(first.master,))
    print(f"deposed and elected in {time.monotonic() - started:.2f} s (lease {LONG.lease_seconds:g} s)")
    assert second.master != first.master and second.epoch == first.epoch + 1
    current = await group.backend().get(group.key)
    assert current is not None and first.master not in current.record.in_sync


async def test_a_deposed_master_that_still_runs_stops_being_master(group: Group) -> None:
    first, follower = await three_with_a_long_lease(group)
    assert first.master is not None
    old = group.electors[first.master]
    assert await group.electors[follower].depose(first.epoch, first.master)
    # It learns it from the record (watch, or its keep-alive on Kubernetes): one master again,
    # of the next epoch, and the old one follows it (it is no longer in sync, so it cannot win).
    deadline = time.monotonic() + 5
    while old.role == first:
        assert time.monotonic() < deadline, "the deposed master is still master"
        await asyncio.sleep(0.05)
    second = await group.settled(within=8)
    assert second.epoch == first.epoch + 1 and second.master != first.master
    assert old.role == Role(RoleKind.FOLLOWER, second.epoch, second.master)


async def test_only_an_in_sync_follower_deposes_and_only_the_master_of_the_epoch_named(group: Group) -> None:
    await group.seed((0, 1))
    group.make(0, config=LONG)
    group.make(1, config=LONG)
    group.make(2, config=LONG)  # never in sync
    await group.start(0, 1, 2)
    first = await group.settled(within=10)
    assert first.master in (0, 1)
    other = 1 - first.master
    before = await group.backend().get(group.key)
    assert not await group.electors[2].depose(first.epoch, first.master)  # out of sync
    assert not await group.electors[other].depose(first.epoch - 1, first.master)  # an older epoch
    assert not await group.electors[other].depose(first.epoch, other)  # not the master
    assert not await group.electors[first.master].depose(first.epoch, first.master)  # itself
    assert await group.backend().get(group.key) == before
    assert group.masters() == [first.master]


SLOW_TURNS = dataclasses.replace(LONG, backoff_step=5.0)  # a candidate's turn: 5 s per rank


async def test_candidates_waiting_their_turn_follow_the_winner_at_once(group: Group) -> None:
    """A candidate that ranks behind another waits its turn (backoff_step per rank, here 5 s) but
    reads a record written meanwhile at once (the watch): the group settles on the winner well
    inside the second-ranked candidate's turn, at the first election and after a deposition."""
    await group.seed((0, 1, 2))
    for replica in range(3):
        group.make(replica, config=SLOW_TURNS)
    started = time.monotonic()
    await group.start(0, 1, 2)
    first = await group.settled(within=4)
    assert first.master is not None
    print(f"first election settled in {time.monotonic() - started:.2f} s (turns of {SLOW_TURNS.backoff_step:g} s)")
    crash(group.electors[first.master])
    follower = next(r for r in range(3) if r != first.master)
    started = time.monotonic()
    assert await group.electors[follower].depose(first.epoch, first.master)
    second = await group.settled(within=4, exclude=(first.master,))
    print(f"after the deposition settled in {time.monotonic() - started:.2f} s")
    assert second.epoch == first.epoch + 1


async def test_a_master_that_resigns_leaves_the_in_sync_set_and_another_is_elected(group: Group) -> None:
    """Elector.resign (a master whose replication listener did not start): the record loses its
    master and the resigning replica's place in the in-sync set, the resigner drops its role, and
    another in-sync replica is elected without waiting for a lease; a master alone in sync is
    refused with a sentence and the record stays as it was."""
    first, _ = await three_with_a_long_lease(group)
    assert first.master is not None
    resigner = group.electors[first.master]
    started = time.monotonic()
    assert await resigner.resign()
    second = await group.settled(within=5)  # the resigner follows it
    print(f"resigned and elected in {time.monotonic() - started:.2f} s (lease {LONG.lease_seconds:g} s)")
    assert second.master != first.master and second.epoch == first.epoch + 1
    assert resigner.role.kind is not RoleKind.MASTER
    current = await group.backend().get(group.key)
    assert current is not None and first.master not in current.record.in_sync
    assert not await resigner.resign()  # no longer master: nothing written
    assert await group.backend().get(group.key) == current


async def test_a_master_alone_in_sync_may_not_resign(group: Group) -> None:
    await group.seed((0,))
    group.make(0, config=LONG)
    group.make(1, config=LONG)  # never in sync
    await group.start(0, 1)
    first = await group.settled(within=10)
    assert first.master == 0
    before = await group.backend().get(group.key)
    with pytest.raises(ElectionError, match="only in-sync replica"):
        await group.electors[0].resign()
    assert await group.backend().get(group.key) == before
    assert group.masters() == [0]
