"""``make demo``: stream records through llog on the local stack and print what happened.

Writes several batches to several topic-partitions through the core writer (each batch one
shared WAL blob), reads everything back through the core reader, checks it; then streams
generated events through ``writeStream.format("llog")`` (Spark, local mode) into topic
``events``, adds a few bad events (not JSON, no ``ts``, ``ts`` in the future), and runs the
llog -> Delta job (``jobs/llog_to_delta.py``, ``availableNow``, consumer group
``llog-demo-to-delta``) on those events into a Delta table under ``.cache/demo``, through the
data-quality gate of ``conf/expectations/events.json`` (the bad events land in the quarantine
table beside it). Prints the table, the quarantine and the group's lag, and writes
``.cache/demo/report.html``: records/s per micro-batch of the sink and the source, and the
group's lag over time. The stack keeps running afterwards (``llog stack down`` stops it).
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
from dataclasses import dataclass
from pathlib import Path

from jobs.demo_report import write_report
from llog.config import Config, llog_home
from llog.describe import describe_topic
from llog.discovery import partition_controls
from llog.topics import create_topic
from llog.keys import shared_wal_prefix
from llog.reader import LogReader, ReadRequest
from llog.records import ControlRecord
from llog.writer import AppendGroup, LogWriter
from llog_tools import progress
from llog_tools.describe import format_descriptions


CHECKOUT = Path(__file__).resolve().parents[1]
#: The quality gate's suite (jobs/quality_gate.py).
EXPECTATIONS = CHECKOUT / "conf" / "expectations" / "events.json"
#: The topics the demo writes: the core writer's (``--topics``) and the one Spark streams into.
#: The front page's examples use others, so that they print what the page shows after a demo.
CORE_TOPICS = "orders,payments"
EVENTS_TOPIC = "events"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", default=CORE_TOPICS)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--records", type=int, default=1000, help="records per partition per batch")
    parser.add_argument("--events", type=int, default=20_000, help="events per micro-batch streamed through Spark")
    parser.add_argument("--micro-batches", type=int, default=3, help="micro-batches streamed through Spark")
    parser.add_argument("--max-per-batch", type=int, default=25_000,
                        help="records per micro-batch of the llog -> Delta job, at most")
    args = parser.parse_args(argv)
    topics = args.topics.split(",")
    config = Config.load()
    run = uuid.uuid4().hex[:8]

    started = time.perf_counter()
    with LogWriter(config, auto_initialize=True) as writer, LogReader(config) as reader:
        for t in topics:  # as `llog topics create T --partitions N --if-not-exists` (docs/protocol.md section 10)
            create_topic(writer.coordination, config.root_prefix, t, args.partitions, if_not_exists=True)
        first_hw = {(t, p): reader.high_watermark(t, p) for t in topics for p in range(args.partitions)}
        blobs_before = sum(1 for _ in writer.objects.list(shared_wal_prefix(config.root_prefix)))
        written: dict[tuple[str, int], list[bytes]] = {}
        for batch in progress.track(range(args.batches), "writing shared WAL blobs", unit="blobs"):
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
        before, after, sink_batches = stream_through_spark(spark, config, args.partitions, args.micro_batches,
                                                                 args.events)
        streamed = sum(after.values()) - sum(before.values())
        after = add_bad_events(config, after)
        print()
        outcome = events_to_delta(spark, config, before, after, max_per_batch=args.max_per_batch)
    finally:
        spark.stop()
    print()
    report = write_report(llog_home() / "demo" / "report.html", sink_batches, outcome.batches, outcome.lag_samples,
                          summary={"records written by the core writer": total,
                                   "events streamed through the sink": streamed,
                                   "bad events added": len(BAD_EVENTS),
                                   "rows in the Delta table": outcome.rows,
                                   "rows quarantined by the quality gate": outcome.quarantined,
                                   "group": outcome.group, "group lag at the end": outcome.final_lag})
    print(f"report: {report} (records/s per micro-batch of the sink and the source, the group's lag over time)")
    if not outcome.complete:
        return 1
    print()
    print(f"done in {time.perf_counter() - started:.2f}s. The local stack is still running: "
          "`llog stack status` shows it, `llog stack down` (or `make stack-down`) stops it.")
    return 0


#: What Spark's JVM prints while it starts that says nothing about the demo: the JVM's line on
#: every start, and Ivy's report on the first Delta start of a checkout (later starts load the
#: jars jobs/local_spark.py recorded then, without Ivy; conf/log4j2.properties keeps Spark at WARN).
_SPARK_NOISE = re.compile(
    r"^WARNING: Using incubator modules: jdk\.incubator\.vector$"
    r"|^(:: (loading settings|resolving dependencies|resolution report|retrieving) :: |Ivy Default Cache set to: "
    r"|The jars for the packages stored in: |downloading https?://)"
    r"|^\t(confs: \[|:: evicted modules:|\S+#\S+;\S+ by \[|-{20}|\||\[SUCCESSFUL \] |\d+ artifacts copied, )"
    r"|^\S+#\S+ added as a dependency$")


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
                         ) -> tuple[dict[int, int], dict[int, int], list[dict]]:
    """A streaming query from Spark's ``rate-micro-batch`` source into topic ``events``; the
    high watermark of each partition before and after, and the query's progress per batch."""
    import tempfile

    from pyspark.sql import functions as F

    from jobs.local_spark import wait_for_running_tasks

    print(f"streaming {batches} micro-batches of {rows:,} events through writeStream.format('llog') ...")
    started = time.perf_counter()
    with LogReader(config) as reader, tempfile.TemporaryDirectory(prefix="llog-demo-ck-") as checkpoint:
        before = _high_watermarks(reader, config, EVENTS_TOPIC)
        events = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", rows)
                  .option("startTimestamp", int(time.time() * 1000)).load()  # event times of today, not 1970
                  # batch b holds values b*rows .. b*rows+rows-1: a batch that starts before stop()
                  # below lands (when its commit wins the race) but writes nothing
                  .where(F.col("value") < batches * rows)
                  .select(F.to_json(F.struct(F.col("value").alias("seq"), F.col("timestamp").cast("string").alias("ts")))
                          .alias("value")))
        query = (events.writeStream.format("llog").option("topic", EVENTS_TOPIC).option("partitions", partitions)
                 .option("checkpointLocation", checkpoint).trigger(processingTime="0 seconds").start())
        with progress.task("streaming micro-batches into llog", total=batches, unit="batches") as advance:
            while not query.recentProgress or query.recentProgress[-1]["batchId"] < batches - 1:
                if query.exception() is not None:
                    raise query.exception()
                advance.update(completed=len(query.recentProgress))
                time.sleep(0.2)
            advance.update(completed=batches)
        spark.sparkContext.setLogLevel("OFF")  # stopping cancels the batch in flight, which Spark logs as errors
        query.stop()
        wait_for_running_tasks(spark)
        spark.sparkContext.setLogLevel("ERROR")
        batch_progress = [p for p in query.recentProgress if p["numInputRows"] and p["batchId"] < batches]
        for p in batch_progress:
            print(f"  batch {p['batchId']}: {p['numInputRows']:,} rows in "
                  f"{p['durationMs'].get('triggerExecution', 0) / 1000:.2f}s")
        after = _high_watermarks(reader, config, EVENTS_TOPIC)
    print(f"events: {sum(after.values()) - sum(before.values()):,} records committed in "
          f"{time.perf_counter() - started:.1f}s; offsets per partition: "
          + ", ".join(f"events[{p}] {before.get(p, 0) + 1}..{hw}" if hw > before.get(p, 0) else f"events[{p}] -"
                      for p, hw in sorted(after.items())))
    return before, after, batch_progress


