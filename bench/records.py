"""``python -m bench records``: what records-v2 (docs/protocol.md section 11) costs and saves, beside
bytes-batch-v1, in one run.

Core (no Spark). Two workloads, each 8 partitions x 10,000 records per ``append_shared`` (the
``core`` case's shape): ``random``, 100-byte random values; ``events``, the demo's events
(``jobs/demo.py``: ``to_json(struct(seq, ts))`` as Spark writes it, e.g.
``{"seq":123,"ts":"2026-11-25 12:00:00.123"}``, seq increasing by 1 and ts by 1 ms per record,
Spark's trailing-zero trimming of the fraction kept; the demo's own rate source gives every row
of a micro-batch the same whole-second ts, which compresses a little better still). Formats,
each on its own topic, their calls in turn: ``v1`` (values alone, compression none:
bytes-batch-v1), ``v2-none`` (the same values, a random 16-byte key and one header ``("source",
b"bench")`` per record, compression none: records-v2), ``v2-zstd`` (as ``v2-none``, zstd) and
``v2-zstd-values`` (the values alone, zstd: records-v2). Appends: records/s at the median of the
timed rounds, after a warm-up round. Reads: ``read_batches`` of one append's offsets in all 8
partitions, records/s at the median. Bytes per record: the bodies' bytes (the sum of the topic's
index entries' ``byte_length``) over its records. ``v2_zstd_bytes_ratio`` is the events' bytes
per record in ``v2-zstd-values`` over those in ``v1`` (target: at most 0.4).

Spark sink. ``rate-micro-batch`` into ``writeStream.format("llog")``, ``local[2]``, option
``partitions`` 8 and ``compression`` none in both cases: ``v1`` writes a 100-byte binary value
and a ``partition`` column (``seq % 8``), so it is placed by that column; ``v2-none`` writes the
same value, a 16-byte binary key (no ``partition`` column: placed by Kafka's murmur2 of the key
over the 8 partitions) and a ``headers`` column with one header ``("source", b"bench")`` (the
issue's v2 case: 16-byte keys and one header), every column built by Spark SQL functions. Baselines
``v1-drop`` and ``v2-none-drop``: the same two column sets into ``bench.sink``'s sink that drops
its Arrow input, so what Spark itself pays for the extra columns (building them, handing them
to Python as Arrow) shows apart from llog's share. Each case runs as fresh queries in turn
(v1, v2-none, v1-drop, v2-none-drop, v1, ...), one warm-up micro-batch each; records/s are rows
over the median micro-batch time (``triggerExecution``) of all its timed batches; CPU seconds
per batch as in ``bench.sink`` (the whole machine, and the local S3 server on the same cores).
``v2_none_sink_ratio`` = v2-none records/s over v1 records/s (target: at least 0.8);
``v2_none_drop_ratio``, the same for the baselines.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bench.report import CpuMeter, emit, env_int, llog_records, progress, random_values, s3_server_marker, timed_together
from llog.codec import HEADERS_TYPE
from llog.config import Config
from llog.describe import describe_topic
from llog.errors import PartitionNotInitialized
from llog.partitioner import kafka_partitions
from llog.reader import LogReader, ReadRequest
from llog.topics import create_topic
from llog.writer import AppendGroup, LogWriter
from llog_tools import progress as llog_progress

VALUE_BYTES = 100
KEY_BYTES = 16
PARTITIONS = 8
RECORDS_PER_PARTITION = 10_000
HEADER = ("source", b"bench")
BYTES_RATIO_TARGET = 0.4
SINK_RATIO_TARGET = 0.8
#: The events' first ``ts`` (2026-11-25 12:00:00 UTC, as in the brief's example).
EVENTS_START_MS = 1_795_608_000_000

#: Core formats: (keys and headers?, compression).
FORMATS = {
    "v1": (False, "none"),
    "v2-none": (True, "none"),
    "v2-zstd": (True, "zstd"),
    "v2-zstd-values": (False, "zstd"),
}


# --- core ---------------------------------------------------------------------------------------


def demo_events(count: int, first_seq: int = 0, start_ms: int = EVENTS_START_MS) -> pa.BinaryArray:
    """``count`` of the demo's events as JSON bytes: ``{"seq":N,"ts":"YYYY-MM-DD HH:MM:SS.fff"}``
    with seq and ts (ms) increasing, the fraction without trailing zeros (Spark's timestamp to
    string cast), built with Arrow compute, no loop per record."""
    seq = pc.cast(pa.array(np.arange(first_seq, first_seq + count, dtype=np.int64)), pa.string())
    ts = pc.strftime(pa.array(start_ms + np.arange(count, dtype=np.int64), type=pa.timestamp("ms")),
                     format="%Y-%m-%d %H:%M:%S")  # "%S" of a ms timestamp is "SS.fff"
    ts = pc.replace_substring_regex(ts, pattern=r"\.?0+$", replacement="")
    json_text = pc.binary_join_element_wise('{"seq":', seq, ',"ts":"', ts, '"}', "")
    return json_text.cast(pa.binary())


def one_header_each(count: int) -> pa.ListArray:
    """One header ``("source", b"bench")`` per record, as records-v2's headers type."""
    items = pa.StructArray.from_arrays([pa.repeat(pa.scalar(HEADER[0]), count), pa.repeat(pa.scalar(HEADER[1]), count)],
                                       fields=list(HEADERS_TYPE.value_type))
    return pa.ListArray.from_arrays(pa.array(np.arange(count + 1, dtype=np.int32)), items, type=HEADERS_TYPE)


