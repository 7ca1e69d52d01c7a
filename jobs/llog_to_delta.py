"""llog -> Delta: read topics with ``spark.readStream.format("llog")`` and append every record to
a Delta table, exactly once across restarts.

Each micro-batch is appended in ``foreachBatch`` with Delta's idempotent writes:
``txnAppId = app id`` and ``txnVersion = batch id``. Delta records both in the commit that adds
the batch's files, and skips an append whose version it has already committed for that app id.
A driver that dies after the append but before Spark records the batch as done replays the same
batch (same offsets, from the checkpoint) on restart, and Delta skips it; one that dies before
the append runs it then. So every record lands once, whatever the moment of the crash.

The app id must be the same on every restart from one checkpoint, and different for another
checkpoint writing to the same table (otherwise its batches 0, 1, ... would be skipped as
already written). The default is the streaming query's id, which Spark keeps in the checkpoint
(Delta's documentation suggests it); ``--app-id`` sets one explicitly.

Data-quality gate (``--expectations SUITE.json``, :mod:`jobs.quality_gate`): each micro-batch is
checked against a great-expectations suite (translated to Spark SQL) as it is written. Rows that
pass go to the table; rows that fail go, in the same batch, to the quarantine table
(``--quarantine PATH``) with the names of the expectations they failed; the batch's result (one
row per expectation: success, rows checked, unexpected rows) is logged and appended to the
results table (``--results PATH``, default ``<quarantine>_results``). The counts come first
(every expectation evaluated once a row, cached for the appends), then the three appends at once
(three Delta commits in parallel); a batch no row of which failed appends nothing to the quarantine.
Each of the three appends is idempotent the same way (``txnAppId``, ``txnVersion = batch id``), and a replayed batch splits
the same way (the same rows, the same ``batch_timestamp``), so every record lands exactly once,
in the table or in the quarantine. ``--on-failure fail`` stops the query instead, naming the
expectation, before anything of the failing batch is written.

Table columns: the source's with headers (key, value, topic, partition, offset, timestamp,
timestampType, headers). A table written before llog had keys gains the key and headers columns
on its next append (Delta's ``mergeSchema``); its older rows read them as null.
Connection settings come from ``LLOG_*`` variables or the local stack's settings file.

Crash points for tests (``llog.failpoints.hit``; ``LLOG_FAILPOINT=<name>`` kills the driver with
SIGKILL there). Each is hit as ``<name>`` in every batch and as ``<name>.<batch id>`` in that
batch only, so ``llog_to_delta.after_append.2`` dies in the middle of a run:

  llog_to_delta.before_append   a batch is planned (in Spark's offset log), its Delta append not begun
  llog_to_delta.after_append    the batch is committed to the Delta table, Spark has not recorded it as done
  llog_to_delta.after_quarantine  (with a gate) its failing rows are committed to the quarantine (its results may be)

Run as ``python -m jobs.llog_to_delta`` (a local Spark with Delta), or as a script by
``spark-submit`` or a Databricks task (the cluster's session; Delta must be on it).

Examples::

    python -m jobs.llog_to_delta --topics orders,payments --table /data/orders --checkpoint /ck/orders
    python -m jobs.llog_to_delta --topic-pattern 'orders.*' --table t --checkpoint ck \\
        --trigger processing-time='10 seconds' --max-offsets-per-trigger 100000 --group-id to-delta
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from dataclasses import dataclass

if not __package__:  # run as a script (spark-submit, a Databricks spark_python_task): import from the checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(globals().get("__file__") or sys.argv[0]))))

from llog import failpoints
from llog.config import Config

#: The crash points of this job (module doc).
FAILPOINTS = {
    "llog_to_delta.before_append": "a batch is planned (in Spark's offset log), its Delta append not begun",
    "llog_to_delta.after_append": "the batch is committed to the Delta table, Spark has not recorded it as done",
    "llog_to_delta.after_quarantine": "(with a gate) its failing rows are in the quarantine table (its results may be)",
}
AVAILABLE_NOW = "available-now"
_PROCESSING_TIME = "processing-time="


def parse_trigger(text: str) -> dict:
    """``available-now`` or ``processing-time=<interval>`` as ``DataStreamWriter.trigger``
    keyword arguments."""
    if text == AVAILABLE_NOW:
        return {"availableNow": True}
    if text.startswith(_PROCESSING_TIME) and text[len(_PROCESSING_TIME):].strip():
        return {"processingTime": text[len(_PROCESSING_TIME):].strip()}
    raise ValueError(f"trigger {text!r}: expected {AVAILABLE_NOW!r} or 'processing-time=<interval>' "
                     "(like 'processing-time=10 seconds')")


@dataclass(frozen=True)
class Job:
    """What to read, where to write it, and how."""

    table: str
    checkpoint: str
    topics: tuple[str, ...] = ()
    topic_pattern: str | None = None
    trigger: str = AVAILABLE_NOW
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    group_id: str | None = None
    app_id: str | None = None
    #: The data-quality gate (module doc): a GX suite file, the quarantine and results tables.
    expectations: str | None = None
    quarantine: str | None = None
    results: str | None = None
    on_failure: str = "quarantine"

    def __post_init__(self):
        if isinstance(self.topics, str):  # "a,b" as well as ("a", "b")
            object.__setattr__(self, "topics", tuple(t.strip() for t in self.topics.split(",") if t.strip()))
        if bool(self.topics) == (self.topic_pattern is not None):
            raise ValueError("give exactly one of topics and topic_pattern")
        parse_trigger(self.trigger)
        if self.expectations and not self.quarantine and self.on_failure == "quarantine":
            raise ValueError("a quality gate (expectations) with on_failure 'quarantine' needs a quarantine table path")
        if (self.quarantine or self.results) and not self.expectations:
            raise ValueError("quarantine and results tables need expectations (a great-expectations suite)")
        if self.on_failure not in ("quarantine", "fail"):
            raise ValueError(f"on_failure {self.on_failure!r}: expected 'quarantine' or 'fail'")

    @property
    def results_table(self) -> str | None:
        """Where the gate's per-batch results go: ``results``, else beside the quarantine."""
        if not self.expectations:
            return None
        return self.results or (f"{self.quarantine.rstrip('/')}_results" if self.quarantine
                                else f"{self.table.rstrip('/')}_quality_results")

    def source_options(self, config: Config) -> dict[str, str]:
        """The options of ``readStream.format("llog")``: the subscription, the job's options and
        the connection settings (lower-cased, as Spark hands options over)."""
        options = {k.lower(): v for k, v in config.to_options().items()}
        if self.topics:
            options["topics"] = ",".join(self.topics)
        else:
            options["topicPattern"] = self.topic_pattern
        options["startingOffsets"] = self.starting_offsets
        options["includeHeaders"] = "true"
        if self.max_offsets_per_trigger:
            options["maxOffsetsPerTrigger"] = str(self.max_offsets_per_trigger)
        if self.group_id:
            options["groupId"] = self.group_id
        return options


