"""ConsumeQueue and IndexFile on their own: end detection, truncation, chain walking."""

from __future__ import annotations

from tidemq.broker.store.consume_queue import UNIT, ConsumeQueue
from tidemq.broker.store.index import ENTRY, HEADER_SIZE, IndexFile, index_file_size, key_hash
from tidemq.broker.store.mapped_file import MappedFile


def _cq(tmp_path, dirty=None) -> ConsumeQueue:
    return ConsumeQueue(tmp_path, "T", 0, 10, dirty if dirty is not None else set())


def test_consume_queue_finds_its_end_and_start_after_reload(tmp_path):
    cq = _cq(tmp_path)
    for q in range(25):
        cq.put(q, q * 100, 100, 7)
    assert (cq.min_offset, cq.max_offset, len(cq.files)) == (0, 25, 3)
    again = _cq(tmp_path)
    again.load()
    assert (again.min_offset, again.max_offset) == (0, 25)
    assert again.unit(24) == (2400, 100, 7) and again.unit(25) is None
    assert [u[0] for u in again.units(8, 5)] == [800, 900]  # stops at the file end


def test_consume_queue_with_offset_zero_record_and_zero_tags(tmp_path):
    cq = _cq(tmp_path)
    cq.put(0, 0, 91, 0)  # the only unit that may start with eight zero bytes
    cq.put(1, 91, 91, 0)
    again = _cq(tmp_path)
    again.load()
    assert again.max_offset == 2


def test_consume_queue_starting_late_keeps_its_min(tmp_path):
    cq = _cq(tmp_path)
    for q in range(35, 47):
        cq.put(q, q * 100, 100, 0)
    assert (cq.min_offset, cq.max_offset) == (35, 47)
    again = _cq(tmp_path)
    again.load()
    assert (again.min_offset, again.max_offset) == (35, 47)
    assert again.first_offset_at_or_after(4000) == 40
    assert again.first_offset_ending_after(4000) == 40


def test_consume_queue_truncation_and_stale_units(tmp_path):
    dirty = set()
    cq = _cq(tmp_path, dirty)
    for q in range(25):
        cq.put(q, q * 100, 100, 0)
    assert dirty
    gone = cq.truncate_to(12)
    assert len(gone) == 1 and cq.max_offset == 12
    for f in gone:
        f.destroy()
    # a stale unit after a hole is cleared at load
    f = cq.files[-1]
    UNIT.pack_into(f.mm, 5 * 20, 999, 9, 9)
    again = _cq(tmp_path)
    again.load()
    assert again.max_offset == 12
    assert again.files[-1].mm[5 * 20 : 6 * 20] == bytes(20)


def _index(tmp_path, slots=7, entries=50) -> IndexFile:
    path = tmp_path / "idx"
    return IndexFile(MappedFile.create(path, index_file_size(slots, entries), 0), slots, entries)


def test_index_chain_lookup_newest_first_and_time_window(tmp_path):
    idx = _index(tmp_path)
    h = key_hash("T#a")
    for i in range(20):
        idx.put(h if i % 3 == 0 else key_hash(f"T#x{i}"), 1000 + i, 1_000_000 + i * 10_000)
    out: list[int] = []
    idx.lookup(h, 0, 2**62, 100, out)
    assert out == [1018, 1015, 1012, 1009, 1006, 1003, 1000]
    out = []
    idx.lookup(h, 1_090_000, 1_130_000, 100, out)
    assert out == [1012, 1009]


def test_index_truncate_rebuilds_slots_and_a_looping_chain_stops(tmp_path):
    idx = _index(tmp_path)
    h = key_hash("T#a")
    for i in range(10):
        idx.put(h, 100 + i, 5000)
    idx.truncate(6)  # keep entries 1..5
    out: list[int] = []
    idx.lookup(h, 0, 2**62, 100, out)
    assert out == [104, 103, 102, 101, 100]
    # damage: entry 5 points forward to itself
    pos = HEADER_SIZE + 7 * 4 + 5 * 20
    eh, phys, diff, _prev = ENTRY.unpack_from(idx.mf.mm, pos)
    ENTRY.pack_into(idx.mf.mm, pos, eh, phys, diff, 5)
    out = []
    idx.lookup(h, 0, 2**62, 100, out)
    assert out == [104]
    idx.mf.close()
