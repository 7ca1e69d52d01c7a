"""Timing streaming queries of Spark for the benches (``bench.sink``, ``bench.records``): micro-batches
from ``rate-micro-batch`` into a sink, and the baseline sink that drops its Arrow input."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

from bench.report import CpuMeter, check_landed, progress
from jobs.local_spark import wait_for_running_tasks
from llog_tools import progress as llog_progress


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
                        rows: int, batches: int, deadline_s: float = 600,
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
