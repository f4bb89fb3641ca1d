"""AdminService over in-memory managers and a fake store: topic and group changes answered once
persisted, refusals that change nothing, statistics."""

from __future__ import annotations

import pytest

from tidemq.bodies import SubscriptionGroupConfig
from tidemq.broker.groups import SubscriptionGroupManager
from tidemq.broker.messaging.admin import AdminService, QueueProgress, QueueStats
from tidemq.broker.offsets import ConsumerOffsetManager
from tidemq.broker.quota import CreationLimits, CreationQuota
from tidemq.broker.topics import TopicConfig, TopicConfigManager
from tidemq.errors import BrokerError
from tidemq.remoting import ResponseCode


class StatsStore:
    def __init__(self) -> None:
        self.max: dict[tuple[str, int], int] = {}
        self.deleted: list[str] = []

    def max_offset(self, topic: str, q: int) -> int:
        return self.max.get((topic, q), 0)

    def min_offset(self, topic: str, q: int) -> int:
        return 1 if self.max.get((topic, q), 0) else 0

    def store_time_at(self, topic: str, q: int, offset: int) -> int:
        return 1000 + offset

    def delete_topic(self, topic: str) -> None:
        self.deleted.append(topic)


class Parts:
    def __init__(self, tmp, limits: CreationLimits = CreationLimits()) -> None:
        self.topics = TopicConfigManager(tmp / "topics.json")
        self.groups = SubscriptionGroupManager(tmp / "groups.json")
        self.offsets = ConsumerOffsetManager(tmp / "offsets.json")
        self.store = StatsStore()
        self.events: list[str] = []
        self.service = AdminService(
            topics=self.topics, groups=self.groups, offsets=self.offsets, store=self.store,
            quota=CreationQuota(limits), reserved_names=("DefaultCluster", "broker-a"),
            persist_topics=self._persist("topics"), topics_changed=self._changed,
            persist_groups=self._persist("groups"))

    def _persist(self, what: str):
        async def persist() -> None:
            self.events.append(f"persist {what}")
        return persist

    def _changed(self, persist: bool = True) -> None:
        self.events.append(f"register (persist={persist})")


async def test_a_topic_change_is_applied_at_once_and_answered_once_persisted(tmp_path):
    parts = Parts(tmp_path)
    done = parts.service.update_topic(TopicConfig("orders", 4, 4, 6))
    assert parts.topics.get("orders").read_queue_nums == 4  # applied before the answer is awaited
    assert parts.events == []
    await done
    assert parts.events == ["persist topics", "register (persist=False)"]
    await parts.service.update_topic(TopicConfig("orders", 4, 4, 6))  # no change: nothing written
    assert len(parts.events) == 2
    assert parts.service.topic_table()["topicConfigTable"]["orders"]["writeQueueNums"] == 4


@pytest.mark.parametrize("tc, remark", [
    (TopicConfig("bad topic"), "fix the topic name"),
    (TopicConfig("TBW102"), "The topic[TBW102] is conflict with system topic."),
    (TopicConfig("broker-a"), "The topic[broker-a] is conflict with system topic."),
    (TopicConfig("t", 0, 0), "queue counts read=0 write=0 are out of range"),
    (TopicConfig("t", 65536, 1), "queue counts read=65536 write=1 are out of range"),
    (TopicConfig("t", 1, 1, 32), "perm 32 is invalid; use 2 (W), 4 (R) or 6 (RW)"),
])
def test_a_bad_topic_config_is_refused_and_changes_nothing(tmp_path, tc, remark):
    parts = Parts(tmp_path)
    with pytest.raises(BrokerError) as err:
        parts.service.update_topic(tc)
    assert err.value.code == ResponseCode.SYSTEM_ERROR and remark in err.value.remark
    assert parts.topics.get(tc.topic_name) is None


def test_the_total_limits_refuse_new_topics_and_groups_but_not_updates(tmp_path):
    parts = Parts(tmp_path, CreationLimits(max_topics=1, max_groups=1))
    parts.topics.put(TopicConfig("a"))
    parts.groups.put(SubscriptionGroupConfig("g"))
    with pytest.raises(BrokerError, match="topic b was not created: the broker holds 1 topics"):
        parts.service.update_topic(TopicConfig("b"))
    with pytest.raises(BrokerError, match="group h was not created: the broker holds 1 groups"):
        parts.service.update_group(SubscriptionGroupConfig("h"))
    parts.service.update_topic(TopicConfig("a", 2, 2)).close()
    changed = parts.service.update_group(SubscriptionGroupConfig("g", consume_enable=False))
    assert changed is not None
    changed.close()


async def test_deleting_a_topic_drops_its_messages_and_offsets(tmp_path):
    parts = Parts(tmp_path)
    parts.topics.put(TopicConfig("t"))
    parts.offsets.commit("g", "t", 0, 5)
    await parts.service.delete_topic("t")
    assert parts.store.deleted == ["t"] and parts.offsets.table == {}
    await parts.service.delete_topic("t")  # already gone: nothing more
    assert parts.store.deleted == ["t"] and parts.events == ["persist topics", "register (persist=False)"]
    with pytest.raises(BrokerError, match="conflict with system topic"):
        parts.service.delete_topic("DefaultCluster")


async def test_group_changes_are_persisted_only_when_something_changed(tmp_path):
    parts = Parts(tmp_path)
    with pytest.raises(BrokerError):
        parts.service.update_group(SubscriptionGroupConfig("bad group!"))
    await parts.service.update_group(SubscriptionGroupConfig("g"))
    assert parts.service.update_group(SubscriptionGroupConfig("g")) is None
    parts.offsets.commit("g", "t", 0, 5)
    await parts.service.delete_group("g", remove_offsets=False)
    assert parts.offsets.table
    assert parts.service.delete_group("g", remove_offsets=True) is None  # no such group any more
    parts.groups.put(SubscriptionGroupConfig("g"))
    await parts.service.delete_group("g", remove_offsets=True)
    assert parts.offsets.table == {}
    assert parts.events == ["persist groups"] * 3
    assert parts.service.group_table()["subscriptionGroupTable"] == {}


def test_topic_stats_cover_the_write_queues(tmp_path):
    parts = Parts(tmp_path)
    with pytest.raises(BrokerError) as err:
        parts.service.topic_stats("t")
    assert (err.value.code, err.value.remark) == (ResponseCode.TOPIC_NOT_EXIST, "topic[t] not exist")
    parts.topics.put(TopicConfig("t", 3, 2))
    parts.store.max[("t", 1)] = 10
    assert parts.service.topic_stats("t") == (QueueStats("t", 0, 0, 0, 0), QueueStats("t", 1, 1, 10, 1009))


def test_consume_stats_cover_the_read_queues_of_one_or_every_committed_topic(tmp_path):
    parts = Parts(tmp_path)
    parts.topics.put(TopicConfig("t", 2, 3))
    parts.topics.put(TopicConfig("u", 1, 1))
    parts.store.max[("t", 0)] = 9
    parts.offsets.commit("g", "t", 0, 4)
    parts.offsets.commit("g", "gone", 0, 4)  # its topic was deleted: left out
    assert parts.service.consume_stats("g") == (QueueProgress("t", 0, 9, 4, 1003), QueueProgress("t", 1, 0, 0, 0))
    assert parts.service.consume_stats("g", "u") == (QueueProgress("u", 0, 0, 0, 0),)
    assert parts.service.consumer_offsets() == {"t@g": {0: 4}, "gone@g": {0: 4}}
