"""QUERY_MESSAGE (12, by key or unique key) and VIEW_MESSAGE_BY_ID (33, by commit-log offset)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from tidemq.broker.acl import Perm
from tidemq.errors import CodecError
from tidemq.message import decode_record
from tidemq.remoting import Connection, RemotingCommand, RequestCode, ResponseCode

if TYPE_CHECKING:
    from tidemq.broker.broker import Broker

DEFAULT_QUERY_MAX = 32
MAX_QUERY = 64  # RocketMQ maxMsgsNumBatch
MAX_QUERY_BYTES = 8 * 1024 * 1024  # well under a client's 16 MiB frame limit


class QueryProcessor:
    def __init__(self, broker: "Broker") -> None:
        self.broker = broker

    def handlers(self) -> dict[int, object]:
        return {RequestCode.QUERY_MESSAGE: self.query, RequestCode.VIEW_MESSAGE_BY_ID: self.view}

    def query(self, conn: Connection, cmd: RemotingCommand):
        topic = cmd.get_str("topic") or ""
        key = cmd.get_str("key") or ""
        if not topic or not key:
            return cmd.response(ResponseCode.SYSTEM_ERROR, "topic and key are required")
        max_num = min(max(cmd.get_int("maxNum", DEFAULT_QUERY_MAX), 1), MAX_QUERY)
        if cmd.get_bool("_UNIQUE_KEY_QUERY"):
            max_num = DEFAULT_QUERY_MAX
        begin = cmd.get_int("beginTimestamp", 0)
        end = cmd.get_int("endTimestamp", 0) or int(time.time() * 1000) + 60_000
        store = self.broker.store
        records = []
        size = 0
        for rec in store.query_by_key(topic, key, max_num, begin, end):
            if records and size + len(rec) > MAX_QUERY_BYTES:
                break
            records.append(rec)
            size += len(rec)
        fields = {"indexLastUpdateTimestamp": 0, "indexLastUpdatePhyoffset": store.commitlog_max_offset}
        if not records:
            return cmd.response(
                ResponseCode.QUERY_NOT_FOUND, "can not find message, maybe time range not correct", fields
            )
        return cmd.response(ResponseCode.SUCCESS, None, fields, records)

    def view(self, conn: Connection, cmd: RemotingCommand):
        offset = cmd.get_int("offset")
        record = self.broker.store.read_record(offset) if offset >= 0 else None
        if record is None:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}")
        if self.broker.acl is not None:
            try:
                msg = decode_record(record)
            except CodecError as exc:
                return cmd.response(ResponseCode.SYSTEM_ERROR, f"the message at offset {offset} is unreadable: {exc}")
            denied = self.broker.refuse_stored(conn, cmd, msg.topic, msg.properties, Perm.SUB)
            if denied is not None:
                return denied
        return cmd.response(body=record)
