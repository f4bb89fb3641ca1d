"""CONSUMER_SEND_MSG_BACK (36): ConsumerSendMsgBackRequestHeader, decoded once.

A consumer names the message it gives back by its CommitLog ``offset``; ``delayLevel`` 0 lets the
broker choose, < 0 sends it straight to the dead-letter queue; ``maxReconsumeTimes`` is honoured
from request version 121 (the adapter applies that rule). A bad number raises ValueError naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tidemq.remoting.command import field_int

_INT32 = 1 << 31
MAX_RECONSUME_HEADER_VERSION = 121  # V3_4_9: the request's maxReconsumeTimes is honoured from here


@dataclass(frozen=True, slots=True)
class SendBackHeader:
    group: str
    offset: int
    delay_level: int
    max_reconsume_times: int | None  # None when absent


def decode_send_back_header(fields: Mapping[str, str]) -> SendBackHeader:
    get = fields.get
    group = get("group") or ""
    offset = field_int(get("offset"), "offset")
    delay_level = field_int(get("delayLevel"), "delayLevel", 0, _INT32)
    max_times = get("maxReconsumeTimes")
    return SendBackHeader(group, offset, delay_level,
                          field_int(max_times, "maxReconsumeTimes", 0, _INT32) if max_times else None)
