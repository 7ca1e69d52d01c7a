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
from llog.errors import ObjectNotFound, OffsetOutOfRange, PartitionNotInitialized, TopicNotFound, TopicRecreated
from llog.process_clients import log_reader
from llog.reader import STREAM_CHUNK_BYTES, ReadRequest
from llog_source.planning import LlogSplit, data_loss, removed_by_retention
from llog_source.schema import (
    ARROW_HEADERS_TYPE, ARROW_SCHEMA, ARROW_SCHEMA_WITH_HEADERS, CREATE_TIME, LOG_APPEND_TIME,
)


def read_split(split: LlogSplit, config: Config, fail_on_data_loss: bool, include_headers: bool = False,
               chunk_bytes: int = STREAM_CHUNK_BYTES) -> Iterator[pa.RecordBatch]:
    """The records of ``split``, in offset order (``chunk_bytes``: record bodies fetched per
    step, :meth:`~llog.reader.LogReader.stream_batches`).

    Offsets that can no longer be read are data loss (``data_loss``: fail naming them, or with
    ``failOnDataLoss=false`` warn and go on): a blob that is gone, a partition that no longer
    exists, an end past the high watermark (the topic was recreated), and offsets below the log
    start offset (docs/protocol.md section 10.3): retention moved it after the batch was planned, at
    the start of the read or midway. The read then goes on from the log start; each retry starts
    past the last one (the log start only moves forward) or ends sooner, so it ends.
    """
    reader = log_reader(config)
    where = f"{split.topic}[{split.partition}]"
    same = _SameInEveryRow(split.topic, split.partition)

    def missing(first: int, last: int, error: ObjectNotFound) -> None:
        data_loss(fail_on_data_loss, f"offsets {first}..{last} of {where}: {error}", "skipping them")

    position, end = split.start, split.end  # the next offset to return, the last one

    def recreated() -> None:
        data_loss(fail_on_data_loss, f"topic {split.topic!r} was deleted and created again since offsets "
                                     f"{position}..{end} of {where} were planned", "skipping them")

    if split.topic_id is not None and not _same_incarnation(reader, split):
        recreated()
        return
    while position <= end:
        try:
            for batch in reader.stream_batches(ReadRequest(split.topic, split.partition, position, end),
                                               chunk_bytes=chunk_bytes, on_missing=missing):
                if split.topic_id is not None and not _read_in(reader, split):
                    recreated()  # the read met the old incarnation's tombstone and moved to the new one
                    return
                if batch.num_rows:
                    position = batch.column(0)[batch.num_rows - 1].as_py() + 1
                    yield spark_batch(same, batch, include_headers)
            return
        except (PartitionNotInitialized, TopicNotFound):
            data_loss(fail_on_data_loss, f"partition {where} no longer exists, so offsets {position}..{end} "
                                         "cannot be read", "skipping them")
            return
        except TopicRecreated:  # docs/protocol.md section 10.2: the records being read are gone
            data_loss(fail_on_data_loss, f"topic {split.topic!r} was deleted and created again while offsets "
                                         f"{position}..{end} of {where} were read", "skipping them")
            return
        except OffsetOutOfRange as e:
            if e.below_start and e.log_start_offset > position:
                going_on = "skipping them" if e.log_start_offset > end else f"going on from offset {e.log_start_offset}"
                data_loss(fail_on_data_loss, removed_by_retention(where, position, e.log_start_offset, end), going_on)
                position = e.log_start_offset
            elif not e.below_start and e.high_watermark < end:
                data_loss(fail_on_data_loss, f"offsets {max(position, e.high_watermark + 1)}..{end} of {where} are "
                                             f"past its high watermark {e.high_watermark} (was the topic recreated?)",
                          "skipping them")
                end = e.high_watermark
            else:  # neither moves the read on: not this read's to skip
                raise


class _SameInEveryRow:
    """The columns that hold one value in every row of a split's batches (topic, partition,
    ``timestampType`` when no record has an event time), built once per split, as long as its
    longest batch, and sliced for each batch: a worker spends its time on the records."""

    def __init__(self, topic: str, partition: int):
        self.topic, self.partition = topic, partition
        self._columns: dict[str, pa.Array] = {}

    def _column(self, name: str, n: int, build) -> pa.Array:
        column = self._columns.get(name)
        if column is None or len(column) < n:
            column = self._columns[name] = build(n)
        return column.slice(0, n)

    def topics(self, n: int) -> pa.Array:
        name = self.topic.encode()
        return self._column("topic", n, lambda m: pa.StringArray.from_buffers(
            m, pa.py_buffer(np.arange(0, (m + 1) * len(name), len(name), dtype=np.int32)), pa.py_buffer(name * m)))

    def partitions(self, n: int) -> pa.Array:
        return self._column("partition", n, lambda m: pa.array(np.full(m, self.partition, dtype=np.int32)))

    def log_append_time(self, n: int) -> pa.Array:
        return self._column("kind", n, lambda m: pa.array(np.full(m, LOG_APPEND_TIME, dtype=np.int32)))


def spark_batch(same: _SameInEveryRow, batch: pa.RecordBatch, include_headers: bool = False) -> pa.RecordBatch:
    """A reader batch (:data:`llog.reader.RECORD_SCHEMA`) of ``same``'s partition as the
    source's columns: a record's timestamp is its event time (CreateTime) when it has one, else
    when the log accepted it (LogAppendTime)."""
    n = batch.num_rows
    created_us = batch.column(2)[0].as_py() * 1000 if n else 0  # one entry's slice: one timestamp
    event_ms = batch.column(5)
    if event_ms.null_count == n:
        timestamps = pa.array(np.full(n, created_us, dtype=np.int64), pa.timestamp("us", tz="UTC"))
        kinds = same.log_append_time(n)
    else:
        has_time = event_ms.is_valid().to_numpy(zero_copy_only=False)
        us = np.where(has_time, event_ms.fill_null(0).to_numpy() * 1000, created_us)
        timestamps = pa.array(us, pa.timestamp("us", tz="UTC"))
        kinds = pa.array(np.where(has_time, CREATE_TIME, LOG_APPEND_TIME).astype(np.int32))
    columns = [batch.column(3), batch.column(1), same.topics(n), same.partitions(n), batch.column(0), timestamps, kinds]
    if include_headers:
        columns.append(batch.column(4).cast(ARROW_HEADERS_TYPE))
        return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA_WITH_HEADERS)
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


def _read_in(reader, split) -> bool:
    """Whether the read just resolved is of the split's incarnation: a read resolves the topic's
    incarnation from the reader's cached record, and, meeting a tombstone, reads the record
    again and goes on in the incarnation it names now (docs/protocol.md section 12.3), which the
    cache then holds. A split names the incarnation its offsets were planned in (section 12.6)."""
    try:
        return reader.keys(split.topic, split.partition).topic_id == split.topic_id
    except TopicNotFound:
        return False


def _same_incarnation(reader, split) -> bool:
    """Whether the topic's current incarnation is the one the split was planned in (section 12):
    offsets of a deleted incarnation must not be read from a later one."""
    try:
        if reader.keys(split.topic, split.partition).topic_id == split.topic_id:
            return True
        return reader.keys(split.topic, split.partition, fresh=True).topic_id == split.topic_id
    except TopicNotFound:
        return False
