"""The store's test seam is an observer passed in, not a module global: each store tells its own
observer of file creations, fdatasyncs and CommitLog flush rounds, and a flush stall holds the
flusher (issue 16, item 4)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tidemq.broker.faults import FlushStall
from tidemq.broker.store.mapped_file import MappedFile
from tidemq.broker.store.observer import StoreObserver, chain
from tests.broker.store.util import config, open_store, req


class Recorder(StoreObserver):
    def __init__(self) -> None:
        self.created: list[Path] = []
        self.synced: list[Path] = []
        self.rounds = 0

    def file_created(self, path: Path) -> None:
        self.created.append(path)

    def file_synced(self, mf: MappedFile) -> None:
        self.synced.append(mf.path)

    def before_flush_round(self) -> None:
        self.rounds += 1


async def test_each_store_tells_only_its_own_observer(tmp_path):
    seen = Recorder()
    watched = open_store(config(tmp_path / "a"), observer=seen)
    other = open_store(config(tmp_path / "b"))
    await watched.start()
    await other.start()
    try:
        assert watched.put(req(body=b"watched")).ok and other.put(req(body=b"other")).ok
        await watched.flush()
        await other.flush()
    finally:
        await watched.shutdown()
        await other.shutdown()
    a, b = (tmp_path / "a").resolve(), (tmp_path / "b").resolve()
    assert any(p.parent.name == "commitlog" for p in seen.created)
    assert any(p.parent.name == "commitlog" for p in seen.synced)
    assert any("consumequeue" in p.parts for p in seen.synced)
    assert seen.rounds >= 1
    assert all(p.resolve().is_relative_to(a) for p in seen.created + seen.synced)
    assert not any(p.resolve().is_relative_to(b) for p in seen.created + seen.synced)


async def test_a_flush_stall_holds_commitlog_flushes_until_its_file_is_gone(tmp_path):
    stall = tmp_path / "stall"
    stall.touch()
    seen = Recorder()
    store = open_store(config(tmp_path / "s"), observer=chain([FlushStall(stall), seen]))
    await store.start()
    try:
        assert store.put(req()).ok
        flush = asyncio.create_task(store.flush())
        await asyncio.sleep(0.3)
        assert not flush.done() and seen.rounds == 0  # the stall comes first in the chain
        stall.unlink()
        await asyncio.wait_for(flush, 5)
        assert seen.rounds >= 1 and store.flushed_offset == store.commitlog_max_offset
    finally:
        stall.unlink(missing_ok=True)
        await store.shutdown()


def test_no_observer_is_none_and_one_is_itself():
    one = Recorder()
    assert chain([]) is None and chain([one]) is one
