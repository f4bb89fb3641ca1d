"""Remoting adapter of the offsets family: QUERY_CONSUMER_OFFSET, UPDATE_CONSUMER_OFFSET,
GET_MAX_OFFSET, GET_MIN_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP and GET_EARLIEST_MSG_STORETIME.

Decodes the header (tidemq.remoting.headers.offsets), calls
:class:`tidemq.broker.messaging.offsets.OffsetService`, answers in the ``offset`` (or ``timestamp``)
response field; a refusal is answered with its code and remark.
"""

from __future__ import annotations

from collections.abc import Awaitable

from tidemq.broker.messaging.offsets import OffsetCommit, OffsetService
from tidemq.broker.processors.common import Callers, Handler
from tidemq.errors import BrokerError
from tidemq.remoting import Connection, RemotingCommand, RequestCode, ResponseCode
from tidemq.remoting.headers.offsets import (
    decode_query_consumer_offset_header,
    decode_queue_header,
    decode_search_offset_header,
    decode_update_consumer_offset_header,
)


class OffsetProcessor:
    def __init__(self, service: OffsetService, *, callers: Callers) -> None:
        self.service = service
        self.callers = callers

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.QUERY_CONSUMER_OFFSET: self.query_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: self.update_offset,
            RequestCode.GET_MAX_OFFSET: self.max_offset,
            RequestCode.GET_MIN_OFFSET: self.min_offset,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: self.search_offset,
            RequestCode.GET_EARLIEST_MSG_STORETIME: self.earliest_time,
        }

    def query_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = decode_query_consumer_offset_header(cmd.ext_fields)
        offset = self.service.committed(h.consumer_group, h.topic, h.queue_id)
        return cmd.response(fields={"offset": offset})

    def update_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | Awaitable[RemotingCommand]:
        h = decode_update_consumer_offset_header(cmd.ext_fields)
        done = self.service.commit(self.callers(conn, cmd),
                                   OffsetCommit(h.consumer_group, h.topic, h.queue_id, h.commit_offset))
        return cmd.response(ResponseCode.SUCCESS) if done is None else _success_after(cmd, done)

    def max_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = decode_queue_header(cmd.ext_fields)
        return cmd.response(fields={"offset": self.service.max_offset(h.topic, h.queue_id)})

    def min_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = decode_queue_header(cmd.ext_fields)
        return cmd.response(fields={"offset": self.service.min_offset(h.topic, h.queue_id)})

    def search_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = decode_search_offset_header(cmd.ext_fields)
        return cmd.response(fields={"offset": self.service.offset_by_time(h.topic, h.queue_id, h.timestamp)})

    def earliest_time(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = decode_queue_header(cmd.ext_fields)
        return cmd.response(fields={"timestamp": self.service.earliest_store_time(h.topic, h.queue_id)})


async def _success_after(cmd: RemotingCommand, done: Awaitable[None]) -> RemotingCommand:
    """SUCCESS once the commit is replicated by the group's rule, else the refusal's code."""
    try:
        await done
    except BrokerError as exc:
        return cmd.response(exc.code or ResponseCode.SYSTEM_ERROR, exc.remark)
    return cmd.response(ResponseCode.SUCCESS)
