"""TideMQDataSource: the ``tidemq`` format and the factories Spark calls on the driver.

The read schema is fixed (shaped like Spark's Kafka source, see :mod:`tidemq.spark.arrow`); a
user-supplied schema is refused. Options are parsed by :mod:`tidemq.spark.options` before anything
connects, so a typo fails the query at once with a sentence naming the option.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from tidemq.spark import FORMAT


class TideMQDataSource(DataSource):
    """``spark.read[Stream].format("tidemq")`` and ``df.write[Stream].format("tidemq")``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        from tidemq.spark.arrow import spark_schema
        from tidemq.spark.options import _Opts, SOURCE_OPTIONS
        opts = _Opts(self.options, SOURCE_OPTIONS, "source")
        return spark_schema(opts.bool("includeproperties", "includeProperties", False))

    def reader(self, schema: StructType) -> DataSourceReader:
        from tidemq.spark.reader import BatchReader
        from tidemq.spark.options import parse_source_options
        opts = parse_source_options(self.options, streaming=False)
        _check_schema(schema, opts.include_properties)
        return BatchReader(opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from tidemq.spark.options import parse_source_options
        from tidemq.spark.stream import StreamReader
        opts = parse_source_options(self.options, streaming=True)
        _check_schema(schema, opts.include_properties)
        return StreamReader(opts)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from tidemq.spark.options import parse_sink_options
        from tidemq.spark.sink import BatchWriter
        return BatchWriter(parse_sink_options(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from tidemq.spark.options import parse_sink_options
        from tidemq.spark.sink import StreamWriter
        return StreamWriter(parse_sink_options(self.options), schema, overwrite)


def _check_schema(schema: StructType, include_properties: bool) -> None:
    from tidemq.spark.arrow import spark_schema
    from tidemq.spark.options import SparkOptionError
    expected = spark_schema(include_properties)
    if [f.name for f in schema.fields] != [f.name for f in expected.fields]:
        raise SparkOptionError(
            "the tidemq source has a fixed schema and does not take a user-specified one "
            f"(.schema(...)); it reads {expected.simpleString()}")
