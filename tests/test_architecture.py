"""The layer rules of STYLE.md, checked with import-linter on a staged copy of the package.

import-linter walks packages on disk, and our folders (services/broker, services/namesrv) are
mapped into the tidemq namespace only by the installer; so the test lays the tree out as it is
installed, then runs the contracts from pyproject.toml against it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _package_dirs() -> dict[str, Path]:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping = cfg["package-dir"]
    out = {}
    for pkg in cfg["packages"]:
        base = max((k for k in mapping if pkg == k or pkg.startswith(k + ".")), key=len)
        rel = pkg[len(base):].lstrip(".").replace(".", "/")
        out[pkg] = ROOT / mapping[base] / rel
    return out


def test_every_package_folder_is_listed_in_pyproject():
    listed = {p.resolve() for p in _package_dirs().values()}
    for top in ("tidemq", "services", "operator"):
        for init in (ROOT / top).rglob("__init__.py"):
            assert init.parent.resolve() in listed, f"{init.parent} is a package missing from pyproject's packages"


def test_import_layers_hold(tmp_path):
    for pkg, src in _package_dirs().items():
        dest = tmp_path.joinpath(*pkg.split("."))
        dest.mkdir(parents=True, exist_ok=True)
        for f in src.glob("*.py"):
            shutil.copy(f, dest / f.name)
    lint = Path(sys.executable).with_name("lint-imports")
    r = subprocess.run(
        [str(lint), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=tmp_path, capture_output=True, text=True, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "KEPT" in r.stdout
