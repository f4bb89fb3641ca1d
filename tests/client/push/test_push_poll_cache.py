"""PollCache: lite-pull's hand-out order, splitting, dropping."""

from __future__ import annotations

from tests.client.push.test_push_process_queue import msg
from tidemq.client.push.poll_cache import PollCache
from tidemq.client.push.process_queue import ProcessQueue
from tidemq.client.route import MessageQueue

A, B = MessageQueue("T", "b", 0), MessageQueue("T", "b", 1)


def offsets(entries):
    return [(mq.queue_id, [m.queue_offset for m in msgs]) for mq, _pq, msgs in entries]


def test_take_splits_across_and_within_entries_in_arrival_order():
    c, pa, pb = PollCache(), ProcessQueue(), ProcessQueue()
    c.add(A, pa, [msg(0), msg(1), msg(2)])
    c.add(B, pb, [msg(10), msg(11)])
    c.add(A, pa, [msg(3)])
    assert c.count == 6
    assert offsets(c.take(2)) == [(0, [0, 1])]
    assert c.count == 4
    assert offsets(c.take(3)) == [(0, [2]), (1, [10, 11])]
    assert offsets(c.take(10)) == [(0, [3])]
    assert c.take(10) == [] and c.count == 0


def test_dropped_queues_are_skipped_and_drop_removes_a_queue():
    c, pa, pb = PollCache(), ProcessQueue(), ProcessQueue()
    c.add(A, pa, [msg(0)])
    c.add(B, pb, [msg(5), msg(6)])
    assert c.holds(A) and c.holds(B)
    c.drop(B)
    assert not c.holds(B) and c.count == 1
    c.add(B, pb, [msg(7)])
    pa.dropped = True
    assert offsets(c.take(5)) == [(1, [7])]
    c.add(A, pa, [msg(1)])
    c.clear()
    assert c.count == 0 and not c.holds(A)
