"""Checks, on the driver, that Spark's Python workers can import the data source.

Spark runs every Python part of a data source (planning, reads, writes) in worker processes, and
pickles our classes by reference, so those workers must be able to import ``tidemq.spark``. Spark
starts them with the interpreter named by ``PYSPARK_PYTHON`` as it was when the session started
(default: ``python3`` from PATH, *not* the interpreter running the driver). A job started as
``.venv/bin/python job.py`` without the venv activated therefore runs its workers under some other
Python: ``format("tidemq")`` fails with DATA_SOURCE_NOT_FOUND (the data-source scan runs in such a
worker) and a registered source fails in the worker with "No module named 'tidemq'".

:func:`check_workers` runs a one-task probe job and raises :class:`WorkerPythonError` naming the
fix. It does not set ``PYSPARK_PYTHON`` itself: by the time a session exists, the JVM's data-source
scan has already fixed its interpreter; on a cluster the driver's interpreter path need not exist
where executors run; and a deliberate choice must not be overridden behind the user's back.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Any

from tidemq.errors import ConfigError

log = logging.getLogger(__name__)

# What a worker imports to run our source and sink (pyarrow through arrow).
WORKER_MODULES = ("tidemq.spark.source", "tidemq.spark.reader", "tidemq.spark.stream",
                  "tidemq.spark.sink", "tidemq.spark.arrow")
MAX_REASON_CHARS = 400
JOB_DESCRIPTION = "spark.job.description"  # what the Spark UI shows for the probe job


class WorkerPythonError(ConfigError):
    """Spark's Python workers cannot run the tidemq data source; the message names the fix."""


def check_workers(spark: Any) -> None:
    """Raise :class:`WorkerPythonError` when the session's Python workers cannot import the data
    source (one task on one executor; on a cluster, each executor image must have tidemq too)."""
    try:
        sc = spark.sparkContext
        python = str(sc.pythonExec)
    except Exception as exc:  # noqa: BLE001 (Spark Connect has no SparkContext: its workers are out of reach)
        log.info("not checking Spark's Python workers (no SparkContext: %s)", exc)
        return
    modules = WORKER_MODULES

    # A nested function: cloudpickle sends it by value, so the worker can run it without tidemq.
    def probe(_rows: Any) -> list[tuple[str, str]]:
        import importlib
        import sys as worker_sys
        try:
            for name in modules:
                importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 (report any import failure: ImportError, a broken pyarrow ...)
            return [(worker_sys.executable, f"{type(exc).__name__}: {exc}")]
        return [(worker_sys.executable, "")]

    description = sc.getLocalProperty(JOB_DESCRIPTION)
    sc.setLocalProperty(JOB_DESCRIPTION, "tidemq: can the Python workers import tidemq?")
    try:
        [(executable, error)] = sc.parallelize([0], 1).mapPartitions(probe).collect()
    except Exception as exc:  # noqa: BLE001 (the worker did not start: no such file, another Python ...)
        raise WorkerPythonError(_message(python, None, f"which failed to start: {_reason(exc)}")) from None
    finally:
        sc.setLocalProperty(JOB_DESCRIPTION, description)  # None removes it
    if error:
        raise WorkerPythonError(_message(python, executable, f"which cannot import tidemq: {error}"))
    log.debug("Spark's Python workers (%s) import tidemq.spark", executable)


def _message(python: str, executable: str | None, problem: str) -> str:
    where = python if executable is None or executable == python else f"{python} ({executable})"
    return (f"Spark's Python workers run {where}, {problem}. Spark starts its workers with "
            "PYSPARK_PYTHON as it is when the session starts (default: python3 from PATH). Point it "
            "at a Python that has tidemq[spark]: activate the venv, or export "
            f"PYSPARK_PYTHON={sys.executable} (this driver's Python), or set "
            "os.environ['PYSPARK_PYTHON'] = sys.executable before SparkSession.builder...getOrCreate(); "
            "spark-submit takes --conf spark.pyspark.python=... (a builder .config() of it comes too "
            "late). On a cluster, install tidemq[spark] where the executors run.")


_ERROR_LINE = re.compile(r"^\s*(?:[\w.]+\.)?(\w*(?:Error|Exception)|\[[A-Z_]+\])[: ]")
_WRAPPERS = ("Py4JJavaError", "SparkException", "PythonException")
_TELLING = ("Cannot run program", "[PYTHON_VERSION_MISMATCH]")  # Spark's own words for the usual causes


def _reason(exc: BaseException) -> str:
    """The line of a failed job's (Java and Python) text that says why, shortened."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    best = next((ln[ln.index(m):] for ln in lines for m in _TELLING if m in ln), None)
    if best is None:
        found = [ln for ln in lines if _ERROR_LINE.match(ln)
                 and not any(ln.startswith(w) or f".{w}" in ln.split(":")[0] for w in _WRAPPERS)]
        best = found[-1] if found else (lines[0] if lines else type(exc).__name__)
    best = re.sub(r"\s+", " ", best).rstrip(".")
    return best if len(best) <= MAX_REASON_CHARS else best[:MAX_REASON_CHARS - 3] + "..."


__all__ = ["WORKER_MODULES", "WorkerPythonError", "check_workers"]
