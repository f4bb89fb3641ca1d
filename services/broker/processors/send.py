"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320): the remoting adapter of
:class:`~tidemq.broker.messaging.send.SendService`.

The header is decoded once (:mod:`tidemq.remoting.headers.send`: long names on code 10, one-letter
names otherwise). A batch is also recognised on code 10 with ``batch`` "1"/"true" (the RocketMQ
C++ client 1.2.3 sends batches that way). Every response carries msgId/queueId/queueOffset as
strings, whatever its code; a refusal answers with empty ones.

Hot path (guarded by bench/hot_path.py): one header decode, one request and one result object.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable

from tidemq.broker.messaging.send import PendingSend, SendRequest, SendResult, SendService
from tidemq.broker.processors.common import Answer, Callers, Handler, born_host
from tidemq.errors import BrokerError
from tidemq.remoting import Connection, RemotingCommand, RequestCode, ResponseCode
from tidemq.remoting.headers.send import decode_send_header, send_response_fields
from tidemq.remoting.headers.sendback import MAX_RECONSUME_HEADER_VERSION
from tidemq.remoting.reply import Reply

log = logging.getLogger(__name__)

_SEND_MESSAGE = int(RequestCode.SEND_MESSAGE)
_SEND_BATCH = int(RequestCode.SEND_BATCH_MESSAGE)


def _error(cmd: RemotingCommand, code: int, remark: str) -> RemotingCommand:
    return cmd.response(code, remark, send_response_fields("", 0, 0, "DefaultRegion"))


class SendProcessor:
    def __init__(self, service: SendService, *, callers: Callers, region: str) -> None:
        self.service = service
        self.caller_of = callers.of
        self.region = region  # MSG_REGION of every answer

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.SEND_MESSAGE: self.send,
            RequestCode.SEND_MESSAGE_V2: self.send,
            RequestCode.SEND_BATCH_MESSAGE: self.send,
        }

    def send(self, conn: Connection, cmd: RemotingCommand) -> Answer:
        code = cmd.code
        try:
            h = decode_send_header(cmd.ext_fields, code != _SEND_MESSAGE)
        except ValueError as exc:
            return _error(cmd, ResponseCode.SYSTEM_ERROR, f"bad send request header: {exc}")
        req = SendRequest(
            self.caller_of(conn, cmd), born_host(conn.peer), h.topic, h.queue_id, cmd.body_bytes(), h.properties,
            h.flag, h.sys_flag, h.born_timestamp, h.reconsume_times,
            h.max_reconsume_times if cmd.version >= MAX_RECONSUME_HEADER_VERSION else None,
            code == _SEND_BATCH or h.batch, h.default_topic, h.default_topic_queue_nums,
        )
        try:
            result = self.service.send(req)
        except BrokerError as exc:
            log.debug("send from %s refused (%s): %s", conn.peer, exc.code, exc.remark)
            return _error(cmd, exc.code or ResponseCode.SYSTEM_ERROR, exc.remark)
        if isinstance(result, SendResult):  # hot path: answered now
            return cmd.response_str(result.code, result.remark, send_response_fields(
                result.msg_id, result.queue_id, result.queue_offset, self.region))
        if isinstance(result, PendingSend):  # stored, waiting for SYNC_FLUSH / replicas: no task per send
            cmd.body = None  # a send waiting for its flush must not pin its body
            answer = Reply()  # set within the report that settles the send: no loop turn
            result.then(functools.partial(_answer, answer, self, cmd))
            return answer
        return self._later(conn, cmd, result)

    async def _later(self, conn: Connection, cmd: RemotingCommand, pending: Awaitable[SendResult]) -> RemotingCommand:
        try:
            result = await pending
        except BrokerError as exc:
            log.debug("send from %s refused (%s): %s", conn.peer, exc.code, exc.remark)
            return _error(cmd, exc.code or ResponseCode.SYSTEM_ERROR, exc.remark)
        return self._respond(cmd, result)

    def _respond(self, cmd: RemotingCommand, result: SendResult) -> RemotingCommand:
        return cmd.response_str(result.code, result.remark,
                                send_response_fields(result.msg_id, result.queue_id, result.queue_offset, self.region))


def _answer(answer: Reply, proc: SendProcessor, cmd: RemotingCommand,
            result: SendResult) -> None:
    """A PendingSend's answer, set the moment it is known (in the flusher's release)."""
    if not answer.done():  # else the connection went away (its pending answers are cancelled)
        answer.set_result(proc._respond(cmd, result))
