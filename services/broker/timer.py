"""Delivery-timestamp messages (RocketMQ 5's arbitrary delay): the in-memory timer over the one
queue of TIMER_TOPIC.

That queue is in arrival order, not in delivery order, so the timer keeps a heap of
(delivery time, queue offset) for the entries it has loaded, fed by the store's dispatch listener
for new puts and by scanning the queue (``refill``) at start and whenever it has room again.

Invariants:
- ``progress`` (what is persisted) is the lowest queue offset not yet delivered: every entry below
  it was delivered, so restarting from it never skips one (entries above it that were already
  delivered are delivered again: a duplicate after a crash, never a loss).
- Entries are loaded in queue order: ``scanned`` is the next offset to load, and everything below
  it is either pending in the heap or delivered. At most ``capacity`` entries are pending in memory;
  the rest wait in the queue until room frees up (they are then delivered when loaded, late if
  the heap was full of later ones).
- The due time of a loaded entry comes from the record's TIMER_OUT_MS property (the consume-queue
  tags code is only trusted for fresh puts).
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable

from tidemq.broker.delay import TIMER_TOPIC
from tidemq.broker.store.replay import timer_tags_code
from tidemq.broker.store.store import GetStatus, MessageStore
from tidemq.errors import CodecError
from tidemq.message import decode_record_header, decode_properties

log = logging.getLogger(__name__)

# deliver(record bytes) -> True when done with the record (delivered or skipped), False to retry later
Deliver = Callable[[bytes], bool]
RETRY_AFTER_MS = 1000
_SCAN_BATCH = 32


class DeliveryTimer:
    def __init__(self, store: MessageStore, deliver: Deliver, progress: int = 0,
                 capacity: int = 200_000) -> None:
        self.store = store
        self.deliver = deliver
        self.capacity = max(1, capacity)
        self.scanned = max(0, progress)
        self._heap: list[tuple[int, int]] = []  # (due ms, queue offset)
        self._open: list[int] = []  # pending queue offsets, min-heap, lazily cleaned
        self._pending: set[int] = set()
        self.next_due: int | None = None  # when the driving loop wakes next (None = idle)
        self.delivered = 0

    def __len__(self) -> int:
        return len(self._pending)

    @property
    def progress(self) -> int:
        op, pending = self._open, self._pending
        while op and op[0] not in pending:
            heapq.heappop(op)
        return op[0] if op else self.scanned

    def _add(self, due: int, q: int) -> None:
        heapq.heappush(self._heap, (due, q))
        heapq.heappush(self._open, q)
        self._pending.add(q)

    def advance_to(self, progress: int) -> None:
        """Everything below ``progress`` was delivered elsewhere (the master whose progress a
        follower applies): forget it, and never load it again."""
        if self._open and self._open[0] < progress:
            self._pending = {q for q in self._pending if q >= progress}
            self._heap = [e for e in self._heap if e[1] >= progress]
            heapq.heapify(self._heap)
            self._open = [q for q in self._open if q >= progress]
            heapq.heapify(self._open)
        self.scanned = max(self.scanned, progress)

    def reload(self, progress: int | None = None) -> None:
        """Forget every loaded entry and load again from ``progress`` (default: the progress),
        lower or higher: after the timer queue's tail was cut, what was loaded from it is gone
        and the entries a new master writes there reuse its queue offsets; a replica undoing the
        deliveries of a cut tail sets its progress back (their copies went with the tail)."""
        start = self.progress if progress is None else max(0, progress)
        self._heap.clear()
        self._open.clear()
        self._pending.clear()
        self.scanned = start
        self.next_due = None

    def on_dispatch(self, queue_offset: int, due: int) -> bool:
        """A new entry was written. Returns True when the driving loop must wake earlier."""
        if queue_offset != self.scanned or len(self._pending) >= self.capacity:
            return False  # a gap or no room: ``refill`` loads it from the queue
        self._add(due, queue_offset)
        self.scanned = queue_offset + 1
        return self.next_due is None or due < self.next_due

    def refill(self, budget: int = 1024) -> bool:
        """Load up to ``budget`` entries from the queue; True when more remain to load."""
        store = self.store
        while budget > 0 and len(self._pending) < self.capacity:
            res = store.get_messages(TIMER_TOPIC, 0, self.scanned, min(_SCAN_BATCH, budget), None)
            st = res.status
            if st in (GetStatus.NO_MESSAGE_IN_QUEUE, GetStatus.OFFSET_OVERFLOW_ONE):
                return False
            if st in (GetStatus.OFFSET_TOO_SMALL, GetStatus.OFFSET_OVERFLOW_BADLY):
                log.warning("timer queue: offset %d is outside [%d, %d]; continuing at %d",
                            self.scanned, res.min_offset, res.max_offset, res.next_begin_offset)
                self.scanned = res.next_begin_offset
                if st is GetStatus.OFFSET_OVERFLOW_BADLY:
                    return False
                continue
            for rec in res.records:
                if len(self._pending) >= self.capacity:
                    return True
                try:
                    h = decode_record_header(rec)
                    due = timer_tags_code(h.store_timestamp, decode_properties(h.properties))
                except CodecError as exc:
                    log.error("timer queue: unreadable record at offset %d skipped: %s", self.scanned, exc)
                    continue
                if h.queue_offset >= self.scanned:
                    self._add(due, h.queue_offset)
                    self.scanned = h.queue_offset + 1
                budget -= 1
            if res.next_begin_offset <= self.scanned and not res.records:
                return True  # no progress possible now (a missing file): try again later
            self.scanned = max(self.scanned, res.next_begin_offset)
        return self.scanned < store.max_offset(TIMER_TOPIC, 0)

    def run_due(self, now_ms: int, budget: int = 256) -> int | None:
        """Deliver what is due. Returns the time to run again (ms), None when nothing is pending
        and nothing is left to load."""
        heap = self._heap
        if len(self._pending) < self.capacity:
            self.refill()
        while heap and heap[0][0] <= now_ms:
            if budget <= 0:
                return now_ms
            due, q = heap[0]
            rec = self._read(q)
            if rec is not None and not self.deliver(rec):
                return now_ms + RETRY_AFTER_MS  # the store refused: keep it and try again
            heapq.heappop(heap)
            self._pending.discard(q)
            self.delivered += rec is not None
            budget -= 1
        if len(self._pending) < self.capacity and self.refill():
            return now_ms  # more to load: come back at once (after yielding to the loop)
        if heap:
            return heap[0][0]
        return None

    def _read(self, q: int) -> bytes | None:
        res = self.store.get_messages(TIMER_TOPIC, 0, q, 1, None)
        for rec in res.records:
            try:
                if decode_record_header(rec).queue_offset == q:
                    return rec
            except CodecError:
                pass
        log.error("timer queue: the entry at offset %d can no longer be read (removed by retention?); "
                  "it is dropped", q)
        return None
