"""OffsetService over in-memory managers and a fake store: committed offsets and queue offsets."""

from __future__ import annotations

import pytest

from tidemq.bodies import SubscriptionGroupConfig
from tidemq.broker.creation import ImplicitCreation
from tidemq.broker.groups import SubscriptionGroupManager
from tidemq.broker.messaging.context import Caller
from tidemq.broker.messaging.offsets import OffsetCommit, OffsetService
from tidemq.broker.offsets import ConsumerOffsetManager
from tidemq.broker.quota import CreationLimits, CreationQuota
from tidemq.broker.topics import TopicConfig, TopicConfigManager
from tidemq.errors import BrokerError
from tidemq.remoting import ResponseCode


class QueueStore:
    """The store's per-queue reads: ``queues[(topic, queue)] = (min, max, first store time)``."""

    def __init__(self) -> None:
        self.queues: dict[tuple[str, int], tuple[int, int, int]] = {}

    def min_offset(self, topic: str, q: int) -> int:
        return self.queues.get((topic, q), (0, 0, 0))[0]

    def max_offset(self, topic: str, q: int) -> int:
        return self.queues.get((topic, q), (0, 0, 0))[1]

    def earliest_store_time(self, topic: str, q: int) -> int:
        return self.queues[(topic, q)][2]

    def offset_by_time(self, topic: str, q: int, ts: int) -> int:
        return ts // 1000


@pytest.fixture
def parts(tmp_path):
    topics = TopicConfigManager(tmp_path / "topics.json")
    groups = SubscriptionGroupManager(tmp_path / "groups.json")
    offsets = ConsumerOffsetManager(tmp_path / "offsets.json")
    store = QueueStore()
    creation = ImplicitCreation(topics, groups, CreationQuota(CreationLimits()), lambda: True, lambda: None)
    service = OffsetService(offsets=offsets, store=store, topics=topics, creation=creation)
    return service, topics, groups, offsets, store


CALLER = Caller("10.1.2.3:4000", 15, None)


def test_a_group_without_an_offset_reads_a_young_queue_from_zero_else_not_found(parts):
    service, _, _, offsets, store = parts
    assert service.committed("cg", "t", 0) == 0
    store.queues[("t", 0)] = (5, 9, 0)  # the queue no longer starts at 0
    with pytest.raises(BrokerError) as err:
        service.committed("cg", "t", 0)
    assert err.value.code == ResponseCode.QUERY_NOT_FOUND
    assert err.value.remark == "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first"
    offsets.commit("cg", "t", 0, 7)
    assert service.committed("cg", "t", 0) == 7


def test_a_query_names_a_bad_group_name(parts):
    service = parts[0]
    with pytest.raises(BrokerError) as err:
        service.committed("bad group!", "t", 0)
    assert err.value.code == ResponseCode.SYSTEM_ERROR


def test_a_commit_creates_its_group_for_the_caller_and_keeps_only_real_queues(parts):
    service, topics, groups, offsets, _ = parts
    with pytest.raises(BrokerError) as err:
        service.commit(CALLER, OffsetCommit("cg", "t", 0, 3))
    assert (err.value.code, err.value.remark) == (ResponseCode.TOPIC_NOT_EXIST, "Topic t not exist!")
    assert groups.get("cg") is not None  # created before the topic is checked, as RocketMQ 5
    topics.put(TopicConfig("t", 2, 2))
    for q in (-1, 2):
        with pytest.raises(BrokerError, match=rf"queueId\[{q}\] is illegal, topic t has 2 queues"):
            service.commit(CALLER, OffsetCommit("cg", "t", q, 3))
    service.commit(CALLER, OffsetCommit("cg", "t", 1, 3))
    service.commit(CALLER, OffsetCommit("cg", "t", 1, -1))  # a Java client's "never read": kept
    assert offsets.query("cg", "t", 1) == 3 and offsets.query("cg", "t", 0) is None


def test_a_commit_of_an_unknown_group_is_refused_without_auto_creation(tmp_path):
    topics = TopicConfigManager(tmp_path / "topics.json")
    groups = SubscriptionGroupManager(tmp_path / "groups.json")
    topics.put(TopicConfig("t", 1, 1))
    creation = ImplicitCreation(topics, groups, CreationQuota(CreationLimits()), lambda: False, lambda: None)
    offsets = ConsumerOffsetManager(tmp_path / "offsets.json")
    service = OffsetService(offsets=offsets, store=QueueStore(), topics=topics, creation=creation)
    with pytest.raises(BrokerError) as err:
        service.commit(CALLER, OffsetCommit("cg", "t", 0, 1))
    assert err.value.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
    groups.put(SubscriptionGroupConfig("cg"))
    service.commit(CALLER, OffsetCommit("cg", "t", 0, 1))
    assert offsets.query("cg", "t", 0) == 1


def test_queue_offsets_come_from_the_store_and_an_empty_queue_has_no_earliest_time(parts):
    service, _, _, _, store = parts
    store.queues[("t", 1)] = (2, 10, 1_700_000_000_000)
    assert (service.min_offset("t", 1), service.max_offset("t", 1)) == (2, 10)
    assert service.offset_by_time("t", 1, 42_000) == 42
    assert service.earliest_store_time("t", 1) == 1_700_000_000_000
    assert service.earliest_store_time("t", 0) == -1
