"""Build TideMQ's optional compiled extensions (Cython); everything else is in pyproject.toml.

Every ``*.pyx`` file under a package folder that pyproject.toml maps (``[tool.setuptools.package-dir]``)
becomes an extension module of that package: ``tidemq/remoting/_frame_c.pyx`` is
``tidemq.remoting._frame_c``, ``services/broker/store/_store_c.pyx`` is ``tidemq.broker.store._store_c``.
Each compiled module has a pure-Python twin that stays the reference and the fallback
(:mod:`tidemq.compiled` picks one at import time), so the extensions are optional, as aiokafka's
and msgpack's are: with ``TIDEMQ_NO_EXTENSIONS=1`` set at install time, without Cython, or when the
C compiler fails, the install goes on without them and says so.
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def _warn(msg: str) -> None:
    print(f"tidemq setup: {msg}", file=sys.stderr)


def _disabled() -> bool:
    return os.environ.get("TIDEMQ_NO_EXTENSIONS", "") not in ("", "0")


def _extensions() -> list[Extension]:
    """One Extension per .pyx file of a mapped package folder (folders scanned once, sorted)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs: dict[str, str] = config["package-dir"]
    exts = []
    for package in config["packages"]:
        # the nearest mapped ancestor gives the folder (tidemq.broker.store -> services/broker/store)
        parts = package.split(".")
        for i in range(len(parts), 0, -1):
            base = ".".join(parts[:i])
            if base in dirs:
                folder = Path(dirs[base], *parts[i:])
                break
        else:
            folder = Path(*parts)
        for pyx in sorted((ROOT / folder).glob("*.pyx")):
            exts.append(Extension(f"{package}.{pyx.stem}", [str(pyx.relative_to(ROOT))],
                                  extra_compile_args=["-O2"]))
    return exts


class OptionalBuildExt(build_ext):
    """Build each extension if possible; a failure leaves the pure-Python twin in charge."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 (no compiler at all: install the pure-Python build)
            _warn(f"compiled extensions not built ({exc}); TideMQ runs its pure-Python modules")

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001 (a compiler error: that module stays pure Python)
            _warn(f"{ext.name} not built ({exc}); its pure-Python twin runs instead")


def _ext_modules() -> list[Extension]:
    if _disabled():
        _warn("TIDEMQ_NO_EXTENSIONS is set: building no compiled extensions")
        return []
    try:
        from Cython.Build import cythonize  # noqa: PLC0415 (a build requirement, optional here)
    except ImportError:
        _warn("Cython is not installed: building no compiled extensions (pip installs it as a build "
              "requirement; with --no-build-isolation install Cython>=3.0 first)")
        return []
    exts = _extensions()
    if not exts:
        return []
    return cythonize(exts, language_level=3, quiet=True, build_dir="build/cython",
                     compiler_directives={"boundscheck": True, "wraparound": False,
                                          "cdivision": False, "embedsignature": True})


if __name__ == "__main__":  # pip's build backend runs this file as __main__; tests import _extensions
    setup(ext_modules=_ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
