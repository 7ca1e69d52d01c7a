"""A streaming query into llog, run as its own process so a test can kill it (driver, JVM and
Python workers at once) at a failpoint and run it again from the same checkpoint.

The input is ``rate-micro-batch``: batch ``b`` holds values ``b*R .. b*R+R-1``, the same on a
replay. Each value goes to partition ``value % partitions``. The query runs until ``--batches``
batches are done. Settings come from LLOG_* variables.
"""

from __future__ import annotations

import argparse
import time

from pyspark.sql import functions as F

from llog.config import Config
from jobs.local_spark import local_spark


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--topic", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--batches", type=int, default=3)
    args = parser.parse_args()
    spark = local_spark("llog-sink-query")
    options = {k.lower(): v for k, v in Config.load().to_options().items()}
    query = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", args.rows)
             .option("startTimestamp", 0).option("numPartitions", 2).load()
             .select(F.col("value").cast("string").alias("value"),
                     (F.col("value") % args.partitions).cast("int").alias("partition"))
             .writeStream.format("llog").options(**options).option("topic", args.topic)
             .option("checkpointLocation", args.checkpoint).trigger(processingTime="0 seconds").start())
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        progress = query.lastProgress
        if query.exception() is not None:
            raise query.exception()
        if progress and progress["batchId"] >= args.batches - 1:
            break
        time.sleep(0.2)
    query.stop()
    spark.stop()


if __name__ == "__main__":
    main()
