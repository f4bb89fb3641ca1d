"""The fault-injection suite's own verdicts and CommitLog walk, without processes (issue 17): a
harness that cannot see a lost message, an unsent one or a shared epoch proves nothing."""

from __future__ import annotations

import struct

from tests.broker.ha.faults.checks import lost, shared_epochs, unknown, verdict
from tests.broker.ha.faults.group import log_end
from tests.broker.ha.faults.load import Attempt, first_ack_after
from tidemq.message import BLANK_MAGIC, encode_record

SEGMENT = 1024


def _attempt(body: str, outcome: str = "SEND_OK", ended: float = 1.0, started: float = 0.0) -> Attempt:
    return Attempt(body, started, ended, outcome)


def _record(body: bytes, offset: int) -> bytes:
    return encode_record(topic=b"T", body=body, properties=b"", queue_id=0, flag=0, queue_offset=0,
                         physical_offset=offset, sys_flag=0, born_timestamp=1, born_host=b"\x7f\0\0\x01",
                         born_port=1, store_timestamp=2, store_host=b"\x7f\0\0\x01", store_port=2)


def test_a_clean_run_has_no_problem() -> None:
    attempts = [_attempt("a"), _attempt("b", "FLUSH_SLAVE_TIMEOUT"), _attempt("c", "error: timeout")]
    assert verdict(attempts, ["a", "a", "b"], {1: {0}, 2: {1}}) == []


def test_an_acknowledged_message_nobody_consumed_is_lost_but_an_unacknowledged_one_is_not() -> None:
    attempts = [_attempt("a"), _attempt("b", "SLAVE_NOT_AVAILABLE"), _attempt("c")]
    assert lost(attempts, ["a"]) == ["c"]
    [problem] = verdict(attempts, ["a"], {})
    assert "1 acknowledged message(s) lost" in problem and "'c'" in problem


def test_a_consumed_message_nobody_sent_is_reported() -> None:
    assert unknown([_attempt("a")], ["a", "ghost"]) == ["ghost"]
    assert any("never sent" in p for p in verdict([_attempt("a")], ["a", "ghost"], {}))


def test_two_masters_of_one_epoch_are_reported() -> None:
    assert shared_epochs({1: {0}, 2: {0, 2}}) == {2: {0, 2}}
    assert any("more than one master" in p for p in verdict([_attempt("a")], ["a"], {2: {0, 2}}))


def test_a_run_without_any_acknowledgement_proves_nothing() -> None:
    assert verdict([_attempt("a", "error: refused")], [], {}) == ["no send was acknowledged at all: the run proves nothing"]


def test_first_ack_after_counts_only_sends_started_later() -> None:
    attempts = [_attempt("a", ended=1.0), _attempt("b", "FLUSH_SLAVE_TIMEOUT", started=1.6, ended=2.0),
                _attempt("c", started=2.0, ended=4.5)]
    assert first_ack_after(attempts, 1.5) == 3.0
    assert first_ack_after(attempts, 5.0) is None
    # Answered by the old master just before the fault, arriving after it: not a new acknowledgement.
    assert first_ack_after([_attempt("d", started=1.0, ended=1.7), *attempts], 1.5) == 3.0


def test_log_end_steps_over_a_segment_filler_and_stops_at_a_torn_record() -> None:
    first = _record(b"x" * 100, 0)
    second = _record(b"y" * 100, len(first))
    seg0 = bytearray(SEGMENT)
    seg0[:len(first)] = first
    seg0[len(first):len(first) + len(second)] = second
    filler_at = len(first) + len(second)
    struct.pack_into(">iI", seg0, filler_at, SEGMENT - filler_at, BLANK_MAGIC)
    third = _record(b"z" * 50, SEGMENT)
    seg1 = bytearray(SEGMENT)
    seg1[:len(third)] = third
    log = bytes(seg0 + seg1)
    assert log_end(log, SEGMENT) == SEGMENT + len(third)
    assert log_end(log[:SEGMENT + len(third) - 1], SEGMENT) == SEGMENT  # the last record torn
    assert log_end(bytes(SEGMENT), SEGMENT) == 0
