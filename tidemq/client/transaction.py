"""Transactional messages: a producer that sends half messages, runs the local transaction, ends
it with END_TRANSACTION, and answers the broker's CHECK_TRANSACTION_STATE (RocketMQ's
TransactionMQProducer / TransactionListener).

``TransactionProducer.send_message_in_transaction`` follows Java's
``DefaultMQProducerImpl.sendMessageInTransaction``: the message gets ``TRAN_MSG=true`` and
``PGROUP=<group>`` (a delay level is dropped), is sent as a normal send (the broker keeps it as an
invisible half message), then ``listener.execute_local_transaction(msg, arg)`` runs (an exception
counts as UNKNOW), and END_TRANSACTION goes oneway to the broker that stored the half message:
COMMIT (8), ROLLBACK (12) or UNKNOW (0, the broker will ask later). A half message the broker
stored without flushing it in time (FLUSH_DISK_TIMEOUT ...) is rolled back without running the
local transaction.

A broker that finds a transaction open after its timeout sends CHECK_TRANSACTION_STATE to a
producer of the group; ``listener.check_local_transaction(msg_ext)`` decides, and the answer goes
back (END_TRANSACTION with fromTransactionCheck) on the connection the question came in on.
At most ``check_concurrency`` checks run at once and ``max_pending_checks`` wait; more are
dropped (the broker asks again in its next round).

Listener methods may be coroutine functions (awaited on the loop) or plain functions, which run
in a worker thread so that a blocking database call never stalls the event loop. Each returns a
:class:`LocalTransactionState` (its name as a string is accepted too; None means UNKNOW).

The transaction id is the message's UNIQ_KEY: ``msg.properties["UNIQ_KEY"]`` of the message the
listener gets, ``TransactionSendResult.transaction_id``, and ``msg_ext.msg_id`` in a check.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tidemq.client.base import ClientBase
from tidemq.client.config import ClientConfig
from tidemq.client.facade import SyncFacade, blocking
from tidemq.client.instance import ClientInstance
from tidemq.client.producer import Producer
from tidemq.client.route import MessageQueue
from tidemq.client.selectors import QueueSelector
from tidemq.client.send import SendResult, SendStatus
from tidemq.client.tasks import cancel_all, keep
from tidemq.errors import ClientError, CodecError, RemotingError, TideMQError
from tidemq.message import (
    Message,
    MessageExt,
    Prop,
    SysFlag,
    decode_offset_msg_id,
    decode_record,
    inflate,
)
from tidemq.remoting import Connection, RemotingCommand, RequestCode, ResponseCode

log = logging.getLogger(__name__)

DEFAULT_MAX_PENDING_CHECKS = 2000


class LocalTransactionState(enum.Enum):
    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"  # RocketMQ's spelling


# END_TRANSACTION commitOrRollback: the sysFlag transaction values.
END_TYPES = {
    LocalTransactionState.COMMIT_MESSAGE: int(SysFlag.TRANSACTION_COMMIT),
    LocalTransactionState.ROLLBACK_MESSAGE: int(SysFlag.TRANSACTION_ROLLBACK),
    LocalTransactionState.UNKNOW: 0,
}


class TransactionListener(Protocol):
    def execute_local_transaction(
        self, msg: Message, arg: Any
    ) -> LocalTransactionState | Awaitable[LocalTransactionState]: ...

    def check_local_transaction(
        self, msg: MessageExt
    ) -> LocalTransactionState | Awaitable[LocalTransactionState]: ...


@dataclass(frozen=True, slots=True)
class TransactionSendResult:
    """The half message's send result and the state the local transaction ended in."""

    send_result: SendResult
    local_state: LocalTransactionState

    @property
    def status(self) -> SendStatus:
        return self.send_result.status

    @property
    def msg_id(self) -> str:
        return self.send_result.msg_id

    @property
    def transaction_id(self) -> str:
        return self.send_result.msg_id

    @property
    def offset_msg_id(self) -> str:
        return self.send_result.offset_msg_id

    @property
    def message_queue(self) -> MessageQueue:
        return self.send_result.message_queue

    @property
    def queue_offset(self) -> int:
        return self.send_result.queue_offset


def build_end_transaction(
    group: str,
    tran_state_table_offset: int,
    commit_log_offset: int,
    state: LocalTransactionState,
    msg_id: str,
    transaction_id: str,
    from_check: bool,
    remark: str | None = None,
) -> RemotingCommand:
    """END_TRANSACTION (37), oneway. Pure."""
    cmd = RemotingCommand.request(
        RequestCode.END_TRANSACTION,
        {
            "producerGroup": group,
            "tranStateTableOffset": tran_state_table_offset,
            "commitLogOffset": commit_log_offset,
            "commitOrRollback": END_TYPES[state],
            "fromTransactionCheck": from_check,
            "msgId": msg_id,
            "transactionId": transaction_id,
        },
        oneway=True,
    )
    cmd.remark = remark
    return cmd


