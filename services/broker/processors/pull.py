"""PULL_MESSAGE (11) with long polling.

Checks run in RocketMQ's order (broker readable, group, topic, queue, subscription); the store's
get status maps to the response code and nextBeginOffset of RocketMQ's table. A pull that finds
nothing new and carries the SUSPEND flag is parked until a matching message arrives or its
suspend timeout passes, then runs once more without suspension. Every response carries
nextBeginOffset, minOffset, maxOffset and suggestWhichBrokerId as strings.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from tidemq.broker.clients import SubscriptionParseError, parse_tag_expression
from tidemq.broker.processors.common import refused
from tidemq.broker.store.store import GetStatus
from tidemq.broker.topics import Perm
from tidemq.errors import BrokerError
from tidemq.remoting import Connection, RemotingCommand, RequestCode, ResponseCode

if TYPE_CHECKING:
    from tidemq.broker.broker import Broker

log = logging.getLogger(__name__)

FLAG_COMMIT_OFFSET = 0x1
FLAG_SUSPEND = 0x2
FLAG_SUBSCRIPTION = 0x4


_READ = int(Perm.READ)


def _pull_fields(next_begin: int, min_offset: int, max_offset: int) -> dict[str, str]:
    return {
        "suggestWhichBrokerId": "0",
        "nextBeginOffset": str(next_begin),
        "minOffset": str(min_offset),
        "maxOffset": str(max_offset),
    }


class PullProcessor:
    def __init__(self, broker: "Broker") -> None:
        self.broker = broker

    def handlers(self) -> dict[int, object]:
        return {RequestCode.PULL_MESSAGE: self.pull, RequestCode.LITE_PULL_MESSAGE: self.pull}

    def pull(self, conn: Connection, cmd: RemotingCommand):
        try:
            req = self._check(conn, cmd)
        except BrokerError as exc:
            log.debug("pull from %s refused (%d): %s", conn.peer, exc.code, exc.remark)
            return cmd.response(exc.code, exc.remark, _pull_fields(0, 0, 0))
        except ValueError as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"bad pull request header: {exc}", _pull_fields(0, 0, 0))
        group, topic, queue_id, offset, max_nums, sys_flag, tag_codes = req
        if sys_flag & FLAG_COMMIT_OFFSET:
            commit = cmd.get_int("commitOffset", -1)
            if commit >= 0:
                self.broker.offsets.commit(group, topic, queue_id, commit)
        resp, found = self._read(cmd, topic, queue_id, offset, max_nums, tag_codes)
        if found or resp.code != ResponseCode.PULL_NOT_FOUND or not sys_flag & FLAG_SUSPEND:
            return resp
        cfg = self.broker.config
        if cfg.long_polling:
            suspend_ms = min(cmd.get_int("suspendTimeoutMillis", 15000), cfg.max_long_poll_ms)
        else:
            suspend_ms = cfg.short_polling_ms
        if suspend_ms <= 0:
            return resp
        return self._hold(cmd, topic, queue_id, offset, max_nums, tag_codes, suspend_ms / 1000.0)

    async def _hold(self, cmd, topic, queue_id, offset, max_nums, tag_codes, timeout):
        # A message put between the read above and this task's first step woke nobody: look
        # again before parking (no await between this check and the waiter's registration).
        if self.broker.store.max_offset(topic, queue_id) <= offset:
            await self.broker.holds.wait(topic, queue_id, offset, tag_codes, timeout)
        resp, _found = self._read(cmd, topic, queue_id, offset, max_nums, tag_codes)
        return resp

    def _check(self, conn: Connection, cmd: RemotingCommand):
        b = self.broker
        if not b.config.broker_permission & _READ:
            raise refused(ResponseCode.NO_PERMISSION, f"the broker[{b.config.broker_name}] pulling message is forbidden")
        group = cmd.get_str("consumerGroup") or ""
        topic = cmd.get_str("topic") or ""
        queue_id = cmd.get_int("queueId", bits=32)
        offset = cmd.get_int("queueOffset")
        max_nums = max(1, min(cmd.get_int("maxMsgNums", 32, bits=32), 1024))
        sys_flag = cmd.get_int("sysFlag", 0, bits=32)
        if not group:
            raise ValueError("missing header field 'consumerGroup'")
        g = b.groups.get(group) or b.creation.group(group, b.principal(conn, cmd))
        if not g.consume_enable:
            raise refused(ResponseCode.NO_PERMISSION, f"subscription group [{group}] is not allowed to consume")
        tc = b.topics.get(topic)
        if tc is None:
            raise refused(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not tc.readable:
            raise refused(ResponseCode.NO_PERMISSION, f"the topic[{topic}] pulling message is forbidden")
        if queue_id < 0 or queue_id >= tc.read_queue_nums:
            raise refused(
                ResponseCode.SYSTEM_ERROR,
                f"queueId[{queue_id}] is illegal, topic:[{topic}] topicConfig.readQueueNums:[{tc.read_queue_nums}]",
            )
        if sys_flag & FLAG_SUBSCRIPTION:
            expr_type = (cmd.get_str("expressionType") or "TAG").upper()
            if expr_type != "TAG":
                raise refused(ResponseCode.SUBSCRIPTION_PARSE_FAILED, f"expression type {expr_type} is not supported yet")
            try:
                parsed = parse_tag_expression(cmd.get_str("subscription") or "*")
            except SubscriptionParseError as exc:
                raise refused(ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(exc)) from None
            tag_codes = parsed[1] if parsed else None
        else:
            sub = b.clients.subscription(group, topic)
            if sub is None:
                raise refused(
                    ResponseCode.SUBSCRIPTION_NOT_EXIST,
                    f"the consumer's subscription of {topic} does not exist; send a heartbeat first",
                )
            if sub.sub_version < cmd.get_int("subVersion", 0):
                raise refused(ResponseCode.SUBSCRIPTION_NOT_LATEST, "the consumer's subscription is not latest")
            tag_codes = sub.tag_codes
        return group, topic, queue_id, offset, max_nums, sys_flag, tag_codes

    def _read(self, cmd, topic, queue_id, offset, max_nums, tag_codes) -> tuple[RemotingCommand, bool]:
        b = self.broker
        r = b.store.get_messages(topic, queue_id, offset, max_nums, tag_codes, b.config.max_pull_bytes)
        fields = _pull_fields(r.next_begin_offset, r.min_offset, r.max_offset)
        st = r.status
        if st is GetStatus.FOUND:
            b.metrics.on_get(topic, r.message_count, r.total_bytes)
            return cmd.response(ResponseCode.SUCCESS, None, fields, r.records), True
        if st is GetStatus.NO_MATCHED_MESSAGE or st is GetStatus.MESSAGE_WAS_REMOVING:
            return cmd.response(ResponseCode.PULL_RETRY_IMMEDIATELY, None, fields), False
        if st is GetStatus.NO_MESSAGE_IN_QUEUE:
            if offset != 0:
                return cmd.response(ResponseCode.PULL_OFFSET_MOVED, "the queue is empty", fields), False
            return cmd.response(ResponseCode.PULL_NOT_FOUND, None, fields), False
        if st is GetStatus.OFFSET_TOO_SMALL or st is GetStatus.OFFSET_OVERFLOW_BADLY:
            return cmd.response(ResponseCode.PULL_OFFSET_MOVED, f"offset {offset} is out of range", fields), False
        return cmd.response(ResponseCode.PULL_NOT_FOUND, None, fields), False
