"""ProcessQueue: committable offsets, span, orderly take/commit/re-deliver, lock expiry."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tidemq.client.push.process_queue import LOCK_EXPIRY, ProcessQueue
from tidemq.message import MessageExt


def msg(offset: int, size: int = 10) -> MessageExt:
    return MessageExt(
        topic="T", body=b"x" * size, queue_id=0, queue_offset=offset, commit_log_offset=offset * 100,
        store_size=100, flag=0, sys_flag=0, born_timestamp=0, born_host="127.0.0.1:1",
        store_timestamp=0, store_host="127.0.0.1:2", reconsume_times=0,
        prepared_transaction_offset=0, properties={}, body_crc=0, offset_msg_id="",
    )


def test_empty_queue_has_no_committable_offset():
    pq = ProcessQueue()
    assert pq.committable_offset() == -1
    assert pq.remove_messages([]) == -1
    assert pq.max_span() == 0 and pq.msg_count == 0


def test_slow_message_holds_the_offset_until_acknowledged():
    pq = ProcessQueue()
    msgs = [msg(o) for o in range(5, 10)]
    pq.put_messages(msgs)
    assert (pq.msg_count, pq.msg_size, pq.max_span()) == (5, 50, 4)
    assert pq.remove_messages(msgs[1:]) == 5  # offset 5 still in flight
    assert pq.msg_count == 1 and pq.msg_size == 10 and pq.max_span() == 0
    assert pq.remove_messages(msgs[:1]) == 10  # everything done: max + 1
    assert pq.remove_messages(msgs[:1]) == 10  # acknowledging twice changes nothing
    assert pq.msg_count == 0 and pq.msg_size == 0


def test_duplicates_are_ignored_and_out_of_order_puts_stay_sorted():
    pq = ProcessQueue()
    pq.put_messages([msg(3), msg(1)])
    pq.put_messages([msg(1), msg(2)])
    assert pq.msg_count == 3 and pq.committable_offset() == 1 and pq.max_span() == 2


@given(st.sets(st.integers(0, 500), min_size=1, max_size=60), st.data())
def test_committable_offset_is_the_smallest_unacknowledged(offsets, data):
    pq = ProcessQueue()
    ordered = sorted(offsets)
    pq.put_messages([msg(o) for o in ordered])
    acked = data.draw(st.sets(st.sampled_from(ordered)))
    result = pq.remove_messages([msg(o) for o in acked])
    rest = [o for o in ordered if o not in acked]
    assert result == (rest[0] if rest else ordered[-1] + 1)
    assert pq.msg_count == len(rest)


def test_orderly_take_commit_and_consume_again():
    pq = ProcessQueue()
    assert pq.put_messages([msg(o) for o in range(6)]) is True  # start a consume task
    assert pq.put_messages([msg(6)]) is False  # one is already running
    first = pq.take_messages(4)
    assert [m.queue_offset for m in first] == [0, 1, 2, 3]
    pq.make_message_to_consume_again(first[2:])
    assert pq.committable_offset() == 0
    assert pq.commit() == 2
    assert pq.msg_count == 5
    again = pq.take_messages(2)
    assert [m.queue_offset for m in again] == [2, 3]  # re-delivered first, in order
    assert pq.commit() == 4
    assert [m.queue_offset for m in pq.take_messages(10)] == [4, 5, 6]
    assert pq.commit() == 7 and pq.commit() == -1
    assert pq.take_messages(1) == [] and pq.consuming is False
    assert pq.put_messages([msg(7)]) is True


def test_lock_expires_after_30_seconds_without_renewal():
    now = [1000.0]
    pq = ProcessQueue(clock=lambda: now[0])
    assert not pq.lock_valid()
    pq.set_locked(True)
    now[0] += LOCK_EXPIRY - 1
    assert pq.lock_valid()
    now[0] += 2
    assert pq.locked and pq.lock_expired() and not pq.lock_valid()
    pq.set_locked(True)
    assert pq.lock_valid()


def test_clear_forgets_everything():
    pq = ProcessQueue()
    pq.put_messages([msg(1), msg(2)])
    pq.take_messages(1)
    pq.clear()
    assert pq.msg_count == 0 and not pq.has_messages() and pq.committable_offset() == -1
    assert pq.stats().msg_count == 0