def _groups(topic: str, values: list[pa.Array], keyed: bool) -> list[AppendGroup]:
    if not keyed:
        return [AppendGroup(topic, p, v) for p, v in enumerate(values)]
    return [AppendGroup(topic, p, v, keys=random_values(len(v), KEY_BYTES, 1000 + p), headers=one_header_each(len(v)))
            for p, v in enumerate(values)]


def _core_workload(config: Config, writers: dict[str, LogWriter], reader: LogReader, workload: str,
                   values: list[pa.Array], rounds: int) -> dict[str, dict]:
    """Every format on one workload: appends in turn, reads in turn, bytes per record."""
    records = sum(len(v) for v in values)
    topics = {fmt: f"records-{workload}-{fmt}" for fmt in FORMATS}
    for topic in topics.values():
        create_topic(reader.coordination, config.root_prefix, topic, len(values), if_not_exists=True)
    groups = {fmt: _groups(topics[fmt], values, keyed) for fmt, (keyed, _) in FORMATS.items()}
    results: dict[str, list] = {fmt: [] for fmt in FORMATS}
    value_bytes = sum(int(pc.sum(pc.binary_length(v)).as_py()) for v in values) / records

    progress(f"records: core {workload}: append_shared of {', '.join(FORMATS)}, in turn")
    appends = timed_together({
        fmt: (lambda fmt=fmt: results[fmt].append(writers[FORMATS[fmt][1]].append_shared(groups[fmt])))
        for fmt in FORMATS}, rounds)

    progress(f"records: core {workload}: read_batches of one append's offsets in every partition, in turn")
    ranges = {fmt: iter([[ReadRequest(r.topic, r.partition, r.start_offset, r.end_offset) for r in rs] for rs in res])
              for fmt, res in results.items()}
    counted: dict[str, list[int]] = {fmt: [] for fmt in FORMATS}

    def read(fmt: str) -> None:
        got = reader.read_batches(next(ranges[fmt]))
        counted[fmt].append(sum(b.count for b in got))
        if fmt in ("v2-none", "v2-zstd"):  # the keys and headers came back
            batch = got[0].batches[0]
            assert batch.column("key").null_count == 0 and batch.column("headers").null_count == 0, fmt

    reads = timed_together({fmt: (lambda fmt=fmt: read(fmt)) for fmt in FORMATS}, len(results["v1"]) - 1)
    out = {}
    for fmt in FORMATS:
        assert all(c == records for c in counted[fmt]), (fmt, counted[fmt])
        plain = writers["none"]
        described = describe_topic(plain.coordination, config.root_prefix, topics[fmt], plain.objects)
        stored = sum(d.high_watermark for d in described)
        body_bytes = sum(d.bytes for d in described)
        keyed, compression = FORMATS[fmt]
        record_bytes = value_bytes + (KEY_BYTES + len(HEADER[0]) + len(HEADER[1]) if keyed else 0)
        out[fmt] = row = {
            "bench": "records", "case": "core", "workload": workload, "format": fmt,
            "encoding": "bytes-batch-v1" if fmt == "v1" else "records-v2", "compression": compression,
            "keys_and_headers": keyed, "records_per_append": records,
            "append_rounds": len(appends[fmt]), "read_rounds": len(reads[fmt]),
            "append_records_per_s": round(records / statistics.median(appends[fmt])),
            "read_records_per_s": round(records / statistics.median(reads[fmt])),
            "append_median_s": round(statistics.median(appends[fmt]), 4),
            "read_median_s": round(statistics.median(reads[fmt]), 4),
            "record_bytes_per_record": round(record_bytes, 2),  # key + value + header key and value
            "body_bytes_per_record": round(body_bytes / stored, 2),
            "stored_records": stored,
        }
        emit(row)
    return out


