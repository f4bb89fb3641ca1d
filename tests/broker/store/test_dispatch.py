"""The store's one dispatcher on its own (fake consume queues and index): which records enter a
consume queue, the index and the listeners, for live puts and recovery's replay alike."""

from __future__ import annotations

import logging

import pytest

from tidemq.broker.store.dispatch import (
    ConsumeQueueBuilder,
    Dispatcher,
    IndexBuilder,
    Replayed,
)
from tidemq.errors import StoreCorruptError
from tidemq.message import SysFlag


class FakeQueue:
    def __init__(self) -> None:
        self.units: dict[int, tuple[int, int, int]] = {}
        self.min_offset = self.max_offset = 0

    def put(self, q: int, phys: int, size: int, code: int) -> None:
        self.units[q] = (phys, size, code)
        self.max_offset = max(self.max_offset, q + 1)

    def put_run(self, q: int, phys: int, records) -> None:
        for r in records:
            self.put(q, phys, r.total, r.tags_code)
            q += 1
            phys += r.total

    def unit(self, q: int) -> tuple[int, int, int] | None:
        return self.units.get(q)


class FakeIndex:
    def __init__(self, fail_at: int = -1) -> None:
        self.entries: list[tuple[str, str | None, str | None, int, int]] = []
        self.fail_at = fail_at

    def add(self, topic, keys, uniq, phys, store_ts) -> None:
        if phys == self.fail_at:
            raise OSError(28, "No space left on device")
        self.entries.append((topic, keys, uniq, phys, store_ts))

    def put_run(self, topic, records, start, phys, store_ts) -> tuple[int, int]:
        return 0, phys  # no active file: every record goes through add


@pytest.fixture
def parts():
    queues: dict[tuple[str, int], FakeQueue] = {}

    def queue_for(topic: str, qid: int) -> FakeQueue:
        return queues.setdefault((topic, qid), FakeQueue())

    index = FakeIndex()
    errors: list[tuple[int, OSError]] = []
    heard: list[tuple[str, int, int, int]] = []
    d = Dispatcher(ConsumeQueueBuilder(queue_for), IndexBuilder(index),
                   on_index_error=lambda phys, exc: errors.append((phys, exc)))
    d.listeners.append(lambda *a: heard.append(a))
    return d, queues, index, errors, heard


def run(sys_flag=0, q=0, phys=1000, records=((100, 7, "k1", "U1"),), topic="T", qid=1):
    """Arguments of dispatch/replay: a run of records (total, tags code, keys, unique key)."""
    return topic, qid, int(sys_flag), q, phys, 555, tuple(Replayed(*r) for r in records)


def test_a_normal_put_enters_its_queue_the_index_and_the_listeners(parts):
    d, queues, index, _errors, heard = parts
    d.dispatch(*run())
    assert queues["T", 1].units == {0: (1000, 100, 7)}
    assert index.entries == [("T", "k1", "U1", 1000, 555)]
    assert heard == [("T", 1, 0, 7)]


@pytest.mark.parametrize(("flag", "queued", "indexed"), [
    (SysFlag.TRANSACTION_PREPARED, False, True),
    (SysFlag.TRANSACTION_ROLLBACK, False, False),
    (SysFlag.TRANSACTION_COMMIT, True, True),
])
def test_half_messages_stay_out_of_queues_and_rollbacks_out_of_the_index(parts, flag, queued, indexed):
    d, queues, index, _errors, heard = parts
    d.dispatch(*run(sys_flag=flag))
    assert bool(queues.get(("T", 1)) and queues["T", 1].units) is queued
    assert bool(index.entries) is indexed
    assert bool(heard) is queued


def test_a_batch_wakes_listeners_once_per_tags_code_with_its_highest_offset(parts):
    d, queues, index, _errors, heard = parts
    d.dispatch(*run(q=0, records=[(100, 7, None, "A"), (110, 8, None, "B"), (120, 7, None, "C")]))
    assert queues["T", 1].units == {0: (1000, 100, 7), 1: (1100, 110, 8), 2: (1210, 120, 7)}
    assert [e[3] for e in index.entries] == [1000, 1100, 1210]
    assert sorted(heard) == [("T", 1, 1, 8), ("T", 1, 2, 7)]


def test_a_failing_listener_is_logged_and_the_others_still_hear(parts, caplog):
    d, _queues, _index, _errors, heard = parts
    d.listeners.insert(0, lambda *a: 1 / 0)
    with caplog.at_level(logging.ERROR):
        d.dispatch(*run())
    assert heard == [("T", 1, 0, 7)] and "dispatch listener" in caplog.text


