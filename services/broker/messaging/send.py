"""Sending: one message, a batch, and a big (or compressed) batch stored slice by slice.

``SendService.send`` reads check -> put (single or batch) -> respond, as RocketMQ's
SendMessageProcessor does:

- check: the broker and the topic are writable, the name is valid and not a system topic, the
  topic exists (or is created: from the default topic with auto-creation on, a ``%RETRY%``/``%DLQ%``
  topic of a known group), the queue id is a write queue, below writeQueueNums (-1: a random one);
  a queue that is only readable (the queues a shrink drains, between writeQueueNums and
  readQueueNums) is refused with NO_PERMISSION, after which producers re-read the route, where
  RocketMQ 4.x accepts any queue below max(read, write); a plain send into
  ``%RETRY%<group>`` that has used up the group's retries goes to ``%DLQ%<group>`` instead (the
  send-back rule, :mod:`tidemq.broker.messaging.sendback`).
- put: a single message is stored as is, as a half message (transactions) or redirected to the
  schedule/timer topic (a delay); a batch is stored whole or not at all, after every message of it
  was checked. A batch that is compressed or holds more than BATCH_SLICE messages is inflated,
  decoded and prepared one slice per event-loop turn, one such batch at a time, then appended in
  one step: frames read together must not stall the loop together.
- respond: a :class:`SendResult`, at once, or (SYNC_FLUSH or sync replicas, the producer waits) a
  :class:`PendingSend` answered when the group commit and the in-sync followers cover the message.

A refusal raises BrokerError with the RocketMQ response code; nothing is stored then.

Hot path (guarded by bench/hot_path.py): no JSON, one properties parse per message, topic names
validated once (bounded cache), no per-message object beyond the store request and the result.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tidemq.broker.delay import DELAY_PROPERTIES, TIMER_TOPIC, has_timer, strip_delay
from tidemq.broker.messaging.context import Caller, refused
from tidemq.broker.messaging.sendback import max_reconsume_times
from tidemq.broker.store.config import FlushMode
from tidemq.broker.store.results import PutRequest, PutResult, PutStatus
from tidemq.broker.topics import (
    DLQ_PREFIX,
    NOT_ALLOWED_SEND,
    RETRY_PREFIX,
    TopicConfig,
    group_of,
    loggable,
    validate_topic_name,
)
from tidemq.broker.transaction.half import is_transactional
from tidemq.errors import BrokerError, CodecError
from tidemq.message import Prop, SysFlag, count_batch, decode_batch, decode_properties, inflate
from tidemq.remoting.codes import Perm, ResponseCode

if TYPE_CHECKING:
    from tidemq.broker.config import BrokerConfig
    from tidemq.broker.creation import ImplicitCreation
    from tidemq.broker.groups import SubscriptionGroupManager
    from tidemq.broker.schedule import ScheduleMessageService
    from tidemq.broker.store.store import MessageStore
    from tidemq.broker.topics import TopicConfigManager
    from tidemq.broker.transaction.service import TransactionService

log = logging.getLogger(__name__)

BATCH_SLICE = 2048  # messages of a batch prepared between two yields to the event loop
_SLICE_BYTES = BATCH_SLICE * 22  # a body this short cannot hold more than BATCH_SLICE messages
_VALID_TOPICS_MAX = 10_000
_WRITE = int(Perm.WRITE)
_COMPRESSED = int(SysFlag.COMPRESSED)
_SYNC = FlushMode.SYNC
_PUT_OK = PutStatus.PUT_OK

_PUT_CODES = {
    PutStatus.PUT_OK: ResponseCode.SUCCESS,
    PutStatus.FLUSH_DISK_TIMEOUT: ResponseCode.FLUSH_DISK_TIMEOUT,
    PutStatus.MESSAGE_ILLEGAL: ResponseCode.MESSAGE_ILLEGAL,
    PutStatus.PROPERTIES_SIZE_EXCEEDED: ResponseCode.MESSAGE_ILLEGAL,
    PutStatus.SERVICE_NOT_AVAILABLE: ResponseCode.SERVICE_NOT_AVAILABLE,
}


# SendRequest and SendResult are not frozen: a frozen dataclass's __init__ costs ~1 us more per
# object, made once per message here (bench/hot_path.py). Treated as immutable all the same.
@dataclass(slots=True)
class SendRequest:
    """One send: a message, or a batch (``body`` in the batch encoding) when ``batch``."""

    caller: Caller
    born_host: tuple[str, int]
    topic: str
    queue_id: int  # -1: the broker picks a writable queue
    body: bytes
    properties: str  # encoded (tidemq.message.encode_properties); a batch's apply to each message
    flag: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    reconsume_times: int = 0
    max_reconsume_times: int | None = None  # the producer's retry limit for %RETRY% sends
    batch: bool = False
    default_topic: str = ""  # the template of an auto-created topic
    default_topic_queue_nums: int = 4


@dataclass(slots=True)
class SendResult:
    """A stored send: ``code`` is SUCCESS, or FLUSH_DISK_TIMEOUT (stored, not yet on disk)."""

    msg_id: str  # offset message ids, comma-separated for a batch
    queue_id: int
    queue_offset: int
    code: int = ResponseCode.SUCCESS
    remark: str | None = None


def _namesrv_arg(addrs: tuple[str, ...]) -> str:
    """The ``-n`` argument of a `tidemq admin` hint: this broker's name servers, quoted when a list
    (a shell ends an unquoted command at the ``;``)."""
    joined = ";".join(addrs) or "NAMESRV_ADDR"
    return f'"{joined}"' if ";" in joined else joined


def _queue_refusal(tc: TopicConfig, queue_id: int, broker: str) -> BrokerError:
    """The refusal of a send to ``queue_id`` at or above the topic's writeQueueNums. A readable
    queue is being drained (a shrink lowered writeQueueNums first): writing there after its
    consumers moved on would lose the message, and NO_PERMISSION makes the producer re-read the
    route (tidemq.client.send.ROUTE_FAULT_CODES) and retry on a write queue."""
    topic, write = tc.topic_name, tc.write_queue_nums
    if queue_id < tc.read_queue_nums:
        return refused(
            ResponseCode.NO_PERMISSION,
            f"queue {queue_id} of topic[{topic}] on broker[{broker}] takes no new messages: writeQueueNums is "
            f"{write}, readQueueNums {tc.read_queue_nums} (queues {write}-{tc.read_queue_nums - 1} are only "
            f"read, as while a shrink drains them); refresh the topic's route and send to a queue below {write}",
        )
    return refused(
        ResponseCode.SYSTEM_ERROR,
        f"request queueId[{queue_id}] is illegal, topic {topic} has {tc.queue_nums} queues "
        f"({write} writable); refresh the topic's route",
    )


class SendService:
    def __init__(self, *, settings: Callable[[], "BrokerConfig"], store: "MessageStore",
                 topics: "TopicConfigManager", groups: "SubscriptionGroupManager",
                 creation: "ImplicitCreation", schedule: "ScheduleMessageService",
                 transactions: "TransactionService", store_host: tuple[str, int],
                 on_put: Callable[[str, int, int], None],
                 replicated: "Callable[[int, Callable[[int], None]], int | None] | None" = None) -> None:
        self._settings = settings
        self._store = store
        self._topics = topics
        self._groups = groups
        self._creation = creation
        self._schedule = schedule
        self._transactions = transactions
        self._store_host = store_host
        self._on_put = on_put  # messages and body bytes stored, by topic (a delayed one: its own, not the schedule topic)
        # The replicated group's acknowledgement gate, as a callback (ha/replica.py
        # ReplicaService.when_replicated): None without replication.
        self._replicated = replicated
        self._valid_topics: set[str] = set()
        self._big_batches = asyncio.Lock()  # one batch of more than BATCH_SLICE messages at a time

    def send(self, req: SendRequest) -> SendResult | Awaitable[SendResult]:
        """Store ``req``; the result now, or an awaitable one (SYNC_FLUSH wait, big batch)."""
        cfg = self._settings()
        try:
            topic, queue_id, props = self._check(req, cfg)
            if req.batch:
                return self._put_batch(req, cfg, topic, queue_id, props)
            return self._put_single(req, cfg, topic, queue_id, props)
        except CodecError as exc:
            raise refused(ResponseCode.MESSAGE_ILLEGAL, f"bad message body: {exc}") from None

    # check ----------------------------------------------------------------------------------
    def _check(self, req: SendRequest, cfg: "BrokerConfig") -> tuple[str, int, dict[str, str]]:
        topic = req.topic
        if not cfg.broker_permission & _WRITE:
            raise refused(ResponseCode.NO_PERMISSION, f"the broker[{cfg.broker_name}] sending message is forbidden")
        if topic not in self._valid_topics:  # hot path: validate each name once (bounded cache)
            problem = validate_topic_name(topic)
            if problem:
                raise refused(ResponseCode.SYSTEM_ERROR, f"{problem}; fix the topic name")
            if len(self._valid_topics) >= _VALID_TOPICS_MAX:
                self._valid_topics.clear()
            self._valid_topics.add(topic)
        if topic in NOT_ALLOWED_SEND or topic == TIMER_TOPIC:
            raise refused(ResponseCode.NO_PERMISSION, f"sending message to topic[{topic}] is forbidden")
        tc = self._topics.get(topic)
        if tc is None:
            tc = self._create_topic(req, cfg)
        if not tc.writable:
            raise refused(ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending message is forbidden")
        queue_id = req.queue_id
        if queue_id >= tc.write_queue_nums:
            raise _queue_refusal(tc, queue_id, cfg.broker_name)
        if queue_id < 0:
            queue_id = random.randrange(tc.write_queue_nums or 1)
        props = decode_properties(req.properties)
        props[Prop.CLUSTER] = cfg.cluster_name
        if topic.startswith(RETRY_PREFIX):
            topic, queue_id = self._maybe_dlq(req, topic, queue_id, props)
        return topic, queue_id, props

    def _create_topic(self, req: SendRequest, cfg: "BrokerConfig") -> TopicConfig:
        topic = req.topic
        principal = req.caller.principal
        group = group_of(topic)
        tc = None
        if group is not None:  # %RETRY%<group> of a group that exists (or may be made); %DLQ%<group> of one that exists
            if topic.startswith(RETRY_PREFIX):
                self._creation.group(group, principal)
            elif self._groups.get(group) is None:
                raise refused(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                              f"subscription group [{loggable(group)}] of {loggable(topic)} does not exist")
            tc = self._creation.retry_topic(topic, principal)
        elif cfg.auto_create_topic:
            tc = self._creation.topic_from_default(topic, req.default_topic, req.default_topic_queue_nums, principal)
        if tc is None:
            raise refused(
                ResponseCode.TOPIC_NOT_EXIST,
                f"topic[{topic}] not exist, apply first please! (create it with `tidemq admin updateTopic "
                f"-n {_namesrv_arg(cfg.namesrv_addrs)} -c {cfg.cluster_name} -t {topic}`)",
            )
        return tc

    def _maybe_dlq(self, req: SendRequest, topic: str, queue_id: int,
                   props: dict[str, str]) -> tuple[str, int]:
        """A send into ``%RETRY%<group>`` past the group's retries goes to ``%DLQ%<group>``
        (the rule of CONSUMER_SEND_MSG_BACK)."""
        group = topic[len(RETRY_PREFIX):]
        principal = req.caller.principal
        g = self._creation.group(group, principal)
        if req.reconsume_times < max_reconsume_times(g, req.max_reconsume_times):
            return topic, queue_id
        dlq = DLQ_PREFIX + group
        self._creation.retry_topic(dlq, principal)
        strip_delay(props)
        return dlq, 0

    # put --------------------------------------------------------------------------------------
    def _put_single(self, req: SendRequest, cfg: "BrokerConfig", topic: str, queue_id: int,
                    props: dict[str, str]) -> SendResult | Awaitable[SendResult]:
        body = req.body
        max_size = cfg.store.max_message_size
        if len(body) > max_size:
            raise refused(
                ResponseCode.MESSAGE_ILLEGAL,
                f"message body is {len(body)} bytes, larger than the broker's maximum {max_size}",
            )
        if not body:
            raise refused(ResponseCode.MESSAGE_ILLEGAL, "message body is empty")
        transactional = is_transactional(req.sys_flag, props)  # half message (transaction/)
        wait = props.pop(Prop.WAIT, "true").lower() != "false"
        put = PutRequest(topic, queue_id, body, props, req.flag, req.sys_flag, req.born_timestamp,
                         req.born_host, self._store_host, req.reconsume_times)
        if transactional:
            result = self._transactions.prepare(put)
        else:
            # A delay goes to the schedule/timer topic (hot path: no call when there is none).
            result = self._store.put(put if DELAY_PROPERTIES.isdisjoint(props) else self._schedule.prepare_put(put))
        return self._respond(cfg, result, queue_id, wait, len(body), topic)

    def _put_batch(self, req: SendRequest, cfg: "BrokerConfig", topic: str, queue_id: int,
                   props: dict[str, str]) -> SendResult | Awaitable[SendResult]:
        if is_transactional(req.sys_flag, props):
            raise refused(ResponseCode.MESSAGE_ILLEGAL, "a batch cannot hold transactional messages")
        body = req.body
        sys_flag = req.sys_flag
        compressed = bool(sys_flag & _COMPRESSED)
        put = _BatchPut(topic, queue_id, props, sys_flag & ~_COMPRESSED, req.born_timestamp, req.born_host,
                        self._store_host, req.reconsume_times, cfg.store.max_message_size)
        if compressed or (len(body) > _SLICE_BYTES and count_batch(body, BATCH_SLICE) > BATCH_SLICE):
            return self._put_big_batch(cfg, put, body, compressed)
        put.add(decode_batch(body))
        return self._respond(cfg, self._store.put_batch(put.reqs), queue_id, put.wait, put.size, topic)

    async def _put_big_batch(self, cfg: "BrokerConfig", put: "_BatchPut", body: bytes,
                             compressed: bool) -> SendResult:
        """A compressed batch or one of more than BATCH_SLICE messages: inflated, decoded, checked
        and prepared for the store one step per loop turn, one such batch at a time (others wait
        without using the loop), then appended whole. Other requests are served between steps."""
        store = self._store
        pending: list = []
        total = 0
        async with self._big_batches:
            try:
                await asyncio.sleep(0)
                if compressed:
                    body = inflate(body, cfg.store.max_message_size * 4)
                    await asyncio.sleep(0)
                items = decode_batch(body)
                for i in range(0, len(items), BATCH_SLICE):
                    if i:
                        await asyncio.sleep(0)
                    start = len(put.reqs)
                    put.add(items[i:i + BATCH_SLICE])
                    prepared = store.prepare_batch(put.reqs[start:])
                    if isinstance(prepared, PutResult):
                        raise _refusal(prepared)
                    pending += prepared[0]
                    total += prepared[1]
            except CodecError as exc:
                raise refused(ResponseCode.MESSAGE_ILLEGAL, f"bad message body: {exc}") from None
            result = store.put_prepared(pending, total)  # one append: all of the batch or nothing
        answer = self._respond(cfg, result, put.queue_id, put.wait, put.size, put.topic)
        return answer if isinstance(answer, SendResult) else await answer

    # respond ----------------------------------------------------------------------------------
    def _respond(self, cfg: "BrokerConfig", result: PutResult, queue_id: int, wait: bool, size: int,
                 topic: str) -> SendResult | Awaitable[SendResult]:
        """The result of a put the store answered; raises the refusal when it did not store it."""
        if result.status is _PUT_OK:
            code = ResponseCode.SUCCESS
        else:
            code = _PUT_CODES.get(result.status, ResponseCode.SYSTEM_ERROR)
            if code is not ResponseCode.FLUSH_DISK_TIMEOUT:
                raise _refusal(result)
        self._on_put(topic, result.count, size)
        stored = SendResult(",".join(result.msg_ids), queue_id, result.queue_offset, code)
        gate = self._replicated
        sync = cfg.store.flush_mode is _SYNC
        if not wait or (gate is None and not sync):  # hot path (ASYNC_FLUSH): no PendingSend
            return stored
        # Answered when the group commit and the in-sync followers cover it: a PendingSend whose
        # waits call it back directly (hot path: no future, no task, no loop turn per link; the
        # gate calls back in the step that reads the follower's ack).
        pending = PendingSend(stored, result.end_offset)
        if sync and self._store.when_durable(result.end_offset, pending.flushed):
            pending.waits += 1
        if gate is not None:
            now = gate(result.end_offset, pending.acked)
            if now is None:
                pending.waits += 1
            elif now != ResponseCode.SUCCESS:
                pending.refused(now)
        if pending.waits:
            return pending
        return stored if pending.clean() else pending.settle()


def _refusal(result: PutResult) -> BrokerError:
    """The refusal of a put the store did not take."""
    code = _PUT_CODES.get(result.status, ResponseCode.SYSTEM_ERROR)
    return refused(code, result.remark or f"store refused the message: {result.status.name}")


_NOT_REPLICATED: dict[int, str] = {
    ResponseCode.FLUSH_SLAVE_TIMEOUT: "the message is stored on the master, but its in-sync replicas did not "
                                      "confirm it in time; it may be sent again",
    ResponseCode.SLAVE_NOT_AVAILABLE: "the message is stored on the master, but fewer replicas than minInSync are "
                                      "in sync; it may be sent again",
}


class PendingSend:
    """A stored send answered once its SYNC_FLUSH round (``flushed``) and its in-sync replicas
    (``acked``) are known, as many as it waits for (``waits``). ``then`` callbacks run at that
    moment, in the caller of the last report (the flusher's release, on the loop thread), so a
    flush reaches the connection's answer without a loop iteration per link; awaiting it works
    too (a big batch, a coroutine caller)."""

    __slots__ = ("stored", "end_offset", "waits", "result", "_flushed", "_code", "_callbacks")

    def __init__(self, stored: SendResult, end_offset: int) -> None:
        self.stored = stored
        self.end_offset = end_offset
        self.waits = 0  # reports still to come
        self.result: SendResult | None = None
        self._flushed = True
        self._code: int = ResponseCode.SUCCESS  # the replicas' answer
        self._callbacks: list[Callable[[SendResult], None]] = []

    def flushed(self, durable: bool) -> None:
        """The flusher's report: True once flushed past the send, False on timeout or failure."""
        self._flushed = durable
        self._reported()

    def acked(self, code: int) -> None:
        """The replication gate's report: SUCCESS, or why the replicas did not confirm in time."""
        self._code = code
        self._reported()

    def refused(self, code: int) -> None:
        """The replication gate's answer at once (not a report awaited): why it is not confirmed."""
        self._code = code

    def clean(self) -> bool:
        """Nothing to add to the stored result: flushed (or not waited for) and confirmed."""
        return self._flushed and self._code == ResponseCode.SUCCESS

    def settle(self) -> SendResult:
        """The answer now that every report is in (``waits`` is 0)."""
        self.result = self._settle()
        return self.result

    def then(self, callback: Callable[[SendResult], None]) -> None:
        """Call ``callback(result)`` once answered (now, if it is)."""
        if self.result is not None:
            callback(self.result)
        else:
            self._callbacks.append(callback)

    def __await__(self) -> Generator[Any, None, SendResult]:
        if self.result is not None:
            return self.result
        fut: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
        self.then(functools.partial(_resolve, fut))
        return (yield from fut.__await__())

    def _reported(self) -> None:
        self.waits -= 1
        if self.waits:
            return
        result = self.settle()
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(result)

    def _settle(self) -> SendResult:
        stored = self.stored
        if not self._flushed:
            log.warning("SYNC_FLUSH did not complete within the flush timeout (offset %d)", self.end_offset)
            return SendResult(stored.msg_id, stored.queue_id, stored.queue_offset,
                              ResponseCode.FLUSH_DISK_TIMEOUT, "flush to disk timed out; the message is stored")
        code = self._code
        if code == ResponseCode.SUCCESS:
            return SendResult(stored.msg_id, stored.queue_id, stored.queue_offset)
        return SendResult(stored.msg_id, stored.queue_id, stored.queue_offset, code,
                          _NOT_REPLICATED.get(code, "the message is stored on the master only"))


def _resolve(fut: "asyncio.Future[SendResult]", result: SendResult) -> None:
    if not fut.done():  # the awaiting task may have been cancelled
        fut.set_result(result)


class _BatchPut:
    """The store requests of one batch, built slice by slice; nothing is stored unless every
    message is valid."""

    __slots__ = ("topic", "queue_id", "header_items", "sys_flag", "born_ts", "host", "store_host", "reconsume",
                 "max_size", "reqs", "wait", "size")

    def __init__(self, topic: str, queue_id: int, header_props: dict[str, str], sys_flag: int, born_ts: int,
                 host: tuple[str, int], store_host: tuple[str, int], reconsume: int, max_size: int) -> None:
        self.topic, self.queue_id, self.sys_flag, self.born_ts = topic, queue_id, sys_flag, born_ts
        self.header_items = list(header_props.items())
        self.host, self.store_host, self.reconsume, self.max_size = host, store_host, reconsume, max_size
        self.reqs: list[PutRequest] = []
        self.wait = True
        self.size = 0

    # Hot path (bench/hot_path.py batch): one tight loop, lookups hoisted.
    def add(self, items: list) -> None:
        max_size = self.max_size
        header_items = self.header_items
        topic, queue_id, sys_flag, born_ts = self.topic, self.queue_id, self.sys_flag, self.born_ts
        host, store_host, reconsume = self.host, self.store_host, self.reconsume
        append = self.reqs.append
        size = 0
        for item in items:
            item_body = item.body
            if len(item_body) > max_size:
                raise refused(ResponseCode.MESSAGE_ILLEGAL, f"a message of the batch is {len(item_body)} bytes, "
                              f"larger than the broker's maximum {max_size}; nothing of the batch was stored")
            props = decode_properties(item.properties)
            if Prop.DELAY in props or has_timer(props):
                raise refused(ResponseCode.MESSAGE_ILLEGAL, "batch messages may not use a delay level or delivery time")
            for k, v in header_items:
                if k not in props:
                    props[k] = v
            if props.pop(Prop.WAIT, "true").lower() == "false":
                self.wait = False
            size += len(item_body)
            append(PutRequest(topic, queue_id, item_body, props, item.flag, sys_flag, born_ts, host,
                              store_host, reconsume))
        self.size += size
