"""Remoting adapter of the admin family: topics, subscription groups and statistics
(UPDATE_AND_CREATE_TOPIC, DELETE_TOPIC_IN_BROKER, GET_ALL_TOPIC_CONFIG,
UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, GET_ALL_SUBSCRIPTIONGROUP_CONFIG, DELETE_SUBSCRIPTIONGROUP,
GET_TOPIC_STATS_INFO, GET_CONSUME_STATS, GET_ALL_CONSUMER_OFFSET).

Decodes the header (tidemq.remoting.headers.admin) or the group JSON body, calls
:class:`tidemq.broker.messaging.admin.AdminService` and encodes its answer. Statistics bodies key
their tables by message queue objects, as fastjson writes Java's ``Map<MessageQueue, ...>``.
"""

from __future__ import annotations

from collections.abc import Awaitable

import orjson

from tidemq.bodies import SubscriptionGroupConfig
from tidemq.broker.messaging.admin import AdminService, TopicConfig
from tidemq.broker.processors.common import Handler
from tidemq.errors import BrokerError, FrameError
from tidemq.remoting import (
    Connection,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    fastjson,
)
from tidemq.remoting.fastjson import ObjectKey
from tidemq.remoting.headers.admin import (
    decode_consume_stats_header,
    decode_create_topic_header,
    decode_delete_group_header,
    decode_topic_header,
)


class AdminProcessor:
    def __init__(self, service: AdminService, *, broker_name: str) -> None:
        self.service = service
        self.broker_name = broker_name  # names this broker in the message queues of statistics

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.UPDATE_AND_CREATE_TOPIC: self.update_topic,
            RequestCode.DELETE_TOPIC_IN_BROKER: self.delete_topic,
            RequestCode.GET_ALL_TOPIC_CONFIG: self.all_topic_config,
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: self.update_group,
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: self.all_groups,
            RequestCode.DELETE_SUBSCRIPTIONGROUP: self.delete_group,
            RequestCode.GET_TOPIC_STATS_INFO: self.topic_stats,
            RequestCode.GET_CONSUME_STATS: self.consume_stats,
            RequestCode.GET_ALL_CONSUMER_OFFSET: self.all_offsets,
        }

    # topics -----------------------------------------------------------------------------------
    def update_topic(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | Awaitable[RemotingCommand]:
        h = decode_create_topic_header(cmd.ext_fields)
        tc = TopicConfig(
            topic_name=h.topic,
            read_queue_nums=h.read_queue_nums,
            write_queue_nums=h.write_queue_nums,
            perm=h.perm,
            topic_filter_type=h.topic_filter_type,
            topic_sys_flag=h.topic_sys_flag,
            order=h.order,
        )
        done = self.service.update_topic(tc, h.attributes)
        return _success_after(cmd, done)

    def delete_topic(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | Awaitable[RemotingCommand]:
        h = decode_topic_header(cmd.ext_fields)
        done = self.service.delete_topic(h.topic)
        return _success_after(cmd, done)

    def all_topic_config(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(body=orjson.dumps(self.service.topic_table()))

    # groups -----------------------------------------------------------------------------------
    def update_group(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | Awaitable[RemotingCommand]:
        try:
            data = fastjson.loads(cmd.body_bytes())
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            g = SubscriptionGroupConfig.from_json(data)
        except (FrameError, ValueError, TypeError) as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"bad subscription group config: {exc}")
        done = self.service.update_group(g)
        return cmd.response(ResponseCode.SUCCESS) if done is None else _success_after(cmd, done)

    def all_groups(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(body=orjson.dumps(self.service.group_table()))

    def delete_group(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | Awaitable[RemotingCommand]:
        h = decode_delete_group_header(cmd.ext_fields)
        done = self.service.delete_group(h.group_name, h.remove_offset)
        return cmd.response(ResponseCode.SUCCESS) if done is None else _success_after(cmd, done)

    # statistics -------------------------------------------------------------------------------
    def _mq_key(self, topic: str, queue_id: int) -> ObjectKey:
        return ObjectKey.of(brokerName=self.broker_name, queueId=queue_id, topic=topic)

    def topic_stats(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = decode_topic_header(cmd.ext_fields)
        stats = self.service.topic_stats(h.topic)
        table = {
            self._mq_key(s.topic, s.queue_id): {
                "minOffset": s.min_offset, "maxOffset": s.max_offset, "lastUpdateTimestamp": s.last_update_ms,
            }
            for s in stats
        }
        return cmd.response(body=fastjson.dumps({"offsetTable": table}))

    def consume_stats(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = decode_consume_stats_header(cmd.ext_fields)
        table = {
            self._mq_key(p.topic, p.queue_id): {
                "brokerOffset": p.broker_offset, "consumerOffset": p.consumer_offset, "lastTimestamp": p.last_ms,
            }
            for p in self.service.consume_stats(h.consumer_group, h.topic)
        }
        return cmd.response(body=fastjson.dumps({"consumeTps": 0.0, "offsetTable": table}))

    def all_offsets(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(body=fastjson.dumps({"offsetTable": self.service.consumer_offsets()}))


async def _success_after(cmd: RemotingCommand, done: Awaitable[None]) -> RemotingCommand:
    """SUCCESS once the change is on disk (and replicated, in a replicated group); a refusal
    raised meanwhile (not replicated in time) is answered with its code and remark."""
    try:
        await done
    except BrokerError as exc:
        return cmd.response(exc.code or ResponseCode.SYSTEM_ERROR, exc.remark)
    return cmd.response(ResponseCode.SUCCESS)
