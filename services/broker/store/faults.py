"""TEST-ONLY fault injection: emulate what a power failure leaves on disk (style-and-reliability.md
B7 row D2). Never enabled unless a :class:`DurableShadow` is passed to the store as its observer
(tidemq.broker.store.observer; the hidden broker flag ``--test-power-loss-shadow DIR`` builds
one); nothing here runs otherwise.

kill -9 proves nothing about fsync on an mmap store: the kernel's page cache outlives the process
and writes everything back. A power cut loses every page not yet made durable. To emulate it:

- while the store runs, every time a mapped file is fdatasynced (``StoreFile.flush`` tells its
  observer) its data
  regions are copied into a *shadow* file ``<shadow>/<path relative to the store root>`` -- the
  content the disk is guaranteed to hold. A file created afresh has no shadow yet (= zeros);
- after the broker was killed, ``power_loss(root, shadow)`` rewrites every CommitLog segment and
  consume-queue file from its shadow: pages written since their last fdatasync revert to their
  previous content, zeros in a preallocated segment. Small metadata files (checkpoint, topics,
  offsets, ...) are written with fsync + rename + directory fsync (jsonfile.py), so their current
  content is what the disk holds; interrupted temporary files are deleted.

Index files are not shadowed (up to ~420 MB each, sparse): ``power_loss`` deletes them, the
harshest outcome, and recovery must rebuild the index from the CommitLog.

Emulation is conservative: a real disk may also hold some pages written back early. It never
holds less than the shadow, since the shadow is updated before ``flush`` returns, i.e. before any
acknowledgement or checkpoint relies on it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

from tidemq.broker.store import mapped_file
from tidemq.broker.store.observer import StoreObserver

log = logging.getLogger(__name__)

_CHUNK = 1 << 16
_SHADOWED_DIRS = ("commitlog", "consumequeue")


def _data_regions(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """(start, end) of the regions of ``fd`` holding data (SEEK_DATA/SEEK_HOLE; all when unsupported)."""
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
            end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no data past pos
                return
            yield pos, size
            return
        yield start, end
        pos = end


class DurableShadow(StoreObserver):
    """Keeps, per mapped file under ``root``, what its last fdatasync made durable: a store
    observer (pass it to the MessageStore of ``root``)."""

    def __init__(self, root: Path, shadow_root: Path) -> None:
        self.root = Path(root).resolve()
        self.shadow_root = Path(shadow_root)
        self._lock = threading.Lock()
        log.warning("TEST-ONLY power-loss emulation is on: every fdatasync under %s is copied to %s; "
                    "never use this in production", root, shadow_root)

    def _shadow_path(self, path: Path) -> Path | None:
        try:
            rel = Path(path).resolve().relative_to(self.root)
        except ValueError:
            return None
        if not rel.parts or rel.parts[0] not in _SHADOWED_DIRS:
            return None
        return self.shadow_root / rel

    def file_created(self, path: Path) -> None:
        """``path`` was (re)created: none of its content is durable yet."""
        shadow = self._shadow_path(path)
        if shadow is not None:
            with self._lock, contextlib.suppress(FileNotFoundError):
                shadow.unlink()

    def file_synced(self, mf: mapped_file.MappedFile) -> None:
        """``mf`` was just fdatasynced: its data regions are now on disk."""
        shadow = self._shadow_path(mf.path)
        if shadow is None:
            return
        with self._lock:
            shadow.parent.mkdir(parents=True, exist_ok=True)
            src = os.open(mf.path, os.O_RDONLY)
            dst = os.open(shadow, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                if os.fstat(dst).st_size != mf.size:
                    os.ftruncate(dst, mf.size)
                mm = mf.mm
                for start, end in list(_data_regions(src, mf.size)):
                    for a in range(start, end, _CHUNK):
                        b = min(end, a + _CHUNK)
                        now = mm[a:b]
                        if os.pread(dst, b - a, a) != now:
                            os.pwrite(dst, now, a)
            finally:
                os.close(src)
                os.close(dst)


def power_loss(root: Path, shadow_root: Path) -> dict[str, int]:
    """Rewrite the store under ``root`` (broker stopped) as a power cut would leave it. Returns
    counts: files reverted to their shadow, files zeroed (never synced), index files deleted."""
    root, shadow_root = Path(root), Path(shadow_root)
    counts = {"reverted": 0, "zeroed": 0, "index_deleted": 0, "tmp_deleted": 0}
    for top in _SHADOWED_DIRS:
        for dirpath, _dirs, files in os.walk(root / top):
            for name in files:
                path = Path(dirpath) / name
                if name.endswith(".tmp"):
                    path.unlink()
                    counts["tmp_deleted"] += 1
                    continue
                size = path.stat().st_size
                shadow = shadow_root / path.relative_to(root)
                fd = os.open(path, os.O_RDWR)
                try:
                    os.ftruncate(fd, 0)
                    os.ftruncate(fd, size)
                    if shadow.exists():
                        sfd = os.open(shadow, os.O_RDONLY)
                        try:
                            for start, end in list(_data_regions(sfd, min(size, os.fstat(sfd).st_size))):
                                os.pwrite(fd, os.pread(sfd, end - start, start), start)
                        finally:
                            os.close(sfd)
                        counts["reverted"] += 1
                    else:
                        counts["zeroed"] += 1
                    os.fsync(fd)
                finally:
                    os.close(fd)
    index_dir = root / "index"
    if index_dir.exists():
        counts["index_deleted"] = sum(1 for _ in index_dir.iterdir())
        shutil.rmtree(index_dir)
    for stray in root.glob(".*.tmp"):
        stray.unlink()
        counts["tmp_deleted"] += 1
    return counts
