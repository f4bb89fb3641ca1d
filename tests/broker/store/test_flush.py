"""Flushing: SYNC group commit (few fsyncs for many waiters, one round per loop iteration's sends,
timeouts, failures), ASYNC background flush, the periodic checkpoint."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tidemq.broker.store import flush as flush_module
from tidemq.broker.store.checkpoint import read_checkpoint
from tidemq.broker.store.config import FlushMode
from tidemq.broker.store.observer import StoreObserver
from tidemq.broker.store.store import PutStatus

from tests.broker.store.util import config, open_store, req
from tests.support.waiting import wait_until


@pytest.mark.timeout(20, func_only=True)
async def test_sync_waiters_share_fsyncs(tmp_path):
    store = open_store(config(tmp_path, flush_mode=FlushMode.SYNC, async_flush_interval=5.0))
    await store.start()
    results = [store.put(req(body=b"x" * 100)) for _ in range(300)]
    assert all(await asyncio.gather(*(store.wait_durable(r.end_offset) for r in results)))
    st = store.stats()
    assert st["flushed_offset"] >= results[-1].end_offset
    assert 1 <= st["flush_rounds"] <= 3 and st["commitlog_fsyncs"] <= 6
    await store.shutdown()


@pytest.mark.timeout(20, func_only=True)
async def test_concurrent_sync_producers_are_group_committed(tmp_path):
    store = open_store(config(tmp_path, flush_mode=FlushMode.SYNC, async_flush_interval=5.0))
    await store.start()
    acked = []

    async def producer(n: int) -> None:
        for i in range(10):
            r = store.put(req(queue_id=n % 4, body=b"y" * 200))
            assert r.status is PutStatus.PUT_OK
            assert await store.wait_durable(r.end_offset)
            assert store.flushed_offset >= r.end_offset
            acked.append(r)

    await asyncio.gather(*(producer(n) for n in range(50)))
    assert len(acked) == 500
    assert store.stats()["flush_rounds"] < 100  # far fewer flushes than messages
    await store.shutdown()


@pytest.mark.timeout(20, func_only=True)
async def test_sync_wait_times_out_and_the_message_stays(tmp_path, monkeypatch):
    real = flush_module._fsync_all

    armed = []

    def slow(files):
        if armed:  # far longer than the bound below, so it still tells a timeout from a flush
            time.sleep(3.0)
        return real(files)

    monkeypatch.setattr(flush_module, "_fsync_all", slow)
    store = open_store(config(tmp_path, flush_mode=FlushMode.SYNC, sync_flush_timeout=0.15))
    await store.start()
    armed.append(True)
    r = store.put(req())
    t = time.monotonic()
    assert await store.wait_durable(r.end_offset) is False
    assert time.monotonic() - t < 2.0  # the 0.15 s timeout, not the 3 s fsync (slack for a loaded box)
    armed.clear()  # fsyncs started from now on are fast (so is the shutdown)
    await wait_until(lambda: store.flushed_offset >= r.end_offset, "the timed-out message flushed once fsyncs are fast",
                     interval=0.01)
    assert await store.wait_durable(r.end_offset) is True
    assert store.get_messages("T", 0, 0, 1, None).message_count == 1
    await store.shutdown()


@pytest.mark.timeout(20, func_only=True)
async def test_async_mode_acknowledges_at_once_and_flushes_in_the_background(tmp_path):
    store = open_store(config(tmp_path, flush_mode=FlushMode.ASYNC, async_flush_interval=0.02))
    await store.start()
    r = store.put(req())
    assert store.flushed_offset < r.end_offset
    assert await store.wait_durable(r.end_offset) is True
    await wait_until(lambda: store.flushed_offset >= r.end_offset, "the message flushed in the background",
                     timeout=3, interval=0.01)
    await store.shutdown()


@pytest.mark.timeout(20, func_only=True)
async def test_checkpoint_follows_flushes(tmp_path):
    store = open_store(config(tmp_path, logics_flush_interval=0.02, async_flush_interval=0.02))
    await store.start()
    for _ in range(5):
        store.put(req(keys="a", uniq="u"))
    end = store.commitlog_max_offset
    await wait_until(lambda: _checkpointed(tmp_path) == end, "a checkpoint at the commitlog end", timeout=3, interval=0.01)
    cp = read_checkpoint(tmp_path / "checkpoint")
    assert cp.logics_offset == cp.index_offset == end and cp.index_count == 11
    await store.shutdown()


def _checkpointed(root) -> int:
    cp = read_checkpoint(root / "checkpoint")
    return min(cp.physic_offset, cp.logics_offset) if cp else -1


# SYNC group commit through callbacks ------------------------------------------------------------
@pytest.mark.timeout(20, func_only=True)
async def test_the_sends_of_one_loop_iteration_share_one_round(tmp_path):
    store = open_store(config(tmp_path, flush_mode=FlushMode.SYNC, async_flush_interval=60.0))
    await store.start()
    answers: list[tuple[bool, int]] = []
    for _ in range(20):  # as a read of 20 pipelined sends: append, register, append, register...
        r = store.put(req())
        assert store.when_durable(r.end_offset, lambda ok, end=r.end_offset: answers.append((ok, end)))
    await wait_until(lambda: len(answers) == 20, "every send answered", interval=0.01)
    assert store.stats()["flush_rounds"] == 1  # not one for the first send and one for the rest
    assert all(ok for ok, _ in answers) and store.flushed_offset >= max(end for _, end in answers)
    await store.shutdown()


@pytest.mark.timeout(20, func_only=True)
async def test_a_failed_round_fails_every_waiter_and_the_store(tmp_path, monkeypatch):
    store = open_store(config(tmp_path, flush_mode=FlushMode.SYNC, async_flush_interval=60.0))
    await store.start()
    real = flush_module._fsync_all

    def broken(files):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(flush_module, "_fsync_all", broken)
    answers: list[bool] = []
    for r in [store.put(req()) for _ in range(3)]:
        assert store.when_durable(r.end_offset, answers.append)
    await wait_until(lambda: len(answers) == 3, "every waiter answered", interval=0.01)
    assert answers == [False, False, False]
    assert store.put(req()).status is PutStatus.SERVICE_NOT_AVAILABLE
    monkeypatch.setattr(flush_module, "_fsync_all", real)  # the disk is back for the shutdown's flush
    await store.shutdown()


@pytest.mark.timeout(20, func_only=True)
async def test_a_waiter_callback_that_raises_does_not_hold_back_the_others(tmp_path, caplog):
    store = open_store(config(tmp_path, flush_mode=FlushMode.SYNC, async_flush_interval=60.0))
    await store.start()
    answers = []

    def bad(durable: bool) -> None:
        raise RuntimeError("a bug in one waiter")

    first, second = store.put(req()), store.put(req())
    assert store.when_durable(first.end_offset, bad)
    assert store.when_durable(second.end_offset, answers.append)
    await wait_until(lambda: answers, "the second waiter answered", interval=0.01)
    assert answers == [True]
    assert "a SYNC_FLUSH waiter's callback failed" in caplog.text
    await store.shutdown()


class _Gate(StoreObserver):
    """Holds CommitLog flush rounds on the flushing thread while closed (a stalled disk)."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.open.set()
        self.held = threading.Event()

    def before_flush_round(self) -> None:
        if not self.open.is_set():
            self.held.set()
            self.open.wait(10)


