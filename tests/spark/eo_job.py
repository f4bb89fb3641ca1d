"""A streaming query for the exactly-once test: topic -> Parquet (file sink) with a checkpoint.

Run as a script: ``eo_job.py NAME_SERVERS TOPIC OUT CHECKPOINT (run|available-now)``. ``run``
keeps going until the process is killed; ``available-now`` drains what is there and exits 0.
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from tidemq.spark import register


def main() -> None:
    name_servers, topic, out, checkpoint, mode = sys.argv[1:6]
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (SparkSession.builder.master("local[2]").appName("tidemq-exactly-once")
             .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    df = (spark.readStream.format("tidemq").option("nameServers", name_servers)
          .option("subscribe", topic).option("startingOffsets", "earliest")
          .option("maxOffsetsPerTrigger", "150").load()
          .selectExpr("CAST(value AS STRING) AS value", "queueId", "queueOffset"))
    writer = (df.writeStream.format("parquet").option("path", out)
              .option("checkpointLocation", checkpoint))
    if mode == "available-now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="100 milliseconds")
    query = writer.start()
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
