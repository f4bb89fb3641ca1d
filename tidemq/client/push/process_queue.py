"""ProcessQueue: the local cache of pulled, not yet acknowledged messages of one owned queue.

Pure state, no I/O, time injected. Invariants:

* ``_offsets`` is the sorted list of the queue offsets held in ``_msgs`` (pulled, waiting or
  being consumed); ``msg_count``/``msg_size`` count those plus the orderly "consuming" set;
* the committable offset (:meth:`remove_messages`) is the smallest offset still held, or the
  highest offset ever put + 1 when nothing is held: a slow message never lets the group's offset
  pass it, so a crash re-delivers it rather than losing it;
* orderly mode moves messages from the cache to ``_consuming`` in offset order
  (:meth:`take_messages`) and back (:meth:`make_message_to_consume_again`); :meth:`commit`
  acknowledges the consuming set and answers the next offset to consume;
* ``consuming`` (orderly) is True while a consume task owns the queue: a put dispatches a new
  task only when it is False.

Pulls append increasing offsets, so insertion is an append in the common case.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterable

from tidemq.client.push.types import ProcessQueueStats
from tidemq.message import MessageExt

LOCK_EXPIRY = 30.0  # a lock not renewed for this long no longer counts (RocketMQ: 30 s)


class ProcessQueue:
    __slots__ = (
        "_msgs", "_offsets", "_consuming", "msg_count", "msg_size", "queue_offset_max",
        "dropped", "locked", "last_lock_time", "last_pull_time", "last_consume_time",
        "consuming", "_clock",
    )

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._msgs: dict[int, MessageExt] = {}
        self._offsets: list[int] = []
        self._consuming: dict[int, MessageExt] = {}
        self.msg_count = 0
        self.msg_size = 0
        self.queue_offset_max = -1
        self.dropped = False
        self.locked = False
        self.last_lock_time = 0.0
        self.last_pull_time = 0.0
        self.last_consume_time = 0.0
        self.consuming = False
        self._clock = clock

    # caching -----------------------------------------------------------------------------------
    def put_messages(self, msgs: Iterable[MessageExt]) -> bool:
        """Cache pulled messages (offsets already held are ignored). Returns True when an orderly
        consume task should be started for this queue."""
        for m in msgs:
            off = m.queue_offset
            if off in self._msgs or off in self._consuming:
                continue
            self._msgs[off] = m
            if not self._offsets or off > self._offsets[-1]:
                self._offsets.append(off)
            else:
                bisect.insort(self._offsets, off)
            self.msg_count += 1
            self.msg_size += len(m.body)
            if off > self.queue_offset_max:
                self.queue_offset_max = off
        if self._msgs and not self.consuming:
            self.consuming = True
            return True
        return False

    def max_span(self) -> int:
        """Distance between the highest and the lowest cached offset (0 when empty)."""
        if not self._offsets:
            return 0
        return self._offsets[-1] - self._offsets[0]

    def remove_messages(self, msgs: Iterable[MessageExt]) -> int:
        """Acknowledge consumed messages; return the committable offset (-1: nothing cached ever)."""
        if not self._msgs and self.queue_offset_max < 0:
            return -1
        now = self._clock()
        self.last_consume_time = now
        for m in msgs:
            off = m.queue_offset
            if self._msgs.pop(off, None) is None:
                continue
            i = bisect.bisect_left(self._offsets, off)
            if i < len(self._offsets) and self._offsets[i] == off:
                del self._offsets[i]
            self.msg_count -= 1
            self.msg_size -= len(m.body)
        return self.committable_offset()

    def committable_offset(self) -> int:
        """The next offset the group may record: the smallest held, else max + 1."""
        if self._consuming:
            return min(self._consuming)
        if self._offsets:
            return self._offsets[0]
        return self.queue_offset_max + 1 if self.queue_offset_max >= 0 else -1

    def has_messages(self) -> bool:
        return bool(self._msgs) or bool(self._consuming)

    def clear(self) -> None:
        self._msgs.clear()
        self._offsets.clear()
        self._consuming.clear()
        self.msg_count = 0
        self.msg_size = 0
        self.queue_offset_max = -1
        self.consuming = False

    # orderly -----------------------------------------------------------------------------------
    def take_messages(self, n: int) -> list[MessageExt]:
        """Move the ``n`` lowest cached messages to the consuming set, in offset order. When the
        cache is empty, clear ``consuming`` (the consume task ends) and return []."""
        self.last_consume_time = self._clock()
        taken = self._offsets[:n]
        del self._offsets[:n]
        out = []
        for off in taken:
            m = self._msgs.pop(off)
            self._consuming[off] = m
            out.append(m)
        if not out:
            self.consuming = False
        return out

    def commit(self) -> int:
        """Acknowledge the consuming set; the next offset to consume (-1 if none was consuming)."""
        if not self._consuming:
            return -1
        offset = max(self._consuming) + 1
        for m in self._consuming.values():
            self.msg_count -= 1
            self.msg_size -= len(m.body)
        self._consuming.clear()
        return offset

    def make_message_to_consume_again(self, msgs: Iterable[MessageExt]) -> None:
        """Return consuming messages to the cache so the next take delivers them again first."""
        for m in msgs:
            off = m.queue_offset
            if self._consuming.pop(off, None) is None:
                continue
            self._msgs[off] = m
            bisect.insort(self._offsets, off)

    def mark_pulled(self) -> None:
        self.last_pull_time = self._clock()

    # locks -------------------------------------------------------------------------------------
    def set_locked(self, locked: bool) -> None:
        self.locked = locked
        if locked:
            self.last_lock_time = self._clock()

    def lock_expired(self) -> bool:
        return self._clock() - self.last_lock_time > LOCK_EXPIRY

    def lock_valid(self) -> bool:
        return self.locked and not self.lock_expired()

    def stats(self) -> ProcessQueueStats:
        return ProcessQueueStats(self.msg_count, self.msg_size, self.max_span(), self.locked,
                                 self.dropped)
