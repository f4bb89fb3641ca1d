"""Retention: delete old CommitLog segments, then the consume-queue and index files below them.

RocketMQ 4.x rules (CleanCommitLogService), with time from the store's clock:
- a segment is expired when its newest record is older than ``file_reserved_hours``; its newest
  record is older than the first record of the next segment, whose store time is used (the file's
  modification time when the next segment holds no record yet);
- expired segments go, oldest first and at most 10 per pass, when the local hour is in
  ``delete_when_hours``, when disk usage >= ``disk_clean_ratio``, or on a manual trigger;
- above ``disk_force_clean_ratio`` the oldest segment goes even if not expired (one per pass), so a
  full disk does not refuse writes forever;
- never the active segment, never a segment holding bytes not yet flushed.
Files are detached from every lookup on the loop thread first, then closed and deleted by a worker.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from tidemq.broker.store.commitlog import CommitLog
from tidemq.broker.store.config import StoreConfig
from tidemq.broker.store.mapped_file import StoreFile

log = logging.getLogger(__name__)

MAX_SEGMENTS_PER_PASS = 10


def _mtimes_ms(files: Sequence[StoreFile]) -> list[int]:
    out = []
    for f in files:
        try:
            out.append(int(os.stat(f.path).st_mtime * 1000))
        except OSError:
            out.append(0)
    return out


class Retention:
    def __init__(self, config: StoreConfig, commitlog: CommitLog, clock: Callable[[], float],
                 disk_ratio: Callable[[], float], flushed: Callable[[], int],
                 detach_logics: Callable[[int], list[StoreFile]],
                 executor: concurrent.futures.Executor) -> None:
        self.config = config
        self.commitlog = commitlog
        self.clock = clock
        self.disk_ratio = disk_ratio
        self.flushed = flushed
        self.detach_logics = detach_logics
        self.executor = executor
        self.segments_deleted = 0
        self.files_deleted = 0
        self._lock = asyncio.Lock()

    async def run_once(self, manual: bool = False) -> int:
        """One cleanup pass; returns how many CommitLog segments were deleted."""
        async with self._lock:
            return await self._run_once(manual)

    async def _run_once(self, manual: bool) -> int:
        loop = asyncio.get_running_loop()
        ratio = await loop.run_in_executor(self.executor, self.disk_ratio)
        cfg = self.config
        now_ms = int(self.clock() * 1000)
        hour = time.localtime(now_ms / 1000).tm_hour
        forced = ratio >= cfg.disk_force_clean_ratio
        if not (manual or forced or hour in cfg.delete_when_hours or ratio >= cfg.disk_clean_ratio):
            return 0
        segs = self.commitlog.segments[:-1]
        if not segs:
            return 0
        mtimes = await loop.run_in_executor(self.executor, _mtimes_ms, segs)
        reserved_ms = cfg.file_reserved_hours * 3600_000
        flushed = self.flushed()
        count = 0
        for i, seg in enumerate(segs[:MAX_SEGMENTS_PER_PASS]):
            if seg.end > flushed or self.commitlog.segments[i] is not seg:
                break
            nxt = self.commitlog.segments[i + 1]
            newest = self.commitlog.first_store_timestamp(nxt)
            if newest is None:
                newest = mtimes[i]
            if now_ms - newest >= reserved_ms:
                count += 1
            elif forced and count == 0:
                log.warning("disk usage %.0f%% >= %.0f%%: deleting commitlog segment %s before it expires",
                            ratio * 100, cfg.disk_force_clean_ratio * 100, seg.path)
                count = 1
                break
            else:
                break
        if not count:
            return 0
        gone = self.commitlog.detach_head(count)
        new_min = self.commitlog.min_offset
        logics = self.detach_logics(new_min)
        for seg in gone:
            log.info("deleting commitlog segment %s (retention); commitlog now starts at %d",
                     seg.path, new_min)
        await loop.run_in_executor(self.executor, destroy_all, gone + logics)
        self.segments_deleted += len(gone)
        self.files_deleted += len(logics)
        return len(gone)


class DiskUsage(NamedTuple):
    total: int
    used: int
    free: int


def filesystem_usage(path: str) -> DiskUsage:
    """Disk usage as RocketMQ counts it (Java File.getFreeSpace: free blocks *including* those
    reserved for root). shutil.disk_usage's ``free`` leaves the reserved blocks out, which on a
    large disk with 5 % reserved reads as far fuller than ``df`` shows and would make retention
    delete unexpired segments early."""
    st = os.statvfs(path)
    total = st.f_blocks * st.f_frsize
    free = st.f_bfree * st.f_frsize
    return DiskUsage(total, total - free, free)


def usage_ratio(probe: Callable[[str], object], path: str) -> float:
    """(total - free) / total of what ``probe`` (shutil.disk_usage-like) reports; a number is
    taken as the ratio itself."""
    u = probe(path)
    if isinstance(u, (int, float)):
        return float(u)
    total = u.total  # type: ignore[attr-defined]
    return (total - u.free) / total if total else 0.0  # type: ignore[attr-defined]


def destroy_all(files: Sequence[StoreFile]) -> None:
    """Close and delete files (blocking: a worker thread, or load)."""
    for f in files:
        try:
            f.destroy()
        except OSError as exc:
            log.error("could not delete %s: %s", f.path, exc)
