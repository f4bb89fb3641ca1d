"""The layer rules of STYLE.md: import-linter's contracts (pyproject.toml), run as `python3 dev.py
lint` runs them (lint.py lays the packages out as installed: our folders services/broker,
services/namesrv, operator/tidemq_operator are mapped into the tidemq namespace only by the
installer, and import-linter walks folders).
"""

from __future__ import annotations

from pathlib import Path

import lint

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_folder_is_listed_in_pyproject():
    listed = {p.resolve() for p in lint.package_dirs().values()}
    for top in ("tidemq", "services", "operator", "spark"):
        for init in (ROOT / top).rglob("__init__.py"):
            assert init.parent.resolve() in listed, f"{init.parent} is a package missing from pyproject's packages"


def test_import_layers_hold(tmp_path):
    assert lint.import_contracts(tmp_path / "tree") == []
