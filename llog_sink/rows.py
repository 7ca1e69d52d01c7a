"""The sink's input contract: which columns a DataFrame written to llog may have, and what each
Arrow batch of it holds, checked before anything is written. Names and types are those of
Spark's Kafka sink, plus Kafka's record timestamp.

- ``value``: binary or string (UTF-8), required; null is a tombstone.
- ``key``: binary or string, optional (null: no key).
- ``headers``: ``array<struct<key: string, value: binary>>``, optional.
- ``timestamp``: timestamp (or long, ms since the epoch), optional: the record's event time.
- ``topic``: string column, or the ``topic`` option (the column wins).
- ``partition``: int column. Without one, a row with a key goes where Kafka's default
  partitioner puts it (murmur2 of the key modulo the topic's partition count; llog/partitioner.py),
  and every other row of a task goes to one partition per topic, chosen from the task's partition
  id, the batch id and the topic (sticky by task, and the same again when a batch is replayed).
  The partition count is the topic record's (docs/protocol.md section 10), which the ``partitions`` option
  must match when given; a missing topic is created with it, else on first use with
  ``LLOG_DEFAULT_PARTITIONS`` partitions or enough for the ``partition`` column, whichever is
  more (and grown when a later batch names a higher partition: docs/protocol.md section 10.2).
- Other columns are ignored, with one warning.

Records that are a value alone are written as bytes-batch-v1; keys, headers, timestamps,
tombstones or compression make records-v2 (docs/protocol.md section 11).

Spark hands the writers Arrow batches; a streaming write on pyspark 4.0 (no
``DataSourceStreamArrowWriter``) hands Rows, which :func:`row_batches` puts back into Arrow.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from llog.errors import LlogError
from llog.keys import TopicPartition
from llog.partitioner import kafka_partitions

log = logging.getLogger(__name__)

VALUE, KEY, HEADERS, TIMESTAMP, TOPIC, PARTITION = "value", "key", "headers", "timestamp", "topic", "partition"
#: The record's columns, in the order the sink hands them on.
RECORD_COLUMNS = (KEY, VALUE, HEADERS, TIMESTAMP)
_HEADERS_TYPE = T.ArrayType(T.StructType([T.StructField("key", T.StringType()), T.StructField("value", T.BinaryType())]))


class InvalidSinkInput(LlogError, ValueError):
    """A DataFrame written to llog breaks the input contract (module doc)."""


def _is_headers(kind: T.DataType) -> bool:
    """``array<struct<key: string, value: binary>>``, whatever the nullability flags."""
    if not isinstance(kind, T.ArrayType) or not isinstance(kind.elementType, T.StructType):
        return False
    fields = kind.elementType.fields
    return [f.name for f in fields] == ["key", "value"] and isinstance(fields[0].dataType, T.StringType) \
        and isinstance(fields[1].dataType, T.BinaryType)


@dataclass(frozen=True)
class SinkLayout:
    """What the columns of the written DataFrame mean, decided once on the driver."""

    topic_option: str | None
    has_topic_column: bool
    has_partition_column: bool
    #: The partition count rows are placed by; None: each topic's own (looked up by the task).
    partitions: int | None
    #: The record columns present (``value`` always), in :data:`RECORD_COLUMNS` order.
    record_columns: tuple[str, ...] = (VALUE,)

    @property
    def has_key_column(self) -> bool:
        return KEY in self.record_columns

    @classmethod
    def from_schema(cls, schema, topic_option: str | None, partitions: int | None) -> "SinkLayout":
        """Check a Spark schema (``StructType``) against the contract."""
        fields = {f.name: f.dataType for f in schema.fields}
        if VALUE not in fields:
            raise InvalidSinkInput(f"a 'value' column (binary or string) is required; the columns are {sorted(fields)}")
        if not isinstance(fields[VALUE], (T.BinaryType, T.StringType)):
            raise InvalidSinkInput(f"column 'value' must be binary or string, got {fields[VALUE].simpleString()}")
        if KEY in fields and not isinstance(fields[KEY], (T.BinaryType, T.StringType)):
            raise InvalidSinkInput(f"column 'key' must be binary or string, got {fields[KEY].simpleString()}")
        if HEADERS in fields and not _is_headers(fields[HEADERS]):
            raise InvalidSinkInput(f"column 'headers' must be {_HEADERS_TYPE.simpleString()} (the Kafka connector's "
                                   f"type), got {fields[HEADERS].simpleString()}")
        if TIMESTAMP in fields and not isinstance(fields[TIMESTAMP], (T.TimestampType, T.TimestampNTZType, T.LongType)):
            raise InvalidSinkInput(f"column 'timestamp' must be a timestamp or a long (ms since the epoch), got "
                                   f"{fields[TIMESTAMP].simpleString()}")
        if TOPIC in fields and not isinstance(fields[TOPIC], T.StringType):
            raise InvalidSinkInput(f"column 'topic' must be a string, got {fields[TOPIC].simpleString()}")
        if PARTITION in fields and not isinstance(fields[PARTITION], (T.IntegerType, T.LongType, T.ShortType, T.ByteType)):
            raise InvalidSinkInput(f"column 'partition' must be an integer, got {fields[PARTITION].simpleString()}")
        if TOPIC not in fields and not topic_option:
            raise InvalidSinkInput("no topic: give a 'topic' column or the 'topic' option")
        if topic_option and TOPIC not in fields:
            TopicPartition(topic_option, 0)  # the option's name is checked here, once
        if partitions is not None and partitions < 1:
            raise InvalidSinkInput(f"option 'partitions' must be >= 1, got {partitions}")
        ignored = sorted(set(fields) - {*RECORD_COLUMNS, TOPIC, PARTITION})
        if ignored:
            log.warning("llog sink ignores column(s) %s", ", ".join(ignored))
        return cls(topic_option, TOPIC in fields, PARTITION in fields, partitions,
                   tuple(c for c in RECORD_COLUMNS if c in fields))

    def split(self, batch: pa.RecordBatch, task_id: int, batch_id: int,
              partition_count: Callable[[str], int] | None = None) -> Iterator[tuple[TopicPartition, pa.RecordBatch]]:
        """The batch's records per topic-partition, in row order, as batches of the record
        columns present (value as binary); raises :class:`InvalidSinkInput` naming the column
        and the problem. ``partition_count``: a topic's partition count, when the layout has none."""
        count = (lambda topic: self.partitions) if self.partitions is not None else partition_count
        if count is None and not self.has_partition_column:
            raise ValueError("SinkLayout.split needs partition_count: the layout has no partition count")
        records = self._records(batch)
        partitions = self._partition_column(batch)
        if self.has_topic_column:
            topics = batch.column(batch.schema.get_field_index(TOPIC))
            if topics.null_count:
                raise InvalidSinkInput(f"column 'topic' holds {topics.null_count} null(s)")
            masks = [(topic, pc.equal(topics, topic)) for topic in pc.unique(topics).to_pylist()]
            groups = [(topic, records.filter(mask), None if partitions is None else partitions.filter(mask))
                      for topic, mask in masks]
        else:
            groups = [(self.topic_option, records, partitions)]
        for topic, topic_records, topic_partitions in groups:
            _partition(topic, 0)  # the name is checked before its partition count is looked up
            if topic_partitions is None and self.has_key_column:
                topic_partitions = self._key_partitions(topic, topic_records, task_id, batch_id, count(topic))
            if topic_partitions is None:
                yield self._sticky(topic, task_id, batch_id, count(topic)), topic_records
                continue
            for partition, part in _by_partition(topic_records, topic_partitions):
                yield _partition(topic, partition), part

    def _records(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        columns = [batch.column(batch.schema.get_field_index(name)) for name in self.record_columns]
        columns[self.record_columns.index(VALUE)] = _values(columns[self.record_columns.index(VALUE)])
        return pa.RecordBatch.from_arrays(columns, names=list(self.record_columns))

    def _key_partitions(self, topic: str, records: pa.RecordBatch, task_id: int, batch_id: int,
                        partitions: int) -> np.ndarray:
        """Kafka's default partitioner for rows with a key, the sticky partition for the rest."""
        keys = records.column(self.record_columns.index(KEY))
        if keys.null_count == 0:
            return kafka_partitions(keys, partitions).astype(np.int64)
        placed = np.full(len(keys), self._sticky(topic, task_id, batch_id, partitions).partition, dtype=np.int64)
        if keys.null_count < len(keys):
            present = keys.is_valid()
            placed[present.to_numpy(zero_copy_only=False)] = kafka_partitions(keys.filter(present), partitions)
        return placed

    def _partition_column(self, batch: pa.RecordBatch) -> pa.Int64Array | None:
        if not self.has_partition_column:
            return None
        partitions = batch.column(batch.schema.get_field_index(PARTITION))
        if partitions.null_count:
            raise InvalidSinkInput(f"column 'partition' holds {partitions.null_count} null(s)")
        partitions = partitions.cast(pa.int64())
        lowest = pc.min(partitions).as_py()
        if lowest is not None and lowest < 0:
            raise InvalidSinkInput(f"column 'partition' holds a negative value ({lowest})")
        return partitions

    @property
    def input_columns(self) -> tuple[str, ...]:
        """The columns of the written DataFrame the sink reads (the others are ignored)."""
        return self.record_columns + ((TOPIC,) if self.has_topic_column else ()) \
            + ((PARTITION,) if self.has_partition_column else ())

    @staticmethod
    def _sticky(topic: str, task_id: int, batch_id: int, partitions: int) -> TopicPartition:
        return _partition(topic, (task_id + batch_id + zlib.crc32(topic.encode())) % partitions)


def _by_partition(records: pa.RecordBatch, partitions: pa.Array | np.ndarray) -> Iterator[tuple[int, pa.RecordBatch]]:
    """The rows of each partition, in row order, in partition order. (A filter per partition
    scans the rows in order; one sort and take of them measured no faster: its reads jump.)"""
    if isinstance(partitions, np.ndarray):
        partitions = pa.array(partitions)
    found = pc.unique(partitions).to_pylist()
    if len(found) == 1:
        yield found[0], records
        return
    for partition in sorted(found):
        yield partition, records.filter(pc.equal(partitions, partition))


def _partition(topic: str, partition: int) -> TopicPartition:
    try:
        return TopicPartition(topic, partition)
    except LlogError as e:
        raise InvalidSinkInput(f"column 'topic' or option 'topic': {e}") from None


def _values(column: pa.Array) -> pa.BinaryArray:
    if pa.types.is_binary(column.type):
        return column
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type) or pa.types.is_large_binary(column.type):
        return column.cast(pa.binary())  # string -> binary keeps the bytes (UTF-8)
    raise InvalidSinkInput(f"column 'value' must be binary or string, got {column.type}")


