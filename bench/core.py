"""``python -m bench core``: the protocol's cost over the bytes it moves.

Workload (issue 2): 100-byte records, 8 partitions, 10,000 records per partition per
``append_shared`` (8 MB of record bytes per append). Writes: ``append_shared`` vs a plain boto3
PUT of a blob of the same size. Reads: ``read_batches`` of one append's offsets in all 8
partitions (one blob) vs a plain boto3 GET of a blob of the same size. Both sides run one call
at a time, their calls in turn, against the same S3 server; MB/s count record bytes at the
median call time. Then the record formats side by side (``bench.records``' core cases:
bytes-batch-v1, records-v2 with 16-byte keys and one header, uncompressed and zstd, on random and
JSON event values): records/s and bytes stored per record.
"""

from __future__ import annotations

import os
import uuid

import numpy as np

from bench.records import run_core
from bench.report import emit, mb_s, progress, random_values, timed, timed_together
from llog.config import Config
from llog.objects import make_s3_client
from llog.reader import LogReader, ReadRequest
from llog.topics import create_topic
from llog.writer import AppendGroup, LogWriter

RECORD_BYTES = 100
PARTITIONS = 8
RECORDS_PER_PARTITION = 10_000
ROUNDS = 12


def run(config: Config) -> dict:
    config = config.replace(root_prefix=f"bench-{uuid.uuid4().hex[:8]}")
    topic = "bench"
    record_bytes = RECORD_BYTES * RECORDS_PER_PARTITION * PARTITIONS
    arrays = [random_values(RECORDS_PER_PARTITION, RECORD_BYTES, p) for p in range(PARTITIONS)]
    as_lists = [a.to_pylist() for a in arrays]

    with LogWriter(config, auto_initialize=True) as writer, LogReader(config) as reader:
        # Every partition initialized before the clock starts (a topic needs its record: protocol
        # section 12; an auto-created one would get LLOG_DEFAULT_PARTITIONS).
        create_topic(writer.coordination, config.root_prefix, topic, PARTITIONS)
        results = []
        groups = [AppendGroup(topic, p, arrays[p]) for p in range(PARTITIONS)]
        puts0, writes0 = writer.objects.stats["put"], writer.coordination.writes()
        results.append(writer.append_shared(groups))  # warm-up, and the size of a blob
        s3 = make_s3_client(config)
        blob = os.urandom(writer.objects.stats["put_bytes"] // writer.objects.stats["put"])
        raw_keys = [f"{config.root_prefix}/raw/{i}" for i in range(ROUNDS + 1)]

        progress("core: append_shared (Arrow input) and raw boto3 PUT, in turn")
        put_keys = iter(raw_keys)
        writes = timed_together({
            "append_shared_arrow": lambda: results.append(writer.append_shared(groups)),
            "raw_put": lambda: s3.put_object(Bucket=config.s3_bucket, Key=next(put_keys), Body=blob),
        }, ROUNDS, warmup=0)
        s3.put_object(Bucket=config.s3_bucket, Key=next(put_keys), Body=blob)  # as many raw blobs as appends
        appends = len(results)
        s3_puts_per_append = (writer.objects.stats["put"] - puts0) / appends
        oxia_writes_per_partition_append = (writer.coordination.writes() - writes0) / (appends * PARTITIONS)

        progress("core: append_shared (list of bytes input)")
        list_groups = [AppendGroup(topic, p, as_lists[p]) for p in range(PARTITIONS)]
        write_list_s = timed(lambda: writer.append_shared(list_groups), ROUNDS // 2, name="append_shared_list")

        progress("core: read_batches of one append's offsets in every partition, and raw boto3 GET, in turn")
        passes = 3  # each blob is read this many times
        ranges = iter([[ReadRequest(topic, r.partition, r.start_offset, r.end_offset) for r in rs]
                       for rs in results] * passes)
        get_keys = iter(raw_keys * passes)
        counted = []
        reads = timed_together({
            "read_batches": lambda: counted.append(sum(b.count for b in reader.read_batches(next(ranges)))),
            "raw_get": lambda: s3.get_object(Bucket=config.s3_bucket, Key=next(get_keys))["Body"].read(),
        }, passes * len(results) - 1)
        assert all(c == PARTITIONS * RECORDS_PER_PARTITION for c in counted)

    total_records = PARTITIONS * RECORDS_PER_PARTITION
    cases = {
        **writes, "append_shared_list": write_list_s, **reads,
    }
    for name, seconds in cases.items():
        emit({"bench": "core", "case": name, "rounds": len(seconds), "bytes_per_call": record_bytes,
              "median_s": round(float(np.median(seconds)), 5), "min_s": round(min(seconds), 5),
              "max_s": round(max(seconds), 5), "mb_s": round(mb_s(record_bytes, seconds), 1)})
    write_s, read_s = writes["append_shared_arrow"], reads["read_batches"]
    write, raw_put = mb_s(record_bytes, write_s), mb_s(record_bytes, writes["raw_put"])
    read, raw_get = mb_s(record_bytes, read_s), mb_s(record_bytes, reads["raw_get"])
    summary = {
        "bench": "core",
        "write_mb_s": round(write, 1), "raw_put_mb_s": round(raw_put, 1), "write_ratio": round(write / raw_put, 3),
        "read_mb_s": round(read, 1), "raw_get_mb_s": round(raw_get, 1), "read_ratio": round(read / raw_get, 3),
        "records_per_s_write": round(total_records / float(np.median(write_s))),
        "records_per_s_read": round(total_records / float(np.median(read_s))),
        "oxia_writes_per_partition_append": oxia_writes_per_partition_append,
        "s3_puts_per_append": s3_puts_per_append,
    }
    progress("core: record formats side by side (bench.records: v1, v2-none, v2-zstd)")
    formats = run_core(config, ROUNDS)
    summary["formats"] = {f"{workload}/{fmt}": {k: row[k] for k in ("body_bytes_per_record", "append_records_per_s",
                                                                   "read_records_per_s")}
                          for workload, rows in formats.items() for fmt, row in rows.items()}
    emit(summary)
    return summary
