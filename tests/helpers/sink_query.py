"""A streaming query into llog, run as its own process so a test can kill it (driver, JVM and
Python workers at once) at a failpoint and run it again from the same checkpoint.

The input is ``rate-micro-batch``: batch ``b`` holds values ``b*R .. b*R+R-1``, the same on a
replay. Each value goes to partition ``value % partitions``. The query runs until ``--batches``
batches are done. Settings come from LLOG_* variables.

A replay may be cut differently from the first attempt, as Spark allows: ``--input-partitions``
(the source's tasks), ``--unkeyed`` (no partition column: rows go to a partition by task id),
``--shuffle`` (a repartition by a random column, so rows reach other tasks in another order), or
``--source-topic`` (read an llog topic instead, ``--rows`` records per batch: its splits are
re-planned from the index, which compaction may have changed between the attempts).
``--value-prefix`` changes the query's code: each value written is prefixed, so a replay's rows
truly differ from the first attempt's.
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
    parser.add_argument("--input-partitions", type=int, default=2)
    parser.add_argument("--unkeyed", action="store_true")
    parser.add_argument("--shuffle", type=int, default=0, help="repartition into this many tasks, by rand()")
    parser.add_argument("--source-topic")
    parser.add_argument("--value-prefix", default="", help="written before each value (the query's code changed)")
    args = parser.parse_args()
    spark = local_spark("llog-sink-query")
    options = {k.lower(): v for k, v in Config.load().to_options().items()}
    if args.source_topic:
        rows = (spark.readStream.format("llog").options(**options).option("topics", args.source_topic)
                .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", args.rows)
                .option("minPartitions", args.input_partitions).load()
                .select(F.col("value").cast("string").alias("value")))
    else:
        rows = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", args.rows)
                .option("startTimestamp", 0).option("numPartitions", args.input_partitions).load()
                .select(F.col("value").cast("string").alias("value")))
    if args.shuffle:
        rows = rows.repartition(args.shuffle, F.rand())
    if not args.unkeyed:
        rows = rows.withColumn("partition", (F.col("value").cast("long") % args.partitions).cast("int"))
    if args.value_prefix:
        rows = rows.withColumn("value", F.concat(F.lit(args.value_prefix), F.col("value")))
    query = (rows.writeStream.format("llog").options(**options).option("topic", args.topic)
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