def run_core(config: Config, rounds: int) -> dict[str, dict[str, dict]]:
    random_parts = [random_values(RECORDS_PER_PARTITION, VALUE_BYTES, p) for p in range(PARTITIONS)]
    events = demo_events(PARTITIONS * RECORDS_PER_PARTITION)
    event_parts = [events.slice(p * RECORDS_PER_PARTITION, RECORDS_PER_PARTITION) for p in range(PARTITIONS)]
    progress(f"records: demo events look like {events[0].as_py()!r} .. {events[-1].as_py()!r}")
    with LogWriter(config, auto_initialize=True, compression="none") as plain, \
            LogWriter(config, auto_initialize=True, compression="zstd") as zstd, LogReader(config) as reader:
        writers = {"none": plain, "zstd": zstd}
        return {workload: _core_workload(config, writers, reader, workload, parts, rounds)
                for workload, parts in (("random", random_parts), ("events", event_parts))}


# --- Spark sink ---------------------------------------------------------------------------------


def _sink_columns(case: str):
    """The DataFrame columns of a sink case, from the rate source's ``value``."""
    from pyspark.sql import functions as F

    value = F.lpad(F.col("value").cast("string"), VALUE_BYTES, "x").cast("binary").alias("value")
    if case == "v1":
        return [value, (F.col("value") % PARTITIONS).cast("int").alias("partition")]
    return [
        F.lpad(F.col("value").cast("string"), KEY_BYTES, "k").cast("binary").alias("key"),
        value,
        F.array(F.struct(F.lit(HEADER[0]).alias("key"), F.lit(HEADER[1]).cast("binary").alias("value")))
        .alias("headers"),
    ]


_V1_COLUMNS = "value (100 B) + partition column (seq % 8)"
_V2_COLUMNS = "key (16 B) + value (100 B) + headers [('source', b'bench')]"
#: Sink cases, their calls in turn: (columns, sink format, what the sink does with them).
SINK_CASES = {
    "v1": ("v1", "llog", f"{_V1_COLUMNS} into llog: placed by the partition column; compression none -> "
                         "bytes-batch-v1"),
    "v2-none": ("v2-none", "llog", f"{_V2_COLUMNS} into llog: placed by murmur2 of the key over 8 partitions; "
                                   "compression none -> records-v2"),
    "v1-drop": ("v1", "llog_bench_drop", f"{_V1_COLUMNS} into a sink that drops its Arrow input (Spark's share)"),
    "v2-none-drop": ("v2-none", "llog_bench_drop", f"{_V2_COLUMNS} into a sink that drops its Arrow input "
                                                   "(Spark's share)"),
}


#: Records of each partition :func:`check_sink_sample` reads back (its first ones).
SAMPLE_PER_PARTITION = 200


def check_sink_sample(reader: LogReader, topic: str, columns: str) -> str | None:
    """What is wrong with the first :data:`SAMPLE_PER_PARTITION` records of each partition of
    a sink case's ``topic`` (``columns``: ``"v1"`` or ``"v2-none"``, :func:`_sink_columns`), or
    None: each value is the rate source's ``seq`` left-padded with ``x`` to 100 bytes; ``v1``
    records sit in partition ``seq % 8`` with no key or headers, ``v2-none`` records have the key
    ``seq`` left-padded with ``k`` to 16 bytes, the one header, and sit where murmur2 of the key
    puts them. (How many records landed is checked per query, by ``landed``.)"""
    sampled = 0
    for p in range(PARTITIONS):
        try:
            first, high_watermark = reader.offsets(topic, p)
        except PartitionNotInitialized:  # nothing was written to it
            continue
        if high_watermark < first:
            continue
        for r in reader.read_range(topic, p, first, min(high_watermark, first + SAMPLE_PER_PARTITION - 1)):
            seq = r.value.lstrip(b"x") if r.value is not None else b""
            where = f"partition {p} offset {r.offset}"
            if len(r.value or b"") != VALUE_BYTES or not seq.isdigit():
                return f"{where}: value {r.value!r} is not a seq padded to {VALUE_BYTES} bytes"
            if columns == "v1":
                if int(seq) % PARTITIONS != p or r.key is not None or r.headers is not None:
                    return f"{where}: seq {int(seq)} with key {r.key!r}, headers {r.headers!r}: expected partition " \
                           f"{int(seq) % PARTITIONS}, no key, no headers"
            else:
                key = seq.rjust(KEY_BYTES, b"k")[:KEY_BYTES]  # Spark's lpad: padded on the left, cut on the right
                placed = int(kafka_partitions(pa.array([key], pa.binary()), PARTITIONS)[0])
                if r.key != key or r.headers != [HEADER] or placed != p:
                    return f"{where}: seq {int(seq)} with key {r.key!r}, headers {r.headers!r}: expected key {key!r} " \
                           f"in partition {placed}, headers {[HEADER]!r}"
            sampled += 1
    return None if sampled else f"no record to sample in {topic}"


