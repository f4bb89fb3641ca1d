"""Rebalancer, start-offset rules and offset stores, driven by in-memory fakes (no network)."""

from __future__ import annotations

import pytest

from tidemq.client.allocate import allocate_averagely
from tidemq.client.heartbeat import Subscription
from tidemq.client.push.offset_store import (
    NOT_FOUND,
    READ_ERROR,
    LocalFileOffsetStore,
    ReadOffsetType,
    RemoteOffsetStore,
    make_offset_store,
    read_offset_file,
)
from tidemq.client.push.rebalance import Rebalancer, claim_group, compute_pull_from_where, release_group
from tidemq.client.push.types import ConsumeFromWhere, MessageModel
from tidemq.client.route import BrokerData, MessageQueue, Perm, QueueData, TopicRouteData
from tidemq.client.route_cache import RouteCache
from tidemq.errors import BrokerError, ClientError


class FakeInstance:
    def __init__(self, client_id: str = "c1") -> None:
        self.client_id = client_id
        self.routes = RouteCache()

    async def get_route(self, topic, refresh=False):
        return self.routes.get(topic)


class FakeApi:
    """ConsumerBrokerApi in memory: offsets, max/min/search answers, consumer ids."""

    def __init__(self, inst: FakeInstance, group: str = "g") -> None:
        self.inst = inst
        self.group = group
        self.committed: dict[MessageQueue, int] = {}
        self.max = 100
        self.search = 42
        self.ids: list[str] | None = ["c1"]
        self.fail_query = False
        self.commits: list[tuple[MessageQueue, int, bool]] = []

    async def query_offset(self, mq):
        if self.fail_query:
            raise BrokerError("boom", 1)
        return self.committed.get(mq)

    async def update_offset(self, mq, offset, oneway=False):
        self.commits.append((mq, offset, oneway))
        self.committed[mq] = offset

    async def max_offset(self, mq):
        return self.max

    async def search_offset(self, mq, ts):
        return self.search

    async def consumer_ids(self, topic):
        return self.ids


def route(topic: str, queues: int, broker: str = "broker-a") -> TopicRouteData:
    return TopicRouteData(
        (QueueData(broker, queues, queues, Perm.read_write()),),
        (BrokerData("C", broker, {0: "127.0.0.1:1"}),),
    )


MQ = MessageQueue("T", "broker-a", 0)
RMQ = MessageQueue("%RETRY%g", "broker-a", 0)


@pytest.mark.parametrize("where,normal,retry", [
    (ConsumeFromWhere.LAST_OFFSET, 100, 0),
    (ConsumeFromWhere.FIRST_OFFSET, 0, 0),
    (ConsumeFromWhere.TIMESTAMP, 42, 100),
])
async def test_start_offset_table_of_reference_6_3(where, normal, retry):
    api = FakeApi(FakeInstance())
    store = RemoteOffsetStore(api)  # type: ignore[arg-type]
    assert await compute_pull_from_where(api, store, MQ, where, 1) == normal  # type: ignore[arg-type]
    assert await compute_pull_from_where(api, store, RMQ, where, 1) == retry  # type: ignore[arg-type]
    api.committed[MQ] = 7  # a stored offset always wins
    assert await compute_pull_from_where(api, store, MQ, where, 1) == 7  # type: ignore[arg-type]
    api.fail_query = True  # the broker could not say: try again later
    assert await compute_pull_from_where(api, store, MQ, where, 1) == -1  # type: ignore[arg-type]


async def test_remote_store_reads_updates_and_persists():
    api = FakeApi(FakeInstance())
    store = RemoteOffsetStore(api)  # type: ignore[arg-type]
    assert await store.read(MQ, ReadOffsetType.MEMORY) == NOT_FOUND
    assert await store.read(MQ, ReadOffsetType.MEMORY_THEN_STORE) == NOT_FOUND
    api.committed[MQ] = 5
    assert await store.read(MQ, ReadOffsetType.MEMORY_THEN_STORE) == 5
    store.update(MQ, 3, increase_only=True)
    assert store.snapshot() == {MQ: 5}  # never backwards when increase_only
    store.update(MQ, 9, increase_only=True)
    store.update(RMQ, 1, increase_only=False)
    await store.persist_all([MQ])
    assert api.commits == [(MQ, 9, True)] and store.snapshot() == {MQ: 9}  # RMQ not owned
    await store.persist(MQ)
    assert api.commits[-1] == (MQ, 9, False)
    api.fail_query = True
    assert await store.read(MQ, ReadOffsetType.STORE) == READ_ERROR
    store.remove(MQ)
    assert store.snapshot() == {}


async def test_local_file_store_round_trips_and_refuses_damage(tmp_path):
    path = tmp_path / "a" / "g.json"

    s = LocalFileOffsetStore(path, "g")
    await s.load()
    assert await s.read(MQ, ReadOffsetType.STORE) == NOT_FOUND
    s.update(MQ, 12, increase_only=False)
    s.update(RMQ, 3, increase_only=False)
    await s.persist_all([MQ, RMQ])
    t = LocalFileOffsetStore(path, "g")
    await t.load()
    assert await t.read(MQ, ReadOffsetType.STORE) == 12
    assert await t.read(RMQ, ReadOffsetType.MEMORY) == 3
    t.update(MQ, 20, increase_only=False)
    await t.persist_all([MQ])  # RMQ not owned now but its stored offset is kept
    assert read_offset_file(path) == {MQ: 20, RMQ: 3}
    path.write_bytes(b"{nope")
    with pytest.raises(ClientError, match="damaged"):
        read_offset_file(path)
    assert read_offset_file(tmp_path / "missing.json") == {}


