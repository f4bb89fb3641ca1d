"""EndTransactionService over a fake transaction book: kinds, ACL on the real topic, refusals
logged and answered, SYNC_FLUSH waits."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from tidemq.broker.acl import Perm
from tidemq.broker.messaging.context import Caller, refused
from tidemq.broker.messaging.transaction import EndTransaction, EndTransactionService
from tidemq.broker.transaction.half import EndType
from tidemq.errors import BrokerError
from tidemq.remoting import ResponseCode

CALLER = Caller("10.0.0.3:9", 37, "appKey0001")


@dataclass
class Put:
    end_offset: int


@dataclass
class Committed:
    put: Put


class Book:
    """TransactionService.end as the service calls it."""

    def __init__(self, error: BrokerError | None = None) -> None:
        # The half message as the book reads it: held in the half topic, sent to REAL_TOPIC.
        self.half = SimpleNamespace(topic="RMQ_SYS_TRANS_HALF_TOPIC", properties={"REAL_TOPIC": "orders"})
        self.error = error
        self.calls: list[tuple] = []

    def end(self, group, tran_offset, commit_log_offset, kind, from_check=False, authorize=None):
        self.calls.append((group, tran_offset, commit_log_offset, kind, from_check))
        if authorize is not None:
            authorize(self.half)
        if self.error is not None:
            raise self.error
        return Committed(Put(777)) if kind is EndType.COMMIT else None


class Durability:
    def __init__(self) -> None:
        self.waited: list[int] = []

    async def wait_durable(self, end_offset: int) -> bool:
        self.waited.append(end_offset)
        return True


class Access:
    def __init__(self, allow: bool) -> None:
        self.allow = allow
        self.asked: list[dict] = []

    def check_stored(self, caller, need) -> None:
        self.asked.append(dict(need))
        if not self.allow:
            raise refused(ResponseCode.SYSTEM_ERROR, "AclException: No permission for topic:orders")


def req(kind: int, awaited: bool = True) -> EndTransaction:
    return EndTransaction("pg", 3, 4096, kind, False, "MSGID", awaited)


def test_an_unknown_state_changes_nothing_and_a_bad_kind_is_refused():
    book = Book()
    service = EndTransactionService(transactions=book, store=Durability())
    assert service.end(CALLER, req(0)) is None and book.calls == []
    with pytest.raises(BrokerError) as err:
        service.end(CALLER, req(5))
    assert err.value.remark == "commitOrRollback 5 is not 0, 8 (commit) or 12 (rollback)"


def test_commit_and_rollback_reach_the_book():
    book = Book()
    service = EndTransactionService(transactions=book, store=Durability())
    assert service.end(CALLER, req(8)) is None
    assert service.end(CALLER, req(12)) is None
    assert book.calls == [("pg", 3, 4096, EndType.COMMIT, False), ("pg", 3, 4096, EndType.ROLLBACK, False)]


async def test_in_sync_flush_an_awaited_commit_answers_once_durable():
    store = Durability()
    service = EndTransactionService(transactions=Book(), store=store, sync_flush=True)
    durable = service.end(CALLER, req(8))
    assert await durable == ResponseCode.SUCCESS and store.waited == [777]
    assert service.end(CALLER, req(8, awaited=False)) is None  # oneway: nobody waits
    assert service.end(CALLER, req(12)) is None  # a rollback stores no message


def test_a_refusal_of_the_book_is_logged_and_answered_system_error(caplog):
    book = Book(error=BrokerError("The producer group wrong: ...", ResponseCode.SYSTEM_ERROR))
    service = EndTransactionService(transactions=book, store=Durability())
    with caplog.at_level(logging.WARNING), pytest.raises(BrokerError) as err:
        service.end(CALLER, req(8))
    assert (err.value.code, err.value.remark) == (ResponseCode.SYSTEM_ERROR, "The producer group wrong: ...")
    assert "END_TRANSACTION COMMIT of MSGID from 10.0.0.3:9 (group pg) refused" in caplog.text


def test_with_acl_ending_needs_pub_on_the_half_messages_real_topic():
    allowed = Access(allow=True)
    EndTransactionService(transactions=Book(), store=Durability(), stored_access=allowed).end(CALLER, req(8))
    assert allowed.asked == [{"orders": Perm.PUB}]
    book = Book()
    service = EndTransactionService(transactions=book, store=Durability(), stored_access=Access(allow=False))
    with pytest.raises(BrokerError) as err:
        service.end(CALLER, req(12))
    assert err.value.remark == "AclException: No permission for topic:orders"
