"""The connectors' fallbacks for pyspark 4.0 and 4.1 (pyspark_llog.compat), exercised on this
venv's pyspark against real Oxia and the S3 server: the Row stream writer through real Spark (which
hands a ``DataSourceStreamWriter`` Rows on every version), and the stream reader without
admission control driven as pyspark 4.0 drives it (``latestOffset()`` without the start). The
same paths on the real old versions: tests/compat/check_pyspark.py."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from pyspark.sql.datasource import DataSource

from llog.consumer_groups import committed_offsets
from llog.coordination import Coordination
from llog.keys import TopicPartition
from llog.topics import create_topic
from llog_sink.spark_writers import LlogStreamRowWriter
from llog_source import spark_readers
from llog_source.options import SourceOptions
from llog_source.planning import DataLossError
from jobs.local_spark import local_spark

SCHEMA = "key string, value binary, headers array<struct<key:string,value:binary>>, timestamp timestamp"


class RowSink(DataSource):
    """``format("llog_rows")``: llog's stream writer as pyspark 4.0 gets it (Rows in)."""

    @classmethod
    def name(cls) -> str:
        return "llog_rows"

    def streamWriter(self, schema, overwrite: bool):  # noqa: N802 - Spark's name
        return LlogStreamRowWriter(schema, self.options)


@pytest.fixture(scope="module")
def spark():
    session = local_spark("llog-fallback-tests")
    session.dataSource.register(RowSink)
    yield session
    session.stop()


def _options(config) -> dict[str, str]:
    return {k.lower(): v for k, v in config.to_options().items()}


def _records(count: int) -> list[tuple]:
    start = datetime(2024, 3, 10, 6, 30, tzinfo=timezone.utc)
    return [(f"k{i % 10}", None if i % 7 == 3 else f"v{i}".encode(),
             None if i % 5 == 0 else [(f"h{j}", f"{i}.{j}".encode()) for j in range(i % 3)],
             start + timedelta(minutes=i, milliseconds=i)) for i in range(count)]


def _comparable(key, value, headers, ts) -> tuple:
    return (key, bytes(value) if value is not None else None,
            tuple((h[0], bytes(h[1])) for h in headers) if headers else (), ts.astimezone(timezone.utc))


def test_the_row_stream_writer_writes_what_the_arrow_one_does(spark, config, tmp_path):
    rows = _records(700)
    spark.createDataFrame(rows, SCHEMA).repartition(2).write.parquet(str(tmp_path / "in"))
    query = (spark.readStream.schema(SCHEMA).parquet(str(tmp_path / "in"))
             .writeStream.format("llog_rows").options(**_options(config)).option("topic", "rows")
             .option("partitions", "3").option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert query.exception() is None
    read = (spark.read.format("llog").options(**_options(config)).option("topics", "rows")
            .option("includeHeaders", "true").load().collect())
    assert len(read) == len(rows)
    assert {_comparable(r.key.decode() if r.key is not None else None, r.value, r.headers, r.timestamp)
            for r in read} == {_comparable(*r) for r in rows}
    assert {r.partition for r in read} == {0, 1, 2}  # keyed rows spread by Kafka's partitioner


@pytest.fixture
def without_admission_control(monkeypatch):
    """The stream reader as on pyspark 4.0 and 4.1."""
    monkeypatch.setattr(spark_readers, "ADMISSION_CONTROL", False)


def _reader(config, **options) -> spark_readers.LlogStreamReader:
    return spark_readers.LlogStreamReader(SourceOptions.parse({**_options(config), **options}, streaming=True))


def _read(reader, start: dict, end: dict) -> list[tuple[int, int]]:
    """``(partition, offset)`` of every record the planned splits read, as the tasks would."""
    return sorted((b["partition"], b["offset"]) for split in reader.partitions(start, end)
                  for batch in reader.read(split) for b in batch.select(["partition", "offset"]).to_pylist())


def _committed(config, group: str, topic: str, partitions: int) -> dict[int, int]:
    with Coordination(config) as coordination:
        found = committed_offsets(coordination, config.root_prefix, group,
                                  [TopicPartition(topic, p) for p in range(partitions)])
    return {tp.partition: o.offset for tp, o in found.items()}


def test_reader_without_the_start_commits_the_group_once_batches_are_done(without_admission_control, config,
                                                                           writer):
    topic_id = create_topic(writer.coordination, config.root_prefix, "old", 2).topic_id
    for p in (0, 1):
        writer.append("old", p, [b"r"] * 10)
    reader = _reader(config, topics="old", startingOffsets="earliest", groupId="g")
    start = reader.initialOffset()
    end = reader.latestOffset()  # pyspark 4.0 and 4.1 pass no start and no limit
    # Offsets name the incarnation they belong to (docs/protocol.md section 12.6).
    assert (start, end) == ({"old": {"0": 1, "1": 1, "topic_id": topic_id}},
                            {"old": {"0": 11, "1": 11, "topic_id": topic_id}})
    assert _read(reader, start, end) == [(p, o) for p in (0, 1) for o in range(1, 11)]
    assert _committed(config, "g", "old", 2) == {0: 1, 1: 1}  # planning a batch commits its start
    writer.append("old", 0, [b"r"] * 5)
    later = reader.latestOffset()  # the batch planned last is done: committed now
    assert _committed(config, "g", "old", 2) == {0: 11, 1: 11}
    assert later == {"old": {"0": 16, "1": 11, "topic_id": topic_id}}
    assert _read(reader, end, later) == [(0, o) for o in range(11, 16)]


def test_reader_without_the_start_reports_data_loss_when_planning(without_admission_control, config, writer,
                                                                   capfd):
    create_topic(writer.coordination, config.root_prefix, "lossy", 1)
    writer.append("lossy", 0, [b"r"] * 10)
    strict = _reader(config, topics="lossy")
    end = strict.latestOffset()
    with pytest.raises(DataLossError, match=r"lossy\[0\] was at offset 50 but its high watermark is now 10"):
        strict.partitions({"lossy": {"0": 50}}, end)
    with pytest.raises(DataLossError, match=r"partition gone\[0\] no longer exists"):
        strict.partitions({"lossy": {"0": 1}, "gone": {"0": 3}}, end)
    lenient = _reader(config, topics="lossy", failOnDataLoss="false")
    # Moved back: read again from the log start; gone: dropped; both with a warning.
    assert _read(lenient, {"lossy": {"0": 50}, "gone": {"0": 3}}, end) == [(0, o) for o in range(1, 11)]
    err = capfd.readouterr().err
    assert "lossy[0] was at offset 50" in err and "partition gone[0] no longer exists" in err