#: What the demo adds to ``events`` for the quality gate to catch, each failing one expectation
#: of conf/expectations/events.json (or, for the first, all that look inside the value).
BAD_EVENTS = (b"not json at all", b'{"seq": "seven", "ts": "2026-01-01 00:00:00"}', b'{"seq": 7}',
              b'{"seq": 8, "ts": "2999-01-01 00:00:00"}')


def add_bad_events(config: Config, after: dict[int, int]) -> dict[int, int]:
    """Append :data:`BAD_EVENTS` to ``events`` (one per partition, round robin); the high
    watermarks after."""
    after = dict(after)
    with LogWriter(config) as writer:
        for i, value in enumerate(BAD_EVENTS):
            partition = sorted(after)[i % len(after)]
            after[partition] = writer.append(EVENTS_TOPIC, partition, [value]).end_offset
    print(f"added {len(BAD_EVENTS)} bad events to topic events (not JSON, a seq that is no integer, no ts, a ts in "
          "2999) for the quality gate to catch")
    return after


@dataclass
class DeltaOutcome:
    """What the llog -> Delta run did (:func:`events_to_delta`)."""

    group: str
    batches: list[dict]
    lag_samples: list[tuple[float, int, dict]]
    rows: int
    quarantined: int
    final_lag: int
    complete: bool


