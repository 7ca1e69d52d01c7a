"""``python -m bench sink``: ``writeStream.format("llog")`` against a do-nothing sink.

Workload (issue 3): ``rate-micro-batch`` with 1,000,000 rows per micro-batch, each row a
100-byte binary value, into 8 partitions, ``local[2]``. The baseline is the same query into a
``DataSourceStreamArrowWriter`` that drops its input, in the same run, so both pay for Spark
producing the rows and handing them to Python as Arrow. Records/s are rows over the median
micro-batch time (Spark's ``triggerExecution``). S3 PUTs (blobs) and commit times per batch
come from the sink's own metrics (``LLOG_SINK_METRICS_FILE``).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

from bench.report import emit, progress
from jobs.local_spark import local_spark
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


def _batch_seconds(spark, fmt: str, options: dict[str, str], checkpoint: Path) -> list[float]:
    from pyspark.sql import functions as F

    query = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", ROWS_PER_BATCH)
             .option("numPartitions", 2).load()
             .select(F.lpad(F.col("value").cast("string"), VALUE_BYTES, "x").cast("binary").alias("value"))
             .writeStream.format(fmt).options(**options).option("checkpointLocation", str(checkpoint))
             .trigger(processingTime="0 seconds").start())
    try:
        deadline = time.monotonic() + 600
        while (not query.recentProgress or query.recentProgress[-1]["batchId"] < BATCHES) and time.monotonic() < deadline:
            if query.exception() is not None:
                raise query.exception()
            time.sleep(0.2)
        batches = [p for p in query.recentProgress if p["numInputRows"] == ROWS_PER_BATCH][1:BATCHES + 1]
    finally:
        query.stop()
    if len(batches) < BATCHES:
        raise RuntimeError(f"{fmt}: only {len(batches)} full micro-batches within the deadline")
    return [p["durationMs"]["triggerExecution"] / 1000 for p in batches]


def run(config: Config) -> dict:
    config = config.replace(root_prefix=f"bench-{uuid.uuid4().hex[:8]}")
    with tempfile.TemporaryDirectory(prefix="llog-bench-sink-") as tmp:
        metrics_file = Path(tmp) / "commits.jsonl"
        os.environ[METRICS_FILE_ENV] = str(metrics_file)
        spark = local_spark("llog-bench-sink", cores=2, task_retries=1)
        try:
            spark.dataSource.register(DropSource)
            progress("sink: baseline query into a sink that drops its input")
            baseline = _batch_seconds(spark, "llog_bench_drop", {}, Path(tmp) / "ck-drop")
            progress("sink: the same query into writeStream.format('llog')")
            options = {k.lower(): v for k, v in config.to_options().items()}
            llog_s = _batch_seconds(spark, "llog", {**options, "topic": "bench", "partitions": str(PARTITIONS)},
                                    Path(tmp) / "ck-llog")
        finally:
            spark.stop()
            os.environ.pop(METRICS_FILE_ENV, None)
        commits = [json.loads(line) for line in metrics_file.read_text().splitlines()]

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
    }
    emit(summary)
    return summary
