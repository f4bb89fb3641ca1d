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
import concurrent.futures
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tidemq.broker.store.checkpoint import Checkpoint, write_checkpoint
from tidemq.broker.store.commitlog import CommitLog
from tidemq.broker.store.config import FlushMode
from tidemq.broker.store.mapped_file import MappedFile, fsync_dir
from tidemq.broker.store.tasks import cancel_and_wait

log = logging.getLogger(__name__)


def _fsync_all(files: list[MappedFile]) -> int:
    for f in files:
        f.flush()
    return len(files)


class CommitLogFlusher:
    def __init__(self, commitlog: CommitLog, mode: FlushMode, interval: float, timeout: float,
                 executor: concurrent.futures.Executor) -> None:
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
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="tidemq-store-commitlog-flush")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        await self.flush()

    async def _run(self) -> None:
        while True:
            if self.mode is FlushMode.SYNC:
                # Woken by waiters; the interval also covers puts nobody waits for (WAIT=false).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.interval):
                        await self._wake.wait()
                self._wake.clear()
            else:
                await asyncio.sleep(self.interval)
            try:
                await self.flush()
            except OSError as exc:
                if self.error is None:
                    log.error("flushing the commitlog failed: %s; the store stops accepting messages", exc)
                self.error = exc

    async def flush(self) -> None:
        """One flush round of everything written so far (no-op when nothing is pending)."""
        async with self._lock:
            target = self.commitlog.write_pos
            if target > self.flushed:
                segs = self.commitlog.segments_between(self.flushed, target)
                loop = asyncio.get_running_loop()
                started = time.perf_counter()
                n = await loop.run_in_executor(self.executor, _fsync_all, segs)
                self.seconds += time.perf_counter() - started
                self.fsyncs += n
                self.rounds += 1
                self.flushed = target
            self._release()

    def _release(self) -> None:
        keep = []
        for end, fut in self._waiters:
            if fut.done():
                continue
            if end <= self.flushed:
                fut.set_result(None)
            else:
                keep.append((end, fut))
        self._waiters = keep
        if keep:
            self._wake.set()

    async def wait_durable(self, end_offset: int) -> bool:
        if self.mode is FlushMode.ASYNC or end_offset <= self.flushed:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((end_offset, fut))
        self._wake.set()
        try:
            async with asyncio.timeout(self.timeout):
                await fut
        except TimeoutError:
            log.warning("commitlog not flushed past offset %d within %.1f s", end_offset, self.timeout)
            return False
        return True


@dataclass(frozen=True, slots=True)
class LogicsSnapshot:
    """Captured on the loop thread: what the next checkpoint may vouch for once ``files`` are flushed."""

    files: list[MappedFile]
    dirs: list[Path]  # directories that gained files since the last checkpoint
    dispatched: int  # every record below this offset is in its consume queue and the index
    index_file: int
    index_count: int
    store_timestamp: int


class LogicsFlusher:
    """Every ``interval``: flush dirty consume-queue and index files, then write the checkpoint."""

    def __init__(self, capture: Callable[[], LogicsSnapshot], cl_flusher: CommitLogFlusher,
                 checkpoint_path, interval: float, executor: concurrent.futures.Executor) -> None:
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
