"""`python3 dev.py test` runs the codec, store and client tests on the pure-Python build too
(issue 19): the list names folders and files that exist, the run sets TIDEMQ_NO_EXTENSIONS=1, and
test() runs it after the default suite and before the slow set."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _dev():
    spec = importlib.util.spec_from_file_location("tidemq_dev_pure", ROOT / "dev.py")
    assert spec is not None and spec.loader is not None
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    return dev


def test_the_pure_python_run_names_existing_tests():
    dev = _dev()
    assert {"tests/remoting", "tests/client", "tests/broker/store"} <= set(dev.PURE_PYTHON_TESTS)
    for path in dev.PURE_PYTHON_TESTS:
        assert (ROOT / path).exists(), path
    assert (ROOT / dev.PURE_PYTHON_SKIP.split("::")[0]).exists()


def test_test_runs_it_between_the_default_suite_and_the_slow_set():
    tree = ast.parse((ROOT / "dev.py").read_text(encoding="utf-8"))
    fns = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    source = ast.unparse(fns["run_pure_python"])
    assert "'TIDEMQ_NO_EXTENSIONS': '1'" in source and "'not slow'" in source
    body = ast.unparse(fns["test"])
    assert body.index("'--durations=25'") < body.index("run_pure_python(env)") < body.index("'slow and not e2e'")
