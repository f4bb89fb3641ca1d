"""D2 (style-and-reliability.md B7): emulated power loss with real processes.

The broker runs with the test-only ``--test-power-loss-shadow`` hook (tidemq.broker.store.faults):
every fdatasync copies the synced file's data into a shadow tree. At a random moment under load the
broker is killed and ``power_loss`` rewrites every CommitLog segment and consume-queue file from its
shadow (pages written since their last fdatasync revert: zeros in a preallocated segment) and
deletes the index; then the broker restarts on that store.

- SYNC_FLUSH: no acknowledged message is lost or moved, in every cycle.
- ASYNC_FLUSH: recovery succeeds every time, what survives is a prefix of every queue, only
  messages acknowledged within the last flush interval (+ margin) are lost, and at least one cycle
  loses something -- proof that the emulation has teeth (kill -9 alone loses nothing).
"""

from __future__ import annotations

import os
import random
import signal
import time
import uuid

import pytest

from tidemq.client import Admin
from tidemq.broker.store.faults import DurableShadow, power_loss
from tidemq.broker.store.mapped_file import MappedFile
from tests.broker.chaos import Ledger, check, run_load

QUEUES = 4
ASYNC_INTERVAL = 0.5  # the broker's default async_flush_interval


async def _power_loss_cycles(cluster_factory, tmp_path, flush: str, cycles: int, seed: int) -> None:
    shadow = tmp_path / "shadow"
    c = cluster_factory(flush=flush, segment_size=1 << 20,
                        extra_broker_args=["--test-power-loss-shadow", str(shadow)])
    log = c.broker.log()
    assert "power-loss emulation is on" in log
    if flush == "async":  # the loss window is stated at start
        assert "flush mode ASYNC_FLUSH" in log and f"last {ASYNC_INTERVAL:.1f} s may be lost" in log
    else:
        assert "flush mode SYNC_FLUSH" in log
    topic = f"d2_{uuid.uuid4().hex[:6]}"
    c.create_topic(topic, queues=QUEUES)
    rnd = random.Random(seed)
    ledger = Ledger()
    known: dict = {}
    lost_per_cycle = []
    oldest_lost = 0.0  # seconds between the ack of the oldest lost message and the power cut
    for cycle in range(cycles):
        pid = c.broker.proc.pid
        killed_at = []

        def kill() -> None:
            killed_at.append(time.monotonic())
            os.kill(pid, signal.SIGKILL)

        await run_load(c.broker_addr, topic, QUEUES, cycle, ledger, rnd.uniform(0.5, 2.0), kill)
        c.broker.proc.wait()
        counts = power_loss(c.store_dir, shadow)
        assert counts["reverted"] > 0
        c.broker.start()  # recovery must succeed after every power cut
        res = await check(c.broker_addr, topic, QUEUES, ledger, known if flush == "sync" else None)
        print(f"[{flush}] power cut {cycle + 1}/{cycles}: {res.summary(ledger)} files={counts}")
        assert not res.misplaced, f"acknowledged messages moved to another offset: {res.misplaced[:5]}"
        assert res.duplicates == 0 and res.gaps == 0 and res.phantoms == 0
        if flush == "sync":
            assert not res.lost, f"SYNC_FLUSH lost acknowledged messages in a power cut: {res.lost[:5]}"
        else:
            for body in res.lost:  # a prefix survives: nothing lost below a surviving offset
                q, off = ledger.acked[body]
                assert off >= res.max_offsets[q], f"{body!r} lost at {q}/{off} below max {res.max_offsets[q]}"
                age = killed_at[0] - ledger.ack_time[body]
                oldest_lost = max(oldest_lost, age)
                # bounded by the flush interval plus one flush's own duration (an fdatasync on a shared
                # CI disk can take seconds)
                assert age <= ASYNC_INTERVAL + 3.0, f"{body!r} acknowledged {age:.2f} s before the cut was lost"
            for body in res.lost:  # its offset is reused from now on
                del ledger.acked[body]
        lost_per_cycle.append(len(res.lost))
        # The index was lost with the power (faults.power_loss deletes it): rebuilt from the CommitLog.
        sample = rnd.sample(sorted(set(res.stored.values()) & set(ledger.acked)), 2)
        async with Admin(c.namesrv_addr) as admin:
            for body in sample:
                found = await admin.query_msg_by_key(topic, body.decode())
                assert [m.body for m in found] == [body], f"index lookup of {body!r} after the power cut"
        known = res.stored
    print(f"[{flush}] {cycles} power cuts: acked={len(ledger.acked)} (+{sum(lost_per_cycle)} lost) "
          f"lost per cycle={lost_per_cycle}; oldest lost ack {oldest_lost:.2f} s before its cut")
    assert len(ledger.acked) > cycles * 20, "the load was too small to mean anything"
    if flush == "async":
        assert any(lost_per_cycle), "ASYNC_FLUSH never lost anything: the power-loss emulation has no teeth"


@pytest.mark.slow  # ~15-30 s: the default suite's 15-minute budget
async def test_power_loss_sync_flush_keeps_every_acknowledged_message(cluster_factory, tmp_path):
    await _power_loss_cycles(cluster_factory, tmp_path, "sync", cycles=5, seed=11)


@pytest.mark.slow  # ~15-30 s: the default suite's 15-minute budget
async def test_power_loss_async_flush_loses_only_the_last_interval(cluster_factory, tmp_path):
    await _power_loss_cycles(cluster_factory, tmp_path, "async", cycles=5, seed=12)


@pytest.mark.slow
@pytest.mark.parametrize("flush", ["sync", "async"])
async def test_power_loss_20_cycles(cluster_factory, tmp_path, flush):
    seed = int(os.environ.get("TIDEMQ_POWER_LOSS_SEED", "13"))  # to replay another schedule
    await _power_loss_cycles(cluster_factory, tmp_path, flush, cycles=20, seed=seed)


def test_shadow_holds_only_what_was_synced(tmp_path):
    """The emulation itself: writes after the last flush revert, a never-synced file reads as zeros."""
    root, shadow_root = tmp_path / "store", tmp_path / "shadow"
    (root / "commitlog").mkdir(parents=True)
    shadow = DurableShadow(root, shadow_root)
    a = MappedFile.create(root / "commitlog" / "a", 1 << 20, 0, keep_fd=True, preallocate=True, observer=shadow)
    b = MappedFile.create(root / "commitlog" / "b", 1 << 20, 0, observer=shadow)
    a.write(0, b"synced")
    a.flush()
    a.write(0, b"SYNCED")
    a.write(700_000, b"later")
    b.write(10, b"never")
    a.close()
    b.close()
    counts = power_loss(root, shadow_root)
    assert counts["reverted"] == 1 and counts["zeroed"] == 1
    data = (root / "commitlog" / "a").read_bytes()
    assert len(data) == 1 << 20 and data[:6] == b"synced" and data[700_000:700_005] == bytes(5)
    assert (root / "commitlog" / "b").read_bytes() == bytes(1 << 20)