class Host:
    def __init__(self, lockable: set[MessageQueue] | None = None, refuse_removal: bool = False):
        self.added: list[MessageQueue] = []
        self.removed: list[MessageQueue] = []
        self.lockable = lockable
        self.refuse_removal = refuse_removal
        self.unknown_offset: set[MessageQueue] = set()

    async def on_queue_added(self, mq, pq):
        if mq in self.unknown_offset:
            return False
        self.added.append(mq)
        return True

    async def on_queue_removed(self, mq, pq):
        if self.refuse_removal:
            return False
        pq.dropped = True
        self.removed.append(mq)
        return True

    async def lock_queues(self, mqs):
        return set(mqs) if self.lockable is None else set(mqs) & self.lockable


def make(host, ids=("c1",), model=MessageModel.CLUSTERING, orderly=False, queues=4):
    inst = FakeInstance("c1")
    inst.routes.update("T", route("T", queues))
    api = FakeApi(inst)
    api.ids = list(ids)
    r = Rebalancer(api, host, model, allocate_averagely, orderly=orderly)  # type: ignore[arg-type]
    r.subscriptions = {"T": Subscription("T")}
    return r, api, inst


def qs(*ids: int) -> list[MessageQueue]:
    return [MessageQueue("T", "broker-a", i) for i in ids]


async def test_rebalance_takes_its_share_and_gives_up_the_rest():
    host = Host()
    r, api, _ = make(host, ids=["c1"])
    await r.rebalance()
    assert r.assigned() == qs(0, 1, 2, 3) and host.added == qs(0, 1, 2, 3)
    api.ids = ["c0", "c1"]  # c1 is second of two: takes queues 2, 3
    await r.rebalance()
    assert r.assigned() == qs(2, 3) and host.removed == qs(0, 1)
    api.ids = None  # no consumer list: nothing changes
    await r.rebalance()
    assert r.assigned() == qs(2, 3)
    r.subscriptions = {}
    await r.rebalance()
    assert r.assigned() == []


async def test_broadcasting_takes_every_queue():
    r, api, _ = make(Host(), ids=["c0", "c1", "c2"], model=MessageModel.BROADCASTING)
    await r.rebalance()
    assert r.assigned() == qs(0, 1, 2, 3)


async def test_orderly_adds_only_locked_queues_and_retries_refused_removals():
    host = Host(lockable=set(qs(0, 2)))
    r, api, _ = make(host, orderly=True)
    await r.rebalance()
    assert r.assigned() == qs(0, 2)
    assert all(r.process_queues[mq].locked for mq in qs(0, 2))
    host.lockable = None
    await r.rebalance()
    assert r.assigned() == qs(0, 1, 2, 3)
    host.lockable = set(qs(1, 2, 3))
    await r.lock_all()
    assert not r.process_queues[qs(0)[0]].locked and r.process_queues[qs(1)[0]].locked
    host.refuse_removal = True  # a listener is still running
    api.ids = ["c1", "c2"]
    await r.rebalance()
    assert r.assigned() == qs(0, 1, 2, 3)
    host.refuse_removal = False
    await r.rebalance()
    assert r.assigned() == qs(0, 1)


async def test_queue_without_a_start_offset_is_retried_next_round():
    host = Host()
    host.unknown_offset = set(qs(1))
    r, _, _ = make(host)
    await r.rebalance()
    assert r.assigned() == qs(0, 2, 3)
    host.unknown_offset = set()
    await r.rebalance()
    assert r.assigned() == qs(0, 1, 2, 3)


async def test_assign_mode_owns_exactly_the_given_queues():
    host = Host()
    r, _, _ = make(host)
    await r.assign(set(qs(1, 3)))
    assert r.assigned() == qs(1, 3)
    await r.assign({qs(0)[0], MessageQueue("U", "broker-a", 0)})
    assert r.assigned() == [MessageQueue("T", "broker-a", 0), MessageQueue("U", "broker-a", 0)]


def test_one_rebalancing_consumer_per_group_and_instance():
    inst = object()
    claim_group(inst, "g")
    with pytest.raises(ClientError, match="instance_name"):
        claim_group(inst, "g")
    claim_group(inst, "h")
    release_group(inst, "g")
    claim_group(inst, "g")
    release_group(inst, "g")
    release_group(inst, "h")


def test_offset_store_per_message_model(tmp_path):
    api = FakeApi(FakeInstance("10.0.0.1@1234#99"))
    assert isinstance(make_offset_store(MessageModel.CLUSTERING, api, tmp_path, "DEFAULT"),  # type: ignore[arg-type]
                      RemoteOffsetStore)
    local = make_offset_store(MessageModel.BROADCASTING, api, tmp_path, "DEFAULT")  # type: ignore[arg-type]
    assert isinstance(local, LocalFileOffsetStore)
    assert local.path == tmp_path / "10.0.0.1@DEFAULT" / "g.json"  # stable across restarts
