"""Recovery at load: clean restarts, crashes with torn tails, corruption, rebuilt consume queues
and index, and a property test over random bytes at the CommitLog tail."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemq.errors import StoreCorruptError
from tidemq.message import decode_record, encode_record

from tidemq.broker.store.checkpoint import read_checkpoint
from tidemq.broker.store.config import FlushMode
from tidemq.broker.store.store import GetStatus

from tests.broker.store.util import SEGMENT, Clock, config, open_store, read_queue, req


def _seg_path(root: Path, offset: int) -> Path:
    return root / "commitlog" / f"{offset // SEGMENT * SEGMENT:020d}"


def _patch(root: Path, offset: int, data: bytes) -> None:
    with open(_seg_path(root, offset), "r+b") as f:
        f.seek(offset % SEGMENT)
        f.write(data)


def _fill(store, n: int, size: int = 3000, queues: int = 2) -> list[bytes]:
    bodies = [bytes([65 + i % 26]) * (size + i) for i in range(n)]
    for i, b in enumerate(bodies):
        assert store.put(req(queue_id=i % queues, body=b, keys=f"k{i}", uniq=f"U{i}")).ok
    return bodies


def _bodies(store, queues: int = 2) -> list[bytes]:
    msgs = [m for q in range(queues) for m in read_queue(store, "T", q)]
    return [m.body for m in sorted(msgs, key=lambda m: m.commit_log_offset)]


@pytest.mark.timeout(20, func_only=True)
async def test_restart_after_clean_shutdown_keeps_everything(tmp_path):
    cfg = config(tmp_path)
    store = open_store(cfg)
    await store.start()
    bodies = _fill(store, 50)
    end, maxes = store.commitlog_max_offset, [store.max_offset("T", q) for q in range(2)]
    await store.shutdown()
    assert not (tmp_path / "abort").exists()
    cp = read_checkpoint(tmp_path / "checkpoint")
    assert cp is not None and cp.physic_offset == cp.logics_offset == cp.index_offset == end

    again = open_store(cfg)
    assert again.stats()["crash_recoveries"] == 0
    assert again.commitlog_max_offset == end and again.flushed_offset == end
    assert [again.max_offset("T", q) for q in range(2)] == maxes
    assert _bodies(again) == bodies
    assert len(again.query_by_key("T", "k7", 5, 0, 2**62)) == 1
    r = again.put(req(queue_id=1))
    assert (r.physical_offset, r.queue_offset) == (end, maxes[1])
    await again.start()
    await again.shutdown()


def test_crash_with_garbage_after_the_end_is_truncated(tmp_path):
    cfg = config(tmp_path)
    store = open_store(cfg)
    bodies = _fill(store, 30)
    end = store.commitlog_max_offset
    store.close_abruptly()
    _patch(tmp_path, end, b"\x13\x37garbage" * 40)

    again = open_store(cfg)
    assert again.stats()["crash_recoveries"] == 1
    assert again.commitlog_max_offset == end
    assert _bodies(again) == bodies
    assert _seg_path(tmp_path, end).read_bytes()[end % SEGMENT :] == bytes(SEGMENT - end % SEGMENT)
    assert again.put(req()).physical_offset == end
    again.close_abruptly()


@pytest.mark.parametrize("damage", ["partial", "bad_crc", "zero_size_header"])
def test_crash_with_a_torn_last_record_is_truncated(tmp_path, damage):
    cfg = config(tmp_path)
    store = open_store(cfg)
    bodies = _fill(store, 12)
    end = store.commitlog_max_offset
    store.close_abruptly()
    rec = encode_record(
        topic=b"T", body=b"Q" * 500, properties=b"", queue_id=0, flag=0, queue_offset=6,
        physical_offset=end, sys_flag=0, born_timestamp=1, born_host=b"\x7f\0\0\1", born_port=1,
        store_timestamp=2, store_host=b"\x7f\0\0\1", store_port=10911,
    )
    torn = {
        "partial": rec[: len(rec) // 2],
        "bad_crc": rec[:200] + b"X" + rec[201:],
        "zero_size_header": b"\0\0\0\0" + rec[4:],
    }[damage]
    _patch(tmp_path, end, torn)

    again = open_store(cfg)
    assert again.commitlog_max_offset == end
    assert _bodies(again) == bodies
    assert again.max_offset("T", 0) == 6
    again.close_abruptly()


def test_corruption_in_the_middle_refuses_to_start(tmp_path):
    cfg = config(tmp_path)
    store = open_store(cfg)
    _fill(store, 12)
    victim = store.get_messages("T", 0, 2, 1, None)
    phys = decode_record(victim.records[0]).commit_log_offset
    store.close_abruptly()  # nothing flushed: the damage lies in the unflushed region
    _patch(tmp_path, phys + 300, b"\xff")  # one flipped body byte: CRC mismatch, valid records follow

    with pytest.raises(StoreCorruptError) as err:
        open_store(cfg)
    msg = str(err.value)
    assert _seg_path(tmp_path, phys).name in msg and str(phys) in msg
    assert "refuses to start" in msg and "backup" in msg
    assert (tmp_path / "abort").exists()


@pytest.mark.timeout(20, func_only=True)
async def test_damaged_flushed_data_refuses_to_start_even_at_the_end(tmp_path):
    cfg = config(tmp_path)
    store = open_store(cfg)
    await store.start()
    _fill(store, 12)
    last = store.put(req(body=b"L" * 400))
    await store.shutdown()  # everything flushed: the checkpoint vouches for it
    _patch(tmp_path, last.end_offset - 100, b"\x00" * 8)  # inside the body: bad CRC

    with pytest.raises(StoreCorruptError, match="flushed"):
        open_store(cfg)


def test_unflushed_pages_lost_in_a_power_failure_are_cut(tmp_path):
    cfg = config(tmp_path)
    store = open_store(cfg)  # load writes a checkpoint: durable up to offset 0
    bodies = _fill(store, 15)
    store.close_abruptly()
    page = 4 * 4096
    _patch(tmp_path, page, bytes(4096))  # one page the kernel never wrote back

    again = open_store(cfg)
    kept = _bodies(again)
    assert 0 < len(kept) < len(bodies) and kept == bodies[: len(kept)]
    assert again.commitlog_max_offset <= page
    assert sum(again.max_offset("T", q) for q in range(2)) == len(kept)
    again.close_abruptly()


@pytest.mark.parametrize("at_page_end", [True, False])
def test_a_page_written_back_in_the_middle_of_a_record_is_cut_but_a_zeroed_stretch_elsewhere_refuses(
        tmp_path, at_page_end):
    """A page the kernel wrote back while a record was half written ends in zeros (everything past
    the write head was still zero) while later pages hold whole records: unflushed, so cut like a
    torn tail. The same zeros not reaching a page boundary look like damage: refuse."""
    cfg = config(tmp_path)
    store = open_store(cfg)  # load writes a checkpoint: durable up to offset 0
    bodies = _fill(store, 15)
    store.close_abruptly()
    page_end = 4 * 4096
    _patch(tmp_path, page_end - 100 if at_page_end else page_end - 300, bytes(100))

    if not at_page_end:
        with pytest.raises(StoreCorruptError, match="refuses to start"):
            open_store(cfg)
        return
    # With SYNC_FLUSH, records past the checkpoint may be acknowledged (fsynced): only a whole
    # page of zeros counts as never written there, so the same damage refuses.
    with pytest.raises(StoreCorruptError, match="refuses to start"):
        open_store(config(tmp_path, flush_mode=FlushMode.SYNC))
    again = open_store(cfg)
    kept = _bodies(again)
    assert 0 < len(kept) < len(bodies) and kept == bodies[: len(kept)]
    assert again.commitlog_max_offset <= page_end - 100
    again.close_abruptly()


def test_consume_queue_units_past_the_commitlog_end_are_dropped(tmp_path):
    cfg = config(tmp_path)
    store = open_store(cfg)
    bodies = _fill(store, 16, queues=1)
    cut_at = store.get_messages("T", 0, 10, 1, None)
    phys = decode_record(cut_at.records[0]).commit_log_offset
    store.close_abruptly()
    _patch(tmp_path, phys, bytes(SEGMENT - phys % SEGMENT))  # the CommitLog lost its tail
    for later in sorted((tmp_path / "commitlog").iterdir()):
        if int(later.name) > phys:
            later.unlink()

    again = open_store(cfg)
    assert again.max_offset("T", 0) == 10
    assert _bodies(again, 1) == bodies[:10]
    assert again.get_messages("T", 0, 10, 32, None).status is GetStatus.OFFSET_OVERFLOW_ONE
    assert again.put(req()).queue_offset == 10
    again.close_abruptly()


@pytest.mark.timeout(20, func_only=True)
@pytest.mark.parametrize("whole_dir", [False, True])
async def test_consume_queues_are_rebuilt_when_their_files_are_deleted(tmp_path, whole_dir):
    cfg = config(tmp_path)
    store = open_store(cfg)
    await store.start()
    bodies = _fill(store, 40, size=200)
    await store.shutdown()
    if whole_dir:
        shutil.rmtree(tmp_path / "consumequeue")
    else:
        for f in (tmp_path / "consumequeue" / "T" / "0").iterdir():
            f.unlink()

    again = open_store(cfg)
    assert _bodies(again) == bodies
    assert [again.max_offset("T", q) for q in range(2)] == [20, 20]
    assert again.put(req()).queue_offset == 20
    again.close_abruptly()


def test_index_is_replayed_after_a_crash_without_duplicates(tmp_path):
    cfg = config(tmp_path)
    store = open_store(cfg)
    _fill(store, 10, size=100)
    store.close_abruptly()
    again = open_store(cfg)
    for i in (0, 9):
        assert len(again.query_by_key("T", f"k{i}", 5, 0, 2**62)) == 1
    assert sum(f.count - 1 for f in again._index.files) == 20  # k<i> and U<i> per message
    again.close_abruptly()


@pytest.mark.timeout(20, func_only=True)
async def test_index_keeps_checkpointed_entries_and_replays_the_rest(tmp_path):
    cfg = config(tmp_path)
    store = open_store(cfg)
    _fill(store, 10, size=100)
    await store.flush()  # checkpoint: index file + count
    for i in range(10, 15):
        store.put(req(body=b"x", keys=f"k{i}", uniq=f"U{i}"))
    store.close_abruptly()
    again = open_store(cfg)
    assert sum(f.count - 1 for f in again._index.files) == 30
    assert all(len(again.query_by_key("T", f"k{i}", 5, 0, 2**62)) == 1 for i in range(15))
    again.close_abruptly()


def test_wrong_segment_size_is_refused_with_advice(tmp_path):
    store = open_store(config(tmp_path))
    _fill(store, 3)
    store.close_abruptly()
    with pytest.raises(StoreCorruptError, match="commitlog_segment_size"):
        open_store(config(tmp_path, commitlog_segment_size=2 * SEGMENT))


def test_a_missing_middle_segment_is_refused(tmp_path):
    store = open_store(config(tmp_path))
    _fill(store, 60)
    store.close_abruptly()
    _seg_path(tmp_path, SEGMENT).unlink()
    with pytest.raises(StoreCorruptError, match="is missing"):
        open_store(config(tmp_path))


# --------------------------------------------------------------------------- property test


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def template(tmp_path_factory):
    """A cleanly shut down store: 24 messages over two segments."""
    root = tmp_path_factory.mktemp("template")
    store = open_store(config(root))
    bodies = _fill(store, 24)
    await store.shutdown()
    return _Template(root, bodies)


class _Template:
    def __init__(self, root: Path, bodies: list[bytes]) -> None:
        self.root, self.bodies = root, bodies

    def __repr__(self) -> str:
        return f"_Template({self.root})"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    delta=st.one_of(st.integers(-400, 600), st.integers(-6000, 0)),
    data=st.binary(min_size=1, max_size=700),
    crash=st.booleans(),
    no_checkpoint=st.booleans(),
)
def test_random_bytes_at_the_tail_never_break_recovery(template, delta, data, crash, no_checkpoint):
    """load() raises nothing but StoreCorruptError, every served record decodes and is one that
    was written, and bytes written past the end never cost a message."""
    src, bodies = template.root, template.bodies
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "s"
        shutil.copytree(src, root)
        segs = sorted(int(p.name) for p in (root / "commitlog").iterdir())
        end = _end_of(root)
        at = max(end + delta, segs[-1])
        data = data[: SEGMENT - at % SEGMENT]
        _patch(root, at, data)
        if crash:
            (root / "abort").touch()
        if no_checkpoint:  # nothing vouched for as flushed
            (root / "checkpoint").unlink()
        try:
            store = open_store(config(root))
        except StoreCorruptError:
            assert at < end  # only damage to existing data may refuse the start
            return
        got = _bodies(store)
        for q in range(2):  # every served record decodes (read_queue decodes them all)
            assert len(read_queue(store, "T", q)) == store.max_offset("T", q) - store.min_offset("T", q)
        assert got == bodies[: len(got)]
        if at >= end:
            assert got == bodies  # writes past the end never cost a message
        store.close_abruptly()


def _end_of(root: Path) -> int:
    cp = read_checkpoint(root / "checkpoint")
    assert cp is not None
    return cp.physic_offset


def test_stray_files_do_not_confuse_loading(tmp_path):
    cfg = config(tmp_path)
    store = open_store(cfg)
    bodies = _fill(store, 5)
    store.close_abruptly()
    (tmp_path / "commitlog" / "00000000000000999999.tmp").write_bytes(b"x")
    (tmp_path / "commitlog" / "README").write_text("hi")
    os.makedirs(tmp_path / "consumequeue" / "T" / "notaqueue")
    again = open_store(cfg)
    assert _bodies(again) == bodies
    assert not (tmp_path / "commitlog" / "00000000000000999999.tmp").exists()
    again.close_abruptly()


@pytest.mark.timeout(20, func_only=True)
async def test_a_deleted_commitlog_with_a_checkpoint_refuses_to_start(tmp_path):
    store = open_store(config(tmp_path))
    _fill(store, 30)
    await store.shutdown()
    last = sorted((tmp_path / "commitlog").iterdir())[-1]
    last.unlink()
    with pytest.raises(StoreCorruptError, match="missing"):
        open_store(config(tmp_path))
    shutil.rmtree(tmp_path / "commitlog")
    with pytest.raises(StoreCorruptError, match="holds no segments"):
        open_store(config(tmp_path))


@pytest.mark.timeout(20, func_only=True)
async def test_schedule_units_get_their_delivery_time_back_on_rebuild(tmp_path):
    clock = Clock(1_000.0)
    store = open_store(config(tmp_path), clock=clock)
    store.put(req(topic="SCHEDULE_TOPIC_XXXX", queue_id=2, tags_code=1_010_000, props={"DELAY": "3"}))
    await store.shutdown()
    shutil.rmtree(tmp_path / "consumequeue")
    again = open_store(config(tmp_path))
    assert again._cq("SCHEDULE_TOPIC_XXXX", 2).unit(0)[2] == 1_000_000 + 10_000  # level 3 = 10 s
    again.close_abruptly()


@pytest.mark.timeout(20, func_only=True)
async def test_a_recreated_topic_survives_a_full_rebuild(tmp_path):
    store = open_store(config(tmp_path))
    await store.start()
    for i in range(10):
        store.put(req(topic="Re", body=b"old%d" % i))
    store.delete_topic("Re")
    for i in range(4):
        store.put(req(topic="Re", body=b"new%d" % i))
    await store.shutdown()
    shutil.rmtree(tmp_path / "consumequeue")
    again = open_store(config(tmp_path))
    assert [m.body for m in read_queue(again, "Re", 0)] == [b"new0", b"new1", b"new2", b"new3"]
    again.close_abruptly()


@pytest.mark.timeout(20, func_only=True)
async def test_a_deleted_topic_does_not_come_back_after_a_full_rebuild(tmp_path):
    store = open_store(config(tmp_path))
    await store.start()
    for i in range(5):
        store.put(req(topic="Gone", body=b"g%d" % i))
        store.put(req(topic="Kept", body=b"k%d" % i))
    store.delete_topic("Gone")
    await store.shutdown()
    shutil.rmtree(tmp_path / "consumequeue")
    again = open_store(config(tmp_path))
    assert again.max_offset("Gone", 0) == 0
    assert [m.body for m in read_queue(again, "Kept", 0)] == [b"k%d" % i for i in range(5)]
    again.close_abruptly()


@pytest.mark.timeout(20, func_only=True)
async def test_a_record_whose_header_disagrees_with_its_consume_queue_refuses_the_start(tmp_path):
    store = open_store(config(tmp_path))
    await store.start()
    offsets = [store.put(req(topic="T", body=b"x%d" % i, queue_id=i % 2)).physical_offset for i in range(6)]
    await store.shutdown()
    seg = sorted((tmp_path / "commitlog").iterdir())[0]
    data = bytearray(seg.read_bytes())
    data[offsets[3] + 12 : offsets[3] + 16] = (0).to_bytes(4, "big")  # queueId 1 -> 0: CRC cannot see it
    seg.write_bytes(bytes(data))
    (tmp_path / "checkpoint").unlink()
    with pytest.raises(StoreCorruptError, match="damaged"):
        open_store(config(tmp_path))


@pytest.mark.timeout(20, func_only=True)
async def test_a_stale_unit_past_the_checkpoint_is_re_pointed_at_the_record_that_carries_it(tmp_path):
    """After a power cut a consume-queue unit may point at a put that was lost, whose queue offset
    a later put re-used: the CommitLog is the truth (a unit nothing claims is re-pointed)."""
    store = open_store(config(tmp_path))
    await store.start()
    offsets = [store.put(req(topic="T", body=b"x%d" % i)).physical_offset for i in range(6)]
    end = store.commitlog_max_offset
    await store.shutdown()
    cq_file = tmp_path / "consumequeue" / "T" / "0" / f"{0:020d}"
    data = bytearray(cq_file.read_bytes())
    data[3 * 20 : 3 * 20 + 8] = (end + 4096).to_bytes(8, "big")  # unit 3 -> where no record is
    cq_file.write_bytes(bytes(data))
    (tmp_path / "checkpoint").unlink()  # nothing vouched for: the walk re-checks every unit
    again = open_store(config(tmp_path))
    assert [m.body for m in read_queue(again, "T", 0)] == [b"x%d" % i for i in range(6)]
    assert [m.commit_log_offset for m in read_queue(again, "T", 0)] == offsets
    again.close_abruptly()


def _tear_units(root: Path, topic: str, units: dict[int, bytes]) -> None:
    cq_file = root / "consumequeue" / topic / "0" / f"{0:020d}"
    data = bytearray(cq_file.read_bytes())
    for q, raw in units.items():
        data[q * 20 : q * 20 + len(raw)] = raw
    cq_file.write_bytes(bytes(data))
    (root / "checkpoint").unlink()  # nothing vouched for: the walk re-checks every unit
    (root / "abort").touch()  # as a power cut leaves it


@pytest.mark.timeout(20, func_only=True)
async def test_a_torn_unit_whose_record_survived_is_rewritten(tmp_path):
    """A 20-byte unit straddles a 4 KiB page boundary; after a power cut only the page holding
    its commitlog offset may be on disk (size and tags code zero): the record completes it."""
    store = open_store(config(tmp_path))
    await store.start()
    offsets = [store.put(req(topic="T", body=b"x%d" % i, tags="TagA")).physical_offset for i in range(6)]
    await store.shutdown()
    _tear_units(tmp_path, "T", {4: offsets[4].to_bytes(8, "big") + bytes(12),  # size + tags lost
                                5: offsets[5].to_bytes(8, "big") + (200).to_bytes(4, "big") + bytes(8)})
    again = open_store(config(tmp_path))
    msgs = read_queue(again, "T", 0)
    assert [m.body for m in msgs] == [b"x%d" % i for i in range(6)]
    assert [m.commit_log_offset for m in msgs] == offsets
    assert again._queues.get("T", 0).unit(5)[2] == again._queues.get("T", 0).unit(0)[2] != 0  # tags code back
    again.close_abruptly()


@pytest.mark.timeout(20, func_only=True)
async def test_torn_units_at_the_end_whose_records_were_lost_are_dropped_not_served(tmp_path):
    """Units past the last surviving record that are torn point at a wrong record (here the one at
    offset 0) or nowhere: they are dropped, so the queue ends at the last record that claims its unit."""
    store = open_store(config(tmp_path))
    await store.start()
    offsets = [store.put(req(topic="T", body=b"x%d" % i)).physical_offset for i in range(6)]
    size0 = len(store.read_record(offsets[0]))
    await store.shutdown()
    _tear_units(tmp_path, "T", {6: bytes(8) + size0.to_bytes(4, "big") + bytes(8),  # offset lost: points at 0
                                7: (offsets[5] + 4096).to_bytes(8, "big") + bytes(12)})  # size lost
    again = open_store(config(tmp_path))
    assert again.max_offset("T", 0) == 6
    assert [m.body for m in read_queue(again, "T", 0)] == [b"x%d" % i for i in range(6)]
    assert again.put(req(topic="T", body=b"next")).queue_offset == 6
    again.close_abruptly()


@pytest.mark.timeout(20, func_only=True)
async def test_a_new_store_says_it_is_new_not_loaded_after_a_clean_shutdown(tmp_path, caplog):
    caplog.set_level("INFO", logger="tidemq.broker.store.store")
    store = open_store(config(tmp_path))
    await store.start()
    await store.shutdown()
    first = [r.getMessage() for r in caplog.records if " is new" in r.getMessage() or "loaded after" in r.getMessage()]
    assert first == [f"store {tmp_path} is new: created empty (nothing to recover)"]
    caplog.clear()
    store = open_store(config(tmp_path))  # the second start has a checkpoint: a clean shutdown
    await store.shutdown()
    assert any(f"store {tmp_path} loaded after a clean shutdown" in r.getMessage() for r in caplog.records)
    assert not any(" is new" in r.getMessage() for r in caplog.records)
