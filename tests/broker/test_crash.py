"""D1 (style-and-reliability.md B7): kill -9 the broker at random moments while 4 producers send and
2 consumers consume; after every restart no acknowledged message is missing or moved, no message
sits at two queue offsets, no queue has a gap, and no committed consumer offset is ahead of the
stored messages.

kill -9 leaves the page cache intact, so this proves the recovery walk and the dispatch order, not
fsync (test_power_loss.py does that); the ASYNC_FLUSH run is expected to pass as well.
"""

from __future__ import annotations

import os
import random
import signal
import time
import uuid

import pytest

from tests.broker.chaos import Ledger, check, run_load

QUEUES = 4


async def _crash_cycles(cluster_factory, flush: str, cycles: int, seed: int) -> None:
    c = cluster_factory(flush=flush, segment_size=1 << 20)  # small segments: rollovers happen
    topic = f"d1_{uuid.uuid4().hex[:6]}"
    c.create_topic(topic, queues=QUEUES)
    rnd = random.Random(seed)
    ledger = Ledger()
    known: dict = {}
    restarts = []
    for cycle in range(cycles):
        pid = c.broker.proc.pid
        await run_load(c.broker_addr, topic, QUEUES, cycle, ledger, rnd.uniform(0.5, 2.5),
                       lambda: os.kill(pid, signal.SIGKILL))
        c.broker.proc.wait()
        t0 = time.monotonic()
        c.broker.start()
        restarts.append(time.monotonic() - t0)
        res = await check(c.broker_addr, topic, QUEUES, ledger, known)
        print(f"[{flush}] cycle {cycle + 1}/{cycles}: {res.summary(ledger)} restart={restarts[-1]:.1f}s")
        assert not res.lost, f"acknowledged messages lost after kill -9: {res.lost[:5]}"
        assert not res.misplaced, f"acknowledged messages at another queue offset: {res.misplaced[:5]}"
        assert res.duplicates == 0 and res.gaps == 0 and res.phantoms == 0
        assert not res.offsets_ahead, f"committed consumer offsets ahead of the store: {res.offsets_ahead}"
        known = res.stored
    assert "crash" in c.broker.log()  # recovery ran as a crash recovery, not a clean start
    assert len(ledger.acked) > cycles * 20, "the load was too small to mean anything"
    assert ledger.consumed > 0 and ledger.commits > 0
    assert max(restarts) < 10, f"restart to serving took {max(restarts):.1f} s"
    print(f"[{flush}] {cycles} kill -9 cycles: acked={len(ledger.acked)} stored={len(known)} "
          f"indeterminate={len(ledger.indeterminate)} consumed={ledger.consumed} lost=0 duplicates=0 "
          f"gaps=0; slowest restart {max(restarts):.1f} s")


@pytest.mark.slow  # ~15-30 s: the default suite's 15-minute budget
async def test_kill_9_under_load_sync_flush_short(cluster_factory):
    await _crash_cycles(cluster_factory, "sync", cycles=5, seed=1)


@pytest.mark.slow
async def test_kill_9_under_load_sync_flush_20_cycles(cluster_factory):
    await _crash_cycles(cluster_factory, "sync", cycles=20, seed=2)


@pytest.mark.slow
async def test_kill_9_under_load_async_flush_passes_too(cluster_factory):
    """kill -9 does not lose the page cache, so ASYNC_FLUSH must pass as well (B7 D1)."""
    await _crash_cycles(cluster_factory, "async", cycles=5, seed=3)
