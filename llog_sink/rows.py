"""The sink's input contract: which columns a DataFrame written to llog may have, and what each
Arrow batch of it holds, checked before anything is written.

- ``value``: binary or string (UTF-8), required, non-null.
- ``topic``: string column, or the ``topic`` option (the column wins).
- ``partition``: int column, else every row of a task goes to one partition per topic, chosen
  from the task's partition id, the batch id and the topic (sticky by task, and the same again
  when a batch is replayed).
- ``key`` and ``headers`` are refused: bytes-batch-v1 stores values only.
- Other columns are ignored, with one warning.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from llog.errors import LlogError
from llog.keys import TopicPartition

log = logging.getLogger(__name__)

VALUE, TOPIC, PARTITION = "value", "topic", "partition"
_REFUSED = ("key", "headers")


class InvalidSinkInput(LlogError, ValueError):
    """A DataFrame written to llog breaks the input contract (module doc)."""


@dataclass(frozen=True)
class SinkLayout:
    """What the columns of the written DataFrame mean, decided once on the driver."""

    topic_option: str | None
    has_topic_column: bool
    has_partition_column: bool
    partitions: int

    @classmethod
    def from_schema(cls, schema, topic_option: str | None, partitions: int) -> "SinkLayout":
        """Check a Spark schema (``StructType``) against the contract."""
        fields = {f.name: f.dataType for f in schema.fields}
        refused = [c for c in _REFUSED if c in fields]
        if refused:
            raise InvalidSinkInput(
                f"column(s) {', '.join(map(repr, refused))} cannot be written to llog: records hold a value only "
                "(bytes-batch-v1); drop them or fold them into 'value'")
        if VALUE not in fields:
            raise InvalidSinkInput(f"a 'value' column (binary or string) is required; the columns are {sorted(fields)}")
        if not isinstance(fields[VALUE], (T.BinaryType, T.StringType)):
            raise InvalidSinkInput(f"column 'value' must be binary or string, got {fields[VALUE].simpleString()}")
        if TOPIC in fields and not isinstance(fields[TOPIC], T.StringType):
            raise InvalidSinkInput(f"column 'topic' must be a string, got {fields[TOPIC].simpleString()}")
        if PARTITION in fields and not isinstance(fields[PARTITION], (T.IntegerType, T.LongType, T.ShortType, T.ByteType)):
            raise InvalidSinkInput(f"column 'partition' must be an integer, got {fields[PARTITION].simpleString()}")
        if TOPIC not in fields and not topic_option:
            raise InvalidSinkInput("no topic: give a 'topic' column or the 'topic' option")
        if topic_option and TOPIC not in fields:
            TopicPartition(topic_option, 0)  # the option's name is checked here, once
        if partitions < 1:
            raise InvalidSinkInput(f"option 'partitions' must be >= 1, got {partitions}")
        ignored = sorted(set(fields) - {VALUE, TOPIC, PARTITION})
        if ignored:
            log.warning("llog sink ignores column(s) %s", ", ".join(ignored))
        return cls(topic_option, TOPIC in fields, PARTITION in fields, partitions)

    def split(self, batch: pa.RecordBatch, task_id: int, batch_id: int) -> Iterator[tuple[TopicPartition, pa.BinaryArray]]:
        """The batch's values per topic-partition, in row order; raises
        :class:`InvalidSinkInput` naming the column and the problem."""
        values = _values(batch.column(batch.schema.get_field_index(VALUE)))
        partitions = self._partition_column(batch)
        if self.has_topic_column:
            topics = batch.column(batch.schema.get_field_index(TOPIC))
            if topics.null_count:
                raise InvalidSinkInput(f"column 'topic' holds {topics.null_count} null(s)")
            masks = [(topic, pc.equal(topics, topic)) for topic in pc.unique(topics).to_pylist()]
            groups = [(topic, values.filter(mask), None if partitions is None else partitions.filter(mask))
                      for topic, mask in masks]
        else:
            groups = [(self.topic_option, values, partitions)]
        for topic, topic_values, topic_partitions in groups:
            if topic_partitions is None:
                yield self._sticky(topic, task_id, batch_id), topic_values
                continue
            for partition in sorted(pc.unique(topic_partitions).to_pylist()):
                yield _partition(topic, partition), topic_values.filter(pc.equal(topic_partitions, partition))

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

    def _sticky(self, topic: str, task_id: int, batch_id: int) -> TopicPartition:
        return _partition(topic, (task_id + batch_id + zlib.crc32(topic.encode())) % self.partitions)


def _partition(topic: str, partition: int) -> TopicPartition:
    try:
        return TopicPartition(topic, partition)
    except LlogError as e:
        raise InvalidSinkInput(f"column 'topic' or option 'topic': {e}") from None


def _values(column: pa.Array) -> pa.BinaryArray:
    if column.null_count:
        raise InvalidSinkInput(f"column 'value' holds {column.null_count} null(s); every record needs a value")
    if pa.types.is_binary(column.type):
        return column
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type) or pa.types.is_large_binary(column.type):
        return column.cast(pa.binary())  # string -> binary keeps the bytes (UTF-8)
    raise InvalidSinkInput(f"column 'value' must be binary or string, got {column.type}")
