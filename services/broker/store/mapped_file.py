"""One fixed-size file mapped into memory (the unit of CommitLog, ConsumeQueue and IndexFile).

Invariants:
- The file has exactly ``size`` bytes from creation on (sparse or preallocated); it is created
  under a temporary name and renamed, so a crash never leaves a short file under its real name.
- The event-loop thread only copies memory in and out of ``mm`` (slice assignment, pack_into,
  slicing, which copies just the slice). ``flush`` (fdatasync; it releases the GIL, unlike
  ``mmap.flush``) and ``close``/``destroy`` run on store worker threads, serialised by a lock.
- Callers detach a file from every lookup structure on the loop thread before closing it in a
  worker thread, so no loop code can touch a closed mapping.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

_ZERO_CHUNK = bytes(1 << 16)
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})

# TEST-ONLY fault-injection hooks (tidemq.broker.store.faults, enabled through
# StoreConfig.power_loss_shadow): told when a file is created and after it was fdatasynced.
_on_create: Callable[[Path], None] | None = None
_on_sync: Callable[["MappedFile"], None] | None = None


def set_sync_hooks(on_create: Callable[[Path], None] | None,
                   on_sync: Callable[["MappedFile"], None] | None) -> None:
    global _on_create, _on_sync
    _on_create, _on_sync = on_create, on_sync


_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux only; elsewhere pages fault on first write


def create_file(path: Path, size: int, preallocate: bool = False, sync_dir: bool = True) -> None:
    """Create ``path`` with ``size`` zero bytes, atomically (temp name + rename). Blocking.
    ``sync_dir=False`` leaves the directory fsync to the caller (files created on the loop)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, size)
            if preallocate and hasattr(os, "posix_fallocate"):
                # Reserve the blocks so writes through the mapping cannot hit ENOSPC (SIGBUS).
                try:
                    os.posix_fallocate(fd, 0, size)
                except OSError as exc:
                    if exc.errno in _NO_SPACE:  # a sparse file here would SIGBUS on a later write
                        raise
                    log.debug("posix_fallocate of %s failed (%s); keeping a sparse file", tmp, exc)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if exc.filename is None:  # name the file in the error the client sees
            raise OSError(exc.errno, f"{exc.strerror} (creating a {size}-byte store file)", str(path)) from None
        raise
    if _on_create is not None:
        _on_create(path)
    if sync_dir:
        fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        log.warning("cannot open directory %s to fsync it: %s", path, exc)
        return
    try:
        os.fsync(fd)
    except OSError as exc:  # some filesystems refuse fsync on directories
        log.debug("fsync of directory %s failed: %s", path, exc)
    finally:
        os.close(fd)


class MappedFile:
    """A mapped file whose name is the 20-digit start offset (or any name) it covers."""

    __slots__ = ("path", "size", "start", "mm", "dirty", "_fd", "_lock", "_closed", "__weakref__")

    def __init__(self, path: Path, size: int, start: int, keep_fd: bool = False,
                 populate: bool = False) -> None:
        """Map an existing file. With ``keep_fd`` the descriptor stays open for cheap flushes.

        ``populate`` pre-faults the whole mapping (MAP_POPULATE; the mmap call releases the GIL):
        for segments created by a worker thread ahead of use, so the loop's first write to each
        page does not take a page fault (bench: 2.3 -> 0.35 us per 1 KiB record)."""
        self.path = path
        self.size = size
        self.start = start
        self.dirty = False
        self._lock = threading.Lock()
        self._closed = False
        fd = os.open(path, os.O_RDWR)
        try:
            actual = os.fstat(fd).st_size
            if actual != size:
                raise ValueError(f"{path} is {actual} bytes, expected {size}")
            flags = mmap.MAP_SHARED | (_POPULATE if populate else 0)
            self.mm = mmap.mmap(fd, size, flags, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        if keep_fd:
            self._fd: int | None = fd
        else:
            os.close(fd)
            self._fd = None

    @classmethod
    def create(cls, path: Path, size: int, start: int, keep_fd: bool = False,
               preallocate: bool = False, sync_dir: bool = True, populate: bool = False) -> "MappedFile":
        create_file(path, size, preallocate, sync_dir)
        return cls(path, size, start, keep_fd, populate)

    @property
    def end(self) -> int:
        return self.start + self.size

    @property
    def closed(self) -> bool:
        return self._closed

    def write(self, pos: int, data: bytes) -> None:
        self.mm[pos : pos + len(data)] = data
        self.dirty = True

    def read(self, pos: int, n: int) -> bytes:
        return self.mm[pos : pos + n]

    def zero_from(self, pos: int, end: int | None = None) -> int:
        """Zero [pos, end) but only the 64 KiB chunks that are not zero already (keeps sparse
        files sparse). Returns how many non-zero chunks were rewritten. Blocking (recovery only)."""
        end = self.size if end is None else end
        rewritten = 0
        p = pos
        while p < end:
            q = min(end, (p // len(_ZERO_CHUNK) + 1) * len(_ZERO_CHUNK))
            n = q - p
            if self.mm[p:q] != _ZERO_CHUNK[:n]:
                self.mm[p:q] = _ZERO_CHUNK[:n]
                rewritten += 1
            p = q
        if rewritten:
            self.dirty = True
        return rewritten

    def flush(self) -> None:
        """fdatasync the file (covers pages dirtied through the mapping). Blocking: worker thread."""
        with self._lock:
            if self._closed:
                return
            self.dirty = False
            if self._fd is not None:
                os.fdatasync(self._fd)
            else:
                try:
                    fd = os.open(self.path, os.O_RDONLY)
                except FileNotFoundError:
                    return
                try:
                    os.fdatasync(fd)
                finally:
                    os.close(fd)
            if _on_sync is not None:
                _on_sync(self)

    def close(self) -> None:
        """Unmap and close. Blocking: worker thread, after the file was detached on the loop."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self.mm.close()
            except BufferError:  # a reader still holds a view; the mapping goes with it
                log.warning("%s is still referenced; it is unmapped when the last view goes", self.path)
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def destroy(self) -> None:
        """Close and delete the file."""
        self.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def __repr__(self) -> str:
        return f"MappedFile({self.path.name}, start={self.start}, size={self.size})"
