"""ScheduleMessageService: delivers delayed messages when they are due.

One LevelTimer per delay level walks its SCHEDULE_TOPIC_XXXX queue in offset order (entries of
one level are due in store order, so the head decides when the level wakes next); a
DeliveryTimer (tidemq.broker.timer) does the same for delivery-timestamp messages. Each is driven
by its own task that sleeps exactly until its next due time, or until a new entry arrives while
it is idle (the store's dispatch listener wakes it); nothing polls.

Progress (the next queue offset per level, and the timer's lowest undelivered offset) is
persisted in ``config/delayOffset.json`` as ``{"offsetTable": {"1": 5, ...}, "timerOffset": 7}``
every ``persist_interval`` seconds and at stop. Invariants: an offset only moves past an entry
once its delivery put succeeded (or the entry is unusable); in SYNC_FLUSH mode the file is only
written once the deliveries it covers are durable. A restart therefore resumes without skipping;
after a crash the entries delivered since the last write are delivered again (duplicates, never
losses).

A replicated broker's followers do not deliver (``may_write``); they take the master's progress
from the replicated log (``apply_progress``, tidemq.broker.ha.metalog), so a follower that
becomes master resumes where the master was, with at most the last batch interval delivered twice.

Time comes from the injected clock (seconds, like ``time.time``); tests call ``run_due`` with
their own ``now`` and never sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

from tidemq.broker.delay import (
    DEFAULT_MAX_TIMER_DELAY_MS,
    TIMER_TOPIC,
    DelayLevels,
    restore_put,
    schedule_put,
    wants_delay,
)
from tidemq.broker.store.config import FlushMode
from tidemq.broker.store.jsonfile import read_json, write_json_atomic
from tidemq.broker.store.replay import SCHEDULE_TOPIC
from tidemq.broker.store.store import GetStatus, MessageStore, PutRequest, PutStatus
from tidemq.broker.store.tasks import cancel_and_wait
from tidemq.broker.timer import RETRY_AFTER_MS, Deliver, DeliveryTimer
from tidemq.errors import CodecError
from tidemq.message import decode_record, decode_record_header
from tidemq.remoting import fastjson

log = logging.getLogger(__name__)

_BATCH = 32
_PERMANENT = (PutStatus.MESSAGE_ILLEGAL, PutStatus.PROPERTIES_SIZE_EXCEEDED)


class LevelTimer:
    """Walks queue ``level - 1`` of SCHEDULE_TOPIC_XXXX; ``offset`` is the next entry to deliver."""

    def __init__(self, store: MessageStore, level: int, delay_ms: int, deliver: Deliver, offset: int = 0) -> None:
        self.store = store
        self.level = level
        self.queue_id = level - 1
        self.delay_ms = delay_ms
        self.deliver = deliver
        self.offset = max(0, offset)
        self.next_due: int | None = None  # when the driving loop wakes next (None = idle)
        self.delivered = 0

    def run_due(self, now_ms: int, budget: int = 256) -> int | None:
        """Deliver the due head entries. Returns the time to run again (ms), None when the queue
        is drained."""
        store = self.store
        batch = 1  # the head alone first: usually it is not due yet, so read no more than it
        while budget > 0:
            res = store.get_messages(SCHEDULE_TOPIC, self.queue_id, self.offset, min(batch, budget), None)
            batch = _BATCH
            st = res.status
            if st in (GetStatus.NO_MESSAGE_IN_QUEUE, GetStatus.OFFSET_OVERFLOW_ONE):
                return None
            if st in (GetStatus.OFFSET_TOO_SMALL, GetStatus.OFFSET_OVERFLOW_BADLY):
                log.warning("delay level %d: offset %d is outside [%d, %d]; continuing at %d",
                            self.level, self.offset, res.min_offset, res.max_offset, res.next_begin_offset)
                self.offset = res.next_begin_offset
                continue
            for rec in res.records:
                try:
                    h = decode_record_header(rec)
                except CodecError as exc:  # the store verified the record; keep going, loudly
                    log.error("delay level %d: unreadable record skipped: %s", self.level, exc)
                    continue
                due = h.store_timestamp + self.delay_ms
                if due > now_ms:
                    self.offset = h.queue_offset
                    return due
                if not self.deliver(rec):
                    self.offset = h.queue_offset
                    return now_ms + RETRY_AFTER_MS
                self.offset = h.queue_offset + 1
                self.delivered += 1
                budget -= 1
            if res.next_begin_offset <= self.offset and not res.records:
                return now_ms + RETRY_AFTER_MS  # nothing readable and no way forward yet
            self.offset = max(self.offset, res.next_begin_offset)
        return now_ms


class ScheduleMessageService:
    def __init__(self, store: MessageStore, levels: DelayLevels, offsets_path: Path,
                 store_host: tuple[str, int], clock: Callable[[], float] = time.time,
                 persist_interval: float = 2.0, timer_capacity: int = 200_000,
                 max_timer_delay_ms: int = DEFAULT_MAX_TIMER_DELAY_MS,
                 may_write: Callable[[], bool] = lambda: True) -> None:
        self.store = store
        # A replica that is not its group's acknowledging master must not deliver: its log is the
        # master's copy (tidemq.broker.ha), and a due entry waits until this replica may write.
        self.may_write = may_write
        self.levels = levels
        self.path = offsets_path
        self.store_host = store_host
        self.clock = clock
        self.persist_interval = persist_interval
        self.max_timer_delay_ms = max_timer_delay_ms
        self.level_timers = [
            LevelTimer(store, lvl, levels.delay_ms(lvl), self._deliver) for lvl in range(1, levels.max_level + 1)
        ]
        self.timer = DeliveryTimer(store, self._deliver, 0, timer_capacity)
        self._wakes: list[asyncio.Event] = []
        self._tasks: list[asyncio.Task] = []
        self._last_written: dict | None = None
        self._delivered_end = 0  # CommitLog end of the newest delivery put
        self._persist_lock: asyncio.Lock | None = None
        self.skipped = 0
        self.scheduled = 0

    # ------------------------------------------------------------------ the put side
    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def prepare_put(self, req: PutRequest) -> PutRequest:
        """Redirect a put that asks for a delay to the schedule/timer topic (tidemq.broker.delay).
        Raises BrokerError (MESSAGE_ILLEGAL) for a bad timer property."""
        if not wants_delay(req.properties):  # hot path (bench/produce_consume.py)
            return req
        out = schedule_put(req, self.levels, self.now_ms(), self.max_timer_delay_ms)
        if out.topic in (SCHEDULE_TOPIC, TIMER_TOPIC):
            self.scheduled += 1
        return out

    def on_dispatch(self, topic: str, queue_id: int, queue_offset: int, tags_code: int) -> None:
        """Store dispatch listener: wake the timer a new entry belongs to."""
        if not self._wakes:
            return
        if topic == SCHEDULE_TOPIC:
            if 0 <= queue_id < len(self.level_timers) and self.level_timers[queue_id].next_due is None:
                self._wakes[queue_id].set()
        elif topic == TIMER_TOPIC and queue_id == 0:
            if self.timer.on_dispatch(queue_offset, tags_code):
                self._wakes[-1].set()

    # ------------------------------------------------------------------ delivering
    def _deliver(self, rec: bytes) -> bool:
        if not self.may_write():
            return False  # tried again after RETRY_AFTER_MS
        try:
            msg = decode_record(rec)
            req = restore_put(msg, self.store_host)
        except (CodecError, ValueError) as exc:
            self.skipped += 1
            log.error("scheduled message skipped, it cannot be delivered: %s", exc)
            return True
        result = self.store.put(req)
        if result.ok:
            self._delivered_end = max(self._delivered_end, result.end_offset)
            return True
        if result.status in _PERMANENT:
            self.skipped += 1
            log.error("scheduled message for %s/%d dropped, the store refuses it: %s",
                      req.topic, req.queue_id, result.remark)
            return True
        log.warning("delivering a scheduled message to %s/%d failed (%s); retrying in %d ms",
                    req.topic, req.queue_id, result.remark or result.status.name, RETRY_AFTER_MS)
        return False

    @property
    def delivered(self) -> int:
        return sum(t.delivered for t in self.level_timers) + self.timer.delivered

    # ------------------------------------------------------------------ progress
    def load(self) -> None:
        """Read the persisted progress (blocking; after the store loaded, before ``start``).

        Schedule queues beyond the level table (left by a longer table before a restart) get a
        walker too, at the table's longest delay, so their messages are still delivered."""
        stored = self.store.queue_ids(SCHEDULE_TOPIC)
        top = max(stored, default=-1) + 1
        if top > len(self.level_timers):
            log.warning("SCHEDULE_TOPIC_XXXX has queues up to %d but the delay table has %d levels; "
                        "delivering the extra queues after the longest delay", top - 1, self.levels.max_level)
            for lvl in range(len(self.level_timers) + 1, top + 1):
                self.level_timers.append(LevelTimer(self.store, lvl, self.levels.delay_ms(lvl), self._deliver))
        data = read_json(self.path, None, fastjson.loads) or {}
        table = data.get("offsetTable") or {}
        for key, value in table.items():
            try:
                level, offset = int(str(key)), int(value)
            except (TypeError, ValueError):
                log.warning("%s: ignoring entry %r: %r", self.path, key, value)
                continue
            if 1 <= level <= len(self.level_timers):
                self.level_timers[level - 1].offset = max(0, offset)
            else:
                log.warning("%s: delay level %d is not in the table of %d levels; its offset %d is ignored",
                            self.path, level, len(self.level_timers), offset)
        self.timer.scanned = max(0, int(data.get("timerOffset") or 0))
        self._last_written = self.snapshot()
        log.info("delay progress loaded: %s, timer from offset %d",
                 {t.level: t.offset for t in self.level_timers if t.offset}, self.timer.scanned)

    def snapshot(self) -> dict:
        return {
            "offsetTable": {str(t.level): t.offset for t in self.level_timers},
            "timerOffset": self.timer.progress,
        }

    def progress(self) -> tuple[tuple[tuple[int, int], ...], int]:
        """((level, next offset) per level, the timer's lowest undelivered offset)."""
        return tuple((t.level, t.offset) for t in self.level_timers), self.timer.progress

    def apply_progress(self, levels: tuple[tuple[int, int], ...], timer: int) -> None:
        """Take the master's progress (a follower: its own walkers never deliver). Levels this
        broker's table does not have are ignored, as at ``load``."""
        self._set_levels(levels)
        self.timer.advance_to(timer)

    def rewind_progress(self, levels: tuple[tuple[int, int], ...], timer: int) -> None:
        """As :meth:`apply_progress`, but the delivery timer may go back too (a replica undoing
        the deliveries of a tail it cut)."""
        self._set_levels(levels)
        self.timer.reload(timer)

    def _set_levels(self, levels: tuple[tuple[int, int], ...]) -> None:
        for level, offset in levels:
            if 1 <= level <= len(self.level_timers):
                self.level_timers[level - 1].offset = max(0, offset)

    def after_cut(self) -> None:
        """The store's CommitLog was cut: the timer loads its queue again from its progress
        (what it loaded from the cut tail, maybe while the cut was being made, is gone)."""
        self.timer.reload()
        # Deliveries past the cut are gone: a SYNC_FLUSH persist must not wait for them.
        self._delivered_end = min(self._delivered_end, self.store.commitlog_max_offset)
        if self._wakes:
            self._wakes[-1].set()

    async def persist(self) -> None:
        """Write the progress if it moved (after the deliveries it covers are durable in SYNC)."""
        if self._persist_lock is None:
            self._persist_lock = asyncio.Lock()
        async with self._persist_lock:
            snap = self.snapshot()
            if snap == self._last_written:
                return
            end = self._delivered_end
            if end and self.store.flush_mode is FlushMode.SYNC and not await self.store.wait_durable(end):
                log.warning("delay progress not persisted: deliveries up to %d are not durable yet", end)
                return
            await asyncio.to_thread(write_json_atomic, self.path, snap)
            self._last_written = snap

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._persist_lock = asyncio.Lock()
        self._wakes = [asyncio.Event() for _ in range(len(self.level_timers) + 1)]
        steps: list[tuple[str, Callable[[int], int | None], LevelTimer | DeliveryTimer]] = [
            (f"delay-level-{t.level}", t.run_due, t) for t in self.level_timers
        ]
        steps.append(("delivery-timer", self.timer.run_due, self.timer))
        self._tasks = [
            asyncio.create_task(self._drive(step, holder, wake), name=name)
            for (name, step, holder), wake in zip(steps, self._wakes)
        ]
        self._tasks.append(asyncio.create_task(self._persist_loop(), name="delay-offsets"))

    async def stop(self) -> None:
        await cancel_and_wait(*self._tasks)
        self._tasks = []
        self._wakes = []
        await self._persist_logged()

    async def _drive(self, step: Callable[[int], int | None], holder: LevelTimer | DeliveryTimer,
                     wake: asyncio.Event) -> None:
        while True:
            wake.clear()
            now = self.now_ms()
            try:
                nxt = step(now)
            except Exception:
                log.exception("delayed delivery step failed; retrying in %d ms", RETRY_AFTER_MS)
                nxt = now + RETRY_AFTER_MS
            holder.next_due = nxt
            if nxt is None:
                await wake.wait()
                continue
            delay = (nxt - self.now_ms()) / 1000
            if delay <= 0:
                await asyncio.sleep(0)
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay + 0.001):
                    await wake.wait()

    async def _persist_loop(self) -> None:
        while True:
            await asyncio.sleep(self.persist_interval)
            await self._persist_logged()

    async def _persist_logged(self) -> None:
        try:
            await self.persist()
        except OSError as exc:
            log.error("could not persist delay progress to %s: %s", self.path, exc)
