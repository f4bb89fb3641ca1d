"""Values crossing the store's API: put requests and results, get results, their statuses."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import final

from tidemq.message import MessageExt, split_host


@dataclass(slots=True)
class PutRequest:
    topic: str
    queue_id: int
    body: bytes
    properties: dict[str, str]  # encoded by the store in Java form (tidemq.message.encode_properties)
    flag: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: tuple[str, int] = ("127.0.0.1", 0)
    store_host: tuple[str, int] = ("127.0.0.1", 10911)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    tags_code: int | None = None  # None -> tidemq.message.tags_code(properties.get("TAGS"))


def put_again(msg: MessageExt, topic: str, queue_id: int, properties: dict[str, str],
              store_host: tuple[str, int], *, sys_flag: int | None = None,
              reconsume_times: int | None = None, prepared_transaction_offset: int = 0) -> PutRequest:
    """A put that stores a stored message again under ``topic``/``queue_id``: its body, flag, born
    time and host kept; sysFlag and reconsumeTimes kept unless given."""
    return PutRequest(
        topic=topic,
        queue_id=queue_id,
        body=msg.body,
        properties=properties,
        flag=msg.flag,
        sys_flag=msg.sys_flag if sys_flag is None else sys_flag,
        born_timestamp=msg.born_timestamp,
        born_host=split_host(msg.born_host),
        store_host=store_host,
        reconsume_times=msg.reconsume_times if reconsume_times is None else reconsume_times,
        prepared_transaction_offset=prepared_transaction_offset,
    )


class PutStatus(enum.Enum):
    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"


# final: the put path tells it from a Pending with ``type(x) is PutResult`` (cheaper than
# isinstance), which mypy narrows only for a final class.
@final
@dataclass(slots=True)
class PutResult:
    status: PutStatus
    physical_offset: int = -1  # of the first record
    queue_offset: int = -1  # of the first record (0 for prepared/rollback half messages)
    msg_ids: list[str] = field(default_factory=list)  # offset message ids
    count: int = 0
    end_offset: int = -1  # CommitLog offset just past the last record (for wait_durable)
    remark: str = ""

    @property
    def ok(self) -> bool:
        return self.status is PutStatus.PUT_OK


class GetStatus(enum.Enum):
    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"


@dataclass(slots=True)
class GetResult:
    status: GetStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    records: list[bytes] = field(default_factory=list)  # whole stored records, as stored
    message_count: int = 0
    total_bytes: int = 0