class DeltaAppend:
    """The ``foreachBatch`` function: one idempotent Delta append per micro-batch (with a gate:
    one per table it writes). It runs on the driver, in this Python process."""

    def __init__(self, table: str, app_id: str | None, gate=None, quarantine: str | None = None,
                 results: str | None = None):
        self.table = table
        self.app_id = app_id
        self.gate, self.quarantine, self.results = gate, quarantine, results
        self._ready = threading.Event()
        if app_id is not None:
            self._ready.set()

    def started(self, query) -> None:
        """Without an explicit app id, take the query's id (known once the query has started)."""
        if self.app_id is None:
            self.app_id = f"llog_to_delta-{query.id}"
        self._ready.set()

    def __call__(self, batch, batch_id: int) -> None:
        if not self._ready.wait(120):
            raise RuntimeError("llog_to_delta: the query's id never became known; no batch was written")
        _hit("llog_to_delta.before_append", batch_id)
        if self.gate is None:
            self._append(batch, self.table, batch_id)
            _hit("llog_to_delta.after_append", batch_id)
            return
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        from jobs.quality_gate import BATCH_TIMESTAMP, RESULT_SCHEMA

        gate = self.gate
        # Every expectation evaluated once a row (by the counts, which cache it), read by the
        # table's append, the counts and the quarantine's.
        marked = gate.marked(batch).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            # The counts first: --on-failure fail stops here, before anything is written.
            results, (stamp,) = gate.counts(marked, F.max(BATCH_TIMESTAMP))
            gate.report(batch_id, results)
            passed, quarantined = gate.split(marked, batch_id)
            rows = gate.result_rows(batch_id, stamp, results)

            def table() -> None:
                self._append(passed.drop(BATCH_TIMESTAMP), self.table, batch_id)
                _hit("llog_to_delta.after_append", batch_id)

            def quarantine() -> None:
                # No row failed: nothing to quarantine (a replay of the batch finds none either).
                if self.quarantine is not None and any(r.unexpected_count for r in results):
                    self._append(quarantined, self.quarantine, batch_id)
                _hit("llog_to_delta.after_quarantine", batch_id)

            def record_results() -> None:
                self._append(batch.sparkSession.createDataFrame(rows, RESULT_SCHEMA), self.results, batch_id)

            # Three tables, three commits at once: each append is idempotent on its own
            # (txnAppId, txnVersion), so whichever a crash left out is made by the batch's replay.
            _all_at_once(batch.sparkSession, table, quarantine, record_results)
        finally:
            marked.unpersist()

    def _append(self, frame, table: str, batch_id: int) -> None:
        """Append ``frame`` to ``table`` unless this app id's ``batch_id`` is already in it."""
        (frame.write.format("delta").mode("append").option("mergeSchema", "true")
         .option("txnAppId", self.app_id).option("txnVersion", batch_id)
         .save(table))


