"""Broker metadata managers: topic names, topic/group configs, offsets, client registry, locks."""

from __future__ import annotations

import pytest

from tidemq.broker.clients import ClientRegistry, parse_tag_expression
from tidemq.broker.processors.consumers import notify_consumer_ids_changed
from tidemq.broker.groups import SubscriptionGroupConfig, SubscriptionGroupManager
from tidemq.broker.locks import RebalanceLockManager
from tidemq.broker.offsets import ConsumerOffsetManager
from tidemq.broker.topics import TopicConfig, TopicConfigManager, validate_topic_name


@pytest.mark.parametrize("name,ok", [("Topic-1_%RETRY%|x", True), ("", False), ("bad topic", False), ("a" * 128, False), ("a" * 127, True), ("中文", False)])
def test_topic_name_rules(name, ok):
    assert (validate_topic_name(name) is None) is ok


def test_topics_persist_and_bump_data_version(tmp_path):
    m = TopicConfigManager(tmp_path / "topics.json", clock=lambda: 1000.0)
    m.ensure_system_topics("C", "b", auto_create=True, default_queues=8)
    assert m.get("TBW102").perm == 7 and m.get("C") is not None
    v0 = m.counter
    assert m.put(TopicConfig("T", 4, 2, 6))
    assert not m.put(TopicConfig("T", 4, 2, 6))  # unchanged: no new version
    assert m.counter == v0 + 1
    m.persist()
    m2 = TopicConfigManager(tmp_path / "topics.json")
    m2.load()
    assert m2.get("T") == TopicConfig("T", 4, 2, 6) and m2.counter == m.counter
    m2.ensure_system_topics("C", "b", auto_create=False, default_queues=8)
    assert m2.get("TBW102") is None  # auto-create off removes the template


def test_auto_created_topic_inherits_from_template(tmp_path):
    m = TopicConfigManager(tmp_path / "t.json")
    m.ensure_system_topics("C", "b", auto_create=True, default_queues=8)
    tc = m.create_from_default("New", "TBW102", 4)
    assert (tc.read_queue_nums, tc.write_queue_nums, tc.perm) == (4, 4, 6)
    assert m.create_from_default("Other", "NOPE", 4) is None


def test_group_config_parses_wire_types(tmp_path):
    g = SubscriptionGroupConfig.from_json({"groupName": "g", "consumeEnable": "false", "retryQueueNums": "2", "retryMaxTimes": 5})
    assert g.consume_enable is False and g.retry_queue_nums == 2 and g.retry_max_times == 5
    assert SubscriptionGroupConfig.from_json(g.to_json()) == g
    with pytest.raises(ValueError):
        SubscriptionGroupConfig.from_json({"consumeEnable": True})
    m = SubscriptionGroupManager(tmp_path / "g.json")
    assert m.find_or_create("x", auto_create=False) is None
    assert m.find_or_create("x", auto_create=True).retry_max_times == 16


def test_offsets_round_trip_and_dirty_flag(tmp_path):
    m = ConsumerOffsetManager(tmp_path / "o.json")
    m.commit("g", "T", 0, 5)
    m.commit("g", "T", 1, 7)
    assert m.dirty
    ConsumerOffsetManager.write(m.path, m.snapshot())
    assert not m.dirty
    m2 = ConsumerOffsetManager(tmp_path / "o.json")
    m2.load()
    assert m2.query("g", "T", 1) == 7 and m2.query("g", "T", 2) is None and m2.topics_of_group("g") == ["T"]
    m2.delete_topic("T")
    assert m2.query("g", "T", 0) is None


def test_tag_expressions():
    assert parse_tag_expression("*") is None and parse_tag_expression("") is None
    tags, codes = parse_tag_expression(" TagA || TagB ")
    assert tags == {"TagA", "TagB"} and codes == {2598919, 2598920}


class _Conn:
    def __init__(self, peer):
        self.peer = peer
        self.sent = []

    def invoke_oneway(self, cmd):
        self.sent.append(cmd)


