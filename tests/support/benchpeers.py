"""bench/peers' modules for tests of the benchmarks' pure parts. bench/peers is not a package: it is
on sys.path only while importing, so its module names (limits, report) shadow nothing else in the
session."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

PEERS = str(Path(__file__).resolve().parent.parent.parent / "bench" / "peers")


def bench_peers(*names: str) -> list[ModuleType]:
    """The modules ``names`` of bench/peers, imported."""
    sys.path.insert(0, PEERS)
    try:
        return [importlib.import_module(n) for n in names]
    finally:
        sys.path.remove(PEERS)
