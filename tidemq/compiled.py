"""Which hot paths run compiled: the optional Cython extensions and their pure-Python twins.

Each compiled module (``*_c``, built from a ``.pyx`` file by setup.py) has a pure-Python twin that
is the reference: same functions, same results, byte for byte (the differential tests prove it).
A module that wants the compiled version asks :func:`load` at import time and falls back to its
twin when it gets None. ``TIDEMQ_NO_EXTENSIONS=1`` in the environment (read once, at first import)
selects the pure-Python modules everywhere, as aiokafka's ``AIOKAFKA_NO_EXTENSIONS`` does;
``tidemq --version`` reports which build runs (:func:`summary`).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

#: every compiled module of the project; a module listed here but not importable runs its twin
MODULES: tuple[str, ...] = (
    "tidemq._message_c",
    "tidemq.broker.store._dispatch_c",
    "tidemq.broker.store._reader_c",
    "tidemq.broker.store._scan_c",
    "tidemq.broker.store._writer_c",
    "tidemq.remoting._frame_c",
    "tidemq.remoting.headers._headers_c",
    "tidemq.spark._arrow_c",
)

DISABLED = os.environ.get("TIDEMQ_NO_EXTENSIONS", "") not in ("", "0")

_loaded: dict[str, ModuleType | None] = {}
_errors: dict[str, str] = {}


def load(name: str) -> ModuleType | None:
    """The compiled module ``name``, or None (disabled, not built, or built for another Python)."""
    if name in _loaded:
        return _loaded[name]
    module = None
    if not DISABLED:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            _errors[name] = str(exc)
    _loaded[name] = module
    return module


def active() -> dict[str, bool]:
    """Each known compiled module and whether it runs (importing it if not yet asked for)."""
    return {name: load(name) is not None for name in MODULES}


def summary() -> str:
    """One line for ``tidemq --version``: which build runs, and why when it is not compiled."""
    if DISABLED:
        return "pure Python (TIDEMQ_NO_EXTENSIONS is set)"
    state = active()
    if not state:
        return "pure Python (no compiled modules in this version)"
    done = sum(state.values())
    if done == len(state):
        return f"compiled extensions ({done} modules)"
    missing = sorted(n for n, ok in state.items() if not ok)
    if not done:
        return ("pure Python (the compiled extensions are not built: reinstall with a C compiler, "
                "e.g. `pip install --force-reinstall --no-deps tidemq`)")
    return f"partly compiled ({done} of {len(state)} modules; pure Python: {', '.join(missing)})"
