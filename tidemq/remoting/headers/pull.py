"""PULL_MESSAGE (11) and LITE_PULL_MESSAGE (361): PullMessageRequestHeader, decoded once, and the
response header (PullMessageResponseHeader).

``sysFlag`` bits say what else the request carries: a commit offset, whether it may be held
(long polling) and whether the subscription comes with it (else the broker uses the one the
consumer's heartbeat registered). Numbers are range-checked; a bad one raises ValueError naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tidemq import compiled
from tidemq.remoting.command import field_int

FLAG_COMMIT_OFFSET = 0x1
FLAG_SUSPEND = 0x2
FLAG_SUBSCRIPTION = 0x4

_INT32 = 1 << 31
MAX_MSG_NUMS = 1024  # the most messages one pull asks for (more are served as this many)


@dataclass(frozen=True, slots=True)
class PullHeader:
    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    max_msg_nums: int  # clamped to 1..MAX_MSG_NUMS
    sys_flag: int
    commit_offset: int  # -1 when absent
    suspend_timeout_millis: int
    subscription: str  # "" when absent
    expression_type: str  # "" when absent
    sub_version: int

    @property
    def commits(self) -> bool:
        return bool(self.sys_flag & FLAG_COMMIT_OFFSET)

    @property
    def suspends(self) -> bool:
        return bool(self.sys_flag & FLAG_SUSPEND)

    @property
    def carries_subscription(self) -> bool:
        return bool(self.sys_flag & FLAG_SUBSCRIPTION)


def decode_pull_header_py(fields: Mapping[str, str]) -> PullHeader:
    get = fields.get
    group = get("consumerGroup") or ""
    topic = get("topic") or ""
    queue_id = field_int(get("queueId"), "queueId", None, _INT32)
    offset = field_int(get("queueOffset"), "queueOffset")
    max_nums = max(1, min(field_int(get("maxMsgNums"), "maxMsgNums", 32, _INT32), MAX_MSG_NUMS))
    sys_flag = field_int(get("sysFlag"), "sysFlag", 0, _INT32)
    if not group:
        raise ValueError("missing header field 'consumerGroup'")
    return PullHeader(
        group, topic, queue_id, offset, max_nums, sys_flag,
        field_int(get("commitOffset"), "commitOffset", -1),
        field_int(get("suspendTimeoutMillis"), "suspendTimeoutMillis", 15000),
        get("subscription") or "",
        get("expressionType") or "",
        field_int(get("subVersion"), "subVersion", 0),
    )


def pull_response_fields(next_begin: int, min_offset: int, max_offset: int) -> dict[str, str]:
    return {
        "suggestWhichBrokerId": "0",
        "nextBeginOffset": str(next_begin),
        "minOffset": str(min_offset),
        "maxOffset": str(max_offset),
    }


# The compiled twin (tidemq/remoting/headers/_headers_c.pyx) when built: same values and errors
# (tests/remoting/test_headers_compiled.py). Loaded last: it builds this module's header class.
_c = compiled.load("tidemq.remoting.headers._headers_c")
decode_pull_header = decode_pull_header_py if _c is None else _c.decode_pull_header
