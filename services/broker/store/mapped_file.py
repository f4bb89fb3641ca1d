"""One fixed-size file mapped into memory (the unit of CommitLog, ConsumeQueue and IndexFile).

``StoreFile`` holds what every kind shares (flush, close, destroy); ``MappedFile`` is mapped from
construction to close (CommitLog segments, index files), ``LazyMappedFile`` only on demand.

Invariants:
- The file has exactly ``size`` bytes from creation on (sparse or preallocated); it is created
  under a temporary name and renamed, so a crash never leaves a short file under its real name.
- The event-loop thread only copies memory in and out of ``mm`` (slice assignment, pack_into,
  slicing, which copies just the slice). ``flush`` (fdatasync; it releases the GIL, unlike
  ``mmap.flush``) and ``close``/``destroy`` run on store worker threads, serialised by a lock.
- Callers detach a file from every lookup structure on the loop thread before closing it in a
  worker thread, so no loop code can touch a closed mapping.
- ``MappedFile.prefault`` (a worker thread faulting pages in ahead of the writer) holds the file's
  lock like ``flush`` and ``close``, so it never touches a range that was unmapped.
- A file may be mapped lazily (``LazyMappedFile``: consume-queue files, of which a store can hold
  hundreds of thousands). Its ``mm`` is None while unmapped; ``map``/``unmap`` run on the loop
  thread only, through a ``MappedFileCache`` that bounds how many such files are mapped at once.
  Unmapping loses nothing: pages written through the mapping stay dirty in the page cache and
  ``flush`` (fdatasync through a descriptor, never msync) still makes them durable.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import mmap
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path

from tidemq.broker.store.observer import StoreObserver

log = logging.getLogger(__name__)

_ZERO_CHUNK = bytes(1 << 16)
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})

_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux only; elsewhere pages fault on first write
# CPython's mmap keeps a dup() of the file's descriptor for as long as the mapping lives, unless it
# is made with trackfd=False (3.13+): below that, every mapped file costs an open descriptor.
MAPPING_HOLDS_FD = sys.version_info < (3, 13)
_UNTRACKED: dict[str, bool] = {} if MAPPING_HOLDS_FD else {"trackfd": False}

# madvise(2) advice that faults a range in writable, as a write to each page would, without
# changing a byte (Linux >= 5.14; older kernels answer EINVAL). mmap.madvise holds the GIL through
# the call; a ctypes foreign call releases it, so the loop runs while a worker takes the faults.
MADV_POPULATE_WRITE = 23


def _libc_madvise() -> Callable[[int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_madvise = _libc_madvise()


def create_file(path: Path, size: int, preallocate: bool = False, sync_dir: bool = True,
                observer: StoreObserver | None = None) -> None:
    """Create ``path`` with ``size`` zero bytes, atomically (temp name + rename). Blocking.
    ``sync_dir=False`` leaves the directory fsync to the caller (files created on the loop).
    ``observer`` (used for testing) is told of the new file."""
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
    if observer is not None:
        observer.file_created(path)
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


class StoreFile:
    """A fixed-size store file and its mapping: what both kinds share (flush, close, delete).
    The name is the 20-digit start offset it covers (or any name). ``mm`` is typed by the kind:
    always mapped (``MappedFile``) or mapped on demand (``LazyMappedFile``)."""

    __slots__ = ("path", "size", "start", "mm", "dirty", "observer", "_fd", "_lock", "_closed", "__weakref__")

    def __init__(self, path: Path, size: int, start: int, observer: StoreObserver | None) -> None:
        self.path = path
        self.observer = observer  # used for testing: told after each ``flush`` what reached the disk
        self.size = size
        self.start = start
        self.dirty = False
        self._lock = threading.Lock()
        self._closed = False
        self.mm: mmap.mmap | None = None
        self._fd: int | None = None

    @property
    def end(self) -> int:
        return self.start + self.size

    @property
    def closed(self) -> bool:
        return self._closed

    def zero_from(self, pos: int, end: int | None = None) -> int:
        """Zero [pos, end) but only the 64 KiB chunks that are not zero already (keeps sparse
        files sparse). Returns how many non-zero chunks were rewritten. Blocking (recovery only)."""
        mm = self.mm
        if mm is None:
            raise ValueError(f"{self.path} is not mapped; map it (MappedFileCache.open) before zeroing")
        end = self.size if end is None else end
        rewritten = 0
        p = pos
        while p < end:
            q = min(end, (p // len(_ZERO_CHUNK) + 1) * len(_ZERO_CHUNK))
            n = q - p
            if mm[p:q] != _ZERO_CHUNK[:n]:
                mm[p:q] = _ZERO_CHUNK[:n]
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
            if self.observer is not None:
                self._report_sync(self.observer)

    def _report_sync(self, observer: StoreObserver) -> None:
        """Testing: hand the observer (the power-loss shadow, faults.py) what was just synced. It
        reads the content through ``mm`` on this worker thread, while the loop may unmap a lazy
        file's ``mm`` at any moment (cache eviction): it gets a twin with a private read-only
        mapping."""
        try:
            twin = MappedFile(self.path, self.size, self.start, writable=False)
        except FileNotFoundError:
            return
        try:
            observer.file_synced(twin)
        finally:
            twin.close()

    def close(self) -> None:
        """Unmap and close. Blocking: worker thread, after the file was detached on the loop."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self.mm is not None:
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
        return f"{type(self).__name__}({self.path.name}, start={self.start}, size={self.size})"


