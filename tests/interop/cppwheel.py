"""Shared by the C++-client interop tests: skip a module where the `rocketmq` wheel (RocketMQ
C++ client) cannot load, and run one scenario script in its own process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

RESULT_MARKER = "@@RESULT@@"


def _wheel_problem() -> str | None:
    r = subprocess.run([sys.executable, "-c", "import rocketmq.client"], capture_output=True, text=True)
    if r.returncode != 0:
        return r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "import failed"
    return None


def skip_module_without_wheel() -> None:
    problem = _wheel_problem()
    if problem:
        pytest.skip(f"the RocketMQ C++ client wheel cannot load here ({problem}); it needs Linux x86_64",
                    allow_module_level=True)


def run_scenario(script: Path, scenario: str, args: dict, timeout: float = 90) -> dict:
    """Run ``scenario`` of ``script`` with ``args`` (JSON on stdin); return its JSON result."""
    r = subprocess.run([sys.executable, str(script), scenario], input=json.dumps(args),
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0 or RESULT_MARKER not in r.stdout:
        raise AssertionError(f"C++ scenario {scenario} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.rsplit(RESULT_MARKER, 1)[1])
