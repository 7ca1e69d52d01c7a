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
import uuid
from pathlib import Path

from bench.records import run_sink
from bench.report import CpuMeter, emit, llog_records, progress, s3_server_marker
from bench.spark_streams import DropSource, micro_batch_seconds
from jobs.local_spark import local_spark
from llog.config import Config
from llog_sink.commit import METRICS_FILE_ENV

ROWS_PER_BATCH = 1_000_000
VALUE_BYTES = 100
PARTITIONS = 8
BATCHES = 4  # timed, after one warm-up batch


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
                                                         drop_cpu, ROWS_PER_BATCH, BATCHES)
            progress("sink: the same query into writeStream.format('llog')")
            options = {k.lower(): v for k, v in config.to_options().items()}
            llog_cpu = CpuMeter(s3_server)
            llog_s, llog_batches = micro_batch_seconds(
                spark, _values(), "llog", {**options, "topic": "bench", "partitions": str(PARTITIONS)}, Path(tmp) / "ck-llog",
                llog_cpu, ROWS_PER_BATCH, BATCHES, landed=lambda: llog_records(config, "bench"))
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
