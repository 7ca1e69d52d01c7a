"""``make demo``: stream records through llog on the local stack and print what happened.

Writes several batches to several topic-partitions through the core writer (each batch one
shared WAL blob), reads everything back through the core reader, checks it; then streams
generated events through ``writeStream.format("llog")`` (Spark, local mode) into topic
``events``, and runs the llog -> Delta job (``jobs/llog_to_delta.py``, ``availableNow``, consumer
group ``llog-demo-to-delta``) on those events into a Delta table under ``.cache/demo``, and
prints the table and the group's lag. The stack keeps running afterwards (``llog stack down``
stops it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import threading
import time
import uuid

from llog.config import Config, llog_home
from llog.describe import describe_topic, format_descriptions
from llog.discovery import topic_partitions
from llog.topics import create_topic
from llog.keys import shared_wal_prefix
from llog.reader import LogReader, ReadRequest
from llog.writer import AppendGroup, LogWriter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", default="orders,payments")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--records", type=int, default=1000, help="records per partition per batch")
    args = parser.parse_args(argv)
    topics = args.topics.split(",")
    config = Config.load()
    run = uuid.uuid4().hex[:8]

    started = time.perf_counter()
    with LogWriter(config, auto_initialize=True) as writer, LogReader(config) as reader:
        for t in topics:  # as `llog topics create T --partitions N --if-not-exists` (docs/topics.md)
            create_topic(writer.coordination, config.root_prefix, t, args.partitions, if_not_exists=True)
        first_hw = {(t, p): reader.high_watermark(t, p) if _initialized(reader, t, p) else 0
                    for t in topics for p in range(args.partitions)}
        blobs_before = sum(1 for _ in writer.objects.list(shared_wal_prefix(config.root_prefix)))
        written: dict[tuple[str, int], list[bytes]] = {}
        for batch in range(args.batches):
            groups = []
            for t in topics:
                for p in range(args.partitions):
                    values = [f'{{"run":"{run}","topic":"{t}","partition":{p},"batch":{batch},"seq":{i}}}'.encode()
                              for i in range(args.records)]
                    written.setdefault((t, p), []).extend(values)
                    groups.append(AppendGroup(t, p, values))
            results = writer.append_shared(groups)
            print(f"batch {batch}: 1 blob, {len(results)} partitions, "
                  + ", ".join(f"{r.topic}[{r.partition}]@{r.start_offset}..{r.end_offset}" for r in results[:3])
                  + (", ..." if len(results) > 3 else ""))
        write_s = time.perf_counter() - started

        read_started = time.perf_counter()
        requests = [ReadRequest(t, p, first_hw[(t, p)] + 1) for (t, p) in written]
        results = reader.read_batches(requests)
        read_s = time.perf_counter() - read_started
        for result in results:
            got = result.table().column("value").to_pylist()
            if got != written[(result.topic, result.partition)]:
                print(f"MISMATCH in {result.topic}[{result.partition}]", file=sys.stderr)
                return 1
        blobs_after = sum(1 for _ in writer.objects.list(shared_wal_prefix(config.root_prefix)))

        total = sum(len(v) for v in written.values())
        print()
        print(f"wrote {total:,} records to {len(written)} topic-partitions in {args.batches} shared WAL blobs "
              f"({write_s:.2f}s), read them all back in {read_s:.2f}s: every record matches")
        print(f"S3: {blobs_after - blobs_before} new objects under s3://{config.s3_bucket}/"
              f"{shared_wal_prefix(config.root_prefix)} ({blobs_after} in all)")
        for t in topics:
            print()
            print(format_descriptions(t, describe_topic(writer.coordination, config.root_prefix, t)))
    print()
    spark = start_spark()
    try:
        before, after = stream_through_spark(spark, config, args.partitions)
        print()
        complete = events_to_delta(spark, config, before, after)
    finally:
        spark.stop()
    if not complete:
        return 1
    print()
    print(f"done in {time.perf_counter() - started:.2f}s. The local stack is still running: "
          "`llog stack status` shows it, `llog stack down` (or `make stack-down`) stops it.")
    return 0


#: What Spark's JVM prints while it starts that says nothing about the demo: Ivy's report on
#: the Delta jars (cached in .cache/ivy after the first run) and Spark's banner.
_SPARK_NOISE = re.compile(
    r"^(:: |WARNING: Using incubator modules|Ivy Default Cache set to|The jars for the packages stored in"
    r"|Using Spark's default log4j profile|Setting default log level to|To adjust logging level use)"
    r"|^\s+(confs: |found \S+ in |\S+#\S+ from \S+ in \[|\S+#\S+ by \[|-{10}|\||:: (modules in use|evicted modules)"
    r"|\d+ artifacts copied)"
    r"|^\s*$|\[SUCCESSFUL \]|added as a dependency$|WARN NativeCodeLoader"
    r"|You probably access the destination server through a proxy")


def start_spark():
    """The demo's SparkSession (local mode, with Delta). The JVM's output goes through a filter
    that drops :data:`_SPARK_NOISE`; everything else (warnings, errors, the llog sink's and
    source's lines from Spark's Python workers) still reaches stderr."""
    from jobs.local_spark import local_spark

    print("starting Spark (local mode) with Delta (the first run downloads the Delta jars into .cache/ivy) ...")
    real_stderr = os.fdopen(os.dup(2), "wb", buffering=0)
    read_fd, write_fd = os.pipe()

    def forward() -> None:
        with os.fdopen(read_fd, "rb") as pipe:
            for line in pipe:
                if not _SPARK_NOISE.search(line.decode(errors="replace").rstrip("\n")):
                    real_stderr.write(line)

    threading.Thread(target=forward, name="spark-output", daemon=True).start()
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    os.dup2(write_fd, 1)  # the JVM started now inherits these two
    os.dup2(write_fd, 2)
    try:
        spark = local_spark("llog-demo", delta=True)
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, write_fd):
            os.close(fd)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def stream_through_spark(spark, config: Config, partitions: int, batches: int = 3, rows: int = 20_000
                         ) -> tuple[dict[int, int], dict[int, int]]:
    """A streaming query from Spark's ``rate-micro-batch`` source into topic ``events``; the
    high watermark of each partition before and after."""
    import tempfile

    from pyspark.sql import functions as F

    from jobs.local_spark import wait_for_running_tasks

    print(f"streaming {batches} micro-batches of {rows:,} events through writeStream.format('llog') ...")
    started = time.perf_counter()
    with LogReader(config) as reader, tempfile.TemporaryDirectory(prefix="llog-demo-ck-") as checkpoint:
        before = _high_watermarks(reader, config, "events", partitions)
        events = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", rows)
                  .option("startTimestamp", int(time.time() * 1000)).load()  # event times of today, not 1970
                  .select(F.to_json(F.struct(F.col("value").alias("seq"), F.col("timestamp").cast("string").alias("ts")))
                          .alias("value")))
        query = (events.writeStream.format("llog").option("topic", "events").option("partitions", partitions)
                 .option("checkpointLocation", checkpoint).trigger(processingTime="0 seconds").start())
        while not query.recentProgress or query.recentProgress[-1]["batchId"] < batches - 1:
            if query.exception() is not None:
                raise query.exception()
            time.sleep(0.2)
        spark.sparkContext.setLogLevel("OFF")  # stopping cancels the batch in flight, which Spark logs as errors
        query.stop()
        wait_for_running_tasks(spark)
        spark.sparkContext.setLogLevel("ERROR")
        for progress in query.recentProgress:
            print(f"  batch {progress['batchId']}: {progress['numInputRows']:,} rows in "
                  f"{progress['durationMs'].get('triggerExecution', 0) / 1000:.2f}s")
        after = _high_watermarks(reader, config, "events", partitions)
    print(f"events: {sum(after.values()) - sum(before.values()):,} records committed in "
          f"{time.perf_counter() - started:.1f}s; offsets per partition: "
          + ", ".join(f"events[{p}] {before.get(p, 0) + 1}..{hw}" if hw > before.get(p, 0) else f"events[{p}] -"
                      for p, hw in sorted(after.items())))
    return before, after


def events_to_delta(spark, config: Config, before: dict[int, int], after: dict[int, int],
                    group: str = "llog-demo-to-delta", max_per_batch: int = 30_000) -> bool:
    """The llog -> Delta job on the events just streamed (from the offsets they start at),
    ``availableNow``, into a fresh Delta table under ``.cache/demo`` (``$LLOG_HOME/demo``);
    then the table and the group's lag. False if the table does not hold every event."""
    from jobs.llog_to_delta import Job, describe_batches, group_lag, run

    workdir = llog_home() / "demo"
    table, checkpoint = workdir / "events-delta", workdir / "events-delta-checkpoint"
    for path in (table, checkpoint):
        shutil.rmtree(path, ignore_errors=True)
    starting = {"events": {str(p): before.get(p, 0) + 1 for p in sorted(after)}}  # every partition of the topic
    job = Job(table=str(table), checkpoint=str(checkpoint), topics=("events",), starting_offsets=json.dumps(starting),
              max_offsets_per_trigger=max_per_batch, group_id=group)
    print(f"llog -> Delta: readStream.format('llog') from those offsets, availableNow, at most {max_per_batch:,} "
          f"records per batch, group {group!r} ...")
    started = time.perf_counter()
    progress = run(spark, job, config)
    for line in describe_batches(progress):
        print(f"  {line}")
    df = spark.read.format("delta").load(str(table))
    rows, streamed = df.count(), sum(hw - before.get(p, 0) for p, hw in after.items())
    print(f"Delta table {table}: {rows:,} rows in {time.perf_counter() - started:.1f}s "
          + ("(every event streamed above)" if rows == streamed else f"(MISMATCH: {streamed:,} events were streamed)"))
    sample = (df.orderBy("partition", "offset").limit(5)
              .selectExpr("topic", "partition", "offset", "CAST(value AS STRING) AS value", "timestamp").collect())
    print("  " + "\n  ".join(f"{r.topic}[{r.partition}]@{r.offset}  {r.value}  {r.timestamp}" for r in sample))
    print()
    print(group_lag(config, group, ["events"]))
    return rows == streamed


def _high_watermarks(reader: LogReader, config: Config, topic: str, partitions: int) -> dict[int, int]:
    """The high watermark of every initialized partition of ``topic`` (the demo's, and any an
    earlier run with more partitions made)."""
    candidates = set(range(partitions)) | set(topic_partitions(reader.coordination, config.root_prefix, topic))
    return {p: reader.high_watermark(topic, p) for p in sorted(candidates) if _initialized(reader, topic, p)}


def _initialized(reader: LogReader, topic: str, partition: int) -> bool:
    keys = reader.keys(topic, partition)
    return reader.coordination.get(keys.control, keys.partition_key) is not None


if __name__ == "__main__":
    sys.exit(main())
