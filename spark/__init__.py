"""The ``tidemq`` PySpark data source: read topics (batch and streaming) and write to them.

Use ``tidemq.spark.register(spark)`` once per session, or install the package so that the top-level
module ``pyspark_tidemq`` lets ``spark.read.format("tidemq")`` resolve on its own. The source talks
to brokers only through :mod:`tidemq.client`; executors import this package (Spark pickles our
classes by reference), so it must be installed where executors run, and Spark must start its Python
workers with an interpreter that has it (``PYSPARK_PYTHON``): :func:`register` checks that.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FORMAT", "TideMQDataSource", "register"]

FORMAT = "tidemq"


def __getattr__(name: str) -> Any:
    # pyspark is an optional extra: import it only when the data source itself is used.
    if name == "TideMQDataSource":
        from tidemq.spark.source import TideMQDataSource
        return TideMQDataSource
    raise AttributeError(name)


def register(spark: Any, check_workers: bool = True) -> None:
    """Register the ``tidemq`` format with a SparkSession.

    With ``check_workers`` (the default) a one-task job first checks that the session's Python
    workers can import tidemq, and raises :class:`~tidemq.spark.workers.WorkerPythonError` naming
    the fix (``PYSPARK_PYTHON``) when they cannot, instead of a ModuleNotFoundError from a worker
    at the first query.
    """
    from tidemq.spark.source import TideMQDataSource
    if check_workers:
        from tidemq.spark.workers import check_workers as check
        check(spark)
    spark.dataSource.register(TideMQDataSource)
