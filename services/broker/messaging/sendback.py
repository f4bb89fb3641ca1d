"""Sending back: a consumer gives a message back for a later retry (CONSUMER_SEND_MSG_BACK).

RocketMQ 4.x semantics (PROTOCOL-REFERENCE 6.6): the original record is loaded by its CommitLog
offset and stored again, with reconsumeTimes + 1, either under ``%RETRY%<group>`` with a delay
level (the request's, or ``3 + reconsumeTimes``), so the schedule service delivers it later, or,
once reconsumeTimes reached the group's ``retryMaxTimes`` (or delayLevel < 0), under
``%DLQ%<group>`` with no delay. ``RETRY_TOPIC`` keeps the first topic and ``ORIGIN_MESSAGE_ID`` the
first message's id across every hop. With ACL on, the caller must be allowed to read the message
it copies (:class:`~tidemq.broker.messaging.context.StoredAccess`).

:func:`max_reconsume_times` is the one rule for "retries used up", shared with the send path (a
plain send into ``%RETRY%<group>`` goes to the DLQ by it too).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tidemq.bodies import SubscriptionGroupConfig
from tidemq.broker.acl import Perm as AclPerm
from tidemq.broker.acl import stored_message_topics
from tidemq.broker.delay import strip_delay
from tidemq.broker.messaging.context import Caller, StoredAccess, refused
from tidemq.broker.store.config import FlushMode
from tidemq.broker.store.results import PutStatus, put_again
from tidemq.broker.topics import DLQ_PREFIX, RETRY_PREFIX
from tidemq.errors import CodecError
from tidemq.message import Prop, decode_record
from tidemq.remoting.codes import Perm, ResponseCode

if TYPE_CHECKING:
    from tidemq.broker.config import BrokerConfig
    from tidemq.broker.creation import ImplicitCreation
    from tidemq.broker.schedule import ScheduleMessageService
    from tidemq.broker.store.store import MessageStore

log = logging.getLogger(__name__)

DEFAULT_MAX_RECONSUME_TIMES = 16
FIRST_RETRY_LEVEL = 3
_WRITE = int(Perm.WRITE)


def max_reconsume_times(g: SubscriptionGroupConfig | None, requested: int | None) -> int:
    """The group's retryMaxTimes, overridden by the consumer's (or producer's) own limit when its
    request carries one (``requested``; the wire front-end decides when a request may)."""
    if requested is not None:
        return requested
    return g.retry_max_times if g is not None else DEFAULT_MAX_RECONSUME_TIMES


@dataclass(frozen=True, slots=True)
class SendBackRequest:
    caller: Caller
    group: str
    offset: int  # CommitLog offset of the message given back
    delay_level: int = 0  # 0: the broker's choice; < 0: straight to the dead-letter queue
    max_reconsume_times: int | None = None


@dataclass(frozen=True, slots=True)
class SendBackResult:
    """Where the message went: ``topic`` ``%RETRY%``/``%DLQ%<group>``, or "" when the group keeps
    no retry queue (the message is dropped, as RocketMQ does)."""

    topic: str
    reconsume_times: int = 0


class SendBackService:
    def __init__(self, *, settings: Callable[[], "BrokerConfig"], store: "MessageStore",
                 creation: "ImplicitCreation", schedule: "ScheduleMessageService",
                 store_host: tuple[str, int], access: StoredAccess | None,
                 replicated: "Callable[[int], asyncio.Future[int] | None] | None" = None) -> None:
        self._settings = settings
        self._replicated = replicated  # the replicated group's acknowledgement gate (None: alone)
        self._store = store
        self._creation = creation
        self._schedule = schedule
        self._store_host = store_host
        self._access = access  # None: ACL is off

    def send_back(self, req: SendBackRequest) -> SendBackResult | Awaitable[SendBackResult]:
        """Store the message again for a retry (or dead-letter it); awaitable under SYNC_FLUSH."""
        cfg = self._settings()
        group = req.group
        offset = req.offset
        if not group:
            raise refused(ResponseCode.SYSTEM_ERROR, "the send-back request names no consumer group")
        principal = req.caller.principal
        g = self._creation.group(group, principal)
        if not cfg.broker_permission & _WRITE:
            raise refused(ResponseCode.NO_PERMISSION, f"the broker[{cfg.broker_name}] sending message is forbidden")
        if g.retry_queue_nums <= 0:
            return SendBackResult("")
        raw = self._store.read_record(offset) if offset >= 0 else None
        if raw is None:
            raise refused(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}")
        try:
            msg = decode_record(raw)
        except CodecError as exc:
            raise refused(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}: {exc}") from None
        if self._access is not None:  # the caller may not read that message: it may not copy it either
            self._access.check_stored(req.caller, {t: AclPerm.SUB for t in stored_message_topics(msg.topic,
                                                                                               msg.properties)})
        props = dict(msg.properties)
        props.setdefault(Prop.RETRY_TOPIC, msg.topic)
        strip_delay(props)
        dead = msg.reconsume_times >= max_reconsume_times(g, req.max_reconsume_times) or req.delay_level < 0
        topic = DLQ_PREFIX + group if dead else RETRY_PREFIX + group
        tc = self._creation.retry_topic(topic, principal)
        if not tc.writable:
            raise refused(ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending message is forbidden")
        queue_id = random.randrange(max(1, tc.write_queue_nums))
        if not dead:
            level = req.delay_level if req.delay_level > 0 else FIRST_RETRY_LEVEL + msg.reconsume_times
            props[Prop.DELAY] = str(level)
        props[Prop.ORIGIN_MESSAGE_ID] = msg.properties.get(Prop.ORIGIN_MESSAGE_ID) or msg.offset_msg_id
        times = msg.reconsume_times + 1
        put = put_again(msg, topic, queue_id, props, self._store_host, reconsume_times=times)
        result = self._store.put(self._schedule.prepare_put(put))
        if result.status is not PutStatus.PUT_OK:
            raise refused(ResponseCode.SYSTEM_ERROR, result.remark or result.status.name)
        log.debug("message at %d of %s given back by group %s: now %s (reconsume %d)",
                  offset, msg.topic, group, topic, times)
        done = SendBackResult(topic, times)
        acked = self._replicated(result.end_offset) if self._replicated is not None else None
        if cfg.store.flush_mode is FlushMode.SYNC or acked is not None:
            return self._durable(result.end_offset, done, cfg.store.flush_mode is FlushMode.SYNC, acked)
        return done

    async def _durable(self, end: int, done: SendBackResult, flush: bool,
                       acked: "asyncio.Future[int] | None") -> SendBackResult:
        if flush and not await self._store.wait_durable(end):
            raise refused(ResponseCode.SYSTEM_ERROR, "FLUSH_DISK_TIMEOUT: the message is stored but not yet on disk")
        # Not acknowledged by the group's rule: the consumer keeps the message and retries it.
        code = await acked if acked is not None else ResponseCode.SUCCESS
        if code != ResponseCode.SUCCESS:
            raise refused(ResponseCode.SYSTEM_ERROR, f"the retry message is stored on the master but not confirmed "
                                                     f"by its in-sync replicas ({ResponseCode(code).name}); retry")
        return done