def events_to_delta(spark, config: Config, before: dict[int, int], after: dict[int, int],
                    group: str = "llog-demo-to-delta", max_per_batch: int = 25_000) -> DeltaOutcome:
    """The llog -> Delta job on the events just streamed (from the offsets they start at),
    ``availableNow``, through the quality gate of ``conf/expectations/events.json``, into a
    fresh Delta table and quarantine under ``.cache/demo`` (``$LLOG_HOME/demo``), sampling the
    group's lag meanwhile; then the table, the quarantine and the group's lag. ``complete`` is
    False unless every event is in the table or the quarantine, once."""
    from jobs.llog_to_delta import Job, describe_batches, gate_summary, group_lag, run

    workdir = llog_home() / "demo"
    table, checkpoint, quarantine = (workdir / "events-delta", workdir / "events-delta-checkpoint",
                                     workdir / "events-quarantine")
    for path in (table, checkpoint, quarantine, Path(f"{quarantine}_results")):
        shutil.rmtree(path, ignore_errors=True)
    starting = {p: before.get(p, 0) + 1 for p in sorted(after)}  # every partition of the topic
    job = Job(table=str(table), checkpoint=str(checkpoint), topics=(EVENTS_TOPIC,),
              starting_offsets=json.dumps({EVENTS_TOPIC: {str(p): o for p, o in starting.items()}}),
              max_offsets_per_trigger=max_per_batch, group_id=group, expectations=str(EXPECTATIONS),
              quarantine=str(quarantine))
    print(f"llog -> Delta: readStream.format('llog') from those offsets, availableNow, at most {max_per_batch:,} "
          f"records per batch, group {group!r}, quality gate {EXPECTATIONS.relative_to(CHECKOUT)} ...")
    started = time.perf_counter()
    streamed = sum(hw - before.get(p, 0) for p, hw in after.items())
    with progress.task("llog -> Delta (records the group has committed)", total=streamed, unit="records") as advance, \
            LagSampler(config, group, starting, after,
                       on_sample=lambda lag: advance.update(completed=streamed - lag)) as sampler:
        batches = run(spark, job, config)
    for line in describe_batches(batches):
        print(f"  {line}")
    df = spark.read.format("delta").load(str(table))
    rows = df.count()
    quarantined = spark.read.format("delta").load(str(quarantine)).count() if (quarantine / "_delta_log").exists() else 0
    complete = rows + quarantined == streamed
    print(f"Delta table {table}: {rows:,} rows in {time.perf_counter() - started:.1f}s, {quarantined:,} quarantined "
          + ("(every event streamed above, once)" if complete else f"(MISMATCH: {streamed:,} events were streamed)"))
    sample = (df.orderBy("partition", "offset").limit(3)
              .selectExpr("topic", "partition", "offset", "CAST(value AS STRING) AS value", "timestamp").collect())
    print("  " + "\n  ".join(f"{r.topic}[{r.partition}]@{r.offset}  {r.value}  {r.timestamp}" for r in sample))
    print(gate_summary(spark, job))
    print()
    print(group_lag(config, group, [EVENTS_TOPIC]))
    samples = sampler.samples
    return DeltaOutcome(group, batches, samples, rows, quarantined, samples[-1][1] if samples else 0, complete)


class LagSampler:
    """Samples the group's lag on ``events`` every ``interval_s`` in a thread, while the job runs:
    ``(seconds since start, total lag, {(topic, partition): lag})``. Before the group has
    committed a partition, its lag counts from the job's starting offset."""

    def __init__(self, config: Config, group: str, starting: dict[int, int], after: dict[int, int],
                 interval_s: float = 0.5, on_sample=None):
        self.config, self.group, self.starting, self.interval_s = config, group, starting, interval_s
        self.on_sample = on_sample
        self.samples: list[tuple[float, int, dict]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lag-sampler", daemon=True)

    def __enter__(self) -> "LagSampler":
        self._started = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        from llog.consumer_groups import committed_offsets
        from llog.coordination import Coordination
        from llog.keys import TopicPartition

        partitions = [TopicPartition(EVENTS_TOPIC, p) for p in sorted(self.starting)]
        with Coordination(self.config) as coordination, LogReader(self.config) as reader:
            while True:
                committed = committed_offsets(coordination, self.config.root_prefix, self.group, partitions)
                lags = {}
                for tp in partitions:
                    offset = committed[tp].offset if tp in committed else self.starting[tp.partition]
                    lags[(tp.topic, tp.partition)] = max(0, reader.high_watermark(tp.topic, tp.partition) + 1 - offset)
                self.samples.append((time.perf_counter() - self._started, sum(lags.values()), lags))
                if self.on_sample is not None:
                    self.on_sample(self.samples[-1][1])
                if self._stop.is_set():  # the job has ended: that was the last sample
                    break
                self._stop.wait(self.interval_s)


def _high_watermarks(reader: LogReader, config: Config, topic: str) -> dict[int, int]:
    """The high watermark of every initialized partition of ``topic`` (the demo's, and any an
    earlier run with more partitions made); none before the topic exists."""
    _, controls = partition_controls(reader.coordination, config.root_prefix, topic)
    return {p: ControlRecord.from_json(c.value, c.key).high_watermark for p, c in sorted(controls.items())}


if __name__ == "__main__":
    sys.exit(main())
