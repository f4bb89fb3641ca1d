"""The query family: messages looked up by key or unique key (index) and by commit-log offset.

Invariants: a key query answers at most :data:`MAX_QUERY` records (a unique-key query
:data:`DEFAULT_QUERY_MAX`, as RocketMQ's queryMsgByUniqueKey asks) and at most
:data:`MAX_QUERY_BYTES` of them, always at least one when one is found. With ACL on, a message
viewed by offset is shown only to an account with SUB on its topics (its own, the one a delayed or
transactional message was sent to, and the one a retried message came from).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tidemq.broker.acl import Perm, stored_message_topics
from tidemq.broker.messaging.context import Caller, StoredAccess, refused
from tidemq.errors import CodecError
from tidemq.message import decode_record
from tidemq.remoting.codes import ResponseCode

if TYPE_CHECKING:
    from tidemq.broker.store.store import MessageStore

DEFAULT_QUERY_MAX = 32
MAX_QUERY = 64  # RocketMQ maxMsgsNumBatch
MAX_QUERY_BYTES = 8 * 1024 * 1024  # well under a client's 16 MiB frame limit
END_SLACK_MS = 60_000  # "until now" reaches a minute ahead: messages stored while the query runs


@dataclass(frozen=True, slots=True)
class MessageQuery:
    topic: str
    key: str
    max_num: int
    unique_key: bool = False
    begin_ms: int = 0
    end_ms: int = 0  # 0 = until now


@dataclass(frozen=True, slots=True)
class QueryResult:
    records: tuple[bytes, ...]  # stored records, oldest first
    index_max_offset: int  # the commit log's end when the index was read (indexLastUpdatePhyoffset)


class QueryService:
    def __init__(self, *, store: MessageStore, stored_access: StoredAccess | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._stored_access = stored_access  # None: ACL off
        self._clock = clock

    def query(self, q: MessageQuery) -> QueryResult:
        if not q.topic or not q.key:
            raise refused(ResponseCode.SYSTEM_ERROR, "topic and key are required")
        max_num = DEFAULT_QUERY_MAX if q.unique_key else min(max(q.max_num, 1), MAX_QUERY)
        end = q.end_ms or int(self._clock() * 1000) + END_SLACK_MS
        records: list[bytes] = []
        size = 0
        for rec in self._store.query_by_key(q.topic, q.key, max_num, q.begin_ms, end):
            if records and size + len(rec) > MAX_QUERY_BYTES:
                break
            records.append(rec)
            size += len(rec)
        return QueryResult(tuple(records), self._store.commitlog_max_offset)

    def view(self, caller: Caller, offset: int) -> bytes:
        """The stored record at commit-log ``offset``."""
        record = self._store.read_record(offset) if offset >= 0 else None
        if record is None:
            raise refused(ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}")
        if self._stored_access is not None:
            try:
                msg = decode_record(record)
            except CodecError as exc:
                raise refused(ResponseCode.SYSTEM_ERROR,
                              f"the message at offset {offset} is unreadable: {exc}") from None
            self._stored_access.check_stored(
                caller, {t: Perm.SUB for t in stored_message_topics(msg.topic, msg.properties)})
        return record
