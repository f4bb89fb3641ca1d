"""A run of records big enough (store._PWRITE_MIN) is written with one pwrite from the store's
buffer when the CommitLog pre-faults nothing (SYNC_FLUSH), instead of through the mapping: the same
bytes in the CommitLog as through the mapping (ASYNC_FLUSH), readable at once through the mapping,
recovered after a crash, and nothing left behind when the run is refused."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from tidemq.broker.store import store as store_mod
from tidemq.broker.store.config import FlushMode, StoreConfig
from tidemq.broker.store.store import PutStatus

from tests.broker.store import util
from tests.broker.store.util import Clock, open_store, read_queue, req

BODY = bytes(range(256)) * 4  # 1 KiB


def config(root: Path, flush_mode: FlushMode = FlushMode.SYNC, **kw: object) -> StoreConfig:
    """SYNC_FLUSH by default: the CommitLog pre-faults nothing, so runs go through pwrite."""
    return util.config(root, flush_mode=flush_mode, **kw)


def _batch(n: int, first: int = 0, **kw) -> list:
    return [req("Big", 1, BODY, tags=f"Tag{i % 3}", keys=f"k{i}", uniq=f"U{i:08d}", born_timestamp=1000 + i,
                **kw) for i in range(first, first + n)]


def _log(store) -> bytes:
    cl = store._commitlog
    seg = cl.segments[-1]
    return seg.mm[: cl.write_pos - seg.start]


def test_a_big_batch_is_the_same_bytes_as_through_the_mapping(tmp_path):
    """20 x 1 KiB (past _PWRITE_MIN) through pwrite (SYNC_FLUSH), and the same puts through the
    mapping (ASYNC_FLUSH: the CommitLog pre-faults, here not started): byte-identical CommitLogs,
    queues and key lookups."""
    logs = []
    for mode in (FlushMode.SYNC, FlushMode.ASYNC):
        store = open_store(config(tmp_path / mode.name, mode), clock=Clock())
        assert store._commitlog.prefault is (mode is FlushMode.ASYNC)
        first = store.put_batch(_batch(20))
        second = store.put_batch(_batch(20, 20))
        assert (first.status, second.status) == (PutStatus.PUT_OK, PutStatus.PUT_OK)
        assert first.end_offset - first.physical_offset >= store_mod._PWRITE_MIN
        got = read_queue(store, "Big", 1)
        assert [m.properties["UNIQ_KEY"] for m in got] == [f"U{i:08d}" for i in range(40)]
        assert all(m.body == BODY for m in got)
        assert [m.queue_offset for m in got] == list(range(40))
        assert len(store.query_by_key("Big", "k33", 10, 0, 2**62)) == 1
        logs.append(_log(store))
        store.close_abruptly()
    assert logs[0] == logs[1]
    assert len(logs[0]) > 40 * 1024


def test_a_big_batch_is_recovered_after_a_crash(tmp_path):
    cfg = config(tmp_path)
    store = open_store(cfg, clock=Clock())
    assert store.put_batch(_batch(30)).status is PutStatus.PUT_OK
    before = _log(store)
    store.close_abruptly()  # no flush, no checkpoint: recovery re-reads and checks every record
    again = open_store(cfg, clock=Clock())
    assert _log(again) == before
    assert [m.properties["UNIQ_KEY"] for m in read_queue(again, "Big", 1)] == [f"U{i:08d}" for i in range(30)]
    again.close_abruptly()


@pytest.mark.parametrize("bad", [2**63, -(2**63) - 1])
def test_a_big_batch_with_a_header_value_out_of_range_writes_nothing(tmp_path, bad):
    """The 17th message's born timestamp does not fit its i64 field: the batch is refused, the
    write position stays, no byte of the batch is in the log, and the next put takes its place."""
    store = open_store(config(tmp_path), clock=Clock())
    assert store.put_batch(_batch(2)).status is PutStatus.PUT_OK
    end = store.commitlog_max_offset
    batch = _batch(20, 2)
    batch[16].born_timestamp = bad
    r = store.put_batch(batch)
    assert r.status is PutStatus.MESSAGE_ILLEGAL and "out of range" in r.remark
    assert store.commitlog_max_offset == end
    seg = store._commitlog.segments[-1]
    assert seg.mm[end - seg.start: end - seg.start + 20 * 1100] == bytes(20 * 1100)
    assert store.put_batch(_batch(20, 2)).physical_offset == end
    assert [m.properties["UNIQ_KEY"] for m in read_queue(store, "Big", 1)] == [f"U{i:08d}" for i in range(22)]
    store.close_abruptly()


def test_a_failed_write_refuses_the_batch_and_leaves_no_record(tmp_path):
    """pwrite failing (here: the segment's descriptor closed under it, EBADF; ENOSPC and EIO
    take the same path) refuses the batch with SERVICE_NOT_AVAILABLE and leaves the log as it was."""
    store = open_store(config(tmp_path), clock=Clock())
    assert store.put_batch(_batch(2)).status is PutStatus.PUT_OK
    end = store.commitlog_max_offset
    seg = store._commitlog.segments[-1]
    fd = seg._fd
    seg._fd = 10**6  # no such descriptor
    failed: list[OSError] = []
    store.on_write_failed = failed.append  # a replicated master hands mastership over on it
    try:
        r = store.put_batch(_batch(20, 2))
    finally:
        seg._fd = fd
    assert r.status is PutStatus.SERVICE_NOT_AVAILABLE and "cannot write to the commitlog" in r.remark
    assert [e.errno for e in failed] == [errno.EBADF]
    assert store.commitlog_max_offset == end
    assert seg.mm[end - seg.start: end - seg.start + 20 * 1100] == bytes(20 * 1100)
    assert store.put_batch(_batch(20, 2)).status is PutStatus.PUT_OK
    assert len(read_queue(store, "Big", 1)) == 22
    store.close_abruptly()



def test_a_put_that_cannot_make_its_next_segment_is_refused_told_and_taken_once_it_can(tmp_path, monkeypatch):
    """A full disk at a segment's end: the put is refused SERVICE_NOT_AVAILABLE with nothing
    written, ``on_write_failed`` hears the error (a replicated master hands mastership over on
    it), and puts go in again once files can be made."""
    from tidemq.broker.store import commitlog  # noqa: PLC0415

    store = open_store(config(tmp_path), clock=Clock())
    failed: list[OSError] = []
    store.on_write_failed = failed.append

    def full(*_args, **_kwargs):  # noqa: ANN002, ANN003, ANN202
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(commitlog.MappedFile, "create", full)
    n = 0
    while (r := store.put_batch(_batch(4, n))).status is PutStatus.PUT_OK:
        n += 4
        assert n < 1000, "no new segment was ever needed"
    assert r.status is PutStatus.SERVICE_NOT_AVAILABLE and "cannot create a store file" in r.remark
    assert [e.errno for e in failed] == [errno.ENOSPC]
    end = store.commitlog_max_offset
    assert store.put_batch(_batch(4, n)).status is PutStatus.SERVICE_NOT_AVAILABLE
    assert store.commitlog_max_offset == end and len(failed) == 2
    monkeypatch.undo()
    assert store.put_batch(_batch(4, n)).status is PutStatus.PUT_OK
    assert len(read_queue(store, "Big", 1)) == n + 4
    store.close_abruptly()


class _Watched:
    """A segment's mapping that records every store into it (and still makes it)."""

    def __init__(self, mm) -> None:  # noqa: ANN001
        self.mm, self.stores = mm, []

    def __getitem__(self, key):  # noqa: ANN001, ANN204
        return self.mm[key]

    def __setitem__(self, key, value) -> None:  # noqa: ANN001
        self.stores.append(key)
        self.mm[key] = value

    def __len__(self) -> int:
        return len(self.mm)