def run_sink(config: Config, rows: int, batches: int, rounds: int, metrics_file: Path | None = None
             ) -> dict[str, dict]:
    """The sink cases in turn. ``metrics_file``: the sink's metrics file of a Spark that is
    already running in this process (Spark's JVM, and the Python workers it starts, keep the
    environment it was started with: a variable set later does not reach the sink's commits)."""
    from bench.spark_streams import DropSource, micro_batch_seconds
    from jobs.local_spark import local_spark
    from llog_sink.commit import METRICS_FILE_ENV

    seconds: dict[str, list[float]] = {case: [] for case in SINK_CASES}
    cpu: dict[str, list[tuple[float | None, float | None, int]]] = {case: [] for case in SINK_CASES}
    commits: dict[str, list[dict]] = {case: [] for case in SINK_CASES}
    s3_server = s3_server_marker(config.s3_endpoint_url)
    with tempfile.TemporaryDirectory(prefix="llog-bench-records-") as tmp:
        own_metrics = metrics_file is None
        if own_metrics:
            metrics_file = Path(tmp) / "commits.jsonl"
            metrics_file.touch()
            os.environ[METRICS_FILE_ENV] = str(metrics_file)
        spark = local_spark("llog-bench-records", cores=2, task_retries=1)
        try:
            spark.dataSource.register(DropSource)
            options = {k.lower(): v for k, v in config.to_options().items()}
            queries = [(r, case) for r in range(rounds) for case in SINK_CASES]
            for r, case in llog_progress.track(queries, "records: sink queries", unit="queries"):
                progress(f"records: sink {case} round {r + 1}/{rounds}: {SINK_CASES[case][2]}")
                before = len(metrics_file.read_text().splitlines())
                meter = CpuMeter(s3_server)
                columns, fmt, _ = SINK_CASES[case]
                topic = f"records-sink-{case}"
                got, metered = micro_batch_seconds(
                    spark, _sink_columns(columns), fmt,
                    {**options, "topic": topic, "partitions": str(PARTITIONS), "compression": "none"},
                    Path(tmp) / f"ck-{case}-{r}", meter, rows, batches, deadline_s=300,
                    landed=(lambda topic=topic: llog_records(config, topic)) if fmt == "llog" else None)
                seconds[case] += got
                cpu[case].append((meter.machine_s, meter.process_s, metered))
                if SINK_CASES[case][1] == "llog":
                    lines = metrics_file.read_text().splitlines()[before:]
                    commits[case] += [json.loads(line) for line in lines][1:]  # not the warm-up batch
                progress(f"records: sink {case} round {r + 1}: batches of {rows:,} rows in "
                         + ", ".join(f"{s:.2f}" for s in got) + " s")
        finally:
            spark.stop()
            if own_metrics:
                os.environ.pop(METRICS_FILE_ENV, None)

    with LogReader(config) as reader:  # what the llog cases stored, from their index entries
        stored = {case: describe_topic(reader.coordination, config.root_prefix, f"records-sink-{case}", reader.objects)
                  for case, (_, sink, _) in SINK_CASES.items() if sink == "llog"}
        for case in stored:
            problem = check_sink_sample(reader, f"records-sink-{case}", SINK_CASES[case][0])
            if problem is not None:
                emit({"bench": "records", "case": "sink", "format": case, "status": "failed", "problem": problem})
                raise RuntimeError(f"records sink {case}: {problem}")
    out = {}
    for case in SINK_CASES:
        median = statistics.median(seconds[case])
        machine = [m for m, _, n in cpu[case] if m is not None and n > 0]
        batches_metered = sum(n for m, _, n in cpu[case] if m is not None and n > 0)
        s3 = [s for _, s, n in cpu[case] if s is not None and n > 0]
        out[case] = row = {
            "bench": "records", "case": "sink", "format": case, "sink": SINK_CASES[case][1],
            "columns": SINK_CASES[case][2],
            "rows_per_batch": rows, "batches": len(seconds[case]), "queries": rounds,
            "records_per_s": round(rows / median), "median_s": round(median, 3),
            "min_s": round(min(seconds[case]), 3), "max_s": round(max(seconds[case]), 3),
            "batch_s": [round(s, 3) for s in seconds[case]],
            "stage_s_max_median": round(statistics.median(c["stage_s_max"] for c in commits[case]), 3)
            if commits[case] else None,
            "commit_s_median": round(statistics.median(c["commit_s"] for c in commits[case]), 4)
            if commits[case] else None,
            "s3_puts_per_batch": statistics.median(c["blobs"] for c in commits[case]) if commits[case] else None,
            "partitions_per_batch": statistics.median(c["partitions"] for c in commits[case])
            if commits[case] else None,
            "cpu_s_per_batch": round(sum(machine) / batches_metered, 3) if machine else None,
            "s3_server_cpu_s_per_batch": round(sum(s3) / batches_metered, 3) if s3 else None,
            "body_bytes_per_record": round(sum(d.bytes for d in stored[case]) / sum(d.high_watermark
                                                                                  for d in stored[case]), 2)
            if case in stored else None,
        }
        if case not in stored:
            for key in ("stage_s_max_median", "commit_s_median", "s3_puts_per_batch", "partitions_per_batch",
                        "s3_server_cpu_s_per_batch", "body_bytes_per_record"):
                del row[key]
        emit(row)
    return out


