"""A replica's epoch history on disk (ha/epochs.py) and in the replication handshake: the file's
round trip and refusals, WELCOME carrying the history, and the case it exists for: an old master
that knows the newest epoch (it follows now) but whose log ends in an older one is still cut at the
start of the next epoch (the handshake carries its log's epoch, not the newest it knows)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.broker.ha import protocol
from tidemq.broker.ha.coordination import GroupRecord
from tidemq.broker.ha.epochs import EpochFileError, EpochHistory, EpochStart, normalized
from tidemq.broker.ha.protocol import ReplicationCodecError, Welcome
from tidemq.broker.ha.replication import ReplicationFollower, ReplicationMaster

from tests.broker.ha.test_replication import CFG, assert_same, put, replicating, stores, until


def test_history_round_trips_and_a_restart_drops_epochs_past_the_log(tmp_path: Path) -> None:
    h = EpochHistory(tmp_path)
    h.begin(1, 0)
    h.begin(3, 500)
    h.remember(GroupRecord(epoch=3, master=1, in_sync=(1, 2), min_in_sync=2, master_log_end=500))
    again = EpochHistory(tmp_path)
    again.load(log_end=900)
    assert again.entries == (EpochStart(1, 0), EpochStart(3, 500))
    assert again.record is not None and again.record.in_sync == (1, 2)
    assert (again.epoch_at(499), again.epoch_at(500), again.epoch_at(0)) == (1, 3, 1)
    cut = EpochHistory(tmp_path)
    cut.load(log_end=400)  # the log was cut below epoch 3's start (a crash after a truncation)
    assert cut.entries == (EpochStart(1, 0),)


def test_a_master_cannot_begin_an_older_epoch_and_a_bad_file_says_what_to_do(tmp_path: Path) -> None:
    h = EpochHistory(tmp_path)
    h.begin(4, 100)
    with pytest.raises(ValueError, match="not newer"):
        h.begin(4, 200)
    (tmp_path / "replica-epochs.json").write_text(json.dumps({"version": 1, "epochs": [[2, 10], [1, 20]]}))
    with pytest.raises(EpochFileError, match="empty the store directory"):
        EpochHistory(tmp_path).load(1000)
    (tmp_path / "replica-epochs.json").write_text("{")
    with pytest.raises(EpochFileError, match=r"replica-epochs\.json\.bak"):
        EpochHistory(tmp_path).load(1000)


@given(st.lists(st.tuples(st.integers(1, 1 << 40), st.integers(0, 1 << 50)), max_size=20, unique_by=lambda e: e[0]))
def test_welcome_carries_the_history(raw: list[tuple[int, int]]) -> None:
    try:
        history = normalized(EpochStart(e, s) for e, s in raw)
    except ValueError:
        return  # not a history (starts going down): encode never sees one
    frame = Welcome(9, -1, 100, history)
    assert protocol.decode(protocol.encode(frame)) == frame


def test_a_welcome_with_a_history_that_is_not_one_is_refused() -> None:
    good = protocol.encode(Welcome(3, -1, 0, (EpochStart(1, 0), EpochStart(2, 50))))
    head = protocol.FRAME_HEAD.size + protocol.WELCOME.size
    swapped = good[:head] + good[head + 16:head + 32] + good[head:head + 16]
    assert protocol.decode(swapped).history == (EpochStart(1, 0), EpochStart(2, 50))  # sorted on decode
    bad = good[:head] + protocol.EPOCH_START.pack(1, 60) + protocol.EPOCH_START.pack(2, 50)
    with pytest.raises(ReplicationCodecError, match="history"):
        protocol.decode(bad)
    with pytest.raises(ReplicationCodecError):
        protocol.decode(good[:-1])


async def test_an_old_master_following_a_newer_epoch_is_cut_at_that_epochs_start(tmp_path: Path) -> None:
    async with stores(tmp_path) as (master, follower):
        # ``follower`` was master of epoch 1; ``master`` copied its log up to ``common``.
        put(master, 120)
        async with replicating(master, follower):
            await until(lambda: follower.commitlog_max_offset == master.commitlog_max_offset)
        common = master.commitlog_max_offset
        old = EpochHistory(tmp_path / "f")
        old.begin(1, 0)
        put(follower, 40, 1000)  # the old master's tail, never replicated
        put(master, 80, 120)  # epoch 2, the new master's, began at ``common``
        new = EpochHistory(tmp_path / "m")
        new.begin(1, 0)
        new.begin(2, common)
        m = ReplicationMaster(master, CFG, 2, new.entries)
        port = await m.start("127.0.0.1", 0)
        # It knows epoch 2 from the group record, but its log ends in epoch 1.
        f = ReplicationFollower(follower, CFG, 1, 2, ("127.0.0.1", port), history=old)
        f.start()
        try:
            await until(lambda: m.acked_offset(1) == master.commitlog_max_offset)
        finally:
            await f.close()
            await m.close()
        assert_same(master, follower)
        assert old.entries == new.entries  # adopted, and on disk
        reloaded = EpochHistory(tmp_path / "f")
        reloaded.load(follower.commitlog_max_offset)
        assert reloaded.entries == new.entries
