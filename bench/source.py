"""``python -m bench source``: ``readStream.format("llog")`` against a do-nothing source.

Workload (from the issue): 8 partitions pre-filled with 8,000,000 records of 100 bytes, streamed with
``trigger(availableNow=True)`` into Spark's ``noop`` sink, ``local[2]``. The baseline
(:mod:`bench.arrow_floor`) is a Python streaming source that yields prebuilt Arrow batches of the
same schema, partitioning (one input partition per llog partition, cut as the llog source cuts
one holding more than ``maxRecordsPerPartition``) and batch sizes (one batch per index entry
slice), in the same run, so both pay for Spark planning the batch, starting the planner process, and taking
Arrow from Python workers into the JVM. Each run reads everything from ``earliest`` into a fresh
checkpoint, timed from ``start()`` to termination; the two sources run in turn
(:func:`~bench.report.timed_together`) after a small warm-up run of each (JVM, Python workers,
their imports and the workers' llog reader). Records/s are at the median run.

The fill (not timed) is ``append_shared`` of ``RECORDS_PER_APPEND`` records to each of
``PARTITIONS_PER_APPEND`` partitions per call. The default, one partition per 8 MB blob, is what
the sink writes by default (each task writes one partition per topic, cutting blobs at
``LLOG_BATCH_MAX_BYTES``); a sink writing a ``partition`` column packs several partitions per
blob, which ``BENCH_SOURCE_PARTITIONS_PER_APPEND`` reproduces (more, smaller range GETs).
A last, Spark-free pass reads every split with ``llog_source.partition_reader.read_split`` in this
process, to show the read path's own speed and its S3 GETs.

Sizes come from the environment for quick runs: ``BENCH_SOURCE_RECORDS`` (total, default
8,000,000), ``BENCH_SOURCE_PARTITIONS`` (8), ``BENCH_SOURCE_RECORDS_PER_APPEND`` (80,000 per
partition), ``BENCH_SOURCE_PARTITIONS_PER_APPEND`` (1), ``BENCH_SOURCE_ROUNDS`` (3 timed runs
per source).
"""

from __future__ import annotations

import statistics
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from itertools import count
from pathlib import Path

from bench.arrow_floor import ArrowSource
from bench.report import emit, env_int, progress, random_values, timed_together
from jobs.local_spark import local_spark
from llog.config import Config
from llog.process_clients import close_all, log_reader
from llog.topics import create_topic
from llog.writer import AppendGroup, LogWriter
from llog_source.partition_reader import read_split
from llog_source.planning import LlogSplit, cut
from llog_source.options import DEFAULT_MAX_RECORDS_PER_PARTITION
from llog_tools import progress as llog_progress

VALUE_BYTES = 100
TOPIC = "bench"
WARM_TOPIC = "bench-warm"
WARM_RECORDS_PER_PARTITION = 2_000


@dataclass(frozen=True)
class Sizes:
    records: int
    partitions: int
    records_per_append: int
    partitions_per_append: int
    rounds: int

    @classmethod
    def from_env(cls) -> "Sizes":
        return cls(env_int("BENCH_SOURCE_RECORDS", 8_000_000), env_int("BENCH_SOURCE_PARTITIONS", 8), env_int("BENCH_SOURCE_RECORDS_PER_APPEND", 80_000),
                   env_int("BENCH_SOURCE_PARTITIONS_PER_APPEND", 1), env_int("BENCH_SOURCE_ROUNDS", 3))

    @property
    def per_partition(self) -> int:
        return self.records // self.partitions


# --- the baseline: a Python streaming source that does nothing but yield Arrow ----------------


def split_rows(per_partition: int, entry_rows: int, share: int = DEFAULT_MAX_RECORDS_PER_PARTITION) -> str:
    """The records of each task reading one partition of ``per_partition`` records in entries of
    ``entry_rows``, cut as ``llog_source.planning.plan_splits`` cuts them: the baseline's
    ``splitRows`` option (:mod:`bench.arrow_floor`)."""
    ends = list(range(entry_rows, per_partition, entry_rows)) + [per_partition]
    return ",".join(str(hi - lo + 1) for lo, hi in cut(1, per_partition, ends, share))


# --- fill ---------------------------------------------------------------------------------------


