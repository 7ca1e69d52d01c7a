"""``make demo``: stream records through llog on the local stack and print what happened.

Writes several batches to several topic-partitions through the core writer (each batch one
shared WAL blob), reads everything back through the core reader, checks it; then streams
generated events through ``writeStream.format("llog")`` (Spark, local mode) and prints the
offsets each partition reached. The stack keeps running afterwards (``llog stack down`` stops it).
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid

from llog.config import Config
from llog.describe import describe_topic, format_descriptions
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
    stream_through_spark(config, args.partitions)
    print()
    print(f"done in {time.perf_counter() - started:.2f}s. The local stack is still running: "
          "`llog stack status` shows it, `llog stack down` (or `make stack-down`) stops it.")
    return 0


def stream_through_spark(config: Config, partitions: int, batches: int = 3, rows: int = 20_000) -> None:
    """A streaming query from Spark's ``rate-micro-batch`` source into topic ``events``."""
    import tempfile

    from pyspark.sql import functions as F

    from jobs.local_spark import local_spark

    print(f"streaming {batches} micro-batches of {rows:,} events through writeStream.format('llog') ...")
    spark = local_spark("llog-demo")
    spark.sparkContext.setLogLevel("ERROR")
    started = time.perf_counter()
    with LogReader(config) as reader, tempfile.TemporaryDirectory(prefix="llog-demo-ck-") as checkpoint:
        before = {p: reader.high_watermark("events", p) if _initialized(reader, "events", p) else 0
                  for p in range(partitions)}
        events = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", rows).load()
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
        for progress in query.recentProgress:
            print(f"  batch {progress['batchId']}: {progress['numInputRows']:,} rows in "
                  f"{progress['durationMs'].get('triggerExecution', 0) / 1000:.2f}s")
        after = {p: reader.high_watermark("events", p) if _initialized(reader, "events", p) else 0
                 for p in range(partitions)}
    spark.stop()
    print(f"events: {sum(after.values()) - sum(before.values()):,} records committed in "
          f"{time.perf_counter() - started:.1f}s; offsets per partition: "
          + ", ".join(f"events[{p}] {before[p] + 1}..{after[p]}" if after[p] > before[p] else f"events[{p}] -"
                      for p in range(partitions)))


def _initialized(reader: LogReader, topic: str, partition: int) -> bool:
    keys = reader.keys(topic, partition)
    return reader.coordination.get(keys.control, keys.partition_key) is not None


if __name__ == "__main__":
    sys.exit(main())
