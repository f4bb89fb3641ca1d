"""Making the store durable: CommitLog flushing (ASYNC interval or SYNC group commit) and the
periodic flush of consume queues + index followed by the checkpoint.

Invariants:
- ``CommitLogFlusher.flushed`` only grows, and only after an fdatasync covering every byte below it
  returned; ``wait_durable(end)`` resolves True only when ``flushed >= end``.
- Group commit: waiters register and wake the flusher; one flush round captures the write position,
  fdatasyncs the segments below it once, then releases every waiter it covers. Waiters arriving
  during a round are served by the next one. fsync count grows with rounds, never with messages.
  A waiter is answered True only after that fdatasync returned, False after ``timeout`` or a
  failed flush (which fails every waiter), exactly once either way.
- All fdatasync calls run on store worker threads; the event loop only captures positions (an
  fdatasync on the loop would hold every other answer for its wall time: see CommitLogFlusher).
- The checkpoint is written after the files it vouches for were flushed (see checkpoint.py).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
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

    SYNC hot path (bench/compare.py SYNC rows, bench/hot_path.py --loop --flush sync): a put's
    waiter is a plain callback in a deque, called with True/False on the loop thread the moment
    its round ends (no future, so no loop iteration per link between the fdatasync and the
    answer). The first waiter of an idle flusher schedules one round for the end of the current
    loop iteration, so every put read in that iteration shares it; waiters arriving during a round
    are served by the next one. Deadlines are checked by one timer, not one per waiter.

    Rounds run on the flush thread, never on the loop, though Redis's appendfsync always flushes
    inline (in beforeSleep) and that spares the thread's wake-up, the loop's wake-up by it and the
    GIL hand-offs between them (broker CPU per one-in-flight send 78-91 -> 42-53 us with the
    fdatasync taken out): measured in docs/benchmarks.md ("SYNC_FLUSH: one send in flight and the
    end-to-end tail"), an inline round holds every other answer of the broker for the fdatasync's
    wall time, so the disk's latency tail became the end-to-end tail (bench/compare.py row 5 SYNC
    p99 24-25 ms against 1.1-1.3 ms with the thread), while one-in-flight throughput stayed bound
    by the fdatasync either way.
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
        self._waiters: collections.deque[tuple[int, float, Callable[[bool], None]]] = collections.deque()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._requests: queue.SimpleQueue[tuple[int, list[MappedFile]] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._in_flight = False  # a round runs on the thread
        self._scheduled = False  # a round is scheduled for the end of this loop iteration
        self._paused = False  # inside ``paused``: no round starts
        self._round_over: asyncio.Future[None] | None = None  # ``paused`` waits for the thread's round
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
        waiters = self._waiters
        while waiters:  # nothing will flush them: answer now (FLUSH_DISK_TIMEOUT)
            _call(waiters.popleft()[2], False)

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
        """Between flush rounds (a replica's truncation moves the write position back): neither
        a round under the lock nor one on the SYNC thread runs inside. A thread round in flight is
        waited for first: its target was taken before the cut, and reported after it, it would
        move ``flushed`` past the log's end (what a follower acks and the checkpoint vouches for)."""
        async with self._lock:
            self._paused = True
            try:
                while self._in_flight and self._thread is not None:
                    self._round_over = fut = asyncio.get_running_loop().create_future()
                    await fut
                yield
            finally:
                self._paused = False
                self._round_over = None
                if self._waiters and not self._in_flight and not self._scheduled and self._loop is not None:
                    self._scheduled = True
                    self._loop.call_soon(self._begin_round)

    def cut(self, offset: int) -> None:
        """The CommitLog is cut at ``offset`` (inside ``paused``): ``flushed`` moves back to it,
        and the waiters for records past it are answered False now (what they wait for is gone;
        the records written there next are others)."""
        self.flushed = min(self.flushed, offset)
        waiters = self._waiters
        if not waiters or waiters[-1][0] <= offset:
            return
        gone = [w for w in waiters if w[0] > offset]
        kept = [w for w in waiters if w[0] <= offset]
        waiters.clear()
        waiters.extend(kept)
        log.warning("%d SYNC_FLUSH waiter(s) past commitlog offset %d answered not durable: the log was cut there",
                    len(gone), offset)
        for _, _, callback in gone:
            _call(callback, False)

    # ---------------------------------------------------------------- SYNC group commit
    def when_durable(self, end_offset: int, callback: Callable[[bool], None]) -> bool:
        """Have ``callback(True)`` called on the loop thread once the CommitLog is flushed past
        ``end_offset``, ``callback(False)`` after ``timeout`` or a failed flush. Returns False,
        without calling it, when ``end_offset`` is durable already (or in ASYNC mode)."""
        if self.mode is FlushMode.ASYNC or end_offset <= self.flushed:
            return False
        loop = self._loop or asyncio.get_running_loop()
        if self.error is not None or self._thread is None:
            loop.call_soon(callback, False)
            return True
        self._waiters.append((end_offset, loop.time() + self.timeout, callback))
        if self._timer is None:
            self._timer = loop.call_at(self._waiters[0][1], self._expire, loop)
        if not self._in_flight and not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._begin_round)
        return True

    async def wait_durable(self, end_offset: int) -> bool:
        loop = self._loop or asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        if not self.when_durable(end_offset, functools.partial(_resolve, fut)):
            return True
        return await fut

    def _begin_round(self) -> None:
        """End of the loop iteration that registered the first waiter: one round for all of them."""
        self._scheduled = False
        if (self._in_flight or self._paused or not self._waiters or self.error is not None
                or self._thread is None):
            return  # (no thread: stopped, and stop's flush releases them, or abandoned as in a crash;
            # paused: the pause starts the round when it ends)
        self._start_round()

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
        self._round_ended()
        if self._waiters and self.error is None and not self._paused:
            self._start_round()  # waiters that arrived during the round: they waited long enough

    def _round_failed(self, exc: OSError) -> None:
        self._in_flight = False
        self._fail(exc)
        self._round_ended()

    def _round_ended(self) -> None:
        fut = self._round_over
        if fut is not None and not fut.done():
            fut.set_result(None)

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
            _call(waiters.popleft()[2], True)

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
            end, _, callback = waiters.popleft()
            log.warning("commitlog not flushed past offset %d within %.1f s", end, self.timeout)
            _call(callback, False)
        if waiters:
            self._timer = loop.call_at(waiters[0][1], self._expire, loop)


def _call(callback: Callable[[bool], None], durable: bool) -> None:
    """A waiter's callback: one that raises must not keep the waiters after it from their answer."""
    try:
        callback(durable)
    except Exception:
        log.exception("a SYNC_FLUSH waiter's callback failed")


def _resolve(fut: asyncio.Future[bool], durable: bool) -> None:
    if not fut.done():  # the awaiting task may have been cancelled
        fut.set_result(durable)


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
