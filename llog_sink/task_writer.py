"""What a Spark task does: stage its rows as shared WAL blobs in S3. In Oxia it reads topic records
and the deployment record, and writes nothing but that record, when its root prefix has none yet.

Spark's Arrow batches are buffered as they arrive; when their keys and values reach
``LLOG_BATCH_MAX_BYTES`` they are split by topic-partition, once for the whole buffer (Spark
hands over batches of 10,000 rows: one murmur2 call and one filter per partition and column for
the buffer instead of for each), and packed into one LLS1 blob, PUT in the background: each
partition's records one body, bytes-batch-v1 for values alone, records-v2 otherwise. The commit
message lists every staged slice in the order written, for the driver to commit (``commit.py``).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import WriterCommitMessage

from llog.codec import binary_bytes
from llog.config import Config
from llog.deployment import pass_gate, process_name
from llog.keys import TopicPartition
from llog.topics import TopicCache
from llog.writer import AppendGroup, StagedSlice, stage
from llog.process_clients import coordination, object_store, topic_cache
from llog_sink.rows import HEADERS, KEY, TIMESTAMP, VALUE, SinkLayout

#: Blobs a task may be uploading while it reads on.
UPLOADS_IN_FLIGHT = 2
_upload_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="llog-sink-upload")


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    """One task's staged slices, in the order it wrote them, and what they held."""

    task_id: int
    sink_id: str | None
    slices: list[StagedSlice] = field(default_factory=list)
    #: By topic, the partition count this task placed rows by (keyed, or sticky without a key),
    #: when the layout had none: the commit checks that every task of the batch used one count.
    placed_by: dict[str, int] = field(default_factory=dict)
    records: int = 0
    bytes: int = 0
    blobs: int = 0
    stage_s: float = 0.0
    #: By topic, the sum of the sizes of the records staged (docs/protocol.md section 11.1): with
    #: the slices' record counts, what a replay of the batch must carry again (section 9.1).
    topic_bytes: dict[str, int] = field(default_factory=dict)


def write_task(batches: Iterable[pa.RecordBatch], layout: SinkLayout, config: Config, task_id: int,
               batch_id: int, sink_id: str | None, compression: str | None = None) -> SinkCommitMessage:
    """Stage every row of ``batches`` (one Spark task's input).

    A full buffer is uploaded in the background while the next rows arrive, at most
    :data:`UPLOADS_IN_FLIGHT` blobs at a time, so Spark keeps feeding the task during PUTs.
    Slices are listed in the order their blobs were cut, whatever order the PUTs finish in.
    ``compression``: of every body, instead of each topic's ``compression.type``. When the
    layout has no partition count, or rows name their topic and no compression is given, the
    task reads the topics' records from Oxia (docs/protocol.md section 10): a count afresh, once
    per topic and task, recorded in the commit message (``placed_by``). Before its first row
    the task passes the deployment gate, once per worker process and config (its clock and
    ``G``; docs/protocol.md section 9.2).
    """
    started = time.perf_counter()
    # Once per worker process and config: this executor's clock stamps the blobs' created_at_ms,
    # which the driver's age rules read (docs/protocol.md section 9.2).
    pass_gate(config, coordination(config), object_store(config), f"sink task, {process_name()}")
    topics = topic_cache(config) if layout.partitions is None or (compression is None and layout.has_topic_column) \
        else None
    if compression is None and topics is not None:
        compression = topics.compression
    message = SinkCommitMessage(task_id, sink_id)

    def partition_count(topic: str) -> int:
        if topic not in message.placed_by:
            message.placed_by[topic] = _partition_count(topics, topic)
        return message.placed_by[topic]

    buffered: list[pa.RecordBatch] = []  # Spark's batches as they came, split at the flush
    buffered_bytes = 0
    uploads: collections.deque[Future] = collections.deque()

    def flush() -> None:
        nonlocal buffered, buffered_bytes
        if not buffered:
            return
        rows = buffered[0] if len(buffered) == 1 else pa.Table.from_batches(buffered).combine_chunks().to_batches()[0]
        groups = []
        for tp, records in layout.split(rows, task_id, batch_id, partition_count if topics is not None else None):
            if records.num_rows:
                groups.append(_group(tp, records))
                message.topic_bytes[tp.topic] = message.topic_bytes.get(tp.topic, 0) + record_bytes(records)
        while len(uploads) >= UPLOADS_IN_FLIGHT:
            message.slices.extend(uploads.popleft().result())
        uploads.append(_upload_pool.submit(stage, object_store(config), config, groups, compression=compression))
        message.blobs += 1
        buffered, buffered_bytes = [], 0

    try:
        for batch in batches:
            if not batch.num_rows:
                continue
            buffered.append(batch)
            size = sum(binary_bytes(batch.column(name)) for name in (VALUE, KEY) if name in batch.schema.names)
            buffered_bytes += size
            message.records += batch.num_rows
            message.bytes += size
            if buffered_bytes >= config.batch_max_bytes:
                flush()
        flush()
        while uploads:
            message.slices.extend(uploads.popleft().result())
    finally:
        for upload in uploads:  # a failed task: let its other uploads end before it does
            upload.cancel() or upload.exception()
    message.stage_s = time.perf_counter() - started
    return message


def _partition_count(topics: TopicCache, topic: str) -> int:
    """The count to place the topic's rows by: its record's, read afresh (the topic may have been
    created, or grown, since this reused worker last looked); a topic without one counts as
    ``LLOG_DEFAULT_PARTITIONS``, the count it is created with on first use when the batch
    commits (nothing is created here: a batch that fails creates nothing)."""
    record = topics.get(topic, fresh=True)
    return record.partitions if record is not None else topics.config.default_partitions


def record_bytes(records: pa.RecordBatch) -> int:
    """The sum of the records' sizes (docs/protocol.md section 11.1): the bytes of each key,
    value, and header key and value."""
    total = sum(binary_bytes(records.column(name)) for name in (VALUE, KEY) if name in records.schema.names)
    if HEADERS in records.schema.names:
        headers = pc.list_flatten(records.column(HEADERS))
        total += binary_bytes(pc.struct_field(headers, [0])) + binary_bytes(pc.struct_field(headers, [1]))
    return total


def _group(tp: TopicPartition, records: pa.RecordBatch) -> AppendGroup:
    """One partition's records (the record columns present) as an append group."""
    column = lambda name: records.column(name) if name in records.schema.names else None  # noqa: E731
    return AppendGroup(tp.topic, tp.partition, column(VALUE), column(KEY), column(HEADERS), column(TIMESTAMP))
