"""A local Spark session (local[2]) shared by every Spark test, with the tidemq format registered.

Starting the JVM costs ~7-10 s, so one session serves the whole test run. Python workers run the
interpreter running the tests (PYSPARK_PYTHON), which has tidemq installed.
"""

from __future__ import annotations

import os
import sys

import pytest

from tidemq.spark import register

pytest.importorskip("pyspark", reason="the Spark tests need the 'spark' extra: "
                                      "pip install -e '.[test,spark]' (python3 dev.py test does)")


def make_session(app: str = "tidemq-tests"):
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession  # noqa: PLC0415 (the spark extra: only past the importorskip)
    spark = (SparkSession.builder.master("local[2]").appName(app)
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.driver.host", "127.0.0.1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


@pytest.fixture(scope="session")
def spark():
    session = make_session()
    register(session)
    yield session
    session.stop()
