"""Headers of the message look-ups: QUERY_MESSAGE (12, by key or unique key) and
VIEW_MESSAGE_BY_ID (33, by commit-log offset).

``_UNIQUE_KEY_QUERY`` (RocketMQ's queryMsgByUniqueKey) marks a key that is a message's unique
id. Numbers are Java longs; ``maxNum`` is a Java int.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tidemq.remoting.command import field_int
from tidemq.remoting.headers.fields import field_bool

DEFAULT_QUERY_MAX = 32  # RocketMQ's default maxNum


@dataclass(frozen=True, slots=True)
class QueryMessageHeader:
    """QUERY_MESSAGE: messages of ``topic`` indexed under ``key``, stored in [begin, end] ms
    (0 = from the start / until now)."""

    topic: str
    key: str
    max_num: int
    unique_key: bool
    begin_timestamp: int
    end_timestamp: int


@dataclass(frozen=True, slots=True)
class ViewMessageHeader:
    """VIEW_MESSAGE_BY_ID: the commit-log offset of the record (from an offset message id)."""

    offset: int


def decode_query_message_header(fields: Mapping[str, str]) -> QueryMessageHeader:
    return QueryMessageHeader(
        fields.get("topic") or "",
        fields.get("key") or "",
        field_int(fields.get("maxNum"), "maxNum", DEFAULT_QUERY_MAX),
        field_bool(fields.get("_UNIQUE_KEY_QUERY")),
        field_int(fields.get("beginTimestamp"), "beginTimestamp", 0),
        field_int(fields.get("endTimestamp"), "endTimestamp", 0),
    )


def decode_view_message_header(fields: Mapping[str, str]) -> ViewMessageHeader:
    return ViewMessageHeader(field_int(fields.get("offset"), "offset"))
