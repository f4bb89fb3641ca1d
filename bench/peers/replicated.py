"""bench/compare.py's replicated rows (issue 17, "Speed"): which peer module runs each system
replicated, the server CPU of a whole replica set, the failover figure, and the table.

Each system runs as its replicated form (tidemq_group_peer: 3 replicas, sync replication,
min-in-sync 2; nats_cluster_peer: 3 servers, R3 stream; redis_replica_peer: primary + 1 replica with
WAIT 1) through the same workloads 1-3 and 5 as the unreplicated rows; the table divides each
replicated TideMQ figure by the same run's unreplicated TideMQ (ASYNC_FLUSH) figure and by the
best replicated peer's.

Failover (row 7): one sender, one message in flight, as workload 1; after ``LEAD`` seconds of
acknowledged sends the master (TideMQ: the replica the name server routes as brokerId 0; NATS:
the server leading the stream) gets SIGKILL, and the figure is the time from the kill to the first
acknowledgement of a send attempt started after it (an answer written before the kill may still be
read after it). With ``--failover-rounds`` N the killed process is started again and caught up
before the next kill, and the row shows the median. Every attempt is capped at ``ATTEMPT``
seconds, so a client's own long timeout (nats-py's JetStream context waits 30 s) does not decide
the figure; the cap is the figure's resolution for a client whose request to the dead master hangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import statistics
import time
from collections import Counter
from pathlib import Path

from peerbase import BenchError, Cell, Meter, cpu_seconds
from report import SYSTEMS, WORKLOADS, size_label
from tidemq.remoting.codes import ResponseCode

MODULES = {"tidemq": "tidemq_group_peer", "redis": "redis_replica_peer", "nats": "nats_cluster_peer"}
ROWS = ("w1", "w2", "w3", "w5")  # the workloads 1-3 and 5
FAILOVER = "w7"
LABELS = {**{w: WORKLOADS[w] for w in ROWS}, FAILOVER: "7. failover: SIGKILL the master"}
LEAD = 1.0  # s of acknowledged sends before the kill
# s: cap of one send attempt during the failover. A request the dead master never answers is
# otherwise held for the client's own timeout (nats-py's JetStream context: 30 s here, 5 by
# default), which would measure that timeout instead of the failover.
ATTEMPT = 1.0
GIVE_UP = 60.0  # s after the kill without an acknowledgement: the row reports an error
# whose CPU the first figure of the split in notes() is (the process Running.pid names)
FIRST = {"tidemq": "master", "redis": "primary", "nats": "server n0 (not necessarily a stream's leader)"}
BEGIN = "<!-- bench/compare.py replicated results: begin (replaced by --replicated ... --write) -->"
END = "<!-- bench/compare.py replicated results: end -->"


class GroupMeter(Meter):
    """Meter whose server CPU is the sum over every process of the replica set (the master's peak
    RSS stays the one figure): replication costs CPU on the followers too."""

    def __init__(self, pids: list[int], master: int) -> None:
        super().__init__(master)
        self.pids = pids

    def _cpu(self) -> float:
        total = 0.0
        for pid in self.pids:
            try:
                total += cpu_seconds(pid)
            except OSError:  # a replica killed by the failover row: its CPU is no longer counted
                pass
        return total

    def __enter__(self) -> "GroupMeter":
        super().__enter__()
        self.group0 = self._cpu()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self.master_cpu = self.cpu  # the base class measured the master alone
        self.cpu = self._cpu() - self.group0

    def fill(self, cell: Cell) -> Cell:
        super().fill(cell)
        cell.extra["master_cpu"] = self.master_cpu
        return cell


async def failover(running, client, topic: str, body: bytes, rounds: int = 1) -> Cell:  # noqa: ANN001 (a peer's Running / Client)
    """Seconds from SIGKILL of the master to the first new acknowledgement, median of ``rounds``
    kills (in ``extra``); between rounds the killed process is started again and caught up."""
    if not hasattr(running, "master_process"):
        return Cell(note="no automatic failover (Redis needs Sentinel for one)")
    tooks: list[float] = []
    per_round: list[str] = []
    kinds: Counter[str] = Counter()
    said: dict[str, str] = {}  # the first message of each kind of failed attempt
    # The client logs each refused heartbeat and send while its broker is down: expected here,
    # counted in the note instead.
    quiet = logging.getLogger("tidemq")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        for k in range(rounds):
            if k:
                await running.restart_killed(client, topic)
            took, victim, failed = await _one_failover(running, client, topic, body, kinds, said)
            text = f"{took:.2f} s (SIGKILL {victim}, {failed} failed attempts"
            own = getattr(running, "failover_seconds", None)
            if own is not None:
                with contextlib.suppress(Exception):  # an account for the note only
                    if (seconds := await own()) is not None:
                        text += f", new master's haLastFailoverSeconds {seconds:.2f} s"
            tooks.append(took)
            per_round.append(text + ")")
    finally:
        quiet.setLevel(level)
    median = statistics.median(tooks)
    note = "; ".join(per_round)
    if kinds:
        note += (". Failed attempts: " + ", ".join(f"{n} {k}" for k, n in kinds.most_common())
                 + f"; most common: {said[kinds.most_common(1)[0][0]]!r}")
    cell = Cell(msgs=1, seconds=median, note=note)
    cell.extra["failover_s"] = median
    cell.extra["failover_max_s"] = max(tooks)
    cell.extra["rounds"] = len(tooks)
    return cell


async def _one_failover(running, client, topic: str, body: bytes, kinds: Counter[str],  # noqa: ANN001
                        said: dict[str, str]) -> tuple[float, str, int]:
    """One kill: (seconds to the first new acknowledgement, the victim, failed attempts after the
    kill); the failed attempts' kinds are added to ``kinds`` (first message of each in ``said``)."""
    acks: list[tuple[float, float]] = []  # (attempt started, acknowledged)
    killed: float | None = None
    failed = 0
    stop = asyncio.Event()

    async def sender() -> None:
        nonlocal failed
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                await asyncio.wait_for(client.send(topic, body), ATTEMPT)
                acks.append((t0, time.perf_counter()))
            except (asyncio.CancelledError, KeyboardInterrupt):
                raise
            except Exception as exc:  # noqa: BLE001 (refused / timed-out attempts are what a failover costs)
                if killed is not None:
                    failed += 1
                    kinds[k := kind(exc)] += 1
                    said.setdefault(k, str(exc)[:160])
                await asyncio.sleep(0.01)

    task = asyncio.ensure_future(sender())
    try:
        await asyncio.sleep(LEAD)
        if not acks:
            raise BenchError(f"no acknowledged send in the {LEAD:g} s before the kill")
        victim, pid = await running.master_process(client, topic)
        before = len(acks)
        os.kill(pid, signal.SIGKILL)
        killed = time.perf_counter()
        # an answer the master wrote before it died may still be read after the kill: only an
        # attempt started after the kill proves that the service is back
        while not (new := [end for start, end in acks[before:] if start >= killed]):
            if time.perf_counter() - killed > GIVE_UP:
                raise BenchError(f"no acknowledgement within {GIVE_UP:g} s after SIGKILL of {victim}")
            await asyncio.sleep(0.005)
        took = new[0] - killed
    finally:
        stop.set()
        await asyncio.gather(task, return_exceptions=True)
    return took, victim, failed


