"""bench/compare.py's main table, the pure part: issue 19's target per row judged from given cells
(throughput, ratio to the best peer, the same run's echo limit, the broker's CPU per message)."""

from __future__ import annotations

from tests.support.benchpeers import bench_peers

report, peerbase = bench_peers("report", "peerbase")
Cell = peerbase.Cell

SIZE = 1024
LIMITS = {SIZE: {"one": 16_000.0, "pipelined": 500_000.0, "mmap": 400_000.0, "p50_ms": 0.06}}


def cell(rate: float, cpu_us: float = 1.0) -> Cell:
    """A cell of ``rate`` msg/s whose broker spent ``cpu_us`` CPU microseconds per message."""
    msgs = int(rate)
    return Cell(msgs=msgs, seconds=1.0, cpu=cpu_us * msgs / 1e6)


def verdict(w: str, tidemq: Cell, redis: Cell, flush: str = "async", results: dict | None = None) -> list[str]:
    row = {"tidemq": tidemq, "redis": redis}
    res = dict(results or {})
    res[(w, SIZE, flush)] = row
    text = report.table(res, [SIZE], [flush], ["tidemq", "redis"], {}, LIMITS)
    line = next(ln for ln in text.splitlines() if ln.startswith(f"| {report.WORKLOADS[w]} "))
    cells = [c.strip() for c in line.strip("|").split("|")]
    return cells[-2:]  # target, met


def test_one_in_flight_needs_the_peer_ratio_the_echo_share_and_the_broker_cpu():
    tgt, met = verdict("w1", cell(13_000, 35), cell(8_000))
    assert "0.75 of echo" in tgt and "40 us" in tgt and met == "met"
    assert verdict("w1", cell(11_000, 35), cell(7_000))[1] == "**NOT MET**"  # 1.57x, but 0.69 of echo
    assert verdict("w1", cell(13_000, 45), cell(8_000))[1] == "**NOT MET**"  # broker CPU 45 us
    assert verdict("w1", cell(13_000, 35), cell(9_000))[1] == "**NOT MET**"  # 1.44x the peer


def test_cpu_targets_apply_to_async_rows_only():
    tgt, _ = verdict("w1", cell(13_000, 200), cell(8_000), flush="sync")
    assert "us/msg" not in tgt
    assert verdict("w1", cell(13_000, 200), cell(8_000), flush="sync")[1] == "met"


def test_batches_need_300k_3x_and_3_us_and_sync_half_of_async():
    assert verdict("w3", cell(310_000, 2.9), cell(100_000))[1] == "met"
    assert verdict("w3", cell(310_000, 3.5), cell(100_000))[1] == "**NOT MET**"
    async_row = {("w3", SIZE, "async"): {"tidemq": cell(400_000)}}
    tgt, met = verdict("w3", cell(310_000, 9), cell(100_000), flush="sync", results=async_row)
    assert "(0.78x)" in tgt and met == "met"
    assert verdict("w3", cell(180_000), cell(50_000), flush="sync", results=async_row)[1] == "**NOT MET**"


def test_consuming_needs_500k_and_0_7_us_pulled():
    assert verdict("w4", cell(600_000, 0.6), cell(150_000))[1] == "met"
    assert verdict("w4", cell(450_000, 0.6), cell(100_000))[1] == "**NOT MET**"  # below 500k
    assert verdict("w4", cell(600_000, 0.8), cell(150_000))[1] == "**NOT MET**"  # 0.8 us per pulled message
