"""bench/compare.py's output: the table, the issue's targets per row, the chart, docs/benchmarks.md.

A row is (workload, body size, flush). Throughput rows show msg/s (MB/s of bodies); the latency row
shows p50 / p99 / p99.9 in ms. "TideMQ / best peer" divides TideMQ's msg/s by the best peer's
whose durability is as strong (for latency: TideMQ's p99 over the best peer p99, lower is better).
A peer marked ``*`` ran with weaker durability than the row names and is left out of the ratio.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

WORKLOADS = {
    "w1": "1. sync send, 1 in flight",
    "w2": "2. 256 sends in flight",
    "w3": "3. batches of 64, 4 in flight",
    "w4": "4. consume the backlog",
    "w5": "5. e2e latency at 5,000 msg/s",
    "w6": "6. fan-out, 4 groups",
}
SYSTEMS = {"tidemq": "TideMQ", "redis": "Redis", "nats": "NATS"}
BEGIN = "<!-- bench/compare.py results: begin (replaced by --write) -->"
END = "<!-- bench/compare.py results: end -->"


def size_label(size: int) -> str:
    return f"{size // 1024} KiB" if size % 1024 == 0 else f"{size} B"


def num(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.0f}"


def cell_text(w: str, cell, size: int, weaker: bool) -> str:  # noqa: ANN001 (peerbase.Cell)
    if cell is None:
        return "-"
    if cell.error:
        return "error"
    star = "\\*" if weaker else ""
    if w == "w5":
        lat = cell.lat_ms or {}
        return f"{lat.get('p50', 0):.2f} / {lat.get('p99', 0):.2f} / {lat.get('p999', 0):.2f}{star}"
    return f"{num(cell.rate)} ({cell.rate * size / 1e6:,.1f} MB/s){star}"


def best_peer(w: str, row: dict, weaker: set[str]):  # noqa: ANN201
    """(system, cell) of the best peer of equal durability, or (None, None)."""
    peers = [(s, c) for s, c in row.items()
             if s != "tidemq" and s not in weaker and c is not None and not c.error and c.msgs]
    if not peers:
        return None, None
    if w == "w5":
        return min(peers, key=lambda sc: (sc[1].lat_ms or {}).get("p99", math.inf))
    return max(peers, key=lambda sc: sc[1].rate)


def ratio(w: str, row: dict, weaker: set[str]) -> float | None:
    t = row.get("tidemq")
    _name, best = best_peer(w, row, weaker)
    if t is None or t.error or best is None or not t.msgs:
        return None
    if w == "w5":
        return (t.lat_ms or {}).get("p99", math.nan) / (best.lat_ms or {}).get("p99", math.nan)
    return t.rate / best.rate if best.rate else None


def target(w: str, size: int, flush: str, row: dict, weaker: set[str],
           results: dict, lim: dict[str, float] | None = None) -> tuple[str, bool | None]:
    """Issue 19's target for this row and whether this run met it (None: cannot be judged).

    Throughput and ratio targets apply to both durability levels; the broker-CPU-per-message
    targets (one-in-flight send <= 40 us, batched <= 3 us, pulled <= 0.7 us) to the ASYNC rows,
    where the broker's own work is what the figure measures (SYNC adds the fdatasync).
    """
    t = row.get("tidemq")
    r = ratio(w, row, weaker)
    if t is None or t.error:
        return "-", None
    rate = t.rate
    cpu_us = t.cpu_per_million  # CPU seconds per million messages = microseconds per message

    def both(*oks: bool | None) -> bool | None:
        parts = [p for p in oks if p is not None]
        return all(parts) if parts else None

    def rel(k: float) -> bool | None:
        return None if r is None else r >= k

    def cpu(limit: float) -> tuple[str, bool | None]:
        if flush != "async" or not t.msgs:
            return "", None
        return f"; broker CPU <= {limit:g} us/msg", cpu_us <= limit

    if w == "w1":
        echo = (lim or {}).get("one")
        echo_ok = None if not echo else rate >= 0.75 * echo
        ctext, cok = cpu(40)
        return f">= 1.5x best peer; >= 0.75 of echo 1 in flight{ctext}", both(rel(1.5), echo_ok, cok)
    if w == "w2":
        return ">= 150,000 msg/s and >= 2x", both(rate >= 150_000, rel(2))
    if w == "w3":
        ctext, cok = cpu(3)
        if flush == "sync":
            a = results.get(("w3", size, "async"), {}).get("tidemq")
            if a is None or a.error or not a.msgs:
                return ">= 300,000 msg/s and >= 3x; >= 0.5x ASYNC (needs --flush both)", both(rate >= 300_000, rel(3))
            half = rate >= 0.5 * a.rate
            return (f">= 300,000 msg/s and >= 3x; >= 0.5x ASYNC ({rate / a.rate:.2f}x)",
                    both(rate >= 300_000, half, rel(3)))
        return f">= 300,000 msg/s and >= 3x{ctext}", both(rate >= 300_000, rel(3), cok)
    if w == "w4":
        ctext, cok = cpu(0.7)
        return f">= 500,000 msg/s and >= 3x{ctext}", both(rate >= 500_000, rel(3), cok)
    if w == "w5":
        limit = 1.0 if flush == "async" else 1.5
        p99 = (t.lat_ms or {}).get("p99", math.inf)
        return f"p99 <= {limit:g} ms and <= best peer", both(p99 <= limit, None if r is None else r <= 1)
    return "none (context)", None


def table(results: dict, sizes: list[int], flushes: list[str], systems: list[str],
          weaker: dict[str, set[str]], limits: dict[int, dict[str, float]]) -> str:
    head = ["workload", "body", "flush", *[SYSTEMS[s] for s in systems], "TideMQ / best peer",
            "TideMQ / local limit", "TideMQ cores busy (broker / client)", "broker CPU s per M msgs (" + " / ".join(SYSTEMS[s][0] for s in systems) + ")",
            "client CPU s per M msgs (" + " / ".join(SYSTEMS[s][0] for s in systems) + ")",
            "broker peak RSS MiB (" + " / ".join(SYSTEMS[s][0] for s in systems) + ")", "target", "met"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 3 + "---:|" * (len(head) - 5) + "---|---|"]
    for w in WORKLOADS:
        for size in sizes:
            for flush in flushes:
                row = results.get((w, size, flush))
                if row is None:
                    continue
                wk = weaker.get(flush, set())
                cells = [cell_text(w, row.get(s), size, s in wk) for s in systems]
                r = ratio(w, row, wk)
                bname, _b = best_peer(w, row, wk)
                rtext = "-" if r is None else (f"p99 {r:.2f}x ({SYSTEMS[bname]})" if w == "w5"
                                               else f"{r:.2f}x ({SYSTEMS[bname]})")
                lim = limit_text(w, row.get("tidemq"), limits.get(size, {}))
                cpu = " / ".join("-" if row.get(s) is None or row[s].error else f"{row[s].cpu_per_million:.1f}"
                                 for s in systems)
                t = row.get("tidemq")
                busy = ("-" if t is None or t.error or not t.seconds else
                        f"{t.cpu / t.seconds:.2f} / {t.client_cpu / t.seconds:.2f}")
                ccpu = " / ".join("-" if row.get(s) is None or row[s].error else f"{row[s].client_cpu_per_million:.1f}"
                                  for s in systems)
                rss = " / ".join("-" if row.get(s) is None or row[s].error else
                                 f"{row[s].hwm_mib:,.0f}" + ("" if row[s].peak_reset else "+")
                                 for s in systems)
                tgt, met = target(w, size, flush, row, wk, results, limits.get(size))
                mark = "-" if met is None else ("met" if met else "**NOT MET**")
                lines.append("| " + " | ".join([WORKLOADS[w], size_label(size), flush, *cells, rtext, lim,
                                                busy, cpu, ccpu, rss, tgt, mark]) + " |")
    return "\n".join(lines)


def latency_notes(results: dict, sizes: list[int], flushes: list[str], systems: list[str]) -> str:
    """Per-run p99 of workload 5 (the table shows each percentile's median over the runs)."""
    lines = []
    for size in sizes:
        for flush in flushes:
            row = results.get(("w5", size, flush), {})
            parts = [f"{SYSTEMS[s]} {row[s].note}" for s in systems
                     if row.get(s) is not None and not row[s].error and row[s].note]
            if parts:
                lines.append(f"- {size_label(size)}, {flush}: " + "; ".join(parts))
    return ("Row 5, each run (the table shows the median of each percentile):\n\n" + "\n".join(lines)) if lines else ""


def limit_text(w: str, t, lim: dict[str, float]) -> str:  # noqa: ANN001
    if t is None or t.error or not lim or not t.msgs:
        return "-"
    if w == "w1":
        return f"{t.rate / lim['one']:.2f} of echo 1 in flight"
    if w == "w5":
        return f"p50 {(t.lat_ms or {}).get('p50', 0) / lim['p50_ms']:.1f}x echo RTT"
    if w == "w3":
        return f"{t.rate / lim['mmap']:.2f} of mmap append"
    return f"{t.rate / lim['pipelined']:.2f} of echo 256 pipelined"


def limits_table(limits: dict[int, dict[str, float]]) -> str:
    sizes = sorted(limits)
    lines = ["| local limit (same run, one core) | " + " | ".join(size_label(s) for s in sizes) + " |",
             "|---|" + "---:|" * len(sizes)]
    rows = [
        ("raw mmap append (preallocated file, header + CRC32), records/s", "mmap", True),
        ("asyncio echo over loopback, 1 in flight, round trips/s", "one", True),
        ("same, round-trip p50 / p99 (ms)", "lat", False),
        ("asyncio echo, 256 frames pipelined, frames/s", "pipelined", True),
    ]
    for label, key, mb in rows:
        vals = []
        for s in sizes:
            d = limits[s]
            if key == "lat":
                vals.append(f"{d['p50_ms']:.3f} / {d['p99_ms']:.3f}")
            else:
                vals.append(f"{num(d[key])} ({d[key] * s / 1e6:,.0f} MB/s)" if mb else num(d[key]))
        lines.append(f"| {label} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def rss_table(rss: dict, systems: list[str]) -> str:
    """Anonymous RSS of each broker with half and all of the backlog loaded."""
    lines = ["| body | flush | " + " | ".join(f"{SYSTEMS[s]} anon RSS MiB, 1/2 -> full backlog" for s in systems)
             + " | TideMQ independent of the backlog? |",
             "|---|---|" + "---:|" * len(systems) + "---|"]
    keys = sorted({(size, flush) for (size, flush, _s) in rss})
    for size, flush in keys:
        cells, verdict = [], "-"
        for s in systems:
            v = rss.get((size, flush, s))
            cells.append("-" if v is None else f"{v[0]:,.0f} -> {v[1]:,.0f}")
            if s == "tidemq" and v is not None:
                grew = v[1] - v[0]
                half_bytes = v[2] / 1024 / 1024  # MiB of bodies loaded in the second half
                ok = grew <= max(16.0, 0.05 * half_bytes)
                verdict = ("met" if ok else "**NOT MET**") + f" ({grew:+,.0f} MiB for {half_bytes:,.0f} MiB more data)"
        lines.append(f"| {size_label(size)} | {flush} | " + " | ".join(cells) + f" | {verdict} |")
    return "\n".join(lines)


def chart(results: dict, sizes: list[int], flushes: list[str], systems: list[str], path: Path,
          title: str) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    colors = {"tidemq": "#1f77b4", "redis": "#d62728", "nats": "#2ca02c"}
    thr = [w for w in WORKLOADS if w != "w5"]
    groups = [(w, s, f) for w in thr for s in sizes for f in flushes if (w, s, f) in results]
    lat = [("w5", s, f) for s in sizes for f in flushes if ("w5", s, f) in results]
    fig, axes = plt.subplots(2, 1, figsize=(max(10, 0.75 * len(groups) + 3), 10),
                             gridspec_kw={"height_ratios": [3, 2]})
    width = 0.8 / len(systems)
    for ax, rows, metric in ((axes[0], groups, "rate"), (axes[1], lat, "p99")):
        for i, sys_ in enumerate(systems):
            xs, ys = [], []
            for j, key in enumerate(rows):
                c = results[key].get(sys_)
                if c is None or c.error or not c.msgs:
                    continue
                xs.append(j + (i - (len(systems) - 1) / 2) * width)
                ys.append(c.rate if metric == "rate" else (c.lat_ms or {}).get("p99", math.nan))
            ax.bar(xs, ys, width, label=SYSTEMS[sys_], color=colors[sys_])
        ax.set_yscale("log")
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([f"{WORKLOADS[w].split('. ', 1)[1]}\n{size_label(s)}, {f}" for w, s, f in rows],
                           fontsize=7, rotation=0 if metric == "p99" else 60, ha="center" if metric == "p99" else "right")
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("msg/s (log)")
    axes[0].set_title(title, fontsize=10)
    axes[1].set_ylabel("end-to-end p99 ms at 5,000 msg/s (log, lower is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_doc(doc: Path, block: str) -> None:
    """Replace the text between BEGIN and END in ``doc`` (append a section when absent)."""
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    new = f"{BEGIN}\n{block.rstrip()}\n{END}"
    if BEGIN in text and END in text:
        text = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _m: new, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n## bench/compare.py: TideMQ vs Redis Streams vs NATS JetStream\n\n" + new + "\n"
    doc.write_text(text)