def kind(exc: BaseException) -> str:
    """A failed attempt's class for the note: the exception type and, if it has one, its code."""
    code = getattr(exc, "code", None)
    if isinstance(code, int):
        with contextlib.suppress(ValueError):
            return f"{type(exc).__name__} {ResponseCode(code).name}"
        return f"{type(exc).__name__} {code}"
    return type(exc).__name__


# the table ------------------------------------------------------------------------------------
def _rate(cell: Cell | None) -> float | None:
    return None if cell is None or cell.error or not cell.msgs else cell.rate


def _p99(cell: Cell | None) -> float | None:
    if cell is None or cell.error or not cell.lat_ms:
        return None
    return cell.lat_ms.get("p99")


def _fo(cell: Cell | None) -> float | None:
    return None if cell is None or cell.error else cell.extra.get("failover_s")


def _text(w: str, cell: Cell | None, size: int) -> str:
    if cell is None:
        return "-"
    if cell.error:
        return "error"
    if w == FAILOVER:
        s = _fo(cell)
        if s is None:
            return f"n/a ({cell.note})"
        n = int(cell.extra.get("rounds", 1))
        return f"{s:.2f} s" if n <= 1 else f"{s:.2f} s (median of {n}, max {cell.extra['failover_max_s']:.2f})"
    if w == "w5":
        lat = cell.lat_ms or {}
        return f"{lat.get('p50', 0):.2f} / {lat.get('p99', 0):.2f} / {lat.get('p999', 0):.2f}"
    return f"{cell.rate:,.0f} ({cell.rate * size / 1e6:,.1f} MB/s)"


def _best(w: str, row: dict) -> tuple[str | None, float | None]:
    """The best replicated peer's figure: highest msg/s, lowest p99 or failover seconds."""
    pick = {"w5": _p99, FAILOVER: _fo}.get(w, _rate)
    vals = [(s, v) for s, c in row.items() if s != "tidemq" and (v := pick(c)) is not None]
    if not vals:
        return None, None
    lower_better = w in ("w5", FAILOVER)
    return (min if lower_better else max)(vals, key=lambda sv: sv[1])


