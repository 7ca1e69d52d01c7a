"""The Spark source and topic incarnations (docs/protocol.md section 12.6): a micro-batch reads
the incarnation its end offsets were taken from, or fails by the data-loss rule; never a topic
created again at offsets planned in the one before it.

The stream reader is driven as Spark drives it, call by call (``latestOffset(start, limit)``,
Spark's offset log, ``partitions(start, end)``, the tasks), with the topic deleted and created
again between two calls; the last test runs a query on local Spark across a re-create.
"""

from __future__ import annotations

import contextlib
import json

import pytest
from pyspark.errors import StreamingQueryException

from llog.coordination import Coordination
from llog.objects import ObjectStore
from llog.topics import create_topic, delete_topic
from llog.writer import LogWriter
from llog_source import spark_readers
from llog_source.compat import ADMISSION_CONTROL, ReadAllAvailable
from llog_source.options import SourceOptions
from llog_source.planning import DataLossError

T = "events"

pytestmark = pytest.mark.skipif(not ADMISSION_CONTROL, reason="Spark's call order with the start: pyspark >= 4.2")


@pytest.fixture
def clients(config):
    config = config.replace(default_partitions=1)
    objects = ObjectStore(config)
    with Coordination(config) as coordination, LogWriter(config) as writer:
        create_topic(coordination, config.root_prefix, T, 1)
        yield config, coordination, objects, writer
    objects.close()


def _reader(config, **options) -> spark_readers.LlogStreamReader:
    settings = {k.lower(): v for k, v in config.to_options().items()}
    return spark_readers.LlogStreamReader(SourceOptions.parse({**settings, "topics": T, **options}, streaming=True))


def _values(reader: spark_readers.LlogStreamReader, start: dict, end: dict) -> list[str]:
    """What the batch ``start..end`` reads, as Spark plans it and its tasks read it."""
    return [v.decode() for split in reader.partitions(start, end) for batch in reader.read(split)
            for v in batch.column("value").to_pylist()]


def _recreate(config, coordination, objects, writer: LogWriter, count: int) -> None:
    delete_topic(coordination, objects, config.root_prefix, T, config=config)
    create_topic(coordination, config.root_prefix, T, 1)
    writer.topics.forget(T)
    writer.append(T, 0, [f"new-{i}".encode() for i in range(1, count + 1)])


def _old(writer: LogWriter, first: int, last: int) -> None:
    writer.append(T, 0, [f"old-{i}".encode() for i in range(first, last + 1)])


def _second_batch_planned_before_a_recreate(clients, **options: str):
    """A reader (``options`` on top of earliest) that read old 1..3 as its first batch and took
    old 4..5 as its second batch's end; then the topic is created again with new 1..10. Returns
    ``(reader, first, second)``: the first batch's end offset and the second's."""
    config, coordination, objects, writer = clients
    _old(writer, 1, 3)
    reader = _reader(config, startingOffsets="earliest", **options)
    start = reader.initialOffset()
    first = reader.latestOffset(start, ReadAllAvailable())
    assert _values(reader, start, first) == ["old-1", "old-2", "old-3"]
    _old(writer, 4, 5)
    second = reader.latestOffset(first, ReadAllAvailable())
    _recreate(config, coordination, objects, writer, 10)
    return reader, first, second


def test_a_batch_planned_before_a_recreate_fails_instead_of_reading_the_new_topic(clients):
    """Spark took the batch's end (4..5 of the old topic) and wrote its offset log; the topic is
    created again before it plans the tasks. The tasks fail naming the re-create (on 1.2 they
    read new-4 and new-5, and new-1..new-3 were never read)."""
    reader, first, second = _second_batch_planned_before_a_recreate(clients)
    with pytest.raises(DataLossError, match=f"topic '{T}' was deleted and created again"):
        _values(reader, first, second)