def coerce_state(value: object, what: str) -> LocalTransactionState:
    if isinstance(value, LocalTransactionState):
        return value
    if value is None:
        return LocalTransactionState.UNKNOW
    if isinstance(value, str) and value in LocalTransactionState.__members__:
        return LocalTransactionState[value]
    log.warning("%s returned %r, not a LocalTransactionState; treated as UNKNOW", what, value)
    return LocalTransactionState.UNKNOW


async def call_listener(fn: Callable[..., Any], *args: Any) -> Any:
    """Await a coroutine function on the loop; run a plain function in a worker thread."""
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)):
        return await fn(*args)
    result = await asyncio.to_thread(fn, *args)
    if inspect.isawaitable(result):
        result = await result
    return result


def _check_listener(listener: object) -> None:
    for name in ("execute_local_transaction", "check_local_transaction"):
        if not callable(getattr(listener, name, None)):
            raise ClientError(f"the transaction listener has no {name}() method; implement "
                              "tidemq.TransactionListener")


class TransactionProducer(ClientBase):
    """An asyncio transactional producer (RocketMQ's TransactionMQProducer).

    ``topics``: topics whose brokers should know this producer as soon as it starts (so it can
    answer checks, e.g. for transactions a crashed instance of the same group left open, before
    its own first send). It can also send ordinary messages with :meth:`send`.
    """

    _not_started = ("transaction producer is not started: call `await producer.start()` "
                    "or use `async with TransactionProducer(...)`")

    def __init__(
        self,
        group: str,
        listener: TransactionListener,
        name_servers: str | Sequence[str] | None = None,
        config: ClientConfig | None = None,
        check_concurrency: int = 1,
        topics: Sequence[str] = (),
        max_pending_checks: int = DEFAULT_MAX_PENDING_CHECKS,
    ) -> None:
        _check_listener(listener)
        if check_concurrency < 1 or max_pending_checks < 1:
            raise ClientError("check_concurrency and max_pending_checks must be at least 1")
        self._producer = Producer(group, name_servers, config)
        self.config = self._producer.config
        self.listener = listener
        self.check_concurrency = check_concurrency
        self.max_pending_checks = max_pending_checks
        self.topics = tuple(topics)
        self._slots: asyncio.Semaphore | None = None
        self._checks: set[asyncio.Task] = set()
        self.checks_answered = 0

    @property
    def group(self) -> str:
        return self._producer.group

    @property
    def producer(self) -> Producer:
        return self._producer

    # lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._instance is not None:
            return
        await self._producer.start()
        try:
            await super().start()
        except BaseException:
            await self._producer.close()
            raise
        inst = self._require()
        try:
            for topic in self.topics:
                await inst.get_route(topic)
            if self.topics:
                await inst.send_heartbeat()
        except BaseException:
            await self.close()
            raise

    def _attach(self, inst: ClientInstance) -> None:
        self._slots = asyncio.Semaphore(self.check_concurrency)
        inst.register_request_handler(RequestCode.CHECK_TRANSACTION_STATE, self._on_check)

    async def close(self) -> None:
        await super().close()
        await self._producer.close()

    async def _detach(self, inst: ClientInstance) -> None:
        inst.unregister_request_handler(RequestCode.CHECK_TRANSACTION_STATE, self._on_check)
        await cancel_all(list(self._checks))

    # sending -----------------------------------------------------------------------------------
    async def send(self, msg: Message, queue: MessageQueue | None = None,
                   selector: QueueSelector | None = None, arg: Any = None,
                   timeout: float | None = None) -> SendResult:
        """Send an ordinary (non-transactional) message."""
        self._require()
        return await self._producer.send(msg, queue, selector, arg, timeout)

    async def send_message_in_transaction(self, msg: Message, arg: Any = None,
                                          timeout: float | None = None) -> TransactionSendResult:
        inst = self._require()
        if not isinstance(msg, Message):
            raise ClientError(f"expected a tidemq.Message, got {type(msg).__name__}")
        props = dict(msg.properties)
        if props.pop(Prop.DELAY, None) is not None:
            log.debug("delay level of a transactional message ignored")
        props[Prop.TRAN_MSG] = "true"
        props[Prop.PGROUP] = self.group
        props.setdefault(Prop.UNIQ_KEY, inst.next_uniq_id())
        half = dataclasses.replace(msg, properties=props)
        result = await self._producer.send(half, timeout=timeout)
        local_exc: BaseException | None = None
        if result.status is SendStatus.SEND_OK:
            try:
                state = coerce_state(
                    await call_listener(self.listener.execute_local_transaction, half, arg),
                    "execute_local_transaction",
                )
            except Exception as exc:  # noqa: BLE001 (a failing local transaction is UNKNOW: the broker asks again)
                log.warning("execute_local_transaction of transaction %s failed: %r", result.msg_id, exc)
                state, local_exc = LocalTransactionState.UNKNOW, exc
        else:
            state = LocalTransactionState.ROLLBACK_MESSAGE
        if state is not LocalTransactionState.COMMIT_MESSAGE:
            log.info("transaction %s of group %s: local transaction state %s", result.msg_id,
                     self.group, state.value)
        try:
            await self._end(inst, result, state, local_exc)
        except TideMQError as exc:
            log.warning("END_TRANSACTION %s for %s failed (the broker will check back): %s",
                        state.value, result.msg_id, exc)
        return TransactionSendResult(result, state)

    async def _end(self, inst: ClientInstance, result: SendResult, state: LocalTransactionState,
                   local_exc: BaseException | None) -> None:
        try:
            id_addr, commit_log_offset = decode_offset_msg_id(result.offset_msg_id)
        except CodecError as exc:
            raise ClientError(f"the broker's message id {result.offset_msg_id!r} is malformed: {exc}") from None
        mq = result.message_queue
        try:
            addr = await inst.master_addr(mq.topic, mq.broker_name)
        except TideMQError:
            addr = id_addr
        remark = f"executeLocalTransactionBranch exception: {local_exc!r}" if local_exc else None
        cmd = build_end_transaction(self.group, result.queue_offset, commit_log_offset, state,
                                    result.msg_id, result.msg_id, False, remark)
        await inst.invoke_oneway(addr, cmd)

    # checks from brokers -----------------------------------------------------------------------
    def _on_check(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        try:
            msg = decode_record(cmd.body_bytes())
            if msg.sys_flag & SysFlag.COMPRESSED:
                msg.body = inflate(msg.body)
                msg.sys_flag &= ~SysFlag.COMPRESSED
        except CodecError as exc:
            log.warning("CHECK_TRANSACTION_STATE from %s with an unreadable message: %s", conn.peer, exc)
            return None
        if msg.properties.get(Prop.PGROUP) != self.group:
            return None  # another producer's group
        if len(self._checks) >= self.max_pending_checks:
            log.warning("%d transaction checks pending; dropping the check of %s (the broker will "
                        "ask again)", len(self._checks), msg.msg_id)
        else:
            keep(self._checks, self._answer_check(conn, cmd, msg))
        return cmd.response(ResponseCode.SUCCESS)  # claims the request; oneway gets no answer

    async def _answer_check(self, conn: Connection, cmd: RemotingCommand, msg: MessageExt) -> None:
        assert self._slots is not None
        async with self._slots:
            remark = None
            try:
                state = coerce_state(
                    await call_listener(self.listener.check_local_transaction, msg),
                    "check_local_transaction",
                )
            except Exception as exc:  # noqa: BLE001 (a failing check answers UNKNOW, with the error as remark)
                log.warning("check_local_transaction of transaction %s failed: %r", msg.msg_id, exc)
                state, remark = LocalTransactionState.UNKNOW, f"checkLocalTransactionState exception: {exc!r}"
        uniq = msg.properties.get(Prop.UNIQ_KEY) or msg.offset_msg_id
        try:
            tran_offset = cmd.get_int("tranStateTableOffset", msg.queue_offset)
            commit_log_offset = cmd.get_int("commitLogOffset", msg.commit_log_offset)
        except ValueError:
            tran_offset, commit_log_offset = msg.queue_offset, msg.commit_log_offset
        end = build_end_transaction(self.group, tran_offset, commit_log_offset, state, uniq,
                                    cmd.get_str("transactionId") or uniq, True, remark)
        try:
            if conn.is_open:
                conn.invoke_oneway(end)
            elif self._instance is not None:
                await self._instance.invoke_oneway(conn.peer, end)
            else:
                return
        except RemotingError as exc:
            log.warning("answering the check of transaction %s to %s failed: %s", uniq, conn.peer, exc)
            return
        self.checks_answered += 1
        log.debug("answered the check of transaction %s from %s: %s", uniq, conn.peer, state.value)


class SyncTransactionProducer(SyncFacade):
    """Blocking :class:`TransactionProducer`. Plain-function listener methods run in worker
    threads of its loop; coroutine ones on its loop."""

    _thread_name = "tidemq-tx-producer"
    _client: TransactionProducer

    def __init__(self, group: str, listener: TransactionListener,
                 name_servers: str | Sequence[str] | None = None, config: ClientConfig | None = None,
                 check_concurrency: int = 1, topics: Sequence[str] = ()) -> None:
        super().__init__(TransactionProducer(group, listener, name_servers, config,
                                             check_concurrency, topics))

    @property
    def group(self) -> str:
        return self._client.group

    send_message_in_transaction = blocking(TransactionProducer.send_message_in_transaction)
    send = blocking(TransactionProducer.send)
