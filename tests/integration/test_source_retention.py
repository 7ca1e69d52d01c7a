"""format("llog") reads and retention (docs/protocol.md section 10.3), with real Spark over real Oxia and
S3 (versitygw): ``earliest`` is each partition's log start offset; a position below it is data loss
(``failOnDataLoss``), on the driver when a batch is planned and in the tasks when retention moved
the start after that; a read never returns another offset's record."""

from __future__ import annotations

import itertools

import pytest
from pyspark.errors import PySparkException

from jobs.local_spark import local_spark
from llog.clock import ShiftedClock
from llog.compactor import Compactor
from llog.consumer_groups import committed_offsets, describe_group
from llog.coordination import Coordination
from llog.gc import gc_pass
from llog.keys import TopicPartition
from llog.records import IndexEntry
from llog.topics import alter_topic, create_topic
from llog_source.partition_reader import read_split
from llog_source.planning import DataLossError, LlogSplit
from tests.integration.test_spark_source import _options, _read, _rows

#: Retention passes (and GC) run an hour ahead: every entry is past the grace period ``G``.
LATER = 3600
_appends = itertools.count()  # makes every record's value unique


@pytest.fixture(scope="module")
def spark():
    session = local_spark("llog-source-retention-tests")
    yield session
    session.stop()


def _create(config, topic: str, partitions: int, **settings) -> None:
    with Coordination(config) as coordination:
        create_topic(coordination, config.root_prefix, topic, partitions, settings=settings)


def _append(writer, topic: str, partition: int, appends: int, records: int = 10) -> list[tuple[int, bytes]]:
    """``appends`` appends (one index entry each) of ``records`` records: ``(offset, value)`` of each."""
    out = []
    for _ in range(appends):
        values = [f"{topic}/{partition}/{next(_appends)}/{i}".encode() for i in range(records)]
        result = writer.append(topic, partition, values)
        out += list(enumerate(values, start=result.start_offset))
    return out


def _retain(config, topic: str, partition: int) -> int:
    """A retention pass of the partition an hour from now; its log start offset after it."""
    with Compactor(config, clock=ShiftedClock(LATER)) as compactor:
        return compactor.retain_partition(topic, partition).log_start_offset


def _keep_last_entries(config, topic: str, partition: int, entries: int) -> int:
    """``retention.bytes`` set to the bytes of the partition's last ``entries`` index entries (and
    no time limit), then a retention pass and a GC pass an hour from now, which delete the other
    entries and their blobs: the log start offset after it."""
    with Compactor(config, clock=ShiftedClock(LATER)) as compactor:
        keys = compactor.keys(topic, partition)
        found = compactor.coordination.range_scan(keys.index(1), keys.index_end, keys.partition_key)
        kept = sum(IndexEntry.from_json(v.value, v.key).byte_length for v in found[-entries:])
        alter_topic(compactor.coordination, config.root_prefix, topic,
                    set_config={"retention.ms": -1, "retention.bytes": kept})
        start = compactor.retain_partition(topic, partition).log_start_offset
        gc_pass(compactor.coordination, compactor.objects, config.root_prefix, config.gc_grace_ms,
                clock=ShiftedClock(LATER))
        return start


def test_batch_reads_start_at_the_log_start_offset(spark, config, writer):
    _create(config, "kept", 2, **{"retention.ms": 1000})
    removed = _append(writer, "kept", 0, 3)
    whole = _append(writer, "kept", 1, 3)
    assert _retain(config, "kept", 0) == 31  # partition 1 keeps everything
    kept = _append(writer, "kept", 0, 2)
    whole += _append(writer, "kept", 1, 1)
    assert [o for o, _ in removed] == list(range(1, 31)) and [o for o, _ in kept] == list(range(31, 51))

    assert _rows(_read(spark, config, topics="kept")) == {0: kept, 1: whole}  # startingOffsets earliest
    assert _rows(_read(spark, config, topics="kept", startingOffsets='{"kept": {"0": -2, "1": 25}}')) == {
        0: kept, 1: whole[24:]}

    below = '{"kept": {"0": 5, "1": -2}}'
    with pytest.raises(PySparkException, match=r"startingOffsets: offsets 5\.\.30 of kept\[0\] were removed by "
                                                r"retention \(its log start offset is 31.*failOnDataLoss=false"):
        _read(spark, config, topics="kept", startingOffsets=below).collect()
    assert _rows(_read(spark, config, topics="kept", startingOffsets=below, failOnDataLoss="false")) == {
        0: kept, 1: whole}


