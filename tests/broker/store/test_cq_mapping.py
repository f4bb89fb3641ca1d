"""Consume-queue files are mapped lazily, at most ``max_mapped_queue_files`` at once (LRU).

Unit tests of MappedFileCache and of ConsumeQueue / QueueTable / MessageStore over a tiny cache:
eviction order, remapping on touch, dirty files that stay durable once unmapped, load and
retention that map only what they must, and the descriptor-fitted bound.
"""

from __future__ import annotations

import os

import pytest

from tidemq.errors import ConfigError
from tidemq.message import decode_record

from tidemq.broker.store import faults, queues as queues_mod
from tidemq.broker.store.consume_queue import UNIT, UNIT_SIZE, ConsumeQueue
from tidemq.broker.store.mapped_file import LazyMappedFile, MappedFileCache, StoreFile, create_file
from tidemq.broker.store.queues import QueueTable, fd_fitted_limit
from tests.broker.store.util import config, open_store, read_queue, req


def _lazy_files(tmp_path, n: int, size: int = 4096) -> list[LazyMappedFile]:
    out = []
    for i in range(n):
        path = tmp_path / f"{i:020d}"
        create_file(path, size, sync_dir=False)
        out.append(LazyMappedFile(path, size, i * size))
    return out


def _cqs(tmp_path, n: int, limit: int, dirty=None) -> tuple[list[ConsumeQueue], MappedFileCache]:
    cache = MappedFileCache(limit)
    dirty = dirty if dirty is not None else set()
    return [ConsumeQueue(tmp_path, f"T{i}", 0, 8, dirty, mapped=cache) for i in range(n)], cache


def test_cache_unmaps_the_least_recently_used_file_first(tmp_path):
    a, b, c, d = _lazy_files(tmp_path, 4)
    cache = MappedFileCache(2)
    assert a.mm is None  # lazy: nothing mapped, no descriptor held
    cache.open(a)
    cache.open(b)
    cache.open(a)  # a is now the most recently used
    cache.open(c)
    assert b.mm is None and a.mm is not None and c.mm is not None
    assert list(cache.lru) == [a, c]
    cache.lru.move_to_end(a)  # what a put or pull on a mapped file does
    cache.open(d)
    assert c.mm is None and list(cache.lru) == [a, d]
    assert (cache.maps, cache.unmaps, cache.peak, len(cache)) == (4, 2, 2, 2)
    cache.forget([a])  # detached by its owner: the cache lets go, the owner closes it
    assert list(cache.lru) == [d] and a.mm is not None
    for f in (a, b, c, d):
        f.close()


def test_a_closed_file_is_never_mapped_again(tmp_path):
    (f,) = _lazy_files(tmp_path, 1)
    f.close()  # an unmapped lazy file closes too (retention, delete_topic)
    with pytest.raises(ValueError):
        MappedFileCache(2).open(f)


def test_reading_an_evicted_file_maps_it_again(tmp_path):
    (q0, q1, q2), cache = _cqs(tmp_path, 3, limit=2)
    for i, cq in enumerate((q0, q1, q2)):
        for q in range(3):
            cq.put(q, 1000 * i + q * 100, 100, i)
    f0 = q0.files[0]
    assert f0.mm is None and len(cache) == 2  # evicted by q2's first file
    maps = cache.maps
    assert q0.unit(1) == (100, 100, 0)  # mapped again on touch
    assert f0.mm is not None and cache.maps == maps + 1
    assert q1.files[0].mm is None  # ...which evicted the least recently used one
    assert [u[0] for u in q1.units(0, 10)] == [1000, 1100, 1200]
    assert cache.peak == 2


def test_puts_on_a_mapped_tail_only_move_it_to_the_end(tmp_path):
    (q0, q1), cache = _cqs(tmp_path, 2, limit=2)
    q0.put(0, 0, 100, 0)
    q1.put(0, 100, 100, 0)
    maps = cache.maps
    for q in range(1, 8):  # the hot path: no map, no unmap while the files stay mapped
        q0.put(q, q * 1000, 100, 0)
        q1.put(q, q * 1000 + 100, 100, 0)
    assert (cache.maps, cache.unmaps) == (maps, 0)
    assert list(cache.lru) == [q0.files[0], q1.files[0]]


def test_an_evicted_dirty_file_stays_registered_and_its_units_are_in_the_file(tmp_path):
    dirty: set[StoreFile] = set()
    (q0, q1, q2), cache = _cqs(tmp_path, 3, limit=2, dirty=dirty)
    q0.put(0, 4242, 91, 7)
    for cq in (q1, q2):
        cq.put(0, 0, 91, 0)
    f0 = q0.files[0]
    assert f0.mm is None and f0.dirty and f0 in dirty  # unmapped without a flush on the loop
    # munmap handed the dirty page to the page cache: the file holds the unit...
    with open(f0.path, "rb") as fh:
        assert UNIT.unpack(fh.read(UNIT_SIZE)) == (4242, 91, 7)
    f0.flush()  # ...and the logics flush makes it durable by path (fdatasync), mapped or not
    assert not f0.dirty and f0.mm is None
    again = ConsumeQueue(tmp_path, "T0", 0, 8, set())
    again.load()
    assert (again.min_offset, again.max_offset, again.unit(0)) == (0, 1, (4242, 91, 7))


