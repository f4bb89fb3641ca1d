"""Admin requests: topics, subscription groups, offsets by queue and statistics."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import orjson

from tidemq.broker.groups import SubscriptionGroupConfig
from tidemq.broker.topics import TopicConfig, is_system_topic, validate_group_name, validate_topic_name
from tidemq.errors import FrameError
from tidemq.remoting import Connection, RemotingCommand, RequestCode, ResponseCode
from tidemq.remoting import fastjson
from tidemq.remoting.fastjson import ObjectKey

if TYPE_CHECKING:
    from tidemq.broker.broker import Broker

log = logging.getLogger(__name__)

class AdminProcessor:
    def __init__(self, broker: "Broker") -> None:
        self.broker = broker

    def handlers(self) -> dict[int, object]:
        return {
            RequestCode.UPDATE_AND_CREATE_TOPIC: self.update_topic,
            RequestCode.DELETE_TOPIC_IN_BROKER: self.delete_topic,
            RequestCode.GET_ALL_TOPIC_CONFIG: self.all_topic_config,
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: self.update_group,
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: self.all_groups,
            RequestCode.DELETE_SUBSCRIPTIONGROUP: self.delete_group,
            RequestCode.GET_TOPIC_STATS_INFO: self.topic_stats,
            RequestCode.GET_CONSUME_STATS: self.consume_stats,
            RequestCode.GET_MAX_OFFSET: self.max_offset,
            RequestCode.GET_MIN_OFFSET: self.min_offset,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: self.search_offset,
            RequestCode.GET_EARLIEST_MSG_STORETIME: self.earliest_time,
            RequestCode.GET_ALL_CONSUMER_OFFSET: self.all_offsets,
        }

    # topics -----------------------------------------------------------------------------------
    def update_topic(self, conn: Connection, cmd: RemotingCommand):
        topic = cmd.get_str("topic") or ""
        problem = validate_topic_name(topic)
        if problem:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"{problem}; fix the topic name")
        if self._is_system(topic):
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"The topic[{topic}] is conflict with system topic.")
        read = cmd.get_int("readQueueNums", 8, bits=32)
        write = cmd.get_int("writeQueueNums", 8, bits=32)
        perm = cmd.get_int("perm", 6, bits=32)
        sys_flag = cmd.get_int("topicSysFlag", 0, bits=32)
        if not (0 <= read <= 65535 and 0 <= write <= 65535) or read + write == 0:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"queue counts read={read} write={write} are out of range")
        if perm not in (0, 2, 4, 6) and perm & ~0xF:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"perm {perm} is invalid; use 2 (W), 4 (R) or 6 (RW)")
        tc = TopicConfig(
            topic_name=topic,
            read_queue_nums=read,
            write_queue_nums=write,
            perm=perm,
            topic_filter_type=cmd.get_str("topicFilterType") or "SINGLE_TAG",
            topic_sys_flag=sys_flag,
            order=cmd.get_bool("order"),
        )
        b = self.broker
        if b.topics.get(topic) is None:
            full = b.quota.check_total("topic", len(b.topics.topics))
            if full is not None:
                return cmd.response(ResponseCode.SYSTEM_ERROR, f"topic {topic} was not created: {full}")
        changed = b.topics.put(tc)
        return self._after_topic_change(cmd, changed)

    def _is_system(self, topic: str) -> bool:
        cfg = self.broker.config
        return is_system_topic(topic) or topic in (cfg.cluster_name, cfg.broker_name)

    async def _after_topic_change(self, cmd: RemotingCommand, changed: bool) -> RemotingCommand:
        """Answer once the change is on disk; name servers learn it in the background (an
        unreachable name server must not make the admin call time out)."""
        if changed:
            await self.broker.persist_topics()
            self.broker.topics_changed(persist=False)
        return cmd.response(ResponseCode.SUCCESS)

    def delete_topic(self, conn: Connection, cmd: RemotingCommand):
        topic = cmd.get_str("topic") or ""
        if self._is_system(topic):
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"The topic[{topic}] is conflict with system topic.")
        b = self.broker
        changed = b.topics.delete(topic)
        if changed:
            b.store.delete_topic(topic)
            b.offsets.delete_topic(topic)
        return self._after_topic_change(cmd, changed)

    def all_topic_config(self, conn: Connection, cmd: RemotingCommand):
        return cmd.response(body=orjson.dumps(self.broker.topics.wrapper()))

    # groups -----------------------------------------------------------------------------------
    def update_group(self, conn: Connection, cmd: RemotingCommand):
        try:
            data = fastjson.loads(cmd.body_bytes())
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            g = SubscriptionGroupConfig.from_json(data)
        except (FrameError, ValueError, TypeError) as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"bad subscription group config: {exc}")
        b = self.broker
        problem = validate_group_name(g.group_name)
        if problem:
            return cmd.response(ResponseCode.SYSTEM_ERROR, problem)
        if b.groups.get(g.group_name) is None:
            full = b.quota.check_total("group", len(b.groups.groups))
            if full is not None:
                return cmd.response(ResponseCode.SYSTEM_ERROR, f"group {g.group_name} was not created: {full}")
        if b.groups.put(g):
            return self._persist_groups(cmd)
        return cmd.response(ResponseCode.SUCCESS)

    async def _persist_groups(self, cmd: RemotingCommand) -> RemotingCommand:
        await self.broker.persist_groups()
        return cmd.response(ResponseCode.SUCCESS)

    def all_groups(self, conn: Connection, cmd: RemotingCommand):
        return cmd.response(body=orjson.dumps(self.broker.groups.wrapper()))

    def delete_group(self, conn: Connection, cmd: RemotingCommand):
        name = cmd.get_str("groupName") or ""
        b = self.broker
        if not b.groups.delete(name):
            return cmd.response(ResponseCode.SUCCESS)
        if cmd.get_bool("removeOffset"):
            b.offsets.delete_group(name)
        return self._persist_groups(cmd)

    # offsets and statistics ---------------------------------------------------------------------
    def _queue(self, cmd: RemotingCommand) -> tuple[str, int]:
        return cmd.get_str("topic") or "", cmd.get_int("queueId", bits=32)

    def max_offset(self, conn: Connection, cmd: RemotingCommand):
        topic, q = self._queue(cmd)
        return cmd.response(fields={"offset": self.broker.store.max_offset(topic, q)})

    def min_offset(self, conn: Connection, cmd: RemotingCommand):
        topic, q = self._queue(cmd)
        return cmd.response(fields={"offset": self.broker.store.min_offset(topic, q)})

    def search_offset(self, conn: Connection, cmd: RemotingCommand):
        topic, q = self._queue(cmd)
        ts = cmd.get_int("timestamp")
        return cmd.response(fields={"offset": self.broker.store.offset_by_time(topic, q, ts)})

    def earliest_time(self, conn: Connection, cmd: RemotingCommand):
        topic, q = self._queue(cmd)
        store = self.broker.store
        ts = store.earliest_store_time(topic, q) if store.max_offset(topic, q) > 0 else -1
        return cmd.response(fields={"timestamp": ts})

    def _mq_key(self, topic: str, queue_id: int) -> ObjectKey:
        return ObjectKey.of(brokerName=self.broker.config.broker_name, queueId=queue_id, topic=topic)

    def topic_stats(self, conn: Connection, cmd: RemotingCommand):
        topic = cmd.get_str("topic") or ""
        tc = self.broker.topics.get(topic)
        if tc is None:
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        store = self.broker.store
        table = {}
        for q in range(tc.write_queue_nums):
            mx = store.max_offset(topic, q)
            table[self._mq_key(topic, q)] = {
                "minOffset": store.min_offset(topic, q),
                "maxOffset": mx,
                "lastUpdateTimestamp": store.store_time_at(topic, q, mx - 1) if mx > 0 else 0,
            }
        return cmd.response(body=fastjson.dumps({"offsetTable": table}))

    def consume_stats(self, conn: Connection, cmd: RemotingCommand):
        b = self.broker
        group = cmd.get_str("consumerGroup") or ""
        topic = cmd.get_str("topic") or ""
        topics = [topic] if topic else b.offsets.topics_of_group(group)
        table = {}
        for t in topics:
            tc = b.topics.get(t)
            if tc is None:
                continue
            committed = b.offsets.offsets(group, t)
            for q in range(tc.read_queue_nums):
                mx = b.store.max_offset(t, q)
                co = committed.get(q, 0)
                table[self._mq_key(t, q)] = {
                    "brokerOffset": mx,
                    "consumerOffset": co,
                    "lastTimestamp": b.store.store_time_at(t, q, co - 1) if co > 0 else 0,
                }
        return cmd.response(body=fastjson.dumps({"consumeTps": 0.0, "offsetTable": table}))

    def all_offsets(self, conn: Connection, cmd: RemotingCommand):
        snap = {"offsetTable": {k: dict(v) for k, v in self.broker.offsets.table.items()}}
        return cmd.response(body=fastjson.dumps(snap))

