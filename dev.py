#!/usr/bin/env python3
"""Set up and run TideMQ from a fresh clone with nothing but Python 3.11+.

    python3 dev.py demo      # venv + install, then `tidemq local --demo` (Ctrl-C to stop)
    python3 dev.py test      # venv + install with test extras, then the whole test suite
    python3 dev.py setup     # venv + install with test extras only (for bench/ and manual work)

Extra arguments after the command go to `tidemq local` or pytest respectively.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("TIDEMQ_VENV", ROOT / ".venv"))
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / "python"


def say(msg: str) -> None:
    print(f"[dev.py] {msg}", flush=True)


# The repository root holds the folder `operator/` (installed as tidemq.operator). `python -m ...`
# started from the root would put the root first on sys.path, where that folder shadows the
# standard library's `operator`; PYTHONSAFEPATH (Python 3.11+) keeps the root off sys.path.
CHILD_ENV = dict(os.environ, PYTHONSAFEPATH="1")


def run(cmd: list[str], **kw) -> int:
    kw.setdefault("env", CHILD_ENV)
    return subprocess.call([str(c) for c in cmd], **kw)


def ensure_venv(extras: str) -> None:
    if sys.version_info < (3, 11):
        sys.exit(f"TideMQ needs Python 3.11 or newer; this is {sys.version.split()[0]}")
    if not PY.exists():
        say(f"creating a virtual environment in {VENV}")
        venv.EnvBuilder(with_pip=True).create(VENV)
    stamp = VENV / f".installed{extras or '-base'}"
    sources = [ROOT / "pyproject.toml"]
    if stamp.exists() and all(stamp.stat().st_mtime >= s.stat().st_mtime for s in sources):
        return
    target = f"{ROOT}[{extras}]" if extras else str(ROOT)
    say(f"installing tidemq{'[' + extras + ']' if extras else ''} and its dependencies (pip) ...")
    rc = run([PY, "-m", "pip", "install", "--disable-pip-version-check", "-q", "-e", target])
    if rc != 0:
        sys.exit(f"pip install failed (exit {rc}); check your network access to PyPI and retry")
    stamp.touch()


def demo(args: list[str]) -> int:
    ensure_venv("")
    say("starting `tidemq local --demo` (name server :9876, broker :10911, data in ./tidemq-data)")
    try:
        return run([BIN / "tidemq", "local", "--demo", *args])
    except KeyboardInterrupt:
        return 0


def test(args: list[str]) -> int:
    ensure_venv("test")
    say("running the test suite")
    rc = run([PY, "-m", "pytest", *args], cwd=ROOT)
    if rc == 5:
        say("pytest collected no tests: that is a failure, not a pass")
        return 1
    return rc


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("demo", "test", "setup"):
        print(__doc__)
        return 2
    cmd, rest = sys.argv[1], sys.argv[2:]
    if cmd == "setup":
        ensure_venv("test")
        say(f"ready: {PY}")
        return 0
    return demo(rest) if cmd == "demo" else test(rest)


if __name__ == "__main__":
    sys.exit(main())