def test_with_fail_on_data_loss_false_the_query_goes_on_from_the_new_topics_start(clients, capfd):
    """The same, with ``failOnDataLoss=false``: the stale batch reads nothing, and the next one
    reads the new topic from its first record, with a warning naming the re-create."""
    reader, first, second = _second_batch_planned_before_a_recreate(clients, failOnDataLoss="false")
    assert _values(reader, first, second) == []
    third = reader.latestOffset(second, ReadAllAvailable())
    assert _values(reader, second, third) == [f"new-{i}" for i in range(1, 11)]
    assert "was deleted and created again" in capfd.readouterr().err


def test_a_query_restarted_after_a_recreate_does_not_read_the_new_topic_from_old_positions(clients):
    """A query read old 1..5 and stopped; the topic is created again with 10 records. The
    restarted query (a new reader, Spark's checkpointed end as its start) fails naming the
    re-create; on 1.2 it read the new topic from offset 6, skipping new-1..new-5."""
    config, coordination, objects, writer = clients
    _old(writer, 1, 5)
    before = _reader(config, startingOffsets="earliest")
    start = before.initialOffset()
    checkpointed = before.latestOffset(start, ReadAllAvailable())
    assert _values(before, start, checkpointed) == [f"old-{i}" for i in range(1, 6)]
    _recreate(config, coordination, objects, writer, 10)
    restarted = _reader(config, startingOffsets="earliest")
    with pytest.raises(DataLossError, match=f"topic '{T}' was deleted and created again"):
        restarted.latestOffset(json.loads(json.dumps(checkpointed)), ReadAllAvailable())
    lenient = _reader(config, startingOffsets="earliest", failOnDataLoss="false")
    end = lenient.latestOffset(checkpointed, ReadAllAvailable())
    assert _values(lenient, checkpointed, end) == [f"new-{i}" for i in range(1, 11)]


def test_offsets_checkpointed_before_they_named_the_topic_id_are_still_read(clients):
    """A checkpoint written by 1.2 (``{"topic": {"partition": position}}``) plans and reads."""
    config, coordination, objects, writer = clients
    _old(writer, 1, 5)
    reader = _reader(config, startingOffsets="earliest")
    end = reader.latestOffset({T: {"0": 3}}, ReadAllAvailable())
    assert _values(reader, {T: {"0": 3}}, end) == ["old-3", "old-4", "old-5"]
    assert _values(reader, {T: {"0": 1}}, {T: {"0": 3}}) == ["old-1", "old-2"]


@pytest.fixture(scope="module")
def spark():
    from jobs.local_spark import local_spark

    session = local_spark("llog-source-incarnation-tests")
    yield session
    session.stop()


def test_a_query_on_local_spark_restarted_across_a_recreate_fails_then_reads_the_new_topic_whole(
        spark, clients, tmp_path):
    """The checkpoint of a query that read old 1..5 names the old incarnation; restarted after
    the topic was created again with 10 records, the query fails naming the re-create, and with
    ``failOnDataLoss=false`` it reads the new topic from its first record."""
    config, coordination, objects, writer = clients
    _old(writer, 1, 5)
    seen: list[str] = []

    def run(**options):
        settings = {k.lower(): v for k, v in config.to_options().items()}
        query = (spark.readStream.format("llog").options(**settings).option("topics", T)
                 .option("startingOffsets", "earliest").options(**options).load()
                 .writeStream.foreachBatch(lambda df, _: seen.extend(bytes(r.value).decode() for r in df.collect()))
                 .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
        with contextlib.suppress(StreamingQueryException):  # a failed query: its exception() says why
            query.awaitTermination(180)
        return query.exception()

    assert run() is None and seen == [f"old-{i}" for i in range(1, 6)]
    _recreate(config, coordination, objects, writer, 10)
    failed = run()
    assert failed is not None and "was deleted and created again" in str(failed)
    assert seen == [f"old-{i}" for i in range(1, 6)]
    assert run(failOnDataLoss="false") is None
    assert seen[5:] == [f"new-{i}" for i in range(1, 11)]