@pytest.mark.timeout(20, func_only=True)
async def test_a_truncation_waits_for_the_round_in_flight_and_fails_the_waiters_it_cuts(tmp_path):
    """A replica's truncation (a demoted master rejoining) while a SYNC round is on the flush
    thread: that round's target was taken before the cut, so reported after it, it would make
    ``flushed`` (what a follower acks, what the checkpoint vouches for) pass the log's end."""
    gate = _Gate()
    store = open_store(config(tmp_path, flush_mode=FlushMode.SYNC, async_flush_interval=60.0), observer=gate)
    await store.start()
    try:
        assert store.put(req()).ok
        cut = store.commitlog_max_offset
        await store.flush()
        gate.open.clear()
        answers: list[tuple[str, bool]] = []
        stored = store.put(req())
        assert store.when_durable(stored.end_offset, lambda ok: answers.append(("in the round", ok)))
        await wait_until(gate.held.is_set, "a round held on the flush thread", interval=0.01)
        later = store.put(req())  # for the next round
        assert store.when_durable(later.end_offset, lambda ok: answers.append(("after it", ok)))
        truncation = asyncio.create_task(store.truncate(cut))
        await asyncio.sleep(0.2)
        gate.open.set()
        await asyncio.wait_for(truncation, 5)
        await wait_until(lambda: answers, "the round's waiter answered", interval=0.01)
        assert store.commitlog_max_offset == cut
        assert store.flushed_offset <= cut
        await wait_until(lambda: len(answers) == 2, "both waiters answered", interval=0.01)
        # the first was on disk when answered; the second's record was cut before any round took it
        assert answers == [("in the round", True), ("after it", False)]
        assert read_checkpoint(store.config.checkpoint_path).physic_offset <= cut
    finally:
        gate.open.set()
        await store.shutdown()