# --- the case -----------------------------------------------------------------------------------


def run(config: Config) -> dict:
    started = time.perf_counter()
    config = config.replace(root_prefix=f"bench-{uuid.uuid4().hex[:8]}")
    core = run_core(config, env_int("LLOG_BENCH_RECORDS_ROUNDS", 10))
    sink = run_sink(config, rows=env_int("LLOG_BENCH_RECORDS_SINK_ROWS", 500_000),
                    batches=env_int("LLOG_BENCH_RECORDS_SINK_BATCHES", 3),
                    rounds=env_int("LLOG_BENCH_RECORDS_SINK_ROUNDS", 3))
    events = core["events"]
    bytes_ratio = events["v2-zstd-values"]["body_bytes_per_record"] / events["v1"]["body_bytes_per_record"]
    sink_ratio = sink["v2-none"]["records_per_s"] / sink["v1"]["records_per_s"]
    drop_ratio = sink["v2-none-drop"]["records_per_s"] / sink["v1-drop"]["records_per_s"]
    summary = {
        "bench": "records",
        "v2_zstd_bytes_ratio": round(bytes_ratio, 3), "v2_zstd_bytes_ratio_target": BYTES_RATIO_TARGET,
        "v2_zstd_bytes_ratio_met": bytes_ratio <= BYTES_RATIO_TARGET,
        "v2_none_sink_ratio": round(sink_ratio, 3), "v2_none_sink_ratio_target": SINK_RATIO_TARGET,
        "v2_none_sink_ratio_met": sink_ratio >= SINK_RATIO_TARGET,
        # The same ratio with both column sets into a sink that drops them: Spark's own share.
        "v2_none_drop_ratio": round(drop_ratio, 3),
        **{f"{workload}_{fmt.replace('-', '_')}_{metric}": row[key]
           for workload, rows in core.items() for fmt, row in rows.items()
           for metric, key in (("bytes_per_record", "body_bytes_per_record"),
                               ("append_records_per_s", "append_records_per_s"),
                               ("read_records_per_s", "read_records_per_s"))},
        **{f"sink_{case.replace('-', '_')}_{metric}": row[metric] for case, row in sink.items()
           for metric in ("records_per_s", "cpu_s_per_batch", "s3_server_cpu_s_per_batch", "body_bytes_per_record")
           if metric in row},
        "sink_rows_per_batch": sink["v1"]["rows_per_batch"],
        "run_s": round(time.perf_counter() - started, 1),
    }
    emit(summary)
    return summary
