"""Remoting adapter of the query family: QUERY_MESSAGE (12, by key or unique key) and
VIEW_MESSAGE_BY_ID (33, by commit-log offset).

Decodes the header (tidemq.remoting.headers.query), calls
:class:`tidemq.broker.messaging.query.QueryService`; found records go back as the body, one
after the other, with the index fields RocketMQ's clients read.
"""

from __future__ import annotations

from tidemq.broker.messaging.query import MessageQuery, QueryService
from tidemq.broker.processors.common import Callers, Handler
from tidemq.remoting import Connection, RemotingCommand, RequestCode, ResponseCode
from tidemq.remoting.headers.query import (
    decode_query_message_header,
    decode_view_message_header,
)


class QueryProcessor:
    def __init__(self, service: QueryService, *, callers: Callers) -> None:
        self.service = service
        self.callers = callers

    def handlers(self) -> dict[int, Handler]:
        return {RequestCode.QUERY_MESSAGE: self.query, RequestCode.VIEW_MESSAGE_BY_ID: self.view}

    def query(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = decode_query_message_header(cmd.ext_fields)
        result = self.service.query(MessageQuery(h.topic, h.key, h.max_num, h.unique_key,
                                                 h.begin_timestamp, h.end_timestamp))
        fields = {"indexLastUpdateTimestamp": 0, "indexLastUpdatePhyoffset": result.index_max_offset}
        if not result.records:
            return cmd.response(
                ResponseCode.QUERY_NOT_FOUND, "can not find message, maybe time range not correct", fields
            )
        return cmd.response(ResponseCode.SUCCESS, None, fields, list(result.records))

    def view(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = decode_view_message_header(cmd.ext_fields)
        record = self.service.view(self.callers(conn, cmd), h.offset)
        return cmd.response(body=record)
