"""END_TRANSACTION (37): a producer's commit or rollback of a half message (usually oneway).

Header: producerGroup, tranStateTableOffset, commitLogOffset, commitOrRollback (0 / 8 / 12),
fromTransactionCheck, msgId, transactionId. A sync request is answered SUCCESS or SYSTEM_ERROR
(in SYNC_FLUSH mode once the committed message is durable); a oneway one gets nothing, and
refusals are logged so an operator sees them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from tidemq.broker.acl import Perm
from tidemq.broker.transaction.half import EndType
from tidemq.errors import BrokerError
from tidemq.message import MessageExt, Prop
from tidemq.remoting import Connection, RemotingCommand, RequestCode, ResponseCode

if TYPE_CHECKING:
    from tidemq.broker.broker import Broker

log = logging.getLogger(__name__)


class EndTransactionProcessor:
    def __init__(self, broker: "Broker") -> None:
        self.broker = broker

    def handlers(self) -> dict[int, object]:
        return {RequestCode.END_TRANSACTION: self.end}

    def end(self, conn: Connection, cmd: RemotingCommand):
        group = cmd.get_str("producerGroup") or ""
        tran_offset = cmd.get_int("tranStateTableOffset")
        commit_log_offset = cmd.get_int("commitLogOffset")
        raw_kind = cmd.get_int("commitOrRollback", bits=32)
        from_check = cmd.get_bool("fromTransactionCheck")
        msg_id = cmd.get_str("msgId") or ""
        try:
            kind = EndType(raw_kind)
        except ValueError:
            return cmd.response(ResponseCode.SYSTEM_ERROR,
                                f"commitOrRollback {raw_kind} is not 0, 8 (commit) or 12 (rollback)")
        if kind is EndType.NOT:
            # The producer does not know yet: the broker will ask it (check-back).
            log.debug("transaction %s of group %s: state unknown%s", msg_id, group,
                      " (answer to a check)" if from_check else "")
            return cmd.response(ResponseCode.SUCCESS)
        b = self.broker
        try:
            result = b.transactions.end(group, tran_offset, commit_log_offset, kind, from_check,
                                        authorize=lambda half: self._authorize(conn, cmd, half))
        except BrokerError as exc:
            log.warning("END_TRANSACTION %s of %s from %s (group %s) refused: %s", kind.name, msg_id,
                        conn.peer, group, exc)
            return cmd.response(ResponseCode.SYSTEM_ERROR, str(exc))
        if result is None:
            return cmd.response(ResponseCode.SUCCESS)
        # Not counted in tidemq_broker_messages_in again: the send of the half message was.
        if b.sync_flush and not cmd.is_oneway:
            return self._await_durable(cmd, result.put.end_offset)
        return cmd.response(ResponseCode.SUCCESS)

    def _authorize(self, conn: Connection, cmd: RemotingCommand, half: MessageExt) -> None:
        """ACL: ending a transaction publishes to the half message's topic, so it needs PUB there."""
        real = half.properties.get(Prop.REAL_TOPIC, half.topic)
        denied = self.broker.refuse_stored(conn, cmd, real, {}, Perm.PUB)
        if denied is not None:
            raise BrokerError(denied.remark or "AclException", ResponseCode.SYSTEM_ERROR)

    async def _await_durable(self, cmd: RemotingCommand, end_offset: int) -> RemotingCommand:
        if await self.broker.store.wait_durable(end_offset):
            return cmd.response(ResponseCode.SUCCESS)
        return cmd.response(ResponseCode.FLUSH_DISK_TIMEOUT,
                            "flush to disk timed out; the committed message is stored")
