"""The compiled extensions' registry and build: every .pyx is a known module, every known module
is built here (CI has a C compiler), and `tidemq --version` says which build runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tidemq import compiled

ROOT = Path(__file__).resolve().parents[1]


def _pyx_modules() -> set[str]:
    sys.path.insert(0, str(ROOT))
    try:
        import setup as setup_module  # noqa: PLC0415 (setup.py's own mapping of folders to packages)
    except SystemExit:  # pragma: no cover (setup() ran without a command)
        pytest.fail("setup.py must not run setup() on import")
    finally:
        sys.path.remove(str(ROOT))
    return {ext.name for ext in setup_module._extensions()}


def test_every_pyx_file_is_a_registered_compiled_module() -> None:
    assert _pyx_modules() == set(compiled.MODULES)


@pytest.mark.skipif(compiled.DISABLED, reason="TIDEMQ_NO_EXTENSIONS is set: this run tests the pure-Python twins")
def test_every_registered_module_is_built_and_loads() -> None:
    assert compiled.active() == {name: True for name in compiled.MODULES}


def _version(**env: str) -> str:
    out = subprocess.run([sys.executable, "-m", "tidemq.cli.main", "--version"], capture_output=True,
                         text=True, env={**os.environ, **env}, timeout=60, check=True)
    return out.stdout


def test_version_names_the_build_that_runs() -> None:
    assert "pure Python (TIDEMQ_NO_EXTENSIONS is set)" in _version(TIDEMQ_NO_EXTENSIONS="1")
    expected = "compiled extensions" if compiled.MODULES else "no compiled modules"
    assert expected in _version(TIDEMQ_NO_EXTENSIONS="")
