"""QueryService over a fake store: look-ups by key within their bounds, and by offset under ACL."""

from __future__ import annotations

import pytest

from tidemq.broker.acl import Perm
from tidemq.broker.messaging.context import Caller, refused
from tidemq.broker.messaging.query import DEFAULT_QUERY_MAX, MAX_QUERY, MAX_QUERY_BYTES, MessageQuery, QueryService
from tidemq.errors import BrokerError
from tidemq.message import encode_properties, encode_record
from tidemq.remoting import ResponseCode

LOCAL = bytes([127, 0, 0, 1])


def record(topic: str, props: dict[str, str] | None = None, body: bytes = b"hello") -> bytes:
    return encode_record(
        topic=topic.encode(), body=body, properties=encode_properties(props or {}).encode(), queue_id=0,
        flag=0, queue_offset=0, physical_offset=0, sys_flag=0, born_timestamp=1, born_host=LOCAL,
        born_port=1, store_timestamp=2, store_host=LOCAL, store_port=10911)


class IndexStore:
    def __init__(self, records: list[bytes]) -> None:
        self.records = records
        self.asked: list[tuple] = []
        self.commitlog_max_offset = 4242

    def query_by_key(self, topic: str, key: str, max_num: int, begin: int, end: int) -> list[bytes]:
        self.asked.append((topic, key, max_num, begin, end))
        return self.records[:max_num]

    def read_record(self, offset: int) -> bytes | None:
        return self.records[offset] if offset < len(self.records) else None


class Access:
    """StoredAccess that refuses every topic in ``denied`` and records what it was asked."""

    def __init__(self, denied: set[str] = frozenset()) -> None:
        self.denied = denied
        self.asked: list[tuple[Caller, dict]] = []

    def check_stored(self, caller: Caller, need) -> None:
        self.asked.append((caller, dict(need)))
        if self.denied & set(need):
            raise refused(ResponseCode.SYSTEM_ERROR, "AclException: no")


CALLER = Caller("10.0.0.1:1", 33, "appKey0001")


def test_a_query_needs_topic_and_key():
    with pytest.raises(BrokerError) as err:
        QueryService(store=IndexStore([])).query(MessageQuery("t", "", 5))
    assert (err.value.code, err.value.remark) == (ResponseCode.SYSTEM_ERROR, "topic and key are required")


def test_a_query_clamps_max_num_and_reaches_a_minute_past_now():
    store = IndexStore([record("t")] * 3)
    service = QueryService(store=store, clock=lambda: 1000.0)
    result = service.query(MessageQuery("t", "k", 1000))
    assert len(result.records) == 3 and result.index_max_offset == 4242
    service.query(MessageQuery("t", "k", 0, begin_ms=5, end_ms=9))
    service.query(MessageQuery("t", "k", 7, unique_key=True))
    assert store.asked == [("t", "k", MAX_QUERY, 0, 1_060_000), ("t", "k", 1, 5, 9),
                           ("t", "k", DEFAULT_QUERY_MAX, 0, 1_060_000)]


def test_a_query_stops_before_the_byte_bound_but_answers_at_least_one_record():
    big = record("t", body=b"x" * (MAX_QUERY_BYTES // 2))
    result = QueryService(store=IndexStore([big, big, big])).query(MessageQuery("t", "k", 3))
    assert len(result.records) == 1
    huge = record("t", body=b"x" * (MAX_QUERY_BYTES + 1))
    assert len(QueryService(store=IndexStore([huge])).query(MessageQuery("t", "k", 3)).records) == 1


def test_view_by_offset_answers_the_record_or_says_it_is_not_there():
    rec = record("t")
    service = QueryService(store=IndexStore([rec]))
    assert service.view(CALLER, 0) == rec
    for offset in (-1, 5):
        with pytest.raises(BrokerError) as err:
            service.view(CALLER, offset)
        assert err.value.remark == f"can not find message by the offset, {offset}"


def test_with_acl_a_viewed_message_needs_sub_on_its_real_and_retry_topics():
    held = record("SCHEDULE_TOPIC_XXXX", {"REAL_TOPIC": "orders", "RETRY_TOPIC": "%RETRY%cg"})
    access = Access()
    service = QueryService(store=IndexStore([held]), stored_access=access)
    assert service.view(CALLER, 0) == held
    assert access.asked == [(CALLER, {"orders": Perm.SUB, "%RETRY%cg": Perm.SUB})]
    refusing = QueryService(store=IndexStore([held]), stored_access=Access({"orders"}))
    with pytest.raises(BrokerError, match="AclException"):
        refusing.view(CALLER, 0)


def test_with_acl_an_unreadable_record_is_refused_not_shown():
    service = QueryService(store=IndexStore([b"\x00" * 100]), stored_access=Access())
    with pytest.raises(BrokerError, match="the message at offset 0 is unreadable"):
        service.view(CALLER, 0)