def test_registry_notifies_members_and_expires_silent_ones():
    now = [0.0]
    reg = ClientRegistry(expiry=120, clock=lambda: now[0], notify=notify_consumer_ids_changed)
    a, b = _Conn("a"), _Conn("b")
    reg.register_consumer("g", a, "A", 1, 63, "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_LAST_OFFSET", [])
    reg.register_consumer("g", b, "B", 1, 63, "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_LAST_OFFSET", [])
    assert sorted(reg.group("g").client_ids()) == ["A", "B"]
    assert [c.code for c in a.sent] == [40, 40]  # told when it joined and when B joined
    now[0] = 100
    reg.register_consumer("g", a, "A", 1, 63, "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_LAST_OFFSET", [])
    now[0] = 121
    assert reg.scan_expired() == 1  # B silent for 121 s
    assert reg.group("g").client_ids() == ["A"]
    reg.connection_closed(a)
    assert reg.group("g") is None


def test_queue_locks_expire():
    now = [0.0]
    locks = RebalanceLockManager(lock_ttl=60, clock=lambda: now[0])
    mq = ("T", "b", 0)
    assert locks.try_lock("g", "c1", [mq]) == [mq]
    assert locks.try_lock("g", "c2", [mq]) == []
    now[0] = 61
    assert locks.try_lock("g", "c2", [mq]) == [mq]
    locks.unlock("g", "c1", [mq])  # not the holder: no effect
    assert locks.try_lock("g", "c1", [mq]) == []


def test_topic_and_group_changes_are_heard_after_they_are_made(tmp_path):
    heard = []
    topics = TopicConfigManager(tmp_path / "t.json")
    topics.on_change = lambda name, tc: heard.append((name, tc, topics.get(name)))
    topics.ensure_system_topics("C", "b", auto_create=True, default_queues=8)
    assert heard == []  # the system topics every broker ensures at load are no change
    tc = TopicConfig("T", 2, 2, 6)
    assert topics.put(tc) and not topics.put(tc)
    topics.create_retry_or_dlq("%RETRY%g")
    assert topics.delete("T") and not topics.delete("T")
    assert [(n, c) for n, c, _now in heard] == [("T", tc), ("%RETRY%g", TopicConfig("%RETRY%g", 1, 1, 6)),
                                                ("T", None)]
    assert [now for _n, _c, now in heard] == [tc, TopicConfig("%RETRY%g", 1, 1, 6), None]
    groups = SubscriptionGroupManager(tmp_path / "g.json")
    seen = []
    groups.on_change = lambda name, g: seen.append((name, g))
    groups.find_or_create("G", auto_create=True)
    groups.put(SubscriptionGroupConfig("G"))  # unchanged: not heard
    assert groups.delete("G") and not groups.delete("G")
    assert seen == [("G", SubscriptionGroupConfig("G")), ("G", None)]


def test_offsets_collect_the_latest_commit_per_queue_and_forget_dropped_ones(tmp_path):
    m = ConsumerOffsetManager(tmp_path / "o.json")
    m.commit("g", "T", 0, 1)
    assert m.take_changes() == []  # not tracked until asked
    dropped = []
    m.on_drop = lambda topic, group: dropped.append((topic, group))
    m.track_changes()
    m.commit("g", "T", 0, 5)
    m.commit("g", "T", 0, 6)
    m.commit("g", "T", 1, 2)
    m.commit("h", "T", 0, 9)
    m.commit("g", "U", 0, 4, record=False)  # applied from the replicated log: not collected again
    assert sorted(m.take_changes()) == [("g", "T", 0, 6), ("g", "T", 1, 2), ("h", "T", 0, 9)]
    assert m.take_changes() == []
    m.commit("g", "T", 0, 7)
    m.commit("h", "T", 0, 10)
    m.delete_group("g")
    assert m.take_changes() == [("h", "T", 0, 10)] and m.query("g", "T", 0) is None
    m.drop("U", None, record=False)
    assert dropped == [(None, "g")] and m.offsets("g", "U") == {}
    m.commit("h", "T", 1, 3)
    m.drop("T", "h")
    assert m.table == {} and m.take_changes() == [] and dropped[-1] == ("T", "h")