class MappedFile(StoreFile):
    """A store file mapped from construction until ``close`` (CommitLog segments, index files)."""

    __slots__ = ("_base",)
    mm: mmap.mmap  # mapped for the file's whole life: its users index it without a check

    def __init__(self, path: Path, size: int, start: int, keep_fd: bool = False,
                 populate: bool = False, observer: StoreObserver | None = None,
                 writable: bool = True) -> None:
        """Map an existing file. With ``keep_fd`` the descriptor stays open for cheap flushes.

        ``populate`` pre-faults the whole mapping (MAP_POPULATE; the mmap call releases the GIL):
        for segments created by a worker thread ahead of use, so the loop's first write to each
        page does not take a page fault (bench: 2.3 -> 0.35 us per 1 KiB record).

        ``writable=False`` maps the file read-only (the observer's twin, ``_report_sync``).
        ``observer`` (used for testing) is told after each ``flush`` what reached the disk."""
        super().__init__(path, size, start, observer)
        fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        try:
            actual = os.fstat(fd).st_size
            if actual != size:
                raise ValueError(f"{path} is {actual} bytes, expected {size}")
            flags = mmap.MAP_SHARED | (_POPULATE if populate else 0)
            prot = mmap.PROT_READ | mmap.PROT_WRITE if writable else mmap.PROT_READ
            self.mm = mmap.mmap(fd, size, flags, prot)
        except BaseException:
            os.close(fd)
            raise
        # The mapping's address, for prefault (a mapping never moves: no resize). Taking it
        # exports the buffer; the export ends with the temporary, so close() is not refused.
        self._base = ctypes.addressof(ctypes.c_char.from_buffer(self.mm)) if writable else 0
        if keep_fd:
            self._fd = fd
        else:
            os.close(fd)

    @classmethod
    def create(cls, path: Path, size: int, start: int, keep_fd: bool = False,
               preallocate: bool = False, sync_dir: bool = True, populate: bool = False,
               observer: StoreObserver | None = None) -> "MappedFile":
        create_file(path, size, preallocate, sync_dir, observer)
        return cls(path, size, start, keep_fd, populate, observer)

    def write(self, pos: int, data: bytes) -> None:
        self.mm[pos : pos + len(data)] = data
        self.dirty = True

    def pwrite(self, pos: int, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` at ``pos`` through the descriptor (the mapping shares its page cache, so
        it sees the bytes at once); for files that keep it (``keep_fd``: CommitLog segments).
        Raises OSError (ENOSPC, EIO) where a write through the mapping would SIGBUS; the bytes a
        cut write did put in are zeroed again first (through the descriptor: their blocks are
        allocated, so this takes no space), and the rest of the range is left untouched: on a
        sparse segment with the disk full, a zeroing store into the mapping there would SIGBUS."""
        fd = self._fd
        if fd is None:
            raise ValueError(f"{self.path} keeps no descriptor to write through (map it with keep_fd=True)")
        with memoryview(data) as view:
            done = 0
            try:
                while done < len(view):  # a regular file writes all at once unless an error cuts it
                    done += os.pwrite(fd, view[done:], pos + done)
            except OSError:
                if done:
                    self.dirty = True
                    try:  # no valid record may remain past the write position
                        os.pwrite(fd, bytes(done), pos)
                    except OSError as exc:
                        log.error("cannot zero the %d bytes a cut write left in %s: %s", done, self.path, exc)
                raise
        self.dirty = True

    def read(self, pos: int, n: int) -> bytes:
        return self.mm[pos : pos + n]

    def prefault(self, pos: int, length: int) -> int:
        """Fault the pages of [pos, pos + length) in, writable, without changing a byte
        (MADV_POPULATE_WRITE): the worker calling this takes the page faults -- page allocation,
        zeroing, the filesystem's block mapping -- that the loop's first write into each fresh
        page would take, and wait in while a flush writes the file back (bench/latency_probe.py:
        row 5's tail). The pages become dirty, so a flush may write their zeros once.

        Blocking: worker thread (the call releases the GIL). Holds the file's lock, so it runs
        between flushes and never after ``close``. Returns 0, or the errno of a kernel or
        platform that cannot (EINVAL before Linux 5.14, ENOSYS without madvise)."""
        if _madvise is None or not self._base:
            return errno.ENOSYS
        page = mmap.PAGESIZE
        start = max(0, pos) // page * page
        end = min(self.size, -(-(pos + length) // page) * page)
        if start >= end:
            return 0
        with self._lock:
            if self._closed:
                return 0
            if _madvise(self._base + start, end - start, MADV_POPULATE_WRITE) != 0:
                return ctypes.get_errno()
        return 0


class LazyMappedFile(StoreFile):
    """A store file mapped only while in a ``MappedFileCache`` (consume-queue files, of which a
    store can hold hundreds of thousands): ``mm`` is None while unmapped. Construction opens
    nothing (the caller checked the size)."""

    __slots__ = ()

    def __init__(self, path: Path, size: int, start: int, observer: StoreObserver | None = None) -> None:
        super().__init__(path, size, start, observer)

    @classmethod
    def create(cls, path: Path, size: int, start: int, sync_dir: bool = True,
               observer: StoreObserver | None = None) -> "LazyMappedFile":
        create_file(path, size, False, sync_dir, observer)
        return cls(path, size, start, observer)

    def map(self) -> mmap.mmap:
        """Map the file (loop thread; callers go through ``MappedFileCache.open``). An open,
        an mmap and a close of an existing file: a few syscalls, like the creation of a consume
        queue file, which also happens on the loop. Without trackfd (Python < 3.13) the mapping
        holds a descriptor until ``unmap``."""
        if self._closed:
            raise ValueError(f"{self.path} was closed; it cannot be mapped again")
        mm = self.mm
        if mm is None:
            fd = os.open(self.path, os.O_RDWR)
            try:
                mm = mmap.mmap(fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, **_UNTRACKED)
            finally:
                os.close(fd)
            self.mm = mm
        return mm

    def unmap(self) -> None:
        """Drop the mapping but keep the file (loop thread: ``MappedFileCache`` eviction).

        No flush is needed first, and none is done: munmap hands the mapping's dirty pages to
        the page cache, where ``flush`` (fdatasync through a descriptor) finds them, so a dirty
        file stays in the store's dirty set and the next logics flush makes it durable. ``flush``
        never touches ``mm``, so this needs no lock. Readers copy out of ``mm`` (slices,
        unpack_from) and hold no view across calls, so nothing still points into the mapping."""
        mm, self.mm = self.mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:  # a view is still held; the mapping goes with it
                log.warning("%s is still referenced; it is unmapped when the last view goes", self.path)


class MappedFileCache:
    """At most ``limit`` lazy files mapped at once; the least recently used is unmapped first.

    Loop thread only. Invariant: a file is in the cache iff its ``mm`` is not None, so a user
    checks ``f.mm`` and either calls ``open(f)`` (map, after evicting to make room) or marks it
    used with ``lru.move_to_end(f)`` -- one dict lookup and relink, the whole cost on the hot
    path (bench/produce_consume.py). Files detached from their owner are ``forget``-ed on the
    loop before a worker closes them, so eviction never touches a closed file. The file being
    opened is never the one evicted, and users read each file right after ``open`` returns it
    (slices and unpack_from copy), so eviction never pulls a mapping from under a reader.
    """

    __slots__ = ("limit", "lru", "peak", "maps", "unmaps")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a mapped-file cache holds at least one file, not {limit}")
        self.limit = limit
        self.lru: OrderedDict[LazyMappedFile, None] = OrderedDict()  # oldest first
        self.peak = 0  # most files mapped at once
        self.maps = 0
        self.unmaps = 0  # evictions

    def __len__(self) -> int:
        return len(self.lru)

    def open(self, f: LazyMappedFile) -> mmap.mmap:
        """``f``'s mapping, mapping it (and unmapping the least recently used) when it has none."""
        if f.mm is not None:
            self.lru.move_to_end(f)
            return f.mm
        lru = self.lru
        while len(lru) >= self.limit:  # make room first: the descriptor and mapping are free again
            old, _ = lru.popitem(last=False)
            old.unmap()
            self.unmaps += 1
        mm = f.map()
        lru[f] = None
        self.maps += 1
        if len(lru) > self.peak:
            self.peak = len(lru)
        return mm

    def forget(self, files: Iterable[LazyMappedFile]) -> None:
        """Stop tracking detached files (their owner closes them, usually in a worker thread)."""
        pop = self.lru.pop
        for f in files:
            pop(f, None)

    def clear(self) -> None:
        self.lru.clear()
