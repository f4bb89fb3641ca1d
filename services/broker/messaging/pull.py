"""Pulling, with long polling.

Checks run in RocketMQ's order (broker readable, group, topic, queue, subscription); the store's
get status maps to the response code and nextBeginOffset of RocketMQ's table. A pull that finds
nothing new and may be held (``suspend``) is parked in the :class:`PullHoldService` until a
matching message arrives or its suspend timeout passes (the request's, capped by
``max_long_poll_ms``; ``short_polling_ms`` when long polling is off), then reads once more.

In a replicated group (issue 17) every replica serves pulls of what it holds (RocketMQ's slave
read, there behind ``slaveReadEnable``), up to the store's ``visible_end`` (the replica's
high-water mark). A replica that is not its group's acknowledging master (``is_master`` false:
a follower, or a master whose lease lapsed) serves reads only, as RocketMQ's SLAVE role does in
PullMessageProcessor:

- a commit offset carried by the pull is ignored (RocketMQ stores it only when the broker role is
  not SLAVE): committed offsets are the master's, replicated to followers through the log;
- it never corrects a consumer's offset (RocketMQ's ``offsetCheckInSlave`` off), since it may
  lag the master: an offset past its end, or a queue it does not hold yet, is answered
  PULL_NOT_FOUND at the requested offset (the consumer long-polls until it has caught up; RocketMQ
  answers PULL_RETRY_IMMEDIATELY), and an offset below its first one PULL_RETRY_IMMEDIATELY with
  nextBeginOffset at its first (the records before it are gone here).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tidemq.broker.clients import SubscriptionParseError, parse_tag_expression
from tidemq.broker.messaging.context import Caller, refused
from tidemq.broker.store.results import GetStatus
from tidemq.remoting.codes import Perm, ResponseCode

if TYPE_CHECKING:
    from tidemq.broker.clients import ClientRegistry
    from tidemq.broker.config import BrokerConfig
    from tidemq.broker.creation import ImplicitCreation
    from tidemq.broker.groups import SubscriptionGroupManager
    from tidemq.broker.longpoll import PullHoldService
    from tidemq.broker.offsets import ConsumerOffsetManager
    from tidemq.broker.store.store import MessageStore
    from tidemq.broker.topics import TopicConfigManager

log = logging.getLogger(__name__)

_READ = int(Perm.READ)


@dataclass(frozen=True, slots=True)
class PullRequest:
    caller: Caller
    group: str
    topic: str
    queue_id: int
    offset: int
    max_nums: int
    commit_offset: int = -1  # >= 0: commit this offset for the group first
    suspend: bool = False  # may be held until a message arrives
    suspend_timeout_ms: int = 15000
    subscription: str | None = None  # the request's own tag expression; None: the registered one
    expression_type: str = "TAG"
    sub_version: int = 0


@dataclass(frozen=True, slots=True)
class PullResult:
    """``code``: SUCCESS (``records`` holds whole stored records), PULL_NOT_FOUND,
    PULL_RETRY_IMMEDIATELY or PULL_OFFSET_MOVED (with ``remark``)."""

    code: int
    next_begin_offset: int
    min_offset: int
    max_offset: int
    records: list[bytes] = field(default_factory=list)
    remark: str | None = None


class PullService:
    def __init__(self, *, settings: Callable[[], "BrokerConfig"], store: "MessageStore",
                 topics: "TopicConfigManager", groups: "SubscriptionGroupManager", creation: "ImplicitCreation",
                 clients: "ClientRegistry", offsets: "ConsumerOffsetManager", holds: "PullHoldService",
                 on_get: Callable[[str, int, int], None], is_master: Callable[[], bool] | None = None) -> None:
        self._settings = settings
        self._store = store
        self._topics = topics
        self._groups = groups
        self._creation = creation
        self._clients = clients
        self._offsets = offsets
        self._holds = holds
        self._on_get = on_get  # messages and stored bytes served, by topic
        # Replicated: whether this replica is its group's acknowledging master (None: no group).
        self._is_master = is_master

    def pull(self, req: PullRequest) -> PullResult | Awaitable[PullResult]:
        """The messages at ``req.offset``; awaitable when the pull is held."""
        cfg = self._settings()
        tag_codes = self._check(req, cfg)
        if req.commit_offset >= 0 and (self._is_master is None or self._is_master()):
            self._offsets.commit(req.group, req.topic, req.queue_id, req.commit_offset)
        result = self._read(req, tag_codes, cfg)
        if result.code != ResponseCode.PULL_NOT_FOUND or not req.suspend:
            return result
        if cfg.long_polling:
            suspend_ms = min(req.suspend_timeout_ms, cfg.max_long_poll_ms)
        else:
            suspend_ms = cfg.short_polling_ms
        if suspend_ms <= 0:
            return result
        return self._hold(req, tag_codes, suspend_ms / 1000.0)

    async def _hold(self, req: PullRequest, tag_codes: frozenset[int] | None, timeout: float) -> PullResult:
        # A message put between the read above and this task's first step woke nobody: look
        # again before parking (no await between this check and the waiter's registration).
        if not self._store.readable(req.topic, req.queue_id, req.offset):
            await self._holds.wait(req.topic, req.queue_id, req.offset, tag_codes, timeout)
        return self._read(req, tag_codes, self._settings())

    def _check(self, req: PullRequest, cfg: "BrokerConfig") -> frozenset[int] | None:
        """Raise the refusal for a pull RocketMQ refuses; else the tag codes it matches (None: all)."""
        if not cfg.broker_permission & _READ:
            raise refused(ResponseCode.NO_PERMISSION, f"the broker[{cfg.broker_name}] pulling message is forbidden")
        group, topic, queue_id = req.group, req.topic, req.queue_id
        g = self._groups.get(group) or self._creation.group(group, req.caller.principal)
        if not g.consume_enable:
            raise refused(ResponseCode.NO_PERMISSION, f"subscription group [{group}] is not allowed to consume")
        tc = self._topics.get(topic)
        if tc is None:
            raise refused(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not tc.readable:
            raise refused(ResponseCode.NO_PERMISSION, f"the topic[{topic}] pulling message is forbidden")
        if queue_id < 0 or queue_id >= tc.read_queue_nums:
            raise refused(
                ResponseCode.SYSTEM_ERROR,
                f"queueId[{queue_id}] is illegal, topic:[{topic}] topicConfig.readQueueNums:[{tc.read_queue_nums}]",
            )
        if req.subscription is not None:
            expr_type = (req.expression_type or "TAG").upper()
            if expr_type != "TAG":
                raise refused(ResponseCode.SUBSCRIPTION_PARSE_FAILED, f"expression type {expr_type} is not supported yet")
            try:
                parsed = parse_tag_expression(req.subscription or "*")
            except SubscriptionParseError as exc:
                raise refused(ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(exc)) from None
            return parsed[1] if parsed else None
        sub = self._clients.subscription(group, topic)
        if sub is None:
            raise refused(
                ResponseCode.SUBSCRIPTION_NOT_EXIST,
                f"the consumer's subscription of {topic} does not exist; send a heartbeat first",
            )
        if sub.sub_version < req.sub_version:
            raise refused(ResponseCode.SUBSCRIPTION_NOT_LATEST, "the consumer's subscription is not latest")
        return sub.tag_codes

    def _read(self, req: PullRequest, tag_codes: frozenset[int] | None, cfg: "BrokerConfig") -> PullResult:
        topic, offset = req.topic, req.offset
        r = self._store.get_messages(topic, req.queue_id, offset, req.max_nums, tag_codes, cfg.max_pull_bytes)
        st = r.status
        if st is GetStatus.FOUND:
            self._on_get(topic, r.message_count, r.total_bytes)
            return PullResult(ResponseCode.SUCCESS, r.next_begin_offset, r.min_offset, r.max_offset, r.records)
        if st is GetStatus.NO_MATCHED_MESSAGE or st is GetStatus.MESSAGE_WAS_REMOVING:
            code, remark = ResponseCode.PULL_RETRY_IMMEDIATELY, None
        elif st is GetStatus.NO_MESSAGE_IN_QUEUE:
            if offset != 0:
                code, remark = ResponseCode.PULL_OFFSET_MOVED, "the queue is empty"
            else:
                code, remark = ResponseCode.PULL_NOT_FOUND, None
        elif st is GetStatus.OFFSET_TOO_SMALL or st is GetStatus.OFFSET_OVERFLOW_BADLY:
            code, remark = ResponseCode.PULL_OFFSET_MOVED, f"offset {offset} is out of range"
        else:
            code, remark = ResponseCode.PULL_NOT_FOUND, None
        if code == ResponseCode.PULL_OFFSET_MOVED and self._is_master is not None and not self._is_master():
            return self._unmoved(req, r.min_offset, r.max_offset)
        return PullResult(code, r.next_begin_offset, r.min_offset, r.max_offset, [], remark)

    def _unmoved(self, req: PullRequest, min_offset: int, max_offset: int) -> PullResult:
        """A follower's answer where a master would move the consumer (see the module docstring)."""
        if req.offset < min_offset:
            return PullResult(ResponseCode.PULL_RETRY_IMMEDIATELY, min_offset, min_offset, max_offset)
        return PullResult(ResponseCode.PULL_NOT_FOUND, req.offset, min_offset, max_offset)
