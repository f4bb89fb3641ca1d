"""Making the store durable: CommitLog flushing (ASYNC interval or SYNC group commit) and the
periodic flush of consume queues + index followed by the checkpoint.

Invariants:
- ``CommitLogFlusher.flushed`` only grows, and only after an fdatasync covering every byte below it
  returned; ``wait_durable(end)`` resolves True only when ``flushed >= end``.
- Group commit: waiters register and wake the flusher; one flush round captures the write position,
  fdatasyncs the segments below it once, then releases every waiter it covers. Waiters arriving
  during a round are served by the next one. fsync count grows with rounds, never with messages.
- All fdatasync calls run on store worker threads; the event loop only captures positions.
- The checkpoint is written after the files it vouches for were flushed (see checkpoint.py).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tidemq.broker.store.checkpoint import Checkpoint, write_checkpoint
from tidemq.broker.store.commitlog import CommitLog
from tidemq.broker.store.config import FlushMode
from tidemq.broker.store.mapped_file import MappedFile, StoreFile, fsync_dir
from tidemq.broker.store.observer import StoreObserver
from tidemq.broker.store.tasks import cancel_and_wait

log = logging.getLogger(__name__)


def _fsync_all(files: Sequence[StoreFile]) -> int:
    for f in files:
        f.flush()
    return len(files)


class CommitLogFlusher:
    """ASYNC: an fdatasync round every ``interval``. SYNC: group commit on a dedicated thread.

    SYNC hot path (bench/compare.py, SYNC rows): a put's waiter is a plain future in a list; the
    first waiter of an idle flusher hands (target offset, segments) to the flush thread through a
    SimpleQueue; the thread fdatasyncs and reports back with one ``call_soon_threadsafe``; every
    waiter at or below the flushed offset is released then, and the waiters that arrived during
    the round start the next one. Deadlines are checked by one timer, not one per waiter.
    """

    def __init__(self, commitlog: CommitLog, mode: FlushMode, interval: float, timeout: float,
                 executor: concurrent.futures.Executor,
                 observer: StoreObserver | None = None) -> None:  # used for testing
        self.commitlog = commitlog
        self.mode = mode
        self.interval = interval
        self.timeout = timeout
        self.executor = executor
        self.flushed = 0
        self.fsyncs = 0
        self.rounds = 0
        self.seconds = 0.0  # summed wall time of flush rounds' fsyncs (a duration, not a timestamp)
        self.error: OSError | None = None
        # Told before each round, on the flushing thread (a test stalls the disk there).
        self.observer = observer
        self._waiters: collections.deque[tuple[int, float, asyncio.Future[bool]]] = collections.deque()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._requests: queue.SimpleQueue[tuple[int, list[MappedFile]] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._in_flight = False
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._loop = loop = asyncio.get_running_loop()
        if self.mode is FlushMode.SYNC:
            self._thread = threading.Thread(target=self._thread_main, args=(loop,),
                                            name="tidemq-store-sync-flush", daemon=True)
            self._thread.start()
        self._task = asyncio.create_task(self._run(), name="tidemq-store-commitlog-flush")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        if self._thread is not None:
            self._requests.put(None)
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
            self._thread = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await self.flush()

    async def _run(self) -> None:
        # ASYNC: the interval flush. SYNC: also covers puts nobody waits for (WAIT=false).
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.flush()
            except OSError as exc:
                self._fail(exc)

    def _fail(self, exc: OSError) -> None:
        if self.error is None:
            log.error("flushing the commitlog failed: %s; the store stops accepting messages", exc)
        self.error = exc
        while self._waiters:  # nothing will flush them: answer now (FLUSH_DISK_TIMEOUT)
            _, _, fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(False)

    async def flush(self) -> None:
        """One flush round of everything written so far (no-op when nothing is pending)."""
        async with self._lock:
            target = self.commitlog.write_pos
            if target > self.flushed:
                segs = self.commitlog.segments_between(self.flushed, target)
                loop = asyncio.get_running_loop()
                started = time.perf_counter()
                if self.observer is not None:
                    await loop.run_in_executor(self.executor, self.observer.before_flush_round)
                n = await loop.run_in_executor(self.executor, _fsync_all, segs)
                self._flushed_to(target, n, time.perf_counter() - started)
            else:
                self._release()

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """Between flush rounds (a replica's truncation moves the write position back)."""
        async with self._lock:
            yield

    # ---------------------------------------------------------------- SYNC group commit
    def durable(self, end_offset: int) -> asyncio.Future[bool] | None:
        """None when ``end_offset`` is durable already (or in ASYNC mode), else a future that
        resolves True once flushed past it, False after ``timeout`` or a failed flush."""
        if self.mode is FlushMode.ASYNC or end_offset <= self.flushed:
            return None
        loop = self._loop or asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        if self.error is not None or self._thread is None:
            fut.set_result(False)
            return fut
        self._waiters.append((end_offset, loop.time() + self.timeout, fut))
        if self._timer is None:
            self._timer = loop.call_at(self._waiters[0][1], self._expire, loop)
        if not self._in_flight:
            self._start_round()
        return fut

    async def wait_durable(self, end_offset: int) -> bool:
        fut = self.durable(end_offset)
        return True if fut is None else await fut

    def _start_round(self) -> None:
        target = self.commitlog.write_pos
        self._in_flight = True
        self._requests.put((target, self.commitlog.segments_between(self.flushed, target)))

    def _thread_main(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            item = self._requests.get()
            if item is None:
                return
            target, segs = item
            started = time.perf_counter()
            try:
                if self.observer is not None:
                    self.observer.before_flush_round()
                n = _fsync_all(segs)
            except OSError as exc:
                loop.call_soon_threadsafe(self._round_failed, exc)
                continue
            except RuntimeError:  # the loop is closed: shutting down
                return
            try:
                loop.call_soon_threadsafe(self._round_done, target, n, time.perf_counter() - started)
            except RuntimeError:
                return

    def _round_done(self, target: int, n: int, seconds: float) -> None:
        self._in_flight = False
        self._flushed_to(target, n, seconds)
        if self._waiters and self.error is None:
            self._start_round()  # waiters that arrived during the round

    def _round_failed(self, exc: OSError) -> None:
        self._in_flight = False
        self._fail(exc)

    def _flushed_to(self, target: int, n: int, seconds: float) -> None:
        self.seconds += seconds
        self.fsyncs += n
        self.rounds += 1
        if target > self.flushed:
            self.flushed = target
        self._release()

    def _release(self) -> None:
        # Waiters arrive in put order, so their offsets (and deadlines) only grow.
        flushed = self.flushed
        waiters = self._waiters
        while waiters and waiters[0][0] <= flushed:
            fut = waiters.popleft()[2]
            if not fut.done():
                fut.set_result(True)

    def abandon(self) -> None:
        """Stop the flush thread without flushing (a test's emulated crash)."""
        if self._thread is not None:
            self._requests.put(None)
            self._thread = None

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        """Answer False to every waiter past its deadline; re-arm for the next one."""
        self._timer = None
        now = loop.time() + 0.001  # timers may fire up to the clock resolution early
        waiters = self._waiters
        while waiters and waiters[0][1] <= now:
            end, _, fut = waiters.popleft()
            if not fut.done():
                log.warning("commitlog not flushed past offset %d within %.1f s", end, self.timeout)
                fut.set_result(False)
        if waiters:
            self._timer = loop.call_at(waiters[0][1], self._expire, loop)


@dataclass(frozen=True, slots=True)
class LogicsSnapshot:
    """Captured on the loop thread: what the next checkpoint may vouch for once ``files`` are flushed."""

    files: list[StoreFile]
    dirs: list[Path]  # directories that gained files since the last checkpoint
    dispatched: int  # every record below this offset is in its consume queue and the index
    index_file: int
    index_count: int
    store_timestamp: int


class LogicsFlusher:
    """Every ``interval``: flush dirty consume-queue and index files, then write the checkpoint."""

    def __init__(self, capture: Callable[[], LogicsSnapshot], cl_flusher: CommitLogFlusher,
                 checkpoint_path: Path, interval: float, executor: concurrent.futures.Executor) -> None:
        self.capture = capture
        self.cl_flusher = cl_flusher
        self.path = checkpoint_path
        self.interval = interval
        self.executor = executor
        self.checkpoints = 0
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="tidemq-store-logics-flush")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.checkpoint()
            except OSError as exc:
                log.error("flushing consume queues / index or writing the checkpoint failed: %s", exc)

    async def checkpoint(self) -> None:
        async with self._lock:
            snap = self.capture()
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self.executor, self.persist, snap)

    def persist(self, snap: LogicsSnapshot) -> None:
        """Blocking: flush the captured files, then write the checkpoint."""
        _fsync_all(snap.files)
        for d in snap.dirs:
            fsync_dir(d)
        physic = self.cl_flusher.flushed  # read after the logics flush: never ahead of the disk
        write_checkpoint(self.path, Checkpoint(
            physic_timestamp=snap.store_timestamp,
            logics_timestamp=snap.store_timestamp,
            index_timestamp=snap.store_timestamp,
            physic_offset=physic,
            logics_offset=snap.dispatched,
            index_offset=snap.dispatched,
            index_file=snap.index_file,
            index_count=snap.index_count,
        ))
        self.checkpoints += 1
