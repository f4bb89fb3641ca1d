"""The end-transaction family: a producer's commit or rollback of a half message (END_TRANSACTION).

Invariants: an unknown state (commitOrRollback 0) changes nothing (the checker will ask the
producer); ending a transaction publishes to the half message's real topic, so with ACL on it
needs PUB there; a refusal is logged (END_TRANSACTION is usually oneway, so the log is where an
operator sees it). In SYNC_FLUSH mode a commit the caller waits for is acknowledged once the
committed message is durable. The transaction's bookkeeping is :mod:`tidemq.broker.transaction`'s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tidemq.broker.acl import Perm
from tidemq.broker.messaging.context import Caller, StoredAccess, refused
from tidemq.broker.transaction.half import EndType
from tidemq.errors import BrokerError
from tidemq.message import MessageExt, Prop
from tidemq.remoting.codes import ResponseCode

if TYPE_CHECKING:
    from tidemq.broker.store.store import MessageStore
    from tidemq.broker.transaction.service import TransactionService

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EndTransaction:
    group: str  # the producer group the half message belongs to
    tran_offset: int  # the half message's queue offset
    commit_log_offset: int  # the half message's commit-log offset
    kind: int  # commitOrRollback: 0 unknown, 8 commit, 12 rollback
    from_check: bool = False  # an answer to the broker's check-back
    msg_id: str = ""  # for logs
    awaited: bool = True  # the caller waits for the answer (a oneway request does not)


class EndTransactionService:
    def __init__(self, *, transactions: TransactionService, store: MessageStore,
                 stored_access: StoredAccess | None = None, sync_flush: bool = False,
                 replicated: "Callable[[int], asyncio.Future[int] | None] | None" = None) -> None:
        self._transactions = transactions
        self._replicated = replicated  # the replicated group's acknowledgement gate (None: alone)
        self._store = store
        self._stored_access = stored_access  # None: ACL off
        self._sync_flush = sync_flush

    def end(self, caller: Caller, req: EndTransaction) -> Awaitable[int] | None:
        """Commit or roll back. None when answered; for an awaited commit in SYNC_FLUSH mode or in
        a sync replicated group, an awaitable of the answer's code: SUCCESS once the committed
        message is durable and acknowledged, else FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT or
        SLAVE_NOT_AVAILABLE (stored, not confirmed)."""
        try:
            kind = EndType(req.kind)
        except ValueError:
            raise refused(ResponseCode.SYSTEM_ERROR,
                          f"commitOrRollback {req.kind} is not 0, 8 (commit) or 12 (rollback)") from None
        if kind is EndType.NOT:
            log.debug("transaction %s of group %s: state unknown%s", req.msg_id, req.group,
                      " (answer to a check)" if req.from_check else "")
            return None
        authorize = None
        access = self._stored_access
        if access is not None:
            def authorize(half: MessageExt) -> None:
                real = half.properties.get(Prop.REAL_TOPIC, half.topic)
                access.check_stored(caller, {real: Perm.PUB})
        try:
            result = self._transactions.end(req.group, req.tran_offset, req.commit_log_offset, kind,
                                            req.from_check, authorize=authorize)
        except BrokerError as exc:
            log.warning("END_TRANSACTION %s of %s from %s (group %s) refused: %s", kind.name, req.msg_id,
                        caller.peer, req.group, exc)
            raise refused(ResponseCode.SYSTEM_ERROR, str(exc)) from None
        # Not counted in tidemq_broker_messages_in again: the send of the half message was.
        if result is None:
            return None
        end = result.put.end_offset
        acked = self._replicated(end) if self._replicated is not None else None
        if not req.awaited or (acked is None and not self._sync_flush):
            return None
        return self._confirmed(end, acked)

    async def _confirmed(self, end: int, acked: "asyncio.Future[int] | None") -> int:
        """The commit's answer: durable (SYNC_FLUSH), then acknowledged by the group."""
        if self._sync_flush and not await self._store.wait_durable(end):
            return int(ResponseCode.FLUSH_DISK_TIMEOUT)
        return int(ResponseCode.SUCCESS) if acked is None else await acked
