"""ConsumerService (heartbeats, group membership, queue locks) over in-memory managers: no Broker,
no network."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tidemq.bodies import SubscriptionGroupConfig
from tidemq.broker.clients import MAX_HEARTBEAT_GROUPS, MAX_HEARTBEAT_SUBSCRIPTIONS, ClientRegistry
from tidemq.broker.creation import ImplicitCreation
from tidemq.broker.groups import SubscriptionGroupManager
from tidemq.broker.locks import RebalanceLockManager
from tidemq.broker.messaging.consumers import (
    ConsumerData,
    ConsumerService,
    Heartbeat,
    QueueLocks,
    QueueRef,
    SubscriptionData,
)
from tidemq.broker.messaging.context import Caller
from tidemq.broker.quota import CreationLimits, CreationQuota
from tidemq.broker.topics import TopicConfig, TopicConfigManager
from tidemq.errors import BrokerError
from tidemq.remoting import ResponseCode


class Channel:
    """A client connection as the service sees it: hashable and opaque."""

    def __init__(self, peer: str = "10.0.0.7:5555") -> None:
        self.peer = peer


class Parts:
    def __init__(self, tmp: Path, auto_create_group: bool = True, registration=None) -> None:
        self.topics = TopicConfigManager(tmp / "topics.json")
        self.groups = SubscriptionGroupManager(tmp / "groups.json")
        self.told: list[tuple[object, str]] = []
        self.clients = ClientRegistry(notify=lambda conn, group: self.told.append((conn, group)))
        self.locks = RebalanceLockManager()
        self.topic_changes = 0
        self.auto = auto_create_group
        self.creation = ImplicitCreation(self.topics, self.groups, CreationQuota(CreationLimits()),
                                         lambda: self.auto, self._changed)
        self.service = ConsumerService(
            clients=self.clients, groups=self.groups, topics=self.topics, creation=self.creation,
            locks=self.locks, auto_create_group=lambda: self.auto, registration=lambda: registration)

    def _changed(self) -> None:
        self.topic_changes += 1


def consumer(group: str, *topics: str, listed: int | None = None) -> ConsumerData:
    subs = tuple(SubscriptionData(t, "TagA || TagB", 3) for t in topics)
    return ConsumerData(group, "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_LAST_OFFSET", subs,
                        len(subs) if listed is None else listed)


def heartbeat(*consumers: ConsumerData, producers: tuple[str, ...] = (), client_id: str = "cid-1") -> Heartbeat:
    return Heartbeat(client_id, 0, 453, consumers, producers)


CALLER = Caller("10.0.0.7:5555", 34, "appKey0001")


async def test_a_heartbeat_registers_creates_the_group_and_its_retry_topic_then_waits_for_registration(tmp_path):
    done = asyncio.get_running_loop().create_future()
    parts = Parts(tmp_path, registration=done)
    ch = Channel()
    pending = parts.service.heartbeat(CALLER, ch, heartbeat(consumer("cg", "orders"), producers=("pg",)))
    assert pending is not None  # a retry topic was created: answer after the name servers know it
    assert parts.groups.get("cg") is not None and parts.topics.get("%RETRY%cg") is not None
    assert parts.topic_changes == 1
    info = parts.clients.group("cg")
    assert info.client_ids() == ["cid-1"]
    sub = info.subscriptions["orders"]
    assert sub.expression == "TagA || TagB" and sub.sub_version == 3 and sub.tag_codes
    assert ch in parts.clients.producers["pg"]
    assert parts.told == [(ch, "cg")]  # the group changed: its members are told
    waiter = asyncio.ensure_future(pending)
    await asyncio.sleep(0)
    assert not waiter.done()
    done.set_result(None)
    await waiter
    # The second heartbeat creates nothing and is answered at once.
    assert parts.service.heartbeat(CALLER, ch, heartbeat(consumer("cg", "orders"))) is None


async def test_a_heartbeat_answers_without_waiting_when_no_registration_runs(tmp_path):
    parts = Parts(tmp_path, registration=None)
    pending = parts.service.heartbeat(CALLER, Channel(), heartbeat(consumer("cg")))
    assert pending is not None
    await pending


def test_the_client_id_defaults_to_the_callers_address(tmp_path):
    parts = Parts(tmp_path, auto_create_group=False)
    parts.service.heartbeat(CALLER, Channel(), heartbeat(consumer("cg"), client_id=""))
    assert parts.clients.group("cg").client_ids() == [CALLER.peer]


def test_a_heartbeat_with_one_bad_group_registers_and_creates_nothing(tmp_path):
    parts = Parts(tmp_path)
    with pytest.raises(BrokerError) as err:
        parts.service.heartbeat(CALLER, Channel(), heartbeat(consumer("good"), producers=("bad group!",)))
    assert err.value.code == ResponseCode.SYSTEM_ERROR
    assert parts.groups.get("good") is None and parts.clients.group("good") is None
    assert parts.clients.registrations == 0


def test_heartbeat_bounds_are_refused_before_anything_changes(tmp_path):
    parts = Parts(tmp_path)
    many = tuple(consumer(f"g{i}") for i in range(MAX_HEARTBEAT_GROUPS + 1))
    with pytest.raises(BrokerError, match=f"more than {MAX_HEARTBEAT_GROUPS}"):
        parts.service.heartbeat(CALLER, Channel(), heartbeat(*many))
    # The bound counts what the client listed, malformed entries included.
    with pytest.raises(BrokerError, match=f"more than {MAX_HEARTBEAT_SUBSCRIPTIONS} topics"):
        too_many = consumer("cg", "t", listed=MAX_HEARTBEAT_SUBSCRIPTIONS + 1)
        parts.service.heartbeat(CALLER, Channel(), heartbeat(too_many))
    assert not parts.groups.groups and parts.clients.registrations == 0


def test_without_auto_creation_an_unknown_group_registers_without_a_retry_topic(tmp_path):
    parts = Parts(tmp_path, auto_create_group=False)
    assert parts.service.heartbeat(CALLER, Channel(), heartbeat(consumer("cg"))) is None
    assert parts.groups.get("cg") is None and parts.topics.get("%RETRY%cg") is None
    assert parts.clients.group("cg").client_ids() == ["cid-1"]


def test_group_queries_refuse_an_offline_group_and_describe_an_online_one(tmp_path):
    parts = Parts(tmp_path, auto_create_group=False)
    with pytest.raises(BrokerError) as err:
        parts.service.consumer_ids("cg")
    assert (err.value.code, err.value.remark) == (ResponseCode.SYSTEM_ERROR, "no consumer for this group, cg")
    with pytest.raises(BrokerError) as err:
        parts.service.connections("cg")
    assert (err.value.code, err.value.remark) == (ResponseCode.CONSUMER_NOT_ONLINE, "the consumer group[cg] not online")
    ch = Channel("10.0.0.9:1")
    parts.service.heartbeat(CALLER, ch, heartbeat(consumer("cg", "orders")))
    assert parts.service.consumer_ids("cg") == ["cid-1"]
    info = parts.service.connections("cg")
    assert [(c.client_id, c.client_addr, c.version) for c in info.connections] == [("cid-1", "10.0.0.9:1", 453)]
    assert [s.topic for s in info.subscriptions] == ["orders"]
    assert info.message_model == "CLUSTERING"
    parts.service.unregister(ch, "", "cg")
    with pytest.raises(BrokerError):
        parts.service.consumer_ids("cg")


def test_locks_hold_only_known_groups_queues_of_known_topics(tmp_path):
    parts = Parts(tmp_path)
    parts.topics.put(TopicConfig("orders", 4, 4))
    wanted = (QueueRef("orders", "b0", 1), QueueRef("orders", "b0", 4), QueueRef("nope", "b0", 0))
    assert parts.service.lock(QueueLocks("cg", "c1", wanted)) == ()  # unknown group: nothing held
    parts.groups.put(SubscriptionGroupConfig("cg"))
    assert parts.service.lock(QueueLocks("cg", "c1", wanted)) == (QueueRef("orders", "b0", 1),)
    assert parts.service.lock(QueueLocks("cg", "c2", wanted)) == ()  # held by c1
    parts.service.unlock(QueueLocks("cg", "c1", wanted))
    assert parts.service.lock(QueueLocks("cg", "c2", wanted)) == (QueueRef("orders", "b0", 1),)
