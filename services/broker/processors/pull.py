"""PULL_MESSAGE (11) and LITE_PULL_MESSAGE (361): the remoting adapter of
:class:`~tidemq.broker.messaging.pull.PullService`.

The header's sysFlag bits become the request's commit offset, suspension and subscription. Every
response carries nextBeginOffset, minOffset, maxOffset and suggestWhichBrokerId as strings (zeros
on a refusal); a found pull's body is the stored records, as stored.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable

from tidemq.broker.messaging.pull import PullRequest, PullResult, PullService
from tidemq.broker.processors.common import Callers, Handler
from tidemq.errors import BrokerError
from tidemq.remoting import Connection, RemotingCommand, RequestCode, ResponseCode
from tidemq.remoting.headers.pull import decode_pull_header, pull_response_fields

log = logging.getLogger(__name__)


class PullProcessor:
    def __init__(self, service: PullService, *, callers: Callers) -> None:
        self.service = service
        self.caller_of = callers.of

    def handlers(self) -> dict[int, Handler]:
        return {RequestCode.PULL_MESSAGE: self.pull, RequestCode.LITE_PULL_MESSAGE: self.pull}

    def pull(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | Awaitable[RemotingCommand]:
        try:
            h = decode_pull_header(cmd.ext_fields)
        except ValueError as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"bad pull request header: {exc}",
                                pull_response_fields(0, 0, 0))
        req = PullRequest(
            self.caller_of(conn, cmd), h.consumer_group, h.topic, h.queue_id, h.queue_offset, h.max_msg_nums,
            h.commit_offset if h.commits else -1, h.suspends, h.suspend_timeout_millis,
            h.subscription if h.carries_subscription else None, h.expression_type, h.sub_version,
        )
        try:
            result = self.service.pull(req)
        except BrokerError as exc:
            log.debug("pull from %s refused (%d): %s", conn.peer, exc.code, exc.remark)
            return cmd.response(exc.code or ResponseCode.SYSTEM_ERROR, exc.remark, pull_response_fields(0, 0, 0))
        if isinstance(result, PullResult):
            return _respond(cmd, result)
        return self._held(cmd, result)

    async def _held(self, cmd: RemotingCommand, pending: Awaitable[PullResult]) -> RemotingCommand:
        return _respond(cmd, await pending)


def _respond(cmd: RemotingCommand, r: PullResult) -> RemotingCommand:
    fields = pull_response_fields(r.next_begin_offset, r.min_offset, r.max_offset)
    return cmd.response(r.code, r.remark, fields, r.records if r.code == ResponseCode.SUCCESS else None)