def _fill(config: Config, topic: str, sizes: Sizes, per_partition: int) -> dict:
    """``per_partition`` records in each partition of ``topic``, ``sizes.records_per_append`` per
    partition per ``append_shared`` over ``sizes.partitions_per_append`` partitions. Partition
    groups fill in parallel (they never share a partition, so their commits do not contend)."""
    started = time.perf_counter()
    arrays = {p: random_values(sizes.records_per_append, VALUE_BYTES, 1000 + p) for p in range(sizes.partitions)}
    groups = [list(range(sizes.partitions))[i:i + sizes.partitions_per_append]
              for i in range(0, sizes.partitions, sizes.partitions_per_append)]
    appends = 0
    with LogWriter(config, auto_initialize=True) as writer, llog_progress.task(
            f"source: filling {topic}", total=per_partition * sizes.partitions, unit="records") as filled:
        create_topic(writer.coordination, config.root_prefix, topic, sizes.partitions, if_not_exists=True)

        def fill_group(partitions: list[int]) -> int:
            done, calls = 0, 0
            while done < per_partition:
                n = min(sizes.records_per_append, per_partition - done)
                writer.append_shared([AppendGroup(topic, p, arrays[p].slice(0, n)) for p in partitions])
                done, calls = done + n, calls + 1
                filled(n * len(partitions))
            return calls

        with ThreadPoolExecutor(max_workers=min(2, len(groups))) as pool:
            appends = sum(pool.map(fill_group, groups))
        puts, put_bytes = writer.objects.stats["put"], writer.objects.stats["put_bytes"]
    return {"appends": appends, "s3_puts": puts, "blob_mb": round(put_bytes / max(puts, 1) / 1e6, 2),
            "seconds": round(time.perf_counter() - started, 1)}


# --- the timed runs -----------------------------------------------------------------------------