def _run(spark, config, checkpoint, **options) -> tuple[list[tuple[str, int, int, bytes]], object]:
    """An ``availableNow`` run of a stream on ``checkpoint``: the rows it read, in arrival order,
    and the query (ended, maybe failed)."""
    rows = []

    def keep(df, _):
        rows.extend((r.topic, r.partition, r.offset, bytes(r.value)) for r in df.collect())

    query = (spark.readStream.format("llog").options(**_options(config)).options(**options).load()
             .writeStream.foreachBatch(keep).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination(180)
    except PySparkException:
        pass  # the test looks at query.exception()
    assert not query.isActive
    return rows, query


def _of(rows, topic: str, partition: int) -> list[tuple[int, bytes]]:
    return [(o, v) for t, p, o, v in rows if (t, p) == (topic, partition)]


def test_a_stream_positioned_below_the_log_start_fails_or_goes_on_from_it(spark, config, writer, tmp_path):
    _create(config, "s", 1, **{"retention.ms": 1000})
    stream = {"topics": "s", "startingOffsets": "earliest", "groupId": "g"}
    checkpoint = tmp_path / "ck"
    _append(writer, "s", 0, 2)
    assert _retain(config, "s", 0) == 21
    first = _append(writer, "s", 0, 1)
    rows, query = _run(spark, config, checkpoint, **stream)
    assert query.exception() is None and rows == [("s", 0, o, v) for o, v in first]  # earliest: 21..30

    # A partition discovered by the query starts at its log start offset: no data loss.
    with Coordination(config) as coordination:
        alter_topic(coordination, config.root_prefix, "s", partitions=2)
    _append(writer, "s", 1, 2)
    assert _retain(config, "s", 1) == 21
    new_partition = _append(writer, "s", 1, 1)
    second = _append(writer, "s", 0, 1)
    rows, query = _run(spark, config, checkpoint, **stream)
    assert query.exception() is None
    assert _of(rows, "s", 0) == second and _of(rows, "s", 1) == new_partition

    # Stopped while retention removed offsets it had not read (41..60).
    missed = _append(writer, "s", 0, 2)
    assert _retain(config, "s", 0) == 61 and missed[0][0] == 41
    after = _append(writer, "s", 0, 1)
    rows, query = _run(spark, config, checkpoint, **stream)
    assert rows == [] and query.exception() is not None
    message = str(query.exception())
    assert "offsets 41..60 of s[0] were removed by retention" in message and "failOnDataLoss=false" in message
    with Coordination(config) as coordination:
        committed = committed_offsets(coordination, config.root_prefix, "g", [TopicPartition("s", 0)])
        assert committed[TopicPartition("s", 0)].offset == 41  # below the log start: committing it works
        lags = {(r.topic, r.partition): r.lag for r in describe_group(coordination, config.root_prefix, "g")}
        assert lags == {("s", 0): 10, ("s", 1): 0}  # counted from the log start 61 (docs/protocol.md section 10.3)

    rows, query = _run(spark, config, checkpoint, failOnDataLoss="false", **stream)
    assert query.exception() is None and rows == [("s", 0, o, v) for o, v in after]  # 61..70
    with Coordination(config) as coordination:
        rows = describe_group(coordination, config.root_prefix, "g")
        assert {(r.topic, r.partition): (r.committed_offset, r.lag) for r in rows} == {("s", 0): (71, 0),
                                                                                       ("s", 1): (31, 0)}


def _split_rows(batches) -> list[tuple[int, bytes]]:
    return [(o, bytes(v)) for batch in batches
            for o, v in zip(batch.column("offset").to_pylist(), batch.column("value").to_pylist())]


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_task_planned_before_retention_moved_the_start(config, writer, fail_on_data_loss):
    written = _append(writer, "r", 0, 6)
    split = LlogSplit("r", 0, 1, 60)  # planned when the log start was 1
    assert _keep_last_entries(config, "r", 0, 2) == 41
    if fail_on_data_loss:
        with pytest.raises(DataLossError, match=r"offsets 1\.\.40 of r\[0\] were removed by retention.*"
                                                r"failOnDataLoss=false"):
            list(read_split(split, config, True))
    else:
        assert _split_rows(read_split(split, config, False)) == written[40:]


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_task_reading_while_retention_runs(config, writer, fail_on_data_loss):
    """Retention (and GC of the blobs it unreferenced) runs after the task has returned its first
    entry's records: the entries it fetched meanwhile are returned as they are (the records of
    those offsets); the rest below the new start is reported, or skipped."""
    written = _append(writer, "r", 0, 6)
    batches = read_split(LlogSplit("r", 0, 1, 60), config, fail_on_data_loss, chunk_bytes=1)  # an entry per step
    got = _split_rows([next(batches)])
    assert got == written[:10]
    assert _keep_last_entries(config, "r", 0, 2) == 41
    try:
        for batch in batches:
            got += _split_rows([batch])
    except DataLossError as e:
        assert fail_on_data_loss
        error = str(e)
    else:
        assert not fail_on_data_loss
        error = None
    read_before = [row for row in got if row[0] < 41]
    assert read_before == written[:len(read_before)] and len(read_before) in (10, 20, 30)  # fetched ahead, or not
    if fail_on_data_loss:
        assert got == read_before
        assert f"offsets {len(read_before) + 1}..40 of r[0] were removed by retention" in error
    else:
        assert got == read_before + written[40:]
