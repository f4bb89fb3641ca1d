"""CommitLog pre-faulting: a worker thread faults the pages ahead of the write position in, so the
writer's first touch of each fresh page takes no page fault (issue 19, compare.py row 5's tail)."""

from __future__ import annotations

import concurrent.futures
import errno
import os
import resource
import sys
import threading

import pytest

from tidemq.broker.store.commitlog import PREFAULT_AHEAD, CommitLog
from tidemq.broker.store.config import FlushMode
from tidemq.broker.store.mapped_file import MappedFile

from tests.broker.store.util import config, open_store, req

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise pre-faulting is Linux only")

SEGMENT = 8 << 20
RECORD = os.urandom(1024)


def _thread_minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def _prefault_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("tidemq-commitlog-prefault")}


def _can_prefault(tmp_path) -> None:
    mf = MappedFile.create(tmp_path / "probe", 1 << 16, 0, keep_fd=True, preallocate=True)
    try:
        err = mf.prefault(0, 1 << 16)
    finally:
        mf.close()
    if err:
        pytest.skip(f"this kernel cannot pre-fault ({os.strerror(err)}; needs Linux >= 5.14)")


def _write(cl: CommitLog, n: int, barrier: concurrent.futures.Executor | None) -> int:
    """Append ``n`` 1 KiB records through the mapping; the writing thread's minor page faults."""
    faults = 0
    for _ in range(n):
        seg, rel = cl.reserve(len(RECORD))
        before = _thread_minor_faults()
        seg.mm[rel:rel + len(RECORD)] = RECORD
        faults += _thread_minor_faults() - before
        cl.commit(len(RECORD))
        if barrier is not None:  # the test's single prefault thread has done what commit asked
            barrier.submit(lambda: None).result()
    return faults


def _commitlog(path, prefaulter: concurrent.futures.Executor | None) -> tuple[CommitLog, concurrent.futures.Executor]:
    cl = CommitLog(path, SEGMENT)
    cl.open_segments()
    cl.ensure_active(0)
    io = concurrent.futures.ThreadPoolExecutor(1)
    if prefaulter is not None:
        cl.start_preallocation(io, prefaulter)
    return cl, io


def test_writes_into_prefaulted_pages_take_no_page_faults(tmp_path):
    _can_prefault(tmp_path)
    prefaulter = concurrent.futures.ThreadPoolExecutor(1)
    cl, io = _commitlog(tmp_path / "on", prefaulter)
    plain, io2 = _commitlog(tmp_path / "off", None)
    try:
        n = 3 * PREFAULT_AHEAD // len(RECORD)  # past the first window: the later asks keep up
        with_prefault = _write(cl, n, prefaulter)
        without = _write(plain, n, None)
    finally:
        cl.close()
        plain.close()
        for ex in (prefaulter, io, io2):
            ex.shutdown()
    pages = n * len(RECORD) // 4096
    assert without >= pages // 2  # the plain writer faults (about) every fresh page itself
    assert with_prefault <= pages // 20, (with_prefault, without)


def test_prefault_changes_no_byte_and_stops_at_close(tmp_path):
    _can_prefault(tmp_path)
    mf = MappedFile.create(tmp_path / "seg", 1 << 20, 0, keep_fd=True, preallocate=True)
    data = os.urandom(10_000)
    mf.write(5000, data)
    assert mf.prefault(3, 300_000) == 0  # unaligned bounds are widened to whole pages
    assert mf.mm[5000:15000] == data and mf.mm[:5000] == bytes(5000) and mf.mm[15000:400_000] == bytes(385_000)
    mf.close()
    assert mf.prefault(0, 4096) == 0  # a closed file is left alone (its range may be mapped anew)


def test_a_read_only_mapping_is_never_prefaulted(tmp_path):
    MappedFile.create(tmp_path / "seg", 1 << 16, 0).close()
    ro = MappedFile(tmp_path / "seg", 1 << 16, 0, writable=False)
    try:
        assert ro.prefault(0, 4096) == errno.ENOSYS
    finally:
        ro.close()


def test_the_commitlog_ends_its_prefault_thread_at_close(tmp_path):
    _can_prefault(tmp_path)
    cl = CommitLog(tmp_path, SEGMENT)
    cl.open_segments()
    cl.ensure_active(0)
    io = concurrent.futures.ThreadPoolExecutor(1)
    before = _prefault_threads()
    cl.start_preallocation(io)
    _write(cl, 200, None)
    assert _prefault_threads() - before
    cl.close()
    io.shutdown()
    assert not _prefault_threads() - before


@pytest.mark.parametrize("mode", [FlushMode.ASYNC, FlushMode.SYNC])
async def test_only_an_async_flush_store_prefaults(tmp_path, mode):
    """SYNC_FLUSH rounds follow the writes within a millisecond: zeros dirtied ahead would be
    written by the next round, then the data over them again."""
    before = _prefault_threads()
    store = open_store(config(tmp_path, flush_mode=mode))
    await store.start()
    try:
        assert store.put(req(body=b"x" * 1000)).ok
        assert bool(_prefault_threads() - before) is (mode is FlushMode.ASYNC)
    finally:
        await store.shutdown()
    assert not _prefault_threads() - before
