"""The Spark data source writers behind ``format("llog")``: streaming and batch, Arrow in.

Tasks stage (``task_writer.py``); the driver commits (``commit.py``). Both writers share that
code; they differ only in who the sink is. A streaming query is sink ``queryId`` (stable across
restarts from the same checkpoint), so replayed batches commit nothing twice. A batch write is
not replayed by Spark and commits without sink progress, unless the caller names a sink and a
batch (``llog.sink.id`` / ``llog.sink.batch.id`` options, as ``foreach_batch.write_batch`` does).

Options: ``topic``, ``partitions`` (default: the topic's partition count, read by each task; a
missing topic is created with the option's count, explicitly, else on first use with
``LLOG_DEFAULT_PARTITIONS`` or enough for the ``partition`` column's highest value, and grown by
later batches naming higher ones; given for an existing topic, it must be the topic's count:
docs/protocol.md section 10.2), ``compression`` (``zstd``, ``lz4`` or ``none``; default: the
topic's ``compression.type``), and any ``llog.*`` setting (``llog.s3.bucket``,
``llog.oxia.service.address``, ...; see ``llog/config.py``).

pyspark 4.0 has no ``DataSourceStreamArrowWriter``: there ``writeStream`` gets
:class:`LlogStreamRowWriter`, which is handed Rows and puts them back into Arrow batches
(``rows.row_batches``) for the same staging; the records written are the same, the conversion
costs CPU in the Python workers. ``LlogStreamWriter`` is the writer this pyspark gets
(``llog_sink.compat``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamWriter
from pyspark.sql.types import StructType

from llog.config import COMPRESSION_TYPES, Config
from llog.process_clients import freeze_kept_objects, log_writer
from llog_sink.commit import commit_batch, sink_partition_count
from llog_sink.rows import InvalidSinkInput, SinkLayout, row_batches
from llog_sink.task_writer import SinkCommitMessage, write_task
from llog_sink.compat import DataSourceStreamArrowWriter

#: Options the sink reads itself; ``llog.*`` options go to the core config.
SINK_ID_OPTION, BATCH_ID_OPTION = "llog.sink.id", "llog.sink.batch.id"
_OWN = {"topic", "partitions", "compression", "path", SINK_ID_OPTION, BATCH_ID_OPTION}


def _int_option(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = options.get(name)
    if raw in (None, ""):
        return default
    try:
        return int(raw)
    except ValueError:
        raise InvalidSinkInput(f"option {name!r} must be an integer, got {raw!r}") from None


class _SinkSettings:
    """Parsed once on the driver; pickled with the writer to the tasks."""

    def __init__(self, schema: StructType, options: Mapping[str, str]):
        self.schema = schema
        self.config = Config.load({k: v for k, v in options.items() if k not in _OWN}).require(
            "oxia_service_address", "s3_bucket")
        option = _int_option(options, "partitions", None)
        layout = SinkLayout.from_schema(schema, options.get("topic") or None, option)
        #: The ``partitions`` option: the count every topic written must have when a batch commits
        #: (a missing topic is created with it then, explicitly), and rows are placed by. Without
        #: it each task reads the count afresh and the commit checks the batch used one count
        #: (``commit.placed_by``): so a streaming query follows a topic created on first use as
        #: it grows (docs/protocol.md section 10.2).
        self.partitions = option
        self.sink_id = options.get(SINK_ID_OPTION) or None
        self.batch_id = _int_option(options, BATCH_ID_OPTION, None)
        if self.sink_id is not None and self.batch_id is None:
            # A default batch id would make every later write of the sink a "replay" of the first.
            raise InvalidSinkInput(f"option {SINK_ID_OPTION!r} ({self.sink_id!r}) needs option {BATCH_ID_OPTION!r}: "
                                   f"(sink id, batch id) names one commit (docs/protocol.md section 9.1); give each "
                                   f"write its own batch id, or drop {SINK_ID_OPTION!r}")
        if self.batch_id is None:
            self.batch_id = 0
        self.compression = options.get("compression") or None
        if self.compression is not None and self.compression not in COMPRESSION_TYPES:
            raise InvalidSinkInput(f"option 'compression' must be one of {', '.join(COMPRESSION_TYPES)}, got "
                                   f"{self.compression!r}")
        if not layout.has_topic_column:  # one topic: the option is checked against it here, once
            topics = log_writer(self.config).topics
            # Read, not created: a write that fails on its input creates nothing. Fresh, once per
            # write: this process (a Python worker Spark reuses) may have looked the topic up
            # before an earlier write's commit, in another worker, created or grew it.
            sink_partition_count(topics.get(layout.topic_option, fresh=True), layout.topic_option, option,
                                 self.config.default_partitions)
            self.compression = self.compression or topics.compression(layout.topic_option)
        self.layout = layout


def _task_id() -> int:
    context = TaskContext.get()
    return context.partitionId() if context is not None else 0


class _StreamWriting:
    """``df.writeStream.format("llog")``: what the Arrow and the Row stream writers share."""

    def __init__(self, schema: StructType, options: Mapping[str, str]):
        self.settings = _SinkSettings(schema, options)

    def _write(self, batches: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        context = TaskContext.get()
        batch_id = int(context.getLocalProperty("streaming.sql.batchId") or 0)
        sink_id = self.settings.sink_id or context.getLocalProperty("sql.streaming.queryId")
        message = write_task(batches, self.settings.layout, self.settings.config, _task_id(), batch_id, sink_id,
                             self.settings.compression)
        freeze_kept_objects()  # Spark collects garbage after every task: hide what later tasks reuse
        return message

    def commit(self, messages: list[SinkCommitMessage | None], batchId: int) -> None:  # noqa: N803 - Spark's name
        commit_batch(self.settings.config, messages, batchId, self.settings.partitions)
        freeze_kept_objects()

    def abort(self, messages: list[SinkCommitMessage | None], batchId: int) -> None:  # noqa: N803
        pass  # nothing of this batch is in Oxia; its blobs are garbage for GC


class LlogStreamRowWriter(_StreamWriting, DataSourceStreamWriter):
    """``df.writeStream.format("llog")`` on pyspark 4.0, which hands stream writers Rows."""

    def write(self, iterator: Iterator[Row]) -> SinkCommitMessage:
        return self._write(row_batches(iterator, self.settings.schema, self.settings.layout.input_columns))


if DataSourceStreamArrowWriter is not None:
    class LlogStreamArrowWriter(_StreamWriting, DataSourceStreamArrowWriter):
        """``df.writeStream.format("llog")`` on pyspark >= 4.1: Arrow batches in."""

        def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
            return self._write(iterator)

    LlogStreamWriter = LlogStreamArrowWriter
else:
    LlogStreamWriter = LlogStreamRowWriter


class LlogBatchWriter(DataSourceArrowWriter):
    """``df.write.format("llog").mode("append")``."""

    def __init__(self, schema: StructType, options: Mapping[str, str]):
        self.settings = _SinkSettings(schema, options)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        message = write_task(iterator, self.settings.layout, self.settings.config, _task_id(), self.settings.batch_id,
                             self.settings.sink_id, self.settings.compression)
        freeze_kept_objects()
        return message

    def commit(self, messages: list[SinkCommitMessage | None]) -> None:
        commit_batch(self.settings.config, messages, self.settings.batch_id, self.settings.partitions)
        freeze_kept_objects()

    def abort(self, messages: list[SinkCommitMessage | None]) -> None:
        pass