def table(rresults: dict, results: dict, sizes: list[int], systems: list[str], lease: float) -> str:
    """Markdown table of the replicated rows. ``rresults[(w, size, "async")][system]``: replicated
    cells; ``results[(w, size, "async")]["tidemq"]``: the same run's unreplicated TideMQ cells."""
    letters = " / ".join(SYSTEMS[s][0] for s in systems)
    head = ["workload", "body", *[f"{SYSTEMS[s]} replicated" for s in systems],
            "TideMQ unreplicated (same run)", "replicated / unreplicated", "TideMQ / best replicated peer",
            f"servers' CPU s per M msgs, all replicas ({letters})", f"client CPU s per M msgs ({letters})",
            "target", "met"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 4) + "---|---|"]
    for w in (*ROWS, FAILOVER):
        for size in sizes:
            row = rresults.get((w, size, "async"))
            if row is None:
                continue
            t = row.get("tidemq")
            base = results.get((w, size, "async"), {}).get("tidemq")
            cells = [_text(w, row.get(s), size) for s in systems]
            name, best = _best(w, row)
            vs_un = vs_peer = "-"
            met: bool | None = None
            if w == FAILOVER:
                s = _fo(t)
                if s is not None and best is not None:
                    vs_peer = f"{s / best:.2f}x ({SYSTEMS[name]}; lower is better)"  # type: ignore[index]
                bound = lease + 5
                tgt = f"<= lease + 5 s = {bound:g} s (aim <= 5 s)"
                met = None if s is None else s <= bound
            elif w == "w5":
                tp, bp, up = _p99(t), best, _p99(base)
                if tp is not None and up is not None:
                    vs_un = f"p99 {tp / up:.2f}x"
                if tp is not None and bp is not None:
                    vs_peer = f"p99 {tp / bp:.2f}x ({SYSTEMS[name]})"  # type: ignore[index]
                tgt = "p99 <= best replicated peer"
                met = None if tp is None or bp is None else tp <= bp
            else:
                tr, ur = _rate(t), _rate(base)
                un = None if tr is None or ur is None else tr / ur
                peer = None if tr is None or best is None else tr / best
                if un is not None:
                    vs_un = f"{un:.2f}x"
                if peer is not None:
                    vs_peer = f"{peer:.2f}x ({SYSTEMS[name]})"  # type: ignore[index]
                if w == "w3":
                    tgt = ">= 0.5x unreplicated and >= 1x best replicated peer"
                    parts = [p for p in (None if un is None else un >= 0.5, None if peer is None else peer >= 1)
                             if p is not None]
                    met = all(parts) if parts else None
                else:
                    tgt = ">= 1x best replicated peer"
                    met = None if peer is None else peer >= 1
            cpu = " / ".join("-" if (c := row.get(s)) is None or c.error or w == FAILOVER or not c.msgs
                             else f"{c.cpu_per_million:.1f}" for s in systems)
            ccpu = " / ".join("-" if (c := row.get(s)) is None or c.error or w == FAILOVER or not c.msgs
                              else f"{c.client_cpu_per_million:.1f}" for s in systems)
            base_text = "-" if w == FAILOVER else _text(w, base, size)
            mark = "-" if met is None else ("met" if met else "**NOT MET**")
            lines.append("| " + " | ".join([LABELS[w], size_label(size), *cells, base_text, vs_un, vs_peer,
                                            cpu, ccpu, tgt, mark]) + " |")
    return "\n".join(lines)


def notes(rresults: dict, sizes: list[int], systems: list[str]) -> str:
    """Per-system notes of the failover row and of latency runs, and how each replicated
    system's server CPU splits between its master and the rest."""
    out = []
    for size in sizes:
        for s in systems:
            split = [f"{LABELS[w].split('. ', 1)[0]}: {c.extra['master_cpu'] / c.msgs * 1e6:.1f} + "
                     f"{(c.cpu - c.extra['master_cpu']) / c.msgs * 1e6:.1f}"
                     for w in ROWS if (c := rresults.get((w, size, "async"), {}).get(s)) is not None
                     and not c.error and c.msgs and "master_cpu" in c.extra]
            if split:
                first = FIRST.get(s, "master")
                out.append(f"- {SYSTEMS[s]} replicated, {size_label(size)}, servers' CPU s per M msgs, "
                           f"{first} + the others, by row: " + "; ".join(split))
    for w in (FAILOVER, "w5"):
        for size in sizes:
            row = rresults.get((w, size, "async"), {})
            parts = [f"{SYSTEMS[s]}: {c.error or c.note}" for s in systems
                     if (c := row.get(s)) is not None and (c.error or c.note)]
            if parts:
                out.append(f"- {LABELS[w]}, {size_label(size)}: " + "; ".join(parts))
    return "\n".join(out)


def write_doc(doc: Path, block: str) -> None:
    """Replace the text between BEGIN and END in ``doc`` (append a "Replicated" section when absent)."""
    text = doc.read_text()
    new = f"{BEGIN}\n{block.rstrip()}\n{END}"
    if BEGIN in text and END in text:
        text = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _m: new, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n## Replicated (issue 17)\n\n" + new + "\n"
    doc.write_text(text)

