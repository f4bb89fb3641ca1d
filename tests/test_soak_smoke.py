"""A short run of bench/soak.py (matrix row L1's CI smoke): 8 producers and 8 consumers against real
processes for 15 s; the run must account for every message (lost 0, duplicated 0, phantoms 0) and
exit 0. The 10-minute run and its numbers are in docs/reliability.md."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("psutil")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # ~15-30 s: the default suite's 15-minute budget
def test_soak_smoke_accounts_for_every_message():
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "soak.py"), "--minutes", "0.25", "--report", "5",
                        "--rate", "1500"], capture_output=True, text=True, timeout=150, cwd=ROOT)
    out = r.stdout
    assert r.returncode == 0, out[-3000:] + r.stderr[-3000:]
    m = re.search(r"accounting: sent (\d+), acknowledged (\d+), indeterminate (\d+), failed (\d+), "
                  r"consumed (\d+), lost (\d+), duplicated (\d+), phantoms (\d+)", out)
    assert m, out[-3000:]
    sent, acked, _ind, _failed, consumed, lost, dup, phantoms = map(int, m.groups())
    assert acked > 1000 and sent >= acked
    assert (lost, dup, phantoms) == (0, 0, 0)
    assert consumed >= acked
    assert re.search(r"end-to-end latency ms: p50 [\d.]+, p90", out)
    assert re.search(r"broker RSS MiB over time: [\d.]+m \d+", out)
