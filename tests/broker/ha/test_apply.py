"""A follower's apply path (MessageStore.append_replicated: one check of a whole frame, then one
dispatch per run) leaves the follower what the master's own puts left it: the same consume-queue
units (tags codes, SCHEDULE_TOPIC delivery times, half messages kept out), the same key lookups
and listeners told of each queue's highest offset per tags code (as a put tells them), whatever
the frame size. Runs with whichever build
is loaded (the compiled store paths, or their pure-Python twins with TIDEMQ_NO_EXTENSIONS=1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemq.errors import StoreError
from tidemq.message import SysFlag

from tidemq.broker.store.replay import SCHEDULE_TOPIC
from tidemq.broker.store.store import MessageStore
from tests.broker.store.util import T0, Clock, config, open_store, req

from .test_replication import assert_same, queues


def _fill(master: MessageStore, clock: Clock) -> None:
    for i in range(60):
        clock.now = T0 + i // 7  # several store times: runs break on them
        master.put(req(f"T{i % 2}", i % 3, bytes([i]) * (30 + i * 13), tags=f"t{i % 5}", keys=f"k{i} shared",
                       uniq=f"u{i}"))
        if i % 9 == 0:
            batch = [req("B", 1, b"b" * (200 + j), tags="tb", keys=f"bk{i}-{j}") for j in range(20)]
            assert master.put_batch(batch).status.name == "PUT_OK"
        if i % 11 == 0:
            # as the schedule service stores it: the unit's code is the delivery time (level 3: 10 s)
            master.put(req(SCHEDULE_TOPIC, 2, b"later", props={"DELAY": "3", "REAL_TOPIC": "T0"},
                           tags_code=int(clock.now * 1000) + 10_000))
            master.put(req("Half", 0, b"h", sys_flag=int(SysFlag.TRANSACTION_PREPARED), uniq=f"h{i}"))


@pytest.mark.parametrize("frame_bytes", [1, 700, 5000, 1 << 20])
def test_a_follower_applies_frames_into_the_masters_queues_and_index(tmp_path: Path, frame_bytes: int) -> None:
    clock = Clock()
    master = open_store(config(tmp_path / "m"), clock=clock)
    follower = open_store(config(tmp_path / "f"), clock=Clock())
    heard: list[tuple[str, int, int, int]] = []
    follower.add_dispatch_listener(lambda *a: heard.append(a))
    try:
        _fill(master, clock)
        at = 0
        while at < master.commitlog_max_offset:
            at, data = master.read_commitlog(at, frame_bytes)
            follower.append_replicated(at, data)
            at += len(data)
        assert_same(master, follower)
        assert queues(follower) == queues(master)
        assert ("Half", 0) not in queues(master)
        assert queues(master)[SCHEDULE_TOPIC, 2][0][2] > T0 * 1000  # a delivery time, not a tag hash
        end = int((T0 + 100) * 1000)
        for key in ("k5", "u17", "shared", "bk18-3", "h22"):
            assert follower.query_by_key("T1" if key != "bk18-3" else "B", key, 100, 0, end) == \
                master.query_by_key("T1" if key != "bk18-3" else "B", key, 100, 0, end)
        assert len(follower.query_by_key("T1", "shared", 100, 0, end)) == 30
        told: dict[tuple[str, int, int], int] = {}  # as a put tells them: the highest offset per tags code
        for t, q, o, code in heard:
            told[t, q, code] = max(told.get((t, q, code), -1), o)
        assert told == {(t, q, unit[2]): o for (t, q), units in queues(master).items() for o, unit in enumerate(units)}
    finally:
        master.close_abruptly()
        follower.close_abruptly()


def test_a_refused_frame_leaves_nothing_and_the_next_good_one_applies(tmp_path: Path) -> None:
    clock = Clock()
    master = open_store(config(tmp_path / "m"), clock=clock)
    follower = open_store(config(tmp_path / "f"), clock=Clock())
    try:
        _fill(master, clock)
        at, data = master.read_commitlog(0, 1 << 20)
        bad = bytearray(data)
        bad[len(data) // 2 :] = bytes(len(data) - len(data) // 2)  # the second half zeroed
        with pytest.raises(StoreError, match="replicated record at commitlog offset .* is refused"):
            follower.append_replicated(at, bytes(bad))
        assert follower.commitlog_max_offset == 0 and queues(follower) == {}
        assert follower.append_replicated(at, data) == at + len(data)
    finally:
        master.close_abruptly()
        follower.close_abruptly()



def test_appended_frames_wait_for_their_dispatch(tmp_path: Path) -> None:
    """append_replicated(dispatch=False) puts the records in the log only; dispatch_replicated
    then builds their units and index entries as an append with its dispatch would have."""
    clock = Clock()
    master = open_store(config(tmp_path / "m"), clock=clock)
    follower = open_store(config(tmp_path / "f"), clock=Clock())
    try:
        _fill(master, clock)
        at = 0
        while at < master.commitlog_max_offset:
            at, data = master.read_commitlog(at, 5000)
            follower.append_replicated(at, data, dispatch=False)
            at += len(data)
        assert follower.commitlog_max_offset == master.commitlog_max_offset
        assert queues(follower) == {}
        follower.dispatch_replicated()
        assert_same(master, follower)
        follower.dispatch_replicated()  # nothing waits: nothing changes
        assert_same(master, follower)
    finally:
        master.close_abruptly()
        follower.close_abruptly()
