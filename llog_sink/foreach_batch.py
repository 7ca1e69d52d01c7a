"""``foreachBatch(write_batch(topic="orders"))``: the sink's engine inside a foreachBatch query.

Each micro-batch DataFrame is written with ``df.write.format("llog")`` naming a sink and the
micro-batch as the batch, so a replayed micro-batch commits nothing twice, exactly as with
``writeStream.format("llog")``.

One (sink id, batch id) names exactly one commit (docs/protocol.md section 9.1), and a
foreachBatch function may write a micro-batch several times (two topics, one topic split by
filters). So each write gets a sink id of its own, derived from what a replay of the micro-batch
makes again: ``{query id}.{label}.{n}``, where ``label`` is the ``name`` given, else the topic
(``topic-column`` when rows name their topics), and ``n`` the write's ordinal among this
micro-batch's writes with that label that returned in this run of the query (0 for the first;
a write that raised is not counted, so the function's retry of it is a replay). Writes of one
label run one after another: a second write of a label while one is in flight (threads in the
function) would take the same ordinal, and is refused (:class:`SinkWriteInFlight`); give
concurrent writes their own ``name=``. A replay after
a restart (a new run, the same query id from the checkpoint) that makes the same writes in the
same order derives the same ids. An id over 249 characters (the topic name rule) takes a SHA-256
digest of the label instead. Spark's local property ``sql.streaming.queryId``, set on the thread
that runs the function, names the query; the query of that id in the session that started it
(``spark.streams.get``) names its run, ``runId``. (``sql.streaming.runId`` is not set on that
thread in pyspark 4.2; when the query is not found there, the batch's job group is its run id:
Spark runs each micro-batch in the job group ``runId``.)
"""

from __future__ import annotations

import collections
import hashlib
import threading
from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession

from llog.errors import InvalidTopicName, SinkWriteInFlight
from llog.keys import MAX_TOPIC_LENGTH, validate_group, validate_topic
from llog_sink.rows import InvalidSinkInput
from llog_sink.spark_writers import BATCH_ID_OPTION, SINK_ID_OPTION

#: The label of a write whose rows name their topics (a ``topic`` column, no ``topic`` option).
TOPIC_COLUMN_LABEL = "topic-column"
#: Per query id: the run and micro-batch being written, how many writes per label returned so
#: far, and the labels with a write in flight.
_writes: dict[str, tuple[str, int, collections.Counter, set[str]]] = {}
_writes_lock = threading.Lock()


def write_sink_id(query_id: str, label: str, ordinal: int) -> str:
    """The sink id of a foreachBatch write (module doc): a valid sink id, at most 249 characters."""
    sink_id = f"{query_id}.{label}.{ordinal}"
    if len(sink_id) > MAX_TOPIC_LENGTH:
        sink_id = f"{query_id}.{hashlib.sha256(label.encode()).hexdigest()}.{ordinal}"
    return validate_group(sink_id)


def _begin_write(query_id: str, run_id: str, batch_id: int, label: str) -> int:
    """The ordinal of a write with ``label`` starting in this micro-batch of this run: the count
    of its writes with that label that returned (:func:`_end_write`). A write that raised is not
    counted, so a function that retries it gets the same sink id, and its retry is a replay of
    whatever the failed attempt pinned and committed (docs/protocol.md section 9.1). A write of
    ``label`` still in flight: :class:`SinkWriteInFlight`, since both would get one sink id."""
    with _writes_lock:
        run, batch, counts, in_flight = _writes.get(query_id, (None, None, None, None))
        if (run, batch) != (run_id, batch_id):
            counts, in_flight = collections.Counter(), set()
            _writes[query_id] = (run_id, batch_id, counts, in_flight)
        if label in in_flight:
            raise SinkWriteInFlight(
                f"write_batch: a write with label {label!r} of micro-batch {batch_id} is still running while another "
                f"starts; writes of one label run one after another (both would get sink id ordinal {counts[label]}). "
                f"Give each concurrent write its own name= (write_batch(..., name=...)); nothing of this write is "
                f"committed")
        in_flight.add(label)
        return counts[label]


def _end_write(query_id: str, run_id: str, batch_id: int, label: str, returned: bool) -> None:
    """A write with ``label`` ended; if it ``returned``, the next one gets the next ordinal."""
    with _writes_lock:
        run, batch, counts, in_flight = _writes.get(query_id, (None, None, None, None))
        if (run, batch) == (run_id, batch_id):
            in_flight.discard(label)
            if returned:
                counts[label] += 1


def _query_and_run(df: DataFrame) -> tuple[str, str]:
    """The streaming query's id and the id of its current run (module doc)."""
    context = df.sparkSession.sparkContext
    query_id = context.getLocalProperty("sql.streaming.queryId")
    if not query_id:
        raise RuntimeError("llog_sink.write_batch must run inside foreachBatch of a streaming query")
    # The function gets a clone of the query's session, whose query manager does not know it.
    started_from = SparkSession.getActiveSession() or SparkSession._instantiatedSession  # noqa: SLF001
    query = started_from.streams.get(query_id) if started_from is not None else None
    run_id = query.runId if query is not None else context.getLocalProperty("spark.jobGroup.id")
    if not run_id:
        raise RuntimeError(f"llog_sink.write_batch: the run of streaming query {query_id} cannot be found")
    return query_id, run_id


def write_batch(topic: str | None = None, partitions: int | None = None, name: str | None = None,
                **options: str) -> Callable[[DataFrame, int], None]:
    """A ``foreachBatch`` function writing each micro-batch to llog. ``options`` are passed on
    (``llog.*`` settings); ``topic``/``partitions`` as the sink's options of those names.
    ``name`` (the topic name rule) labels the write's sink id instead of the topic (module doc):
    a write keeps its id when the function's other writes change."""
    if name is not None:
        try:
            validate_topic(name)
        except InvalidTopicName as e:
            raise InvalidSinkInput(f"write_batch's name={name!r} must follow the topic name rule: {e}") from None
    label = name or topic or TOPIC_COLUMN_LABEL

    def write(df: DataFrame, batch_id: int) -> None:
        query_id, run_id = _query_and_run(df)
        sink_id = write_sink_id(query_id, label, _begin_write(query_id, run_id, batch_id, label))
        returned = False
        try:
            writer = df.write.format("llog").mode("append").options(**options)
            if topic is not None:
                writer = writer.option("topic", topic)
            if partitions is not None:
                writer = writer.option("partitions", str(partitions))
            writer.option(SINK_ID_OPTION, sink_id).option(BATCH_ID_OPTION, str(batch_id)).save()
            returned = True
        finally:
            _end_write(query_id, run_id, batch_id, label, returned)

    return write
