"""llog through a Spark session that is not local mode, run as its own process: a Spark Connect
client (``--remote sc://...``) or a driver of a standalone cluster (``--master spark://...``).

Steps, run in the order given in one session (the last line of stdout is their results, as
JSON, by step):

``write-read``  a batch write of ``--rows`` rows (value ``i``, partition ``i % 3`` of 3), then a
                batch read of the topic: ``{"values": [...]}``.
``group-read``  an ``availableNow`` stream of the topic with consumer group ``--group`` into
                a memory table: ``{"values": [...]}`` (the group's offsets are committed).
``sink``        a streaming query from ``rate-micro-batch`` (batch ``b`` holds ``b*R ..
                b*R+R-1``) into the topic, until ``--batches`` batches are done
                (tests.helpers.sink_query, which runs local mode).

With ``--master``, each step's result also holds ``tasks_by_executor``: the tasks it ran, by
executor id (:func:`tasks_by_executor`).

Settings come from LLOG_* variables. ``--register`` calls ``pyspark_llog.register(spark)``
first, for a Spark whose own lookup misses llog.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from llog.config import Config
from jobs.local_spark import CHECKOUT

DEADLINE_S = 240


def session(args):
    from pyspark.sql import SparkSession

    if args.remote:
        return SparkSession.builder.remote(args.remote).create()
    from tests.helpers.spark_servers import LOG4J, spark_env

    # The driver's JVM and Python processes, and (through spark.executorEnv) the executors'.
    os.environ.update({k: v for k, v in spark_env().items() if k.startswith(("SPARK_", "PYSPARK_", "PYTHONPATH"))})
    return (SparkSession.builder.master(args.master).appName(f"llog-{'-'.join(args.steps)}")
            .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1").config("spark.executor.memory", "512m")
            .config("spark.driver.memory", "1g").config("spark.cores.max", "2")
            .config("spark.sql.shuffle.partitions", "2").config("spark.sql.streaming.stopTimeout", "30s")
            .config("spark.executorEnv.PYTHONPATH", str(CHECKOUT)).config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
            .config("spark.executorEnv.SPARK_LOCAL_IP", "127.0.0.1")
            .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={LOG4J}")
            # The executors start as quickly as the tests' drivers (tests/helpers/jvm_startup.py).
            .config("spark.executor.extraJavaOptions", os.environ.get("SPARK_SUBMIT_OPTS", ""))
            .getOrCreate())


def write_read(spark, options, args) -> dict:
    from pyspark.sql import functions as F

    rows = (spark.range(args.rows).select(F.col("id").cast("string").alias("value"),
                                          (F.col("id") % 3).cast("int").alias("partition")))
    rows.write.format("llog").options(**options).option("topic", args.topic).option("partitions", "3").mode("append").save()
    read = spark.read.format("llog").options(**options).option("topics", args.topic).load()
    return {"values": sorted(int(r.value) for r in read.select(F.col("value").cast("string")).collect())}


def group_read(spark, options, args) -> dict:
    from pyspark.sql import functions as F

    name = f"group_read_{os.getpid()}"
    query = (spark.readStream.format("llog").options(**options).option("topics", args.topic)
             .option("startingOffsets", "earliest").option("groupId", args.group).load()
             .select(F.col("value").cast("string").alias("value"))
             .writeStream.format("memory").queryName(name).option("checkpointLocation", args.checkpoint)
             .trigger(availableNow=True).start())
    if not query.awaitTermination(DEADLINE_S):
        query.stop()
        raise TimeoutError(f"the availableNow run did not end in {DEADLINE_S} s")
    if query.exception() is not None:
        raise query.exception()
    return {"values": sorted(int(r.value) for r in spark.table(name).collect())}


def sink(spark, options, args) -> dict:
    from pyspark.sql import functions as F

    rows = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", args.rows)
            .option("startTimestamp", 0).option("numPartitions", 2).load()
            .select(F.col("value").cast("string").alias("value"),
                    (F.col("value") % 3).cast("int").alias("partition")))
    query = (rows.writeStream.format("llog").options(**options).option("topic", args.topic)
             .option("checkpointLocation", args.checkpoint).trigger(processingTime="0 seconds").start())
    deadline = time.monotonic() + DEADLINE_S
    try:
        while True:
            if query.exception() is not None:
                raise query.exception()
            progress = query.lastProgress
            if progress and progress["batchId"] >= args.batches - 1:
                return {"batch": progress["batchId"]}
            if time.monotonic() > deadline:
                raise TimeoutError(f"batch {args.batches - 1} not done in {DEADLINE_S} s")
            time.sleep(0.2)
    finally:
        query.stop()


def tasks_by_executor(spark) -> dict[str, int]:
    """Tasks each executor of this application has finished so far, by executor id ("driver" for
    tasks run in the driver, as local mode runs them): Spark's status store, which the UI's
    executors page reads (kept with the UI off), once the listener bus has delivered every event."""
    context = spark.sparkContext._jsc.sc()
    context.listenerBus().waitUntilEmpty()
    executors = context.statusStore().executorList(False)
    return {executors.apply(i).id(): executors.apply(i).completedTasks() + executors.apply(i).failedTasks()
            for i in range(executors.size())}


STEPS = {"write-read": write_read, "group-read": group_read, "sink": sink}


def main() -> None:
    parser = argparse.ArgumentParser()
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--remote", help="a Spark Connect server, sc://host:port")
    where.add_argument("--master", help="a standalone master, spark://host:port")
    parser.add_argument("--register", action="store_true", help="pyspark_llog.register(spark) first")
    parser.add_argument("steps", nargs="+", choices=sorted(STEPS))
    parser.add_argument("--topic", required=True)
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--group")
    parser.add_argument("--checkpoint")
    args = parser.parse_args()
    spark = session(args)
    try:
        if args.register:
            import pyspark_llog

            pyspark_llog.register(spark)
        options = {k.lower(): v for k, v in Config.load().to_options().items()}
        results = {}
        for step in args.steps:
            before = tasks_by_executor(spark) if args.master else {}
            results[step] = STEPS[step](spark, options, args)
            if args.master:
                after = tasks_by_executor(spark)
                results[step]["tasks_by_executor"] = {e: n - before.get(e, 0) for e, n in after.items()
                                                      if n > before.get(e, 0)}
    finally:
        spark.stop()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
