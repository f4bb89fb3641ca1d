"""``kopf run -m tidemq.operator`` (the command the docs name) finds the handlers: importing the
package in a fresh interpreter registers them into kopf's default registry; the pure modules
import without registering anything twice."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("kopf")

PROBE = r"""
import json, kopf, tidemq.operator
reg = kopf.get_default_registry()
# kopf 1.45 keeps one registry per handler family; each handler has a Selector
# (group, version, any_name = the plural given to the decorator).
out = {}
for family in ("_changing", "_spawning", "_indexing"):
    for h in getattr(reg, family).get_all_handlers():
        key = f"{h.selector.group}/{h.selector.any_name}"
        out.setdefault(key, []).append(family)
activities = [h.id for h in reg._activities.get_all_handlers()]
print(json.dumps({"resources": out, "activities": activities}))
"""


def test_importing_the_package_registers_the_handlers_in_kopfs_default_registry():
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    res = found["resources"]
    for plural in ("clusters", "topics", "consumergroups"):
        assert "_changing" in res.get(f"tidemq.io/{plural}", []), (plural, res)
        assert "_spawning" in res[f"tidemq.io/{plural}"], (plural, res)  # the timers
    assert "_indexing" in res["tidemq.io/clusters"]  # cluster_index, used by Topic/Group handlers
    assert any("login" in a for a in found["activities"])
    assert any("configure" in a for a in found["activities"])


def test_pure_modules_import_without_kopf():
    probe = ("import sys; sys.modules['kopf'] = None  # import kopf now raises ImportError\n"
             "import tidemq.operator, tidemq.operator.workloads, tidemq.operator.rollout\n"
             "print(hasattr(tidemq.operator, 'handlers'))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"
