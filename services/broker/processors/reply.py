"""SEND_REPLY_MESSAGE (324) and SEND_REPLY_MESSAGE_V2 (325): the remoting adapter of
:class:`~tidemq.broker.messaging.reply.ReplyService`, and its way to the requester.

A replier sends the reply like a message (V2 with the one-letter send header names). The reply
reaches the requester as PUSH_REPLY_MESSAGE_TO_CLIENT (326), a request it must answer within
``reply_push_timeout``, on the connection of the producer registered (by heartbeat) with the
reply's ``REPLY_TO_CLIENT`` client id; the push header carries the send header plus ``bornHost``,
``storeHost`` and ``storeTimestamp`` (RocketMQ's ReplyMessageRequestHeader). Every answer carries
msgId/queueId/queueOffset as strings (msgId "0" when nothing was stored).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from tidemq.broker.messaging.reply import PushedReply, ReplyRequest, ReplyService
from tidemq.broker.processors.common import Callers, Handler, born_host
from tidemq.errors import BrokerError, RemotingError
from tidemq.message import encode_properties
from tidemq.remoting import Connection, RemotingCommand, RequestCode, ResponseCode
from tidemq.remoting.headers.send import SendHeader, decode_send_header, reply_push_fields, send_response_fields

if TYPE_CHECKING:
    from tidemq.broker.clients import ClientRegistry

log = logging.getLogger(__name__)

_V2 = int(RequestCode.SEND_REPLY_MESSAGE_V2)


def build_push(fields: dict[str, str], body: bytes) -> RemotingCommand:
    """The PUSH_REPLY_MESSAGE_TO_CLIENT request for a reply (pure)."""
    return RemotingCommand.request(RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT, fields, body)


class ConnectedRequesters:
    """:class:`~tidemq.broker.messaging.reply.ReplyChannel` over remoting: the requester is the
    producer connection registered with the reply's client id."""

    def __init__(self, clients: "ClientRegistry") -> None:
        self.clients = clients

    def find(self, client_id: str) -> Connection | None:
        """The open connection of a producer registered (by heartbeat) with ``client_id``."""
        for channels in self.clients.producers.values():
            for conn, ch in channels.items():
                if ch.client_id == client_id and conn.is_open:
                    return conn
        return None

    async def push(self, client_id: str, reply: PushedReply, timeout: float) -> str | None:
        target = self.find(client_id)
        r = reply.request
        if target is None:
            log.info("reply for client %s from %s: that client is not connected", client_id, r.caller.peer)
            return (f"push reply message fail, channel of <{client_id}> not found: the "
                    "requester is not connected to this broker (gone, or not yet heartbeating)")
        header = SendHeader(r.producer_group, r.topic, r.default_topic, r.default_topic_queue_nums, r.queue_id,
                            r.sys_flag, r.born_timestamp, r.flag, "", r.reconsume_times, r.unit_mode, None, False)
        fields = reply_push_fields(header, encode_properties(reply.properties), r.caller.peer, reply.store_host,
                                   reply.store_timestamp)
        try:
            resp = await target.invoke(build_push(fields, r.body), timeout)
        except RemotingError as exc:
            log.warning("push of a reply to client %s at %s failed: %s", client_id, target.peer, exc)
            return f"push reply message to {client_id} fail: {exc}"
        if resp.code != ResponseCode.SUCCESS:
            log.warning("client %s refused a reply push: %s %s", client_id, resp.code, resp.remark)
            return f"push reply message to {client_id} fail: code {resp.code} {resp.remark or ''}".rstrip()
        return None


class ReplyProcessor:
    def __init__(self, service: ReplyService, *, callers: Callers, region: str) -> None:
        self.service = service
        self.caller_of = callers.of
        self.region = region  # MSG_REGION of every answer

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.SEND_REPLY_MESSAGE: self.reply,
            RequestCode.SEND_REPLY_MESSAGE_V2: self.reply,
        }

    async def reply(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        try:
            h = decode_send_header(cmd.ext_fields, cmd.code == _V2)
        except ValueError as exc:
            return self._answer(cmd, ResponseCode.SYSTEM_ERROR, f"bad reply request header: {exc}")
        req = ReplyRequest(
            self.caller_of(conn, cmd), born_host(conn.peer), h.topic, h.queue_id, cmd.body_bytes(),
            h.properties, h.flag, h.sys_flag, h.born_timestamp, h.reconsume_times, h.producer_group,
            h.default_topic, h.default_topic_queue_nums, h.unit_mode,
        )
        try:
            r = await self.service.reply(req)
        except BrokerError as exc:
            return self._answer(cmd, exc.code or ResponseCode.SYSTEM_ERROR, exc.remark)
        return self._answer(cmd, r.code, r.remark, r.msg_id, r.queue_id, r.queue_offset)

    def _answer(self, cmd: RemotingCommand, code: int, remark: str | None, msg_id: str = "0", queue_id: int = 0,
                queue_offset: int = 0) -> RemotingCommand:
        return cmd.response(code, remark, send_response_fields(msg_id, queue_id, queue_offset, self.region))
