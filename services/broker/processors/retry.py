"""CONSUMER_SEND_MSG_BACK (36): a consumer gives a message back for a later retry.

RocketMQ 4.x semantics (PROTOCOL-REFERENCE 6.6): the original record is loaded by its CommitLog
offset and stored again, with reconsumeTimes + 1, either under ``%RETRY%<group>`` with a delay
level (the header's, or ``3 + reconsumeTimes``), so the schedule service delivers it later, or,
once reconsumeTimes reached the group's ``retryMaxTimes`` (or delayLevel < 0), under
``%DLQ%<group>`` with no delay. ``RETRY_TOPIC`` keeps the first topic and ``ORIGIN_MESSAGE_ID`` the
first message's id across every hop.

The helpers at the bottom are shared with the send path (a plain send into ``%RETRY%<group>``
goes to the DLQ by the same rule).
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING

from tidemq.bodies import SubscriptionGroupConfig
from tidemq.broker.acl import Perm as AclPerm
from tidemq.broker.delay import strip_delay
from tidemq.broker.processors.common import refused
from tidemq.broker.store.results import PutStatus, put_again
from tidemq.broker.topics import DLQ_PREFIX, RETRY_PREFIX, Perm, TopicConfig
from tidemq.errors import BrokerError, CodecError
from tidemq.message import Prop, decode_record
from tidemq.remoting import Connection, RemotingCommand, RequestCode, ResponseCode

if TYPE_CHECKING:
    from tidemq.broker.broker import Broker

log = logging.getLogger(__name__)

DEFAULT_MAX_RECONSUME_TIMES = 16
MAX_RECONSUME_HEADER_VERSION = 121  # V3_4_9: the request's maxReconsumeTimes is honoured from here
FIRST_RETRY_LEVEL = 3
_WRITE = int(Perm.WRITE)


class RetryProcessor:
    def __init__(self, broker: "Broker") -> None:
        self.broker = broker
        self.sent_back = 0
        self.dead_lettered = 0
        self.dropped = 0

    def handlers(self) -> dict[int, object]:
        return {RequestCode.CONSUMER_SEND_MSG_BACK: self.send_back}

    def send_back(self, conn: Connection, cmd: RemotingCommand):
        try:
            return self._send_back(conn, cmd)
        except BrokerError as exc:
            log.debug("send-back from %s refused (%s): %s", conn.peer, exc.code, exc.remark)
            return cmd.response(exc.code or ResponseCode.SYSTEM_ERROR, exc.remark)
        except ValueError as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"bad send-back request header: {exc}")

    def _send_back(self, conn: Connection, cmd: RemotingCommand):
        b = self.broker
        cfg = b.config
        group = cmd.get_str("group") or ""
        offset = cmd.get_int("offset")
        delay_level = cmd.get_int("delayLevel", 0, bits=32)
        if not group:
            raise refused(ResponseCode.SYSTEM_ERROR, "the send-back request names no consumer group")
        principal = b.principal(conn, cmd)
        g = find_group(b, group, principal)
        if not cfg.broker_permission & _WRITE:
            raise refused(ResponseCode.NO_PERMISSION, f"the broker[{cfg.broker_name}] sending message is forbidden")
        if g.retry_queue_nums <= 0:
            self.dropped += 1
            return cmd.response(ResponseCode.SUCCESS)
        raw = b.store.read_record(offset) if offset >= 0 else None
        if raw is None:
            raise refused(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}")
        try:
            msg = decode_record(raw)
        except CodecError as exc:
            raise refused(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}: {exc}") from None
        denied = b.refuse_stored(conn, cmd, msg.topic, msg.properties, AclPerm.SUB)
        if denied is not None:  # the caller may not read that message: it may not copy it either
            return denied
        props = dict(msg.properties)
        props.setdefault(Prop.RETRY_TOPIC, msg.topic)
        strip_delay(props)
        max_times = max_reconsume_times(g, cmd)
        dead = msg.reconsume_times >= max_times or delay_level < 0
        topic = DLQ_PREFIX + group if dead else RETRY_PREFIX + group
        tc = b.creation.retry_topic(topic, principal)
        if not tc.writable:
            raise refused(ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending message is forbidden")
        queue_id = random.randrange(max(1, tc.write_queue_nums))
        if dead:
            self.dead_lettered += 1
        else:
            level = delay_level if delay_level > 0 else FIRST_RETRY_LEVEL + msg.reconsume_times
            props[Prop.DELAY] = str(level)
            self.sent_back += 1
        props[Prop.ORIGIN_MESSAGE_ID] = msg.properties.get(Prop.ORIGIN_MESSAGE_ID) or msg.offset_msg_id
        req = put_again(msg, topic, queue_id, props, b.store_host, reconsume_times=msg.reconsume_times + 1)
        req = b.schedule.prepare_put(req)
        result = b.store.put(req)
        if result.status is not PutStatus.PUT_OK:
            raise refused(ResponseCode.SYSTEM_ERROR, result.remark or result.status.name)
        log.debug("message at %d of %s given back by group %s: now %s (reconsume %d)",
                  offset, msg.topic, group, topic, msg.reconsume_times + 1)
        if b.sync_flush:
            return self._await_durable(cmd, result.end_offset)
        return cmd.response(ResponseCode.SUCCESS)

    async def _await_durable(self, cmd: RemotingCommand, end: int) -> RemotingCommand:
        if await self.broker.store.wait_durable(end):
            return cmd.response(ResponseCode.SUCCESS)
        return cmd.response(ResponseCode.SYSTEM_ERROR, "FLUSH_DISK_TIMEOUT: the message is stored but not yet on disk")


def find_group(broker: "Broker", group: str, principal: str) -> SubscriptionGroupConfig:
    """The group's config (created when the broker auto-creates groups, within the creation
    limits), else BrokerError SUBSCRIPTION_GROUP_NOT_EXIST."""
    return broker.creation.group(group, principal)


def max_reconsume_times(g: SubscriptionGroupConfig | None, cmd: RemotingCommand) -> int:
    """The group's retryMaxTimes, overridden by the request's maxReconsumeTimes from version 121."""
    max_times = g.retry_max_times if g is not None else DEFAULT_MAX_RECONSUME_TIMES
    if cmd.version >= MAX_RECONSUME_HEADER_VERSION and cmd.get_str("maxReconsumeTimes"):
        max_times = cmd.get_int("maxReconsumeTimes", max_times, bits=32)
    return max_times
