"""CONSUMER_SEND_MSG_BACK (36): the remoting adapter of
:class:`~tidemq.broker.messaging.sendback.SendBackService`.

The request's ``maxReconsumeTimes`` counts from request version 121 (V3_4_9), as in RocketMQ; an
older client's is ignored and the group's ``retryMaxTimes`` applies. The answer is SUCCESS, or the
refusal's code and remark.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable

from tidemq.broker.messaging.sendback import SendBackRequest, SendBackResult, SendBackService
from tidemq.broker.processors.common import Callers, Handler
from tidemq.errors import BrokerError
from tidemq.remoting import Connection, RemotingCommand, RequestCode, ResponseCode
from tidemq.remoting.headers.sendback import MAX_RECONSUME_HEADER_VERSION, decode_send_back_header

log = logging.getLogger(__name__)


class SendBackProcessor:
    def __init__(self, service: SendBackService, *, callers: Callers) -> None:
        self.service = service
        self.caller_of = callers.of

    def handlers(self) -> dict[int, Handler]:
        return {RequestCode.CONSUMER_SEND_MSG_BACK: self.send_back}

    def send_back(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | Awaitable[RemotingCommand]:
        try:
            h = decode_send_back_header(cmd.ext_fields)
        except ValueError as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"bad send-back request header: {exc}")
        max_times = h.max_reconsume_times if cmd.version >= MAX_RECONSUME_HEADER_VERSION else None
        req = SendBackRequest(self.caller_of(conn, cmd), h.group, h.offset, h.delay_level, max_times)
        try:
            result = self.service.send_back(req)
        except BrokerError as exc:
            return _refused(conn, cmd, exc)
        if isinstance(result, SendBackResult):
            return cmd.response(ResponseCode.SUCCESS)
        return self._durable(conn, cmd, result)

    async def _durable(self, conn: Connection, cmd: RemotingCommand,
                       pending: Awaitable[SendBackResult]) -> RemotingCommand:
        try:
            await pending
        except BrokerError as exc:
            return _refused(conn, cmd, exc)
        return cmd.response(ResponseCode.SUCCESS)


def _refused(conn: Connection, cmd: RemotingCommand, exc: BrokerError) -> RemotingCommand:
    log.debug("send-back from %s refused (%s): %s", conn.peer, exc.code, exc.remark)
    return cmd.response(exc.code or ResponseCode.SYSTEM_ERROR, exc.remark)