def _all_at_once(spark, *steps) -> None:
    """Run ``steps`` in threads of their own, each with the calling thread's Spark local
    properties (the streaming query's job group among them), and wait for all; the first error
    is raised once all have ended."""
    from concurrent.futures import ThreadPoolExecutor

    from pyspark.util import inheritable_thread_target

    wrap = inheritable_thread_target(spark)  # the local properties, and the session's tags
    with ThreadPoolExecutor(len(steps), thread_name_prefix="llog_to_delta") as pool:
        futures = [pool.submit(wrap(step)) for step in steps]
    for future in futures:
        future.result()


def _hit(name: str, batch_id: int) -> None:
    failpoints.hit(name)
    failpoints.hit(f"{name}.{batch_id}")


def start(spark, job: Job, config: Config | None = None):
    """Start the job's streaming query on ``spark`` (a session with Delta, like
    ``local_spark(..., delta=True)``) and return it."""
    config = (config or Config.load()).require("oxia_service_address", "s3_bucket")
    records = spark.readStream.format("llog").options(**job.source_options(config)).load()
    gate = None
    if job.expectations:
        from pyspark.sql import functions as F

        from jobs.quality_gate import BATCH_TIMESTAMP, QualityGate

        gate = QualityGate(job.expectations, job.on_failure)
        # In the streaming plan, current_timestamp() is the micro-batch's time, kept in the
        # offset log: a replayed batch has the same one (quality_gate's module doc).
        records = records.withColumn(BATCH_TIMESTAMP, F.current_timestamp())
    append = DeltaAppend(job.table, job.app_id, gate, job.quarantine, job.results_table)
    query = (records.writeStream.foreachBatch(append)
             .option("checkpointLocation", job.checkpoint)
             .trigger(**parse_trigger(job.trigger))
             .start())
    append.started(query)
    return query


def run(spark, job: Job, config: Config | None = None, timeout_s: float | None = None) -> list[dict]:
    """Run the job until its query ends (``available-now``: everything there was when it
    started is in the table), ``timeout_s`` passes (then the query is stopped) or the caller is
    interrupted. Returns the progress of every batch this run processed; raises the query's
    error if it failed."""
    query = start(spark, job, config)
    try:
        query.awaitTermination(timeout_s) if timeout_s is not None else query.awaitTermination()
    except KeyboardInterrupt:
        pass
    finally:
        if query.isActive:
            query.stop()
    if query.exception() is not None:
        raise query.exception()
    return [p for p in query.recentProgress if p["numInputRows"]]


