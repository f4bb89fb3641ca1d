"""bench/compare.py's replicated rows (issue 17), the pure part: the table's ratios and verdicts
from given cells, the failover figure's rules, and the server CPU of a replica set summed over its
processes. (The servers themselves run only in the bench.)"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

from tests.support.benchpeers import bench_peers

replicated, peerbase = bench_peers("replicated", "peerbase")
Cell = peerbase.Cell

SIZE = 1024


def rate(msgs_per_s: float) -> Cell:
    return Cell(msgs=int(msgs_per_s), seconds=1.0, cpu=0.5)


def latency(p99: float) -> Cell:
    return Cell(msgs=1000, seconds=1.0, lat_ms={"p50": p99 / 4, "p99": p99, "p999": p99 * 2})


def fo(seconds: float) -> Cell:
    cell = Cell(msgs=1, seconds=seconds)
    cell.extra["failover_s"] = seconds
    return cell


def row_of(text: str, label: str) -> list[str]:
    line = next(ln for ln in text.splitlines() if ln.startswith(f"| {label} "))
    return [c.strip() for c in line.strip("|").split("|")]


def table(rows: dict, base: dict, lease: float = 10.0) -> str:
    rresults = {(w, SIZE, "async"): cells for w, cells in rows.items()}
    results = {(w, SIZE, "async"): {"tidemq": c} for w, c in base.items()}
    return replicated.table(rresults, results, [SIZE], ["tidemq", "redis", "nats"], lease)


def test_batches_row_needs_half_the_unreplicated_rate_and_the_best_peer():
    text = table({"w3": {"tidemq": rate(30_000), "redis": rate(20_000), "nats": rate(25_000)}},
                 {"w3": rate(50_000)})
    cells = row_of(text, replicated.LABELS["w3"])
    assert cells[6] == "0.60x" and cells[7] == "1.20x (NATS)" and cells[-1] == "met"

    text = table({"w3": {"tidemq": rate(20_000), "redis": rate(10_000), "nats": rate(5_000)}},
                 {"w3": rate(50_000)})
    assert row_of(text, replicated.LABELS["w3"])[-1] == "**NOT MET**"  # 0.40x of unreplicated


def test_latency_row_compares_p99_lower_is_better():
    text = table({"w5": {"tidemq": latency(4.0), "redis": latency(8.0), "nats": latency(5.0)}},
                 {"w5": latency(2.0)})
    cells = row_of(text, replicated.LABELS["w5"])
    assert cells[6] == "p99 2.00x" and cells[7] == "p99 0.80x (NATS)" and cells[-1] == "met"


def test_failover_row_is_bounded_by_the_lease_and_skips_a_peer_without_one():
    no_failover = Cell(note="no automatic failover (Redis needs Sentinel for one)")
    text = table({replicated.FAILOVER: {"tidemq": fo(12.0), "redis": no_failover, "nats": fo(6.0)}}, {})
    cells = row_of(text, replicated.LABELS[replicated.FAILOVER])
    assert cells[2] == "12.00 s" and cells[3].startswith("n/a")
    assert cells[7].startswith("2.00x (NATS") and cells[-1] == "met"  # 12 <= 10 + 5
    text = table({replicated.FAILOVER: {"tidemq": fo(16.0)}}, {})
    assert row_of(text, replicated.LABELS[replicated.FAILOVER])[-1] == "**NOT MET**"


def test_an_errored_cell_reads_error_and_is_not_judged():
    text = table({"w1": {"tidemq": Cell(error="boom"), "redis": rate(5_000)}}, {"w1": rate(8_000)})
    cells = row_of(text, replicated.LABELS["w1"])
    assert cells[2] == "error" and cells[-1] == "-"


class Group:
    """Two real processes standing in for a replica set (one busy, one idle)."""

    def __init__(self) -> None:
        busy = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass\n" \
               "time.sleep(30)"
        self.procs = [subprocess.Popen([sys.executable, "-c", busy]),
                      subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])]

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


def test_group_meter_sums_the_cpu_of_every_process_and_keeps_the_masters():
    group = Group()
    try:
        busy, idle = (p.pid for p in group.procs)
        with replicated.GroupMeter([busy, idle], idle) as m:
            time.sleep(1.5)  # the busy one burns 0.4 s of CPU meanwhile
        cell = m.fill(Cell(msgs=1, seconds=1.0))
    finally:
        group.stop()
    assert cell.cpu >= 0.3, cell.cpu
    assert cell.extra["master_cpu"] < 0.1  # the "master" here is the idle one


class Dies:
    """A Running whose master is a real process the failover row kills; sends fail for
    ``back_after`` seconds after the kill, as while a new master is elected."""

    def __init__(self, back_after: float) -> None:
        self.proc = self.spawn()
        self.killed: list[subprocess.Popen] = []
        self.back_after = back_after
        self.down_at: float | None = None

    @staticmethod
    def spawn() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    async def master_process(self, _client: object, _topic: str) -> tuple[str, int]:
        self.down_at = time.perf_counter()
        self.killed.append(self.proc)
        return "victim", self.proc.pid

    async def restart_killed(self, _client: object, _topic: str) -> None:
        self.proc = self.spawn()

    def end(self) -> list[int | None]:
        for p in [*self.killed, self.proc]:
            if p.poll() is None:
                p.kill()
        return [p.wait(5) for p in self.killed]

    async def send(self, _topic: str, _body: bytes) -> None:
        await asyncio.sleep(0.001)
        if self.down_at is not None and time.perf_counter() - self.down_at < self.back_after:
            raise ConnectionRefusedError("no master")


def test_failover_times_the_kill_to_the_first_new_acknowledgement():
    dies = Dies(back_after=0.3)
    try:
        cell = asyncio.run(replicated.failover(dies, dies, "t", b"x"))
    finally:
        codes = dies.end()
    assert codes == [-9]  # SIGKILLed, once
    assert 0.25 <= cell.extra["failover_s"] < 2.0, cell.extra
    assert "ConnectionRefusedError" in cell.note and "SIGKILL victim" in cell.note


def test_failover_rounds_restart_the_killed_master_and_report_the_median():
    dies = Dies(back_after=0.2)
    try:
        cell = asyncio.run(replicated.failover(dies, dies, "t", b"x", rounds=3))
    finally:
        codes = dies.end()
    assert codes == [-9, -9, -9]  # three masters killed, each a new process
    assert cell.extra["rounds"] == 3 and cell.extra["failover_s"] <= cell.extra["failover_max_s"]
    assert cell.note.count("SIGKILL victim") == 3 and "ConnectionRefusedError" in cell.note
    text = table({replicated.FAILOVER: {"tidemq": cell}}, {})
    assert "(median of 3, max" in row_of(text, replicated.LABELS[replicated.FAILOVER])[2]


def test_a_system_without_failover_says_so():
    cell = asyncio.run(replicated.failover(object(), object(), "t", b"x"))
    assert cell.extra == {} and "no automatic failover" in cell.note
