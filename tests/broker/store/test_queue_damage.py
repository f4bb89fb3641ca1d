"""Consume queues that lost units the checkpoint vouched for (a zeroed or damaged file) are found
during recovery and rebuilt from the CommitLog, instead of serving holes or re-using queue offsets."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemq.broker.store import faults
from tidemq.broker.store.consume_queue import UNIT_SIZE

from tests.broker.store.util import config, open_store, read_queue, req


def _cq_files(root: Path, topic: str, q: int) -> list[Path]:
    return sorted((root / "consumequeue" / topic / str(q)).iterdir())


async def _filled(tmp_path, n: int = 400, crash: bool = False):
    cfg = config(tmp_path)
    store = open_store(cfg)
    await store.start()
    for i in range(n):
        assert store.put(req(queue_id=i % 2, body=f"m{i}".encode() * 20)).ok
    maxes = [store.max_offset("T", q) for q in range(2)]
    await store.flush()  # checkpoint: every unit below the end is vouched for
    if crash:
        store.close_abruptly()
    else:
        await store.shutdown()
    return cfg, maxes


@pytest.mark.parametrize("crash", [False, True], ids=["clean", "crash"])
@pytest.mark.parametrize("which", ["first", "last", "all"])
@pytest.mark.timeout(20, func_only=True)
async def test_a_zeroed_consume_queue_file_is_rebuilt_from_the_commitlog(tmp_path, caplog, crash, which):
    cfg, maxes = await _filled(tmp_path, crash=crash)
    files = _cq_files(tmp_path, "T", 0)
    assert len(files) > 2  # 64 units per file in the test config
    victims = {"first": files[:1], "last": files[-1:], "all": files}[which]
    for f in victims:
        f.write_bytes(bytes(f.stat().st_size))
    store = open_store(cfg)
    try:
        assert "consume queue T/0 is damaged" in caplog.text
        assert [store.max_offset("T", q) for q in range(2)] == maxes
        assert store.min_offset("T", 0) == 0
        bodies = [m.body for m in read_queue(store, "T", 0)]
        assert bodies == [f"m{i}".encode() * 20 for i in range(0, 400, 2)]
        assert [m.queue_offset for m in read_queue(store, "T", 0)] == list(range(maxes[0]))
        r = store.put(req(queue_id=0, body=b"next"))
        assert r.ok and r.queue_offset == maxes[0]  # offsets continue; none is re-used
    finally:
        await store.start()
        await store.shutdown()


@pytest.mark.timeout(20, func_only=True)
async def test_a_consume_queue_unit_pointing_elsewhere_is_repaired(tmp_path, caplog):
    cfg, maxes = await _filled(tmp_path, n=20)
    f = _cq_files(tmp_path, "T", 1)[0]
    data = bytearray(f.read_bytes())
    data[3 * UNIT_SIZE : 4 * UNIT_SIZE] = data[5 * UNIT_SIZE : 6 * UNIT_SIZE]  # unit 3 -> record of 5
    f.write_bytes(bytes(data))
    store = open_store(cfg)
    try:
        assert "consume queue T/1 is damaged" in caplog.text
        assert [m.body for m in read_queue(store, "T", 1)] == [f"m{i}".encode() * 20 for i in range(1, 20, 2)]
    finally:
        await store.start()
        await store.shutdown()


@pytest.mark.timeout(20, func_only=True)
async def test_an_intact_store_is_not_rebuilt(tmp_path, caplog):
    cfg, maxes = await _filled(tmp_path, crash=True)
    store = open_store(cfg)
    try:
        assert "damaged" not in caplog.text
        assert [store.max_offset("T", q) for q in range(2)] == maxes
    finally:
        await store.start()
        await store.shutdown()


@pytest.mark.timeout(20, func_only=True)
async def test_units_rewritten_after_a_recovery_cut_are_flushed(tmp_path, caplog):
    """Regression: a consume-queue file whose tail recovery zeroed was never registered for
    flushing again, so the checkpoint vouched for units that a power cut would lose."""
    root, shadow = tmp_path / "store", tmp_path / "shadow"
    cfg = config(root)
    store = open_store(cfg)
    await store.start()
    for i in range(10):
        assert store.put(req(body=f"old{i}".encode())).ok
    await store.flush()
    end = store.commitlog_max_offset
    for i in range(5):
        assert store.put(req(body=f"lost{i}".encode())).ok
    store.close_abruptly()
    seg = root / "commitlog" / f"{0:020d}"
    with open(seg, "r+b") as f:  # the CommitLog lost its last 5 records, the queue kept their units
        f.seek(end)
        f.write(bytes(4096))
    store = open_store(cfg, observer=faults.DurableShadow(root, shadow))  # cuts units 10..14
    try:
        assert store.max_offset("T", 0) == 10
        await store.start()
        for i in range(5):
            assert store.put(req(body=f"new{i}".encode())).ok
        await store.flush()  # must flush the queue file too, before the checkpoint
    finally:
        store.close_abruptly()
    faults.power_loss(root, shadow)
    caplog.clear()
    store = open_store(cfg)
    try:
        assert "damaged" not in caplog.text
        bodies = [m.body for m in read_queue(store, "T", 0)]
        assert bodies == [f"old{i}".encode() for i in range(10)] + [f"new{i}".encode() for i in range(5)]
    finally:
        await store.start()
        await store.shutdown()