def describe_batches(progress: list[dict]) -> list[str]:
    return [f"batch {p['batchId']}: {p['numInputRows']:,} records in "
            f"{p['durationMs'].get('triggerExecution', 0) / 1000:.2f}s" for p in progress]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m jobs.llog_to_delta", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Connection settings come from LLOG_* environment variables, else from the settings file of\n"
               "the local stack (`llog stack up`).\n\n"
               "Failpoints (tests): LLOG_FAILPOINT=<name> or <name>.<batch id> kills the driver (SIGKILL) at\n"
               + "\n".join(f"  {name:30s} {where}" for name, where in FAILPOINTS.items()))
    subscription = parser.add_mutually_exclusive_group(required=True)
    subscription.add_argument("--topics", help="comma-separated topics to read")
    subscription.add_argument("--topic-pattern", help="read every topic matching this regular expression "
                                                      "(topics created later too)")
    parser.add_argument("--table", required=True, help="path of the Delta table (created if missing)")
    parser.add_argument("--checkpoint", required=True, help="the query's checkpoint directory; restart "
                                                            "from the same one to continue exactly once")
    parser.add_argument("--trigger", default=AVAILABLE_NOW,
                        help=f"{AVAILABLE_NOW!r} (default: read what is there when the job starts, in as "
                             "many batches as --max-offsets-per-trigger needs, then stop) or "
                             "'processing-time=<interval>' (run until interrupted, a batch every interval, "
                             "like 'processing-time=10 seconds')")
    parser.add_argument("--starting-offsets", default="earliest",
                        help="where a new checkpoint starts: earliest (default), latest, or JSON like "
                             '\'{"orders": {"0": 17}}\' (ignored when the checkpoint exists)')
    parser.add_argument("--max-offsets-per-trigger", type=int, help="at most this many records per batch")
    parser.add_argument("--group-id", help="commit the offsets read to this consumer group in Oxia, so "
                                           "`llog groups describe GROUP` shows the job's lag")
    parser.add_argument("--app-id", help="Delta txnAppId; default: the streaming query's id, kept in the "
                                         "checkpoint. Must stay the same for one checkpoint.")
    parser.add_argument("--timeout", type=float, help="stop after this many seconds")
    gate = parser.add_argument_group("data-quality gate (great-expectations)")
    gate.add_argument("--expectations", metavar="SUITE.json",
                      help="validate every micro-batch with this GX expectation suite (conf/expectations/); rows "
                           "that fail go to --quarantine")
    gate.add_argument("--quarantine", metavar="PATH", help="Delta table of the rows that failed, with the names of "
                                                            "the expectations they failed (needed unless "
                                                            "--on-failure fail)")
    gate.add_argument("--results", metavar="PATH", help="Delta table of each batch's result per expectation "
                                                         "(default: <quarantine>_results)")
    gate.add_argument("--on-failure", choices=("quarantine", "fail"), default="quarantine",
                      help="quarantine (default): failing rows go to --quarantine, the rest to --table; fail: "
                           "stop the query at the first failing batch, naming the expectation, writing nothing "
                           "of it")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        parse_trigger(args.trigger)
    except ValueError as e:
        parser.error(str(e))
    if args.max_offsets_per_trigger is not None and args.max_offsets_per_trigger < 1:
        parser.error("--max-offsets-per-trigger must be a positive integer")
    try:
        job = Job(table=args.table, checkpoint=args.checkpoint,
                  topics=tuple(t.strip() for t in (args.topics or "").split(",") if t.strip()),
                  topic_pattern=args.topic_pattern, trigger=args.trigger, starting_offsets=args.starting_offsets,
                  max_offsets_per_trigger=args.max_offsets_per_trigger, group_id=args.group_id, app_id=args.app_id,
                  expectations=args.expectations, quarantine=args.quarantine, results=args.results,
                  on_failure=args.on_failure)
        if job.expectations:
            from jobs.quality_gate import load_suite

            load_suite(job.expectations)  # a bad suite is an argument error, before Spark starts
    except ValueError as e:
        parser.error(str(e))
    config = Config.load()

    from jobs.local_spark import job_spark

    spark, owned = job_spark("llog-to-delta", delta=True)
    started = time.perf_counter()
    try:
        try:
            progress = run(spark, job, config, args.timeout)
        except Exception as e:  # the query's error (a StreamingQueryException), named on one line
            if "ExpectationsFailed" not in str(e):
                raise
            print(f"llog_to_delta: error: {_gate_failure(str(e))}", file=sys.stderr)
            return 1
        for line in describe_batches(progress):
            print(line)
        print(f"llog_to_delta: {sum(p['numInputRows'] for p in progress):,} records processed in {len(progress)} "
              f"batch(es) into {job.table} in {time.perf_counter() - started:.1f}s")
        if job.expectations:
            print(gate_summary(spark, job))
        if job.group_id:
            print(group_lag(config, job.group_id, job.topics or None))
    finally:
        if owned:
            spark.stop()
    return 0


def _gate_failure(text: str) -> str:
    """The :class:`~jobs.quality_gate.ExpectationsFailed` message inside a query's error."""
    for line in text.splitlines():
        if "ExpectationsFailed:" in line:
            return line.split("ExpectationsFailed:", 1)[1].strip()
    return text.splitlines()[0]


def gate_summary(spark, job: Job) -> str:
    """Rows in the table and the quarantine, and failures per expectation over every batch."""
    from pyspark.sql import functions as F

    from jobs.quality_gate import FAILED_EXPECTATIONS

    def count(path):
        try:
            return spark.read.format("delta").load(path).count()
        except Exception:  # not written yet: no batch had a row for it
            return 0
    lines = [f"quality gate ({job.expectations}): {count(job.table):,} row(s) in {job.table}"
             + (f", {count(job.quarantine):,} quarantined in {job.quarantine}" if job.quarantine else "")]
    if job.quarantine and count(job.quarantine):
        per = (spark.read.format("delta").load(job.quarantine).select(F.explode(FAILED_EXPECTATIONS).alias("e"))
               .groupBy("e").count().orderBy("e").collect())
        lines += [f"  {r['count']:,} row(s) failed {r['e']}" for r in per]
    return "\n".join(lines)


def group_lag(config: Config, group: str, topics=None) -> str:
    """The consumer group's lag table (``llog groups describe``)."""
    from llog.consumer_groups import describe_group, format_group
    from llog.coordination import Coordination

    with Coordination(config) as coordination:
        return format_group(group, describe_group(coordination, config.root_prefix, group, topics))


if __name__ == "__main__":
    sys.exit(main())
