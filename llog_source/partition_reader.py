"""Executor side: one :class:`~llog_source.planning.LlogSplit` read into Arrow batches with
the source's exact schema.

The split's index entries are resolved with one multi-key Oxia read (plus a range scan when the
split spans several entries), each blob is fetched once with a range GET, a few chunks ahead of
the batch Spark is consuming, and bodies decode straight into Arrow without a per-record Python
loop. The reader (its Oxia and S3 clients) is kept for the life of the Python worker.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from llog.config import Config
from llog.errors import ObjectNotFound, OffsetOutOfRange, PartitionNotInitialized
from llog.process_clients import log_reader
from llog.reader import ReadRequest
from llog_source.planning import LlogSplit, data_loss
from llog_source.schema import (
    ARROW_HEADERS_TYPE, ARROW_SCHEMA, ARROW_SCHEMA_WITH_HEADERS, CREATE_TIME, LOG_APPEND_TIME,
)


def read_split(split: LlogSplit, config: Config, fail_on_data_loss: bool, include_headers: bool = False
               ) -> Iterator[pa.RecordBatch]:
    reader = log_reader(config)
    where = f"{split.topic}[{split.partition}]"

    def missing(first: int, last: int, error: ObjectNotFound) -> None:
        data_loss(fail_on_data_loss, f"offsets {first}..{last} of {where}: {error}", "skipping them")

    def batches(end: int) -> Iterator[pa.RecordBatch]:
        # Resolution (and its errors) happens before the first batch is produced.
        return reader.stream_batches(ReadRequest(split.topic, split.partition, split.start, end), on_missing=missing)

    try:
        stream = batches(split.end)
        first = next(stream, None)
    except PartitionNotInitialized:
        data_loss(fail_on_data_loss, f"partition {where} no longer exists, so offsets {split.start}..{split.end} "
                                     "cannot be read", "skipping them")
        return
    except OffsetOutOfRange as e:
        data_loss(fail_on_data_loss, f"offsets {max(split.start, e.high_watermark + 1)}..{split.end} of {where} are "
                                     f"past its high watermark {e.high_watermark} (was the topic recreated?)",
                  "skipping them")
        if e.high_watermark < split.start:
            return
        stream = batches(e.high_watermark)
        first = next(stream, None)
    if first is None:
        return
    yield spark_batch(split.topic, split.partition, first, include_headers)
    for batch in stream:
        yield spark_batch(split.topic, split.partition, batch, include_headers)


def spark_batch(topic: str, partition: int, batch: pa.RecordBatch, include_headers: bool = False) -> pa.RecordBatch:
    """A reader batch (:data:`llog.reader.RECORD_SCHEMA`) as the source's columns: a record's
    timestamp is its event time (CreateTime) when it has one, else when the log accepted it
    (LogAppendTime)."""
    n = batch.num_rows
    name = topic.encode()
    topics = pa.StringArray.from_buffers(
        n, pa.py_buffer(np.arange(0, (n + 1) * len(name), len(name), dtype=np.int32)), pa.py_buffer(name * n))
    created_us = batch.column(2)[0].as_py() * 1000 if n else 0  # one entry's slice: one timestamp
    event_ms = batch.column(5)
    if event_ms.null_count == n:
        timestamps = pa.array(np.full(n, created_us, dtype=np.int64), pa.timestamp("us", tz="UTC"))
        kinds = pa.array(np.full(n, LOG_APPEND_TIME, dtype=np.int32))
    else:
        has_time = event_ms.is_valid().to_numpy(zero_copy_only=False)
        us = np.where(has_time, event_ms.fill_null(0).to_numpy() * 1000, created_us)
        timestamps = pa.array(us, pa.timestamp("us", tz="UTC"))
        kinds = pa.array(np.where(has_time, CREATE_TIME, LOG_APPEND_TIME).astype(np.int32))
    columns = [batch.column(3), batch.column(1), topics, pa.array(np.full(n, partition, dtype=np.int32)),
               batch.column(0), timestamps, kinds]
    if include_headers:
        columns.append(batch.column(4).cast(ARROW_HEADERS_TYPE))
        return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA_WITH_HEADERS)
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
