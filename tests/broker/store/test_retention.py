"""Retention with an injected clock and disk probe; refusal when the disk is full."""

from __future__ import annotations

import os
import time

import pytest

from tidemq.message import decode_record

from tidemq.broker.store.retention import filesystem_usage
from tidemq.broker.store.store import GetStatus, PutStatus

from tests.broker.store.util import SEGMENT, T0, Clock, config, open_store, read_queue, req

HOUR = 3600.0


class Disk:
    def __init__(self, ratio: float = 0.1) -> None:
        self.ratio = ratio

    def __call__(self, path: str):
        class Usage:
            total, free = 1000, int(1000 * (1 - self.ratio))
        return Usage


def _other_hour(clock: Clock) -> tuple[int, ...]:
    return ((time.localtime(clock()).tm_hour + 1) % 24,)


async def _store(tmp_path, clock, disk, **kw):
    store = open_store(config(tmp_path, **kw), clock=clock, disk_usage=disk)
    for i in range(300):
        assert store.put(req(body=b"r" * 1000, keys=f"k{i}", uniq=f"u{i}")).ok
    await store.flush()
    return store


@pytest.mark.timeout(20, func_only=True)
async def test_expired_segments_go_and_min_offsets_follow(tmp_path):
    clock, disk = Clock(), Disk()
    store = await _store(tmp_path, clock, disk, delete_when_hours=tuple(range(24)))
    segments = store.stats()["segments"]
    assert segments >= 5
    clock.now = T0 + 71 * HOUR
    assert await store.run_retention() == 0
    clock.now = T0 + 73 * HOUR
    assert await store.run_retention() == segments - 1  # never the active segment
    new_min = store.commitlog_min_offset
    assert new_min == (segments - 1) * SEGMENT == store.stats()["commitlog_min_offset"]
    assert sorted(p.name for p in (tmp_path / "commitlog").iterdir())[0] == f"{new_min:020d}"
    low = store.min_offset("T", 0)
    assert low > 0
    r = store.get_messages("T", 0, 0, 32, None)
    assert (r.status, r.next_begin_offset) == (GetStatus.OFFSET_TOO_SMALL, low)
    msgs = read_queue(store, "T", 0)
    assert msgs[0].queue_offset == low and msgs[0].commit_log_offset >= new_min
    assert len(msgs) == 300 - low
    assert not (tmp_path / "consumequeue" / "T" / "0" / f"{0:020d}").exists()
    assert store.stats()["logic_files_deleted"] >= 2  # a consume queue file and an index file
    assert [decode_record(x).body for x in store.query_by_key("T", "k299", 5, 0, 2**62)]
    assert store.query_by_key("T", "k0", 5, 0, 2**62) == []
    await store.shutdown()
    again = open_store(config(tmp_path))
    assert again.min_offset("T", 0) == low and again.commitlog_min_offset == new_min
    again.close_abruptly()


@pytest.mark.timeout(20, func_only=True)
async def test_nothing_goes_outside_the_delete_hours_unless_triggered_or_disk_is_filling(tmp_path):
    clock, disk = Clock(), Disk()
    store = await _store(tmp_path, clock, disk, delete_when_hours=_other_hour(Clock()))
    clock.now = T0 + 100 * HOUR
    assert time.localtime(clock()).tm_hour not in store.config.delete_when_hours
    assert await store.run_retention() == 0
    assert await store.run_retention(manual=True) >= 1  # TRIGGER_DELETE_FILES ignores the hour
    for _ in range(300):
        store.put(req(body=b"s" * 1000))
    await store.flush()
    clock.now = T0 + 200 * HOUR
    assert time.localtime(clock()).tm_hour not in store.config.delete_when_hours
    assert await store.run_retention() == 0
    disk.ratio = 0.80  # above disk_clean_ratio: expired segments go at any hour
    assert await store.run_retention() >= 1
    await store.shutdown()


@pytest.mark.timeout(20, func_only=True)
async def test_a_nearly_full_disk_deletes_the_oldest_segment_before_it_expires(tmp_path):
    clock, disk = Clock(), Disk()
    store = await _store(tmp_path, clock, disk, delete_when_hours=_other_hour(Clock()))
    disk.ratio = 0.80
    assert await store.run_retention() == 0  # not expired, not forced
    disk.ratio = 0.87  # above disk_force_clean_ratio
    assert await store.run_retention() == 1
    assert store.commitlog_min_offset == SEGMENT
    await store.shutdown()


@pytest.mark.timeout(20, func_only=True)
async def test_unflushed_segments_are_never_deleted(tmp_path):
    clock = Clock()
    store = open_store(config(tmp_path, delete_when_hours=tuple(range(24))), clock=clock, disk_usage=Disk())
    for _ in range(100):
        store.put(req(body=b"r" * 1000))
    clock.now = T0 + 100 * HOUR
    assert await store.run_retention() == 0
    await store.flush()
    assert await store.run_retention() >= 1
    await store.shutdown()


@pytest.mark.timeout(20, func_only=True)
async def test_puts_are_refused_above_the_refuse_ratio(tmp_path):
    disk = Disk(0.95)
    store = open_store(config(tmp_path), disk_usage=disk)
    r = store.put(req())
    assert r.status is PutStatus.SERVICE_NOT_AVAILABLE and "full" in r.remark
    disk.ratio = 0.5
    assert abs(store.disk_usage_ratio() - 0.5) < 0.01
    assert store.put(req()).ok
    disk.ratio = 0.91
    await store.run_retention()  # the cleanup pass re-probes the disk
    assert store.put(req()).status is PutStatus.SERVICE_NOT_AVAILABLE
    assert store.stats()["puts_refused"] == 2
    disk.ratio = 0.2
    store.disk_usage_ratio()
    await store.start()
    assert store.put(req()).ok
    await store.shutdown()
    r = store.put(req())
    assert r.status is PutStatus.SERVICE_NOT_AVAILABLE and "shut down" in r.remark


def test_disk_usage_counts_root_reserved_blocks_as_free_like_rocketmq(tmp_path):
    st = os.statvfs(tmp_path)
    u = filesystem_usage(str(tmp_path))
    assert u.total == st.f_blocks * st.f_frsize
    assert u.free == st.f_bfree * st.f_frsize >= st.f_bavail * st.f_frsize
    assert u.used == u.total - u.free