def _stream(spark, fmt: str, options: dict[str, str], checkpoint: Path, expected: int) -> dict:
    """One ``availableNow`` run of ``fmt`` into ``noop``, from ``start()`` to termination; also
    ``startup_s``, from ``load()`` to the first trigger (the source's planner starting, Python
    for a Python source), and ``triggers_s``, Spark's ``triggerExecution`` over all batches."""
    started, started_at = time.perf_counter(), time.time()
    query = (spark.readStream.format(fmt).options(**options).load()
             .writeStream.format("noop").option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    query.awaitTermination(timeout=1800)
    seconds = time.perf_counter() - started
    if query.isActive:
        query.stop()
        raise RuntimeError(f"{fmt}: the availableNow run did not finish within 1800 s")
    if query.exception() is not None:
        raise query.exception()
    progresses = [p for p in query.recentProgress if p["numInputRows"]]
    rows = sum(p["numInputRows"] for p in progresses)
    if rows != expected:
        raise RuntimeError(f"{fmt}: read {rows} records, expected {expected}")
    first_trigger = datetime.fromisoformat(query.recentProgress[0]["timestamp"].replace("Z", "+00:00")).timestamp()
    return {"seconds": seconds, "batches": len(progresses),
            "add_batch_s": sum(p["durationMs"].get("addBatch", 0) for p in progresses) / 1000,
            "startup_s": first_trigger - started_at,
            "triggers_s": sum(p["durationMs"].get("triggerExecution", 0) for p in query.recentProgress) / 1000}


def _direct_read(config: Config, topic: str, sizes: Sizes) -> dict:
    """Every split read by ``read_split`` in this process, one after another (no Spark)."""
    reader = log_reader(config)
    before = dict(reader.objects.stats)
    started = time.perf_counter()
    records = batches = 0
    for p in llog_progress.track(range(sizes.partitions), "source: read_split, no Spark", unit="partitions"):
        for batch in read_split(LlogSplit(topic, p, 1, sizes.per_partition), config, True):
            records += batch.num_rows
            batches += 1
    seconds = time.perf_counter() - started
    if records != sizes.per_partition * sizes.partitions:
        raise RuntimeError(f"direct read: {records} records, expected {sizes.per_partition * sizes.partitions}")
    stats = dict(reader.objects.stats)
    close_all()  # the stack goes away after this case; nothing here should close clients at exit
    gets = stats.get("range_get", 0) + stats.get("get", 0) - before.get("range_get", 0) - before.get("get", 0)
    return {"records_per_s": round(records / seconds), "seconds": round(seconds, 2), "batches": batches,
            "s3_gets": gets, "mb_per_get": round((stats.get("get_bytes", 0) - before.get("get_bytes", 0)) / max(gets, 1) / 1e6, 2)}


def run(config: Config) -> dict:
    sizes = Sizes.from_env()
    config = config.replace(root_prefix=f"bench-{uuid.uuid4().hex[:8]}")
    total = sizes.per_partition * sizes.partitions
    progress(f"source: filling {sizes.partitions} partitions with {sizes.per_partition} records of {VALUE_BYTES} "
             f"bytes each, {sizes.records_per_append} per partition per append, {sizes.partitions_per_append} "
             f"partitions per append")
    fill = _fill(config, TOPIC, sizes, sizes.per_partition)
    progress(f"source: filled in {fill['seconds']} s ({fill['appends']} appends of {fill['blob_mb']} MB blobs)")
    _fill(config, WARM_TOPIC, Sizes(sizes.partitions * WARM_RECORDS_PER_PARTITION, sizes.partitions,
                                    WARM_RECORDS_PER_PARTITION, sizes.partitions_per_append, 1),
          WARM_RECORDS_PER_PARTITION)

    connection = {k.lower(): v for k, v in config.to_options().items()}
    llog_options = {**connection, "startingOffsets": "earliest"}
    arrow_options = {"partitions": str(sizes.partitions), "batchRows": str(sizes.records_per_append)}
    runs: dict[str, list[dict]] = {"llog": [], "baseline": []}
    with tempfile.TemporaryDirectory(prefix="llog-bench-source-") as tmp:
        checkpoints = (Path(tmp) / f"ck-{i}" for i in count())
        spark = local_spark("llog-bench-source", cores=2, task_retries=1)
        try:
            spark.dataSource.register(ArrowSource)
            progress("source: warm-up runs of both sources")
            _stream(spark, "llog", {**llog_options, "topics": WARM_TOPIC}, next(checkpoints),
                    sizes.partitions * WARM_RECORDS_PER_PARTITION)
            _stream(spark, "llog_bench_arrow",
                    {**arrow_options, "splitRows": split_rows(WARM_RECORDS_PER_PARTITION, sizes.records_per_append)},
                    next(checkpoints), sizes.partitions * WARM_RECORDS_PER_PARTITION)
            progress(f"source: {sizes.rounds} availableNow runs of each source, in turn")
            timed_together({
                "llog": lambda: runs["llog"].append(_stream(
                    spark, "llog", {**llog_options, "topics": TOPIC}, next(checkpoints), total)),
                "baseline": lambda: runs["baseline"].append(_stream(
                    spark, "llog_bench_arrow",
                    {**arrow_options, "splitRows": split_rows(sizes.per_partition, sizes.records_per_append)},
                    next(checkpoints), total)),
            }, sizes.rounds, warmup=0)
        finally:
            spark.stop()
    progress("source: read_split of every split in this process, no Spark")
    direct = _direct_read(config, TOPIC, sizes)

    for name, results in runs.items():
        seconds = [r["seconds"] for r in results]
        emit({"bench": "source", "case": name, "rounds": len(seconds), "records": total,
              "median_s": round(statistics.median(seconds), 3), "min_s": round(min(seconds), 3),
              "max_s": round(max(seconds), 3), "seconds": [round(x, 2) for x in seconds],
              "add_batch_s_median": round(statistics.median(r["add_batch_s"] for r in results), 3),
              "startup_s_median": round(statistics.median(r["startup_s"] for r in results), 3),
              "micro_batches": results[0]["batches"]})
    emit({"bench": "source", "case": "read_split_direct", "records": total, **direct})
    records_per_s = total / statistics.median(r["seconds"] for r in runs["llog"])
    baseline_per_s = total / statistics.median(r["seconds"] for r in runs["baseline"])
    summary = {
        "bench": "source",
        "records_per_s": round(records_per_s), "baseline_records_per_s": round(baseline_per_s),
        "ratio": round(records_per_s / baseline_per_s, 3),
        "records": total, "partitions": sizes.partitions, "records_per_batch": sizes.records_per_append,
        "rounds": sizes.rounds,
        "llog_s_median": round(total / records_per_s, 3), "baseline_s_median": round(total / baseline_per_s, 3),
        "s3_gets_per_read": direct["s3_gets"], "direct_read_records_per_s": direct["records_per_s"],
        "fill_s": fill["seconds"], "fill_blob_mb": fill["blob_mb"],
    }
    emit(summary)
    return summary