def test_a_live_index_error_is_reported_and_the_run_goes_on(parts):
    d, queues, index, errors, heard = parts
    index.fail_at = 1000
    d.dispatch(*run(records=[(100, 7, "k", None), (100, 7, "k", None)]))
    assert [phys for phys, _ in errors] == [1000]
    assert [e[3] for e in index.entries] == [1100]
    assert len(queues["T", 1].units) == 2 and heard


def test_replay_tells_no_listener_and_fails_on_an_index_error(parts):
    d, queues, index, errors, heard = parts
    d.replay(*run())
    assert queues["T", 1].units and index.entries and not heard
    index.fail_at = 2000
    with pytest.raises(OSError):
        d.replay(*run(q=1, phys=2000))
    assert not errors


def test_replicated_appends_tell_the_listeners_as_puts_do(parts):
    """A follower's appends (``replicating()``) follow replay's rules and are heard like puts
    (once per run and tags code, with its highest offset), by the listeners of the live
    dispatcher, including one added afterwards."""
    d, queues, index, _errors, heard = parts
    follower = d.replicating()
    late: list[tuple[str, int, int, int]] = []
    d.listeners.append(lambda *a: late.append(a))
    follower.replay(*run(q=0, records=[(100, 7, None, "A"), (110, 8, None, "B"), (120, 7, None, "C")]))
    follower.replay(*run(q=0, phys=3000, sys_flag=SysFlag.TRANSACTION_PREPARED, topic="H"))
    assert queues["T", 1].units == {0: (1000, 100, 7), 1: (1100, 110, 8), 2: (1210, 120, 7)}
    assert len(index.entries) == 4
    assert heard == late == [("T", 1, 2, 7), ("T", 1, 1, 8)]  # as a put's; not the half message
    follower.replay(*run(q=3, phys=1330), to_queue=False)
    assert len(heard) == 2


def test_replay_feeds_only_what_the_checkpoint_does_not_cover(parts):
    d, queues, index, _errors, _heard = parts
    d.replay(*run(), to_queue=False, to_index=True)
    assert ("T", 1) not in queues and len(index.entries) == 1
    d.replay(*run(), to_queue=True, to_index=False)
    assert queues["T", 1].units == {0: (1000, 100, 7)} and len(index.entries) == 1


def test_replaying_a_record_twice_is_harmless(parts):
    d, queues, _index, _errors, _heard = parts
    d.replay(*run(q=0, phys=1000))
    d.replay(*run(q=1, phys=1100))
    d.replay(*run(q=0, phys=1000))
    assert queues["T", 1].units == {0: (1000, 100, 7), 1: (1100, 100, 7)}
    assert d.queues.units_written == 2 and d.queues.units_replaced == 0


def test_a_torn_unit_is_rewritten_from_its_record(parts):
    d, queues, _index, _errors, _heard = parts
    cq = queues.setdefault(("T", 1), FakeQueue())
    cq.put(0, 1000, 0, 0)  # only one page of the unit reached the disk
    cq.put(1, 1100, 100, 7)
    d.replay(*run(q=0, phys=1000))
    assert cq.units[0] == (1000, 100, 7) and d.queues.units_replaced == 1


def test_two_records_claiming_one_queue_offset_refuse_the_start(parts):
    d, queues, _index, _errors, _heard = parts
    d.replay(*run(q=0, phys=1000))
    d.replay(*run(q=1, phys=1100))
    with pytest.raises(StoreCorruptError, match="points elsewhere"):
        d.replay(*run(q=0, phys=5000))


def test_a_unit_pointing_at_no_claiming_record_is_repointed():
    cq = FakeQueue()
    cq.put(0, 1000, 100, 7)
    cq.put(1, 1100, 100, 7)
    claims = {1100: ("T", 1, 1, 100)}  # nothing valid at 1000 any more (a lost put)
    d = Dispatcher(ConsumeQueueBuilder(lambda t, q: cq, claims.get), IndexBuilder(FakeIndex()))
    d.replay(*run(q=0, phys=3000))
    assert cq.units[0] == (3000, 100, 7) and d.queues.units_replaced == 1


def test_a_record_past_the_end_of_its_queue_refuses_the_start(parts):
    d, _queues, _index, _errors, _heard = parts
    d.replay(*run(q=0, phys=1000))
    d.replay(*run(q=1, phys=1100))
    with pytest.raises(StoreCorruptError, match="ends at 2"):
        d.replay(*run(q=5, phys=1200))
