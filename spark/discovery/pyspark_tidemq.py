"""Lets ``spark.read.format("tidemq")`` resolve without a register call.

Spark scans the Python path for top-level modules named ``pyspark_*`` that expose ``DefaultSource``
and registers them under ``DefaultSource.name()``.
"""

from tidemq.spark.source import TideMQDataSource as DefaultSource

__all__ = ["DefaultSource"]
