"""Remoting adapter of the transaction family: END_TRANSACTION (37), a producer's commit or
rollback of a half message (usually oneway), and the broker's CHECK_TRANSACTION_STATE (39)
check-backs to producers (:func:`ask_transaction_state`, the checker's ``ask``).

Decodes the header (tidemq.remoting.headers.transaction) and calls
:class:`tidemq.broker.messaging.transaction.EndTransactionService`. A sync request is answered
SUCCESS or SYSTEM_ERROR (in SYNC_FLUSH mode once the committed message is durable, else
FLUSH_DISK_TIMEOUT; in a sync replicated group once acknowledged, else FLUSH_SLAVE_TIMEOUT or
SLAVE_NOT_AVAILABLE); a oneway one gets nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable

from tidemq.broker.messaging.transaction import EndTransaction, EndTransactionService
from tidemq.broker.processors.common import Callers, Handler
from tidemq.message import MessageExt, Prop
from tidemq.remoting import Connection, RemotingCommand, RequestCode, ResponseCode
from tidemq.remoting.headers.transaction import decode_end_transaction_header


class EndTransactionProcessor:
    def __init__(self, service: EndTransactionService, *, callers: Callers) -> None:
        self.service = service
        self.callers = callers

    def handlers(self) -> dict[int, Handler]:
        return {RequestCode.END_TRANSACTION: self.end}

    def end(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | Awaitable[RemotingCommand]:
        h = decode_end_transaction_header(cmd.ext_fields)
        req = EndTransaction(h.producer_group, h.tran_state_table_offset, h.commit_log_offset,
                             h.commit_or_rollback, h.from_transaction_check, h.msg_id, not cmd.is_oneway)
        durable = self.service.end(self.callers(conn, cmd), req)
        if durable is None:
            return cmd.response(ResponseCode.SUCCESS)
        return _answer_when_durable(cmd, durable)


_NOT_CONFIRMED = {
    ResponseCode.FLUSH_DISK_TIMEOUT: "flush to disk timed out; the committed message is stored",
    ResponseCode.FLUSH_SLAVE_TIMEOUT: "the committed message is stored on the master; its in-sync replicas did "
                                      "not confirm it in time",
    ResponseCode.SLAVE_NOT_AVAILABLE: "the committed message is stored on the master; fewer replicas than "
                                      "minInSync are in sync",
}


async def _answer_when_durable(cmd: RemotingCommand, durable: Awaitable[int]) -> RemotingCommand:
    code = await durable
    if code == ResponseCode.SUCCESS:
        return cmd.response(ResponseCode.SUCCESS)
    return cmd.response(code, _NOT_CONFIRMED.get(ResponseCode(code), "the committed message is not confirmed"))


def check_request(half: MessageExt, record: bytes) -> RemotingCommand:
    """CHECK_TRANSACTION_STATE (oneway) about a half record: the header names the transaction, the
    body is ``record``, the message as the producer sent it (tidemq.broker.transaction.half.check_record)."""
    uniq = half.properties.get(Prop.UNIQ_KEY, "")
    header = {
        "tranStateTableOffset": half.queue_offset,
        "commitLogOffset": half.commit_log_offset,
        "msgId": uniq,
        "transactionId": uniq,
        "offsetMsgId": half.offset_msg_id,
    }
    return RemotingCommand.request(RequestCode.CHECK_TRANSACTION_STATE, header, record, oneway=True)


def ask_transaction_state(conn: Connection, half: MessageExt, record: bytes) -> None:
    """The transaction checker's ``ask`` over remoting; RemotingError when the connection cannot take it."""
    conn.invoke_oneway(check_request(half, record))
