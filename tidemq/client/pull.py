"""The consumer's wire side: PULL_MESSAGE requests, pull results and tag filtering.

Pure functions, no I/O. The broker filters by tag hash code; the client then keeps only
messages whose TAGS string is in the subscription's tag set, removing hash collisions (both
RocketMQ clients do this). Offsets are logical queue offsets; ``next_begin_offset`` is where the
next pull starts, whatever the status.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from enum import IntFlag

from tidemq.client.response import broker_error, header_int
from tidemq.client.route import MessageQueue
from tidemq.errors import BrokerError, CodecError
from tidemq.message import MessageExt, Prop, decode_records
from tidemq.remoting import RemotingCommand, RequestCode, ResponseCode

SUB_ALL = "*"
MAX_PULL_NUMS = 1024


class PullSysFlag(IntFlag):
    COMMIT_OFFSET = 0x1
    SUSPEND = 0x2
    SUBSCRIPTION = 0x4
    CLASS_FILTER = 0x8


class PullStatus(enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


PULL_STATUS_BY_CODE = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}


@dataclass(frozen=True, slots=True)
class PullResult:
    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[MessageExt] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class RawPullResult:
    """A pull result whose records are left encoded (``body``: stored records back to back), for
    readers that decode them in bulk (the Spark source). No tag re-check has been applied."""

    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    body: bytes = b""


def parse_tag_expression(expression: str | None) -> frozenset[str] | None:
    """``None`` for "all" (``*`` or blank), else the set of tags of ``TagA || TagB``."""
    if expression is None or not expression.strip() or expression.strip() == SUB_ALL:
        return None
    tags = frozenset(t.strip() for t in expression.split("||") if t.strip())
    return tags or None


def normalize_expression(expression: str | None) -> str:
    tags = parse_tag_expression(expression)
    return SUB_ALL if tags is None else " || ".join(sorted(tags))


def filter_by_tags(messages: list[MessageExt], tags: frozenset[str] | None) -> list[MessageExt]:
    if tags is None:
        return messages
    return [m for m in messages if m.properties.get(Prop.TAGS) in tags]


def build_pull_request(
    group: str,
    mq: MessageQueue,
    offset: int,
    max_nums: int,
    expression: str,
    suspend_ms: int = 0,
    sub_version: int = 0,
    commit_offset: int | None = None,
) -> RemotingCommand:
    sys_flag = PullSysFlag.SUBSCRIPTION
    if suspend_ms > 0:
        sys_flag |= PullSysFlag.SUSPEND
    if commit_offset is not None and commit_offset > 0:
        sys_flag |= PullSysFlag.COMMIT_OFFSET
    header = {
        "consumerGroup": group,
        "topic": mq.topic,
        "queueId": mq.queue_id,
        "queueOffset": offset,
        "maxMsgNums": max_nums,
        "sysFlag": int(sys_flag),
        "commitOffset": commit_offset or 0,
        "suspendTimeoutMillis": max(suspend_ms, 0),
        "subscription": expression,
        "subVersion": sub_version,
        "expressionType": "TAG",
    }
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, header)


def parse_pull_response_raw(resp: RemotingCommand, mq: MessageQueue,
                            addr: str | None = None) -> RawPullResult:
    status = PULL_STATUS_BY_CODE.get(resp.code)  # type: ignore[call-overload]
    what = f"pull from {mq}"
    if status is None:
        raise broker_error(resp, what, addr)
    return RawPullResult(status, header_int(resp, "nextBeginOffset", what),
                         header_int(resp, "minOffset", what), header_int(resp, "maxOffset", what),
                         resp.body_bytes() if status is PullStatus.FOUND else b"")


def parse_pull_response(
    resp: RemotingCommand, mq: MessageQueue, tags: frozenset[str] | None, addr: str | None = None
) -> PullResult:
    status = PULL_STATUS_BY_CODE.get(resp.code)  # type: ignore[call-overload]
    what = f"pull from {mq}"
    if status is None:
        raise broker_error(resp, what, addr)
    next_begin = header_int(resp, "nextBeginOffset", what)
    min_off = header_int(resp, "minOffset", what)
    max_off = header_int(resp, "maxOffset", what)
    messages: list[MessageExt] = []
    if status is PullStatus.FOUND:
        try:  # hot path (bench/produce_consume.py pull): properties stay unparsed
            messages = decode_records(resp.body_bytes(), extra_properties={
                Prop.MIN_OFFSET: str(min_off), Prop.MAX_OFFSET: str(max_off)})
        except CodecError as exc:
            raise BrokerError(f"{what}: undecodable message records ({exc})", resp.code) from None
        messages = filter_by_tags(messages, tags)
    return PullResult(status, next_begin, min_off, max_off, messages)
