"""Spark's Python workers run the same decoder twin as the driver (issue 19): the compiled one
(tidemq.spark._arrow_c, found through the editable install like the rest of tidemq) when the
driver has it, the pure-Python one in a ``TIDEMQ_NO_EXTENSIONS=1`` run (the workers inherit the
environment)."""

from __future__ import annotations

from tidemq.spark import arrow


def test_python_workers_decode_with_the_drivers_twin(spark):
    def probe(_rows):
        from tidemq.spark import arrow as worker_arrow  # noqa: PLC0415 (runs in the worker)
        c = worker_arrow._c
        yield (c is not None, getattr(c, "__file__", ""), worker_arrow.collect is getattr(c, "collect", None))

    [(compiled, path, chosen)] = spark.sparkContext.parallelize([0], 1).mapPartitions(probe).collect()
    assert compiled == (arrow._c is not None)
    assert chosen == compiled
    if compiled:
        assert path == arrow._c.__file__
