"""``python -m bench sink``: ``writeStream.format("llog")`` against a do-nothing sink.

Workload (issue 3): ``rate-micro-batch`` with 1,000,000 rows per micro-batch, each row a
100-byte binary value, into 8 partitions, ``local[2]``. The baseline is the same query into a
``DataSourceStreamArrowWriter`` that drops its input, in the same run, so both pay for Spark
producing the rows and handing them to Python as Arrow. Records/s are rows over the median
micro-batch time (Spark's ``triggerExecution``). S3 PUTs (blobs) and commit times per batch
come from the sink's own metrics (``LLOG_SINK_METRICS_FILE``). CPU seconds per batch, of the
whole machine and of the local S3 server (versitygw), show where the difference goes: the S3
server shares Spark's two cores here, as S3 proper would not. The llog topic must then hold
exactly the rows of the micro-batches Spark completed (read from its partitions' offsets), or
the bench fails. Then one round of
``bench.records``' sink cases: values alone against 16-byte keys and one header (records-v2).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

from bench.records import run_sink
from bench.report import CpuMeter, check_landed, emit, llog_records, progress, s3_server_marker
from jobs.local_spark import local_spark, wait_for_running_tasks
from llog import progress as llog_progress
from llog.config import Config
from llog_sink.commit import METRICS_FILE_ENV

ROWS_PER_BATCH = 1_000_000
VALUE_BYTES = 100
PARTITIONS = 8
BATCHES = 4  # timed, after one warm-up batch


class _DropWriter(DataSourceStreamArrowWriter):
    def write(self, iterator):
        for _ in iterator:
            pass
        return WriterCommitMessage()

    def commit(self, messages, batchId):  # noqa: N803
        pass


class DropSource(DataSource):
    """The baseline: a sink that reads its Arrow input and keeps nothing."""

    @classmethod
    def name(cls) -> str:
        return "llog_bench_drop"

    def streamWriter(self, schema, overwrite):  # noqa: N802
        return _DropWriter()


def micro_batch_seconds(spark, columns: list, fmt: str, options: dict[str, str], checkpoint: Path, meter: CpuMeter,
                        rows: int = ROWS_PER_BATCH, batches: int = BATCHES, deadline_s: float = 600,
                        landed: Callable[[], int] | None = None, whole_batches: bool = True
                        ) -> tuple[list[float], int]:
    """One query of ``rows`` rows per micro-batch from ``rate-micro-batch`` (its ``value`` and
    ``timestamp``, as ``columns``) into ``fmt``: the seconds of each of ``batches`` timed
    micro-batches (after one warm-up), and how many batches ``meter`` saw (it runs from the end
    of the warm-up batch to the end of the last timed one, as seen by polling). The query is
    stopped in the middle of its next batch, which Spark logs as errors: the log is silenced
    until the cancelled tasks have ended.

    ``landed``: the records ``fmt``'s destination holds. Read before the query starts and after
    it has stopped, the difference must be the rows of every micro-batch the query completed,
    plus, of the one the stop cut, all or none (``whole_batches``: an exactly-once sink) or any
    part (a sink that writes as its tasks go); else :class:`RuntimeError`."""
    before = landed() if landed is not None else None
    query = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", rows).option("numPartitions", 2)
             .option("startTimestamp", int(time.time() * 1000)).load()
             .select(*columns)
             .writeStream.format(fmt).options(**options).option("checkpointLocation", str(checkpoint))
             .trigger(processingTime="0 seconds").start())
    metered_from = None
    try:
        with llog_progress.task(f"{fmt}: micro-batches of {rows:,} rows (1 warm-up)", total=batches + 1,
                                unit="batches") as shown:
            deadline = time.monotonic() + deadline_s
            while time.monotonic() < deadline:
                if query.exception() is not None:
                    raise query.exception()
                done = query.lastProgress["batchId"] if query.lastProgress else -1
                shown.update(completed=min(done + 1, batches + 1))
                if metered_from is None and done >= 0:
                    meter.start()
                    metered_from = done
                if done >= batches:
                    meter.stop()
                    break
                time.sleep(0.1)
        timed = [p for p in query.recentProgress if p["numInputRows"] == rows][1:batches + 1]
    finally:
        spark.sparkContext.setLogLevel("OFF")
        query.stop()
        wait_for_running_tasks(spark)
        time.sleep(0.5)  # the cancelled tasks' last log lines
        spark.sparkContext.setLogLevel("WARN")
    if len(timed) < batches:
        raise RuntimeError(f"{fmt}: only {len(timed)} full micro-batches within the deadline")
    if landed is not None:
        got, sent = landed() - before, sum(p["numInputRows"] for p in query.recentProgress)
        progress(f"{fmt}: {got:,} records landed; the query completed micro-batches of {sent:,} rows")
        check_landed(f"{fmt} sink", got, sent, rows, whole_batches)
    return [p["durationMs"]["triggerExecution"] / 1000 for p in timed], done - metered_from


def _values():
    from pyspark.sql import functions as F

    return [F.lpad(F.col("value").cast("string"), VALUE_BYTES, "x").cast("binary").alias("value")]


def run(config: Config) -> dict:
    config = config.replace(root_prefix=f"bench-{uuid.uuid4().hex[:8]}")
    with tempfile.TemporaryDirectory(prefix="llog-bench-sink-") as tmp:
        metrics_file = Path(tmp) / "commits.jsonl"
        os.environ[METRICS_FILE_ENV] = str(metrics_file)
        s3_server = s3_server_marker(config.s3_endpoint_url)
        spark = local_spark("llog-bench-sink", cores=2, task_retries=1)
        try:
            spark.dataSource.register(DropSource)
            progress("sink: baseline query into a sink that drops its input")
            drop_cpu = CpuMeter(s3_server)
            baseline, drop_batches = micro_batch_seconds(spark, _values(), "llog_bench_drop", {}, Path(tmp) / "ck-drop",
                                                         drop_cpu)
            progress("sink: the same query into writeStream.format('llog')")
            options = {k.lower(): v for k, v in config.to_options().items()}
            llog_cpu = CpuMeter(s3_server)
            llog_s, llog_batches = micro_batch_seconds(
                spark, _values(), "llog", {**options, "topic": "bench", "partitions": str(PARTITIONS)}, Path(tmp) / "ck-llog",
                llog_cpu, landed=lambda: llog_records(config, "bench"))
        finally:
            spark.stop()
        commits = [json.loads(line) for line in metrics_file.read_text().splitlines()]
        progress("sink: record formats side by side (bench.records: v1 and v2-none, one round)")
        formats = run_sink(config, rows=200_000, batches=2, rounds=1, metrics_file=metrics_file)
        os.environ.pop(METRICS_FILE_ENV, None)

    for name, seconds in (("llog", llog_s), ("drop", baseline)):
        emit({"bench": "sink", "case": name, "batches": len(seconds), "rows_per_batch": ROWS_PER_BATCH,
              "median_s": round(statistics.median(seconds), 3), "min_s": round(min(seconds), 3),
              "max_s": round(max(seconds), 3)})
    records_per_s = ROWS_PER_BATCH / statistics.median(llog_s)
    baseline_per_s = ROWS_PER_BATCH / statistics.median(baseline)
    summary = {
        "bench": "sink",
        "records_per_s": round(records_per_s), "baseline_records_per_s": round(baseline_per_s),
        "ratio": round(records_per_s / baseline_per_s, 3),
        "s3_puts_per_batch": statistics.median(c["blobs"] for c in commits),
        "commit_s_median": round(statistics.median(c["commit_s"] for c in commits[1:] or commits), 4),
        **_cpu_per_batch("drop", drop_cpu, drop_batches),
        **_cpu_per_batch("llog", llog_cpu, llog_batches),
    }
    summary["formats"] = {case: {k: row[k] for k in ("records_per_s", "body_bytes_per_record") if k in row}
                          for case, row in formats.items()}
    emit(summary)
    return summary


def _cpu_per_batch(case: str, meter: CpuMeter, batches: int) -> dict:
    """CPU seconds per micro-batch used by the machine and by the S3 server (versitygw, on
    the same cores as Spark here; S3 proper would use none of this machine's CPU)."""
    def per_batch(seconds):
        return None if seconds is None or batches < 1 else round(seconds / batches, 3)
    return {f"{case}_cpu_s_per_batch": per_batch(meter.machine_s),
            f"{case}_s3_server_cpu_s_per_batch": per_batch(meter.process_s)}