def test_a_write_cut_by_a_full_disk_zeroes_what_it_wrote_without_touching_the_mapping(tmp_path, monkeypatch):
    """ENOSPC after part of a run went in: the part written is zeroed again through the descriptor
    (its blocks are allocated) and nothing is stored through the mapping, where the pages past it
    may be unallocated on a sparse segment with the disk full: a store there would be SIGBUS.
    Before the fix the store zeroed the whole run through the mapping."""
    store = open_store(config(tmp_path), clock=Clock())
    assert store.put_batch(_batch(2)).status is PutStatus.PUT_OK
    end = store.commitlog_max_offset
    seg = store._commitlog.segments[-1]
    from tidemq.broker.store import mapped_file  # noqa: PLC0415

    real = mapped_file.os.pwrite
    calls: list[tuple[int, int]] = []

    def cut(fd: int, data, pos: int) -> int:  # noqa: ANN001
        calls.append((pos, len(data)))
        if len(calls) == 1:
            return real(fd, bytes(memoryview(data)[:5000]), pos)  # part of the run goes in
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(fd, data, pos)  # the zeroing of what went in

    monkeypatch.setattr(mapped_file.os, "pwrite", cut)
    seg.mm = watched = _Watched(seg.mm)
    try:
        r = store.put_batch(_batch(20, 2))
    finally:
        seg.mm = watched.mm
        monkeypatch.setattr(mapped_file.os, "pwrite", real)
    assert r.status is PutStatus.SERVICE_NOT_AVAILABLE and "No space left" in r.remark
    assert watched.stores == []
    assert calls[2] == (end - seg.start, 5000)  # exactly what went in is zeroed
    assert store.commitlog_max_offset == end
    assert seg.mm[end - seg.start: end - seg.start + 20 * 1100] == bytes(20 * 1100)
    assert store.put_batch(_batch(20, 2)).status is PutStatus.PUT_OK
    assert len(read_queue(store, "Big", 1)) == 22
    store.close_abruptly()