@pytest.mark.timeout(20, func_only=True)
async def test_units_of_evicted_files_survive_a_power_cut_after_the_logics_flush(tmp_path, caplog):
    """ASYNC mode: every unit written before a checkpoint is on disk, though its file was unmapped."""
    shadow = tmp_path / "shadow"
    cfg = config(tmp_path / "store", max_mapped_queue_files=2, consume_queue_units_per_file=4)
    store = open_store(cfg, observer=faults.DurableShadow(cfg.root, shadow))
    try:
        await store.start()
        for i in range(12):  # 12 queues of 3 files each, through a 2-file cache
            for _ in range(10):
                assert store.put(req(topic=f"T{i}", body=f"m{i}".encode())).ok
        st = store.stats()
        assert st["cq_files_mapped"] <= 2 and st["cq_files_mapped_peak"] == 2 and st["cq_file_unmaps"] > 30
        await store.flush()  # CommitLog fdatasync + logics flush (every dirty CQ file) + checkpoint
    finally:
        store.close_abruptly()  # a crash: no shutdown flush
    counts = faults.power_loss(cfg.root, shadow)  # only what an fdatasync covered survives
    assert counts["reverted"] >= 36  # the 36 consume-queue files among them
    caplog.clear()
    again = open_store(cfg)
    # Recovery checks every unit the checkpoint vouched for; a lost one would rebuild its queue.
    assert "damaged" not in caplog.text and "rebuilt" not in caplog.text
    for i in range(12):
        assert [m.body for m in read_queue(again, f"T{i}", 0)] == [f"m{i}".encode()] * 10
    assert again.stats()["cq_files_mapped_peak"] <= 2
    again.close_abruptly()


def test_load_maps_only_first_and_last_files_within_the_bound(tmp_path):
    (q0, q1, q2, q3), _ = _cqs(tmp_path, 4, limit=64)
    for i, cq in enumerate((q0, q1, q2, q3)):
        for q in range(3, 30):  # four files each, the first starting late
            cq.put(q, i * 10_000 + q * 100, 100, 0)
    table = QueueTable(tmp_path, 8, set(), set(), max_mapped=3)
    assert table.load_all(has_data=True) is False
    assert len(table) == 4 and table.mapped.peak <= 3 and len(table.mapped) == 3
    assert table.mapped.maps == 8  # first and last file of each queue, nothing else
    for i in range(4):
        cq = table.get(f"T{i}", 0)
        assert (cq.min_offset, cq.max_offset) == (3, 30)
        assert cq.unit(17) == (i * 10_000 + 1700, 100, 0)
    assert table.mapped.peak <= 3
    table.close()
    assert len(table.mapped) == 0


def test_retention_leaves_queues_it_does_not_touch_unmapped(tmp_path):
    (old, new), cache = _cqs(tmp_path, 2, limit=2)
    for q in range(20):  # three files, records at 0..1900
        old.put(q, q * 100, 100, 0)
    for q in range(3):
        new.put(q, 10_000 + q * 100, 100, 0)
    head = new.files[0]
    cache.open(old.files[-1]), cache.open(old.files[1])  # push new's file out
    assert head.mm is None
    maps = cache.maps
    assert new.detach_below(1000) == [] and head.mm is None and cache.maps == maps  # untouched
    gone = old.detach_below(1000)  # records below 1000 are gone: the first file goes
    assert [f.start for f in gone] == [0] and old.min_offset == 10 and old.unit(10) == (1000, 100, 0)
    assert not any(f in cache.lru for f in gone)  # detached files leave the cache before they close
    for f in gone:
        f.destroy()


def test_the_bound_is_fitted_under_the_open_file_limit(monkeypatch):
    monkeypatch.setattr(queues_mod, "MAPPING_HOLDS_FD", True)
    assert fd_fitted_limit(2048, None) == (2048, None)
    assert fd_fitted_limit(2048, 1 << 20) == (2048, None)
    limit, why = fd_fitted_limit(2048, 1024)
    assert limit == 256 and "open-file limit is 1024" in why
    assert fd_fitted_limit(2048, 20)[0] == 16  # never below 16
    monkeypatch.setattr(queues_mod, "MAPPING_HOLDS_FD", False)  # trackfd=False: no descriptor held
    assert fd_fitted_limit(2048, 1024) == (2048, None)


def test_the_bound_must_allow_a_batch_spanning_two_files(tmp_path):
    with pytest.raises(ConfigError):
        config(tmp_path, max_mapped_queue_files=1)


def test_a_batch_spanning_more_files_than_the_bound_is_stored_whole(tmp_path):
    store = open_store(config(tmp_path, max_mapped_queue_files=2, consume_queue_units_per_file=2))
    assert store.put(req(topic="A")).ok
    r = store.put_batch([req(topic="T", body=bytes([i])) for i in range(7)])  # four files
    assert r.ok and r.queue_offset == 0
    assert [m.body for m in read_queue(store, "T", 0)] == [bytes([i]) for i in range(7)]
    assert [decode_record(x).queue_offset for x in store.get_messages("T", 0, 5, 8, None).records] == [5]
    assert store.stats()["cq_files_mapped_peak"] == 2
    store.close_abruptly()


def test_fresh_files_are_created_unmapped_elsewhere(tmp_path):
    """A new queue file is mapped once, through the cache; no stray descriptors are left."""
    store = open_store(config(tmp_path, max_mapped_queue_files=4))
    fds = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    for i in range(40):
        assert store.put(req(topic=f"T{i}")).ok
    st = store.stats()
    assert (st["cq_files_mapped"], st["cq_file_maps"], st["cq_file_unmaps"]) == (4, 40, 36)
    if fds is not None:  # at most one descriptor per mapped file (Python < 3.13), never per topic
        assert len(os.listdir("/proc/self/fd")) <= fds + 4
    store.close_abruptly()
