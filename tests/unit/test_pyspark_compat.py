"""What the connectors do on an older pyspark than the venv's (pyspark_llog.compat): the Row
input of the pyspark 4.0 stream writer, and the stream reader's refusal of maxOffsetsPerTrigger
without admission control. Pure code, no servers; the fallbacks end to end are in
tests/integration/test_pyspark_fallbacks.py and tests/compat/check_pyspark.py."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pyarrow as pa
import pytest
from pyspark.sql import types as T
from pyspark.sql.conversion import ArrowTableToRowsConversion

import pyspark_llog.compat as compat
from llog_sink import spark_writers
from llog_sink.rows import InvalidSinkInput, SinkLayout, row_batches
from llog_source import spark_readers
from llog_source.options import InvalidSourceOption, SourceOptions

CONNECTION = {"llog.oxia.service.address": "127.0.0.1:1", "llog.s3.bucket": "b"}
SCHEMA = T.StructType([
    T.StructField("key", T.StringType()), T.StructField("value", T.BinaryType()),
    T.StructField("headers", T.ArrayType(T.StructType([T.StructField("key", T.StringType()),
                                                       T.StructField("value", T.BinaryType())]))),
    T.StructField("timestamp", T.TimestampType()), T.StructField("topic", T.StringType()),
    T.StructField("partition", T.IntegerType()), T.StructField("extra", T.DoubleType()),
])
_HEADERS = pa.list_(pa.field("element", pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])))


@pytest.fixture
def new_york(monkeypatch):
    """The process's local time zone is New York (Spark's Rows carry local times)."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def _spark_input(n: int) -> pa.Table:
    """Arrow as Spark hands a writer the rows of SCHEMA: timestamps in UTC microseconds."""
    instants = [datetime(2024, 3, 10, 6, 0, tzinfo=timezone.utc).timestamp() * 1_000_000 + i * 60_000_000 + i
                for i in range(n)]
    return pa.table({
        "key": pa.array([None if i % 4 == 0 else f"k{i}" for i in range(n)], pa.string()),
        "value": pa.array([None if i % 7 == 3 else f"v{i}".encode() for i in range(n)], pa.binary()),
        "headers": pa.array([None if i % 5 == 0 else [{"key": f"h{j}", "value": None if j == 1 else b"x"}
                                                      for j in range(i % 3)] for i in range(n)], _HEADERS),
        "timestamp": pa.array([None if i == 2 else int(t) for i, t in enumerate(instants)],
                              pa.timestamp("us", tz="UTC")),
        "topic": pa.array([f"t{i % 2}" for i in range(n)], pa.string()),
        "partition": pa.array([i % 3 for i in range(n)], pa.int32()),
        "extra": pa.array([0.5] * n, pa.float64()),
    })


def test_rows_go_back_to_the_arrow_spark_would_have_handed_over(new_york):
    table = _spark_input(250)  # 2 h 30 of minutes across New York's DST change (07:00 UTC)
    rows = ArrowTableToRowsConversion.convert(table, SCHEMA)  # what pyspark 4.0 hands a stream writer
    assert rows[1].timestamp.tzinfo is None and rows[1].timestamp.hour == 1  # local: 06:01 UTC is 01:01 EST
    layout = SinkLayout.from_schema(SCHEMA, None, None)
    assert layout.input_columns == ("key", "value", "headers", "timestamp", "topic", "partition")
    batches = list(row_batches(iter(rows), SCHEMA, layout.input_columns, rows_per_batch=100))
    assert [b.num_rows for b in batches] == [100, 100, 50]
    got = pa.Table.from_batches(batches)
    assert got.column_names == list(layout.input_columns)  # 'extra' is ignored by the sink: not converted
    for name in ("key", "value", "headers", "topic"):
        assert got.column(name).to_pylist() == table.column(name).to_pylist(), name
    assert got.column("partition").to_pylist() == table.column("partition").to_pylist()
    assert got.schema.field("timestamp").type == pa.timestamp("us", tz="UTC")
    assert got.column("timestamp").cast(pa.int64()).to_pylist() == table.column("timestamp").cast(pa.int64()).to_pylist()


def test_rows_of_string_values_ntz_and_long_timestamps():
    schema = T.StructType([T.StructField("value", T.StringType()), T.StructField("timestamp", T.TimestampNTZType())])
    batch, = row_batches([("a", datetime(2024, 1, 1, 12)), ("b", None)], schema, ("value", "timestamp"))
    assert batch.schema == pa.schema([("value", pa.string()), ("timestamp", pa.timestamp("us"))])
    assert batch.column(1).cast(pa.int64()).to_pylist() == [1_704_110_400_000_000, None]  # wall clock as is
    longs = T.StructType([T.StructField("value", T.BinaryType()), T.StructField("timestamp", T.LongType())])
    batch, = row_batches([(bytearray(b"x"), 17)], longs, ("value", "timestamp"))
    assert batch.column(0).to_pylist() == [b"x"] and batch.column(1).type == pa.int64()
    assert list(row_batches([], longs, ("value",))) == []


def test_a_column_the_sink_does_not_read_cannot_be_converted():
    with pytest.raises(InvalidSinkInput, match="column 'extra' of type double"):
        list(row_batches([(b"v", 0.5)], T.StructType([T.StructField("value", T.BinaryType()),
                                                       T.StructField("extra", T.DoubleType())]), ("value", "extra")))


def test_this_venvs_pyspark_has_every_feature():
    """The venv's pyspark (llog[spark], 4.2) gets the Arrow stream writer and admission control."""
    assert compat.features() == {"pyspark": compat.PYSPARK_VERSION, "arrow_stream_writer": True,
                                 "admission_control": True}
    assert spark_writers.LlogStreamWriter is spark_writers.LlogStreamArrowWriter
    assert "SupportsTriggerAvailableNow" in [c.__name__ for c in spark_readers.LlogStreamReader.__mro__]


@pytest.mark.parametrize("version, release", [("4.0.5", (4, 0)), ("4.1.0.dev2", (4, 1)), ("4.2.0+db17", (4, 2)),
                                              ("10.12", (10, 12))])
def test_release_of_a_version(version, release):
    assert compat._release(version) == release


def test_an_unreadable_version_is_an_import_error():
    with pytest.raises(ImportError, match="cannot read the pyspark version 'dev'"):
        compat._release("dev")


def test_without_admission_control_max_offsets_per_trigger_is_refused(monkeypatch):
    options = SourceOptions.parse({**CONNECTION, "topics": "a", "maxOffsetsPerTrigger": "100"}, streaming=True)
    spark_readers.LlogStreamReader(options)  # this pyspark limits batches
    monkeypatch.setattr(spark_readers, "ADMISSION_CONTROL", False)
    monkeypatch.setattr(spark_readers, "PYSPARK_VERSION", "4.0.5")
    with pytest.raises(InvalidSourceOption, match=r"maxOffsetsPerTrigger needs pyspark >= 4.2 \(admission control "
                                                  r"for Python data sources\); this is pyspark 4.0\.5"):
        spark_readers.LlogStreamReader(options)
    spark_readers.LlogStreamReader(SourceOptions.parse({**CONNECTION, "topics": "a"}, streaming=True))