#: Rows per Arrow batch made from Rows: Spark's own batch size (spark.sql.execution.arrow.maxRecordsPerBatch).
ROWS_PER_BATCH = 10_000
_ARROW_HEADERS = pa.list_(pa.field("element", pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])))


def row_batches(rows: Iterable, schema: T.StructType, columns: Iterable[str],
                rows_per_batch: int = ROWS_PER_BATCH) -> Iterator[pa.RecordBatch]:
    """Spark Rows of ``schema`` as Arrow batches of ``columns`` (the ones the sink reads, the
    types :meth:`SinkLayout.from_schema` accepted), as Spark's Arrow writers would have been handed
    them. A ``timestamp`` Row value is a naive datetime in the Python worker's local time (how
    Spark turns its UTC instants into Rows), so it is read as local time and stored as UTC."""
    fields = {f.name: (i, f.dataType) for i, f in enumerate(schema.fields)}
    wanted = [(name, *fields[name]) for name in columns]
    arrow_schema = pa.schema([pa.field(name, _arrow_type(name, kind)) for name, _, kind in wanted])
    local_time = [isinstance(kind, T.TimestampType) for _, _, kind in wanted]
    buffered: list[list] = [[] for _ in wanted]
    count = 0
    for row in rows:
        for values, (_, index, _kind), local in zip(buffered, wanted, local_time):
            value = row[index]
            values.append(value.astimezone(timezone.utc) if local and value is not None else value)
        count += 1
        if count == rows_per_batch:
            yield pa.RecordBatch.from_arrays(
                [pa.array(v, f.type) for v, f in zip(buffered, arrow_schema)], schema=arrow_schema)
            buffered, count = [[] for _ in wanted], 0
    if count:
        yield pa.RecordBatch.from_arrays([pa.array(v, f.type) for v, f in zip(buffered, arrow_schema)],
                                         schema=arrow_schema)


def _arrow_type(name: str, kind: T.DataType) -> pa.DataType:
    """The Arrow type Spark gives a column of ``kind`` (one the input contract allows)."""
    if isinstance(kind, T.BinaryType):
        return pa.binary()
    if isinstance(kind, T.StringType):
        return pa.string()
    if isinstance(kind, T.TimestampType):
        return pa.timestamp("us", tz="UTC")
    if isinstance(kind, T.TimestampNTZType):
        return pa.timestamp("us")
    if isinstance(kind, (T.LongType, T.IntegerType, T.ShortType, T.ByteType)):
        return pa.int64()
    if name == HEADERS and _is_headers(kind):
        return _ARROW_HEADERS
    raise InvalidSinkInput(f"column {name!r} of type {kind.simpleString()} is not one the llog sink reads")
