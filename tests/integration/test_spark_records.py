"""Kafka's record model through Spark (docs/protocol.md section 11): keys, headers, event times,
tombstones and compression written with ``df.write.format("llog")`` and read back with
``spark.read`` / ``spark.readStream.format("llog")``, on real Oxia and the S3 server."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from uuid import uuid4

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.errors import PySparkException
from pyspark.sql import functions as F

from jobs.local_spark import local_spark
from llog.codec import body_compression
from llog.coordination import Coordination
from llog.discovery import topic_partitions
from llog.objects import ObjectStore
from llog.partitioner import kafka_partitions
from llog.records import BYTES_BATCH_V1, RECORDS_V2
from llog_source.schema import SOURCE_SCHEMA, SOURCE_SCHEMA_WITH_HEADERS
from tests.helpers.invariants import check_partition

SINK_SCHEMA = "key binary, value binary, headers array<struct<key:string,value:binary>>, timestamp timestamp"
KAFKA_COLUMNS = ("struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
                 "timestamp:timestamp,timestampType:int>")
HEADERS_TYPE = "array<struct<key:string,value:binary>>"
CREATE_TIME, LOG_APPEND_TIME = 0, 1
#: How far a LogAppendTime may lie outside the test's own clock readings (same host, same clock).
CLOCK_SLACK_MS = 5_000


@pytest.fixture(scope="module")
def spark():
    session = local_spark("llog-records-tests")
    yield session
    session.stop()


def _options(config) -> dict[str, str]:
    return {k.lower(): v for k, v in config.to_options().items()}


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _write(spark, config, df, topic: str, **options) -> None:
    (df.write.format("llog").options(**_options(config)).option("topic", topic)
     .options(**{k: str(v) for k, v in options.items()}).mode("append").save())


def _read(spark, config, topic: str, **options):
    return (spark.read.format("llog").options(**_options(config)).option("topics", topic)
            .options(**{k: str(v) for k, v in options.items()}).load())


def _b(v):
    return None if v is None else bytes(v)


def _headers(h):
    return None if h is None else [(x["key"], _b(x["value"])) for x in h]


def _collect(df, headers: bool = True) -> list[tuple]:
    """``(partition, offset, key, value, headers, timestamp_ms, timestampType)`` rows, ordered;
    the timestamp as UTC epoch ms (computed by Spark: no session or Python time zone involved)."""
    cols = [F.col("partition"), F.col("offset"), F.col("key"), F.col("value"),
            F.col("headers") if headers else F.lit(None).alias("headers"),
            F.unix_millis("timestamp").alias("ts_ms"), F.col("timestampType")]
    return [(r.partition, r.offset, _b(r.key), _b(r.value), _headers(r.headers), r.ts_ms, r.timestampType)
            for r in df.select(*cols).orderBy("partition", "offset").collect()]


def _partitions(config, topic: str) -> list[int]:
    with Coordination(config) as coordination:
        return topic_partitions(coordination, config.root_prefix, topic)


def _kafka_partition(key: bytes, partitions: int) -> int:
    return int(kafka_partitions(pa.array([key], pa.binary()), partitions)[0])


# --- 1. property: any rows round-trip through the sink and the source ----------------------------

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MS = st.integers(min_value=0, max_value=999)
_TIMESTAMPS = st.builds(
    lambda dt, ms: dt.replace(microsecond=ms * 1000),
    st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2099, 12, 31), timezones=st.just(timezone.utc)),
    _MS)
_HEADER_LISTS = st.one_of(st.none(), st.lists(st.tuples(st.text(max_size=6), st.one_of(st.none(), st.binary(max_size=6))),
                                              max_size=3))
_ROWS = st.lists(st.tuples(st.one_of(st.none(), st.binary(max_size=8)),      # key
                           st.one_of(st.none(), st.binary(max_size=12)),     # value
                           _HEADER_LISTS,                                    # headers
                           st.one_of(st.none(), _TIMESTAMPS)),               # timestamp
                 min_size=1, max_size=25)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=_ROWS, compression=st.sampled_from(["none", "lz4", "zstd"]))
def test_any_rows_round_trip_with_kafkas_placement_and_order(spark, config, rows, compression):
    topic = f"prop.{uuid4().hex[:10]}"
    df = spark.createDataFrame(rows, SINK_SCHEMA).coalesce(1)
    before = _now_ms()
    _write(spark, config, df, topic, partitions=3, compression=compression)
    after = _now_ms()
    got = _collect(_read(spark, config, topic, includeHeaders="true"))

    # Keyless rows: one task, so one sticky partition for all of them.
    keyless_partitions = {p for p, _, key, *_ in got if key is None}
    assert len(keyless_partitions) <= 1, f"keyless rows spread over partitions {keyless_partitions}"
    sticky = keyless_partitions.pop() if keyless_partitions else None

    expected: dict[int, list[tuple]] = {}
    for key, value, headers, ts in rows:
        partition = sticky if key is None else _kafka_partition(key, 3)
        ts_ms = None if ts is None else (ts - _EPOCH) // timedelta(milliseconds=1)
        expected.setdefault(partition, []).append(
            (key, value, None if headers is None else [(k, v) for k, v in headers], ts_ms))

    actual: dict[int, list[tuple]] = {}
    for partition, offset, key, value, headers, ts_ms, kind in got:
        actual.setdefault(partition, []).append((offset, key, value, headers, ts_ms, kind))
    assert sorted(actual) == sorted(expected)
    for partition, records in actual.items():
        # Offsets 1..n, in the input rows' order.
        assert [r[0] for r in records] == list(range(1, len(records) + 1))
        assert [(k, v, h, t if kind == CREATE_TIME else None) for _, k, v, h, t, kind in records] == expected[partition]
        for (_, _, _, _, ts_ms, kind), (_, _, _, event_ms) in zip(records, expected[partition]):
            if event_ms is None:
                assert kind == LOG_APPEND_TIME
                assert before - CLOCK_SLACK_MS <= ts_ms <= after + CLOCK_SLACK_MS
            else:
                assert kind == CREATE_TIME and ts_ms == event_ms
    assert set(actual) <= set(_partitions(config, topic)) == {0, 1, 2}  # the topic was created with 3


# --- 2. Kafka's key placement and per-key order at scale ----------------------------------------


def test_string_keys_land_where_kafka_puts_them_in_order(spark, config):
    n, partitions = 2000, 12
    df = spark.range(0, n, 1, 1).select(F.concat(F.lit("user-"), (F.col("id") % 97).cast("string")).alias("key"),
                                        F.col("id").cast("string").alias("value"))
    _write(spark, config, df, "users", partitions=partitions)
    got = _collect(_read(spark, config, "users"), headers=False)
    assert len(got) == n
    per_key: dict[str, list[tuple[int, int, int]]] = {}
    for partition, offset, key, value, _, _, kind in got:
        assert kind == LOG_APPEND_TIME
        per_key.setdefault(key.decode(), []).append((partition, offset, int(value)))
    assert sorted(per_key) == sorted(f"user-{k}" for k in range(97))
    for key, records in per_key.items():
        assert {p for p, _, _ in records} == {_kafka_partition(key.encode(), partitions)}, key
        records.sort(key=lambda r: r[1])  # by offset
        assert [v for _, _, v in records] == [i for i in range(n) if f"user-{i % 97}" == key], key
    used = {p for p, *_ in got}
    assert used <= set(_partitions(config, "users")) == set(range(partitions))
    assert len(used) > 6  # 97 keys hash over most of the 12 partitions


# --- 3. the source's fixed schema -----------------------------------------------------------------


def test_source_schema_is_kafkas_with_headers_last_and_no_other(spark, config, writer):
    writer.append("schema", 0, [b"v"])
    assert _read(spark, config, "schema").schema.simpleString() == KAFKA_COLUMNS
    with_headers = _read(spark, config, "schema", includeHeaders="true")
    assert with_headers.schema.simpleString() == KAFKA_COLUMNS[:-1] + f",headers:{HEADERS_TYPE}>"
    assert with_headers.columns[-1] == "headers"
    # The exact schema may be given; any other is refused, naming the fixed one.
    exact = (spark.read.format("llog").schema(SOURCE_SCHEMA_WITH_HEADERS).options(**_options(config))
             .option("topics", "schema").option("includeHeaders", "true").load())
    assert exact.count() == 1
    refused = [("value string", {}), (SOURCE_SCHEMA_WITH_HEADERS, {}), (SOURCE_SCHEMA, {"includeHeaders": "true"}),
               ("key binary, value binary", {"includeHeaders": "false"})]
    for schema, options in refused:
        with pytest.raises(PySparkException, match="has a fixed schema .* and cannot be read with another one"):
            (spark.read.format("llog").schema(schema).options(**_options(config)).option("topics", "schema")
             .options(**options).load().collect())


# --- 4. streaming reads of keyed and value-only appends -------------------------------------------


class _Collect:
    """A foreachBatch sink keeping every row as in :func:`_collect`, in arrival order."""

    def __init__(self):
        self.rows: list[tuple] = []

    def __call__(self, df, batch_id):
        self.rows += _collect(df)


def test_stream_reads_keys_headers_and_event_times_with_value_only_records(spark, config, writer, tmp_path):
    topic = "mixed"
    plain = writer.append(topic, 0, [b"p1", b"p2"])
    values = [b"k1", None, b"", b"k4"]
    keys = [b"a", "b", None, b""]
    headers = [[("h", b"1"), ("h", None)], [], None, [("\u00e9", b"\x00\xff")]]
    timestamps = [1_700_000_000_123, None, 946_684_800_000, 4_102_444_799_999]
    writer.append(topic, 0, values, keys=keys, headers=headers, timestamps=timestamps)
    writer.append(topic, 0, [b"p3"])
    with Coordination(config) as coordination:
        entries = check_partition(coordination, config.root_prefix, topic, 0).entries
    created = [e.entry.created_at_ms for e in entries]
    assert [e.entry.encoding for e in entries] == [BYTES_BATCH_V1, RECORDS_V2, BYTES_BATCH_V1]
    assert plain.end_offset == 2

    sink = _Collect()
    query = (spark.readStream.format("llog").options(**_options(config)).option("topics", topic)
             .option("startingOffsets", "earliest").option("includeHeaders", "true").load()
             .writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(180)
    assert query.exception() is None
    assert sink.rows == [
        (0, 1, None, b"p1", None, created[0], LOG_APPEND_TIME),
        (0, 2, None, b"p2", None, created[0], LOG_APPEND_TIME),
        (0, 3, b"a", b"k1", [("h", b"1"), ("h", None)], timestamps[0], CREATE_TIME),
        (0, 4, b"b", None, [], created[1], LOG_APPEND_TIME),
        (0, 5, None, b"", None, timestamps[2], CREATE_TIME),
        (0, 6, b"", b"k4", [("\u00e9", b"\x00\xff")], timestamps[3], CREATE_TIME),
        (0, 7, None, b"p3", None, created[2], LOG_APPEND_TIME),
    ]


# --- 5. tombstones and compression from the sink --------------------------------------------------


def _bodies(config, topic: str, partition: int) -> list[tuple[str, str | None]]:
    """``(encoding, compression)`` of every index entry of the partition (compression of records-v2 only)."""
    with Coordination(config) as coordination:
        entries = check_partition(coordination, config.root_prefix, topic, partition).entries
    objects = ObjectStore(config)
    try:
        out = []
        for e in entries:
            entry = e.entry
            compression = None
            if entry.encoding == RECORDS_V2:
                compression = body_compression(objects.get(entry.data_key, entry.byte_offset, entry.byte_length))
            out.append((entry.encoding, compression))
        return out
    finally:
        objects.close()


def test_sink_tombstones_read_back_null_and_compression_picks_the_encoding(spark, config):
    rows = [("k1", b"v1"), ("k1", None), (None, b"v3"), (None, None), ("k2", None)]
    df = spark.createDataFrame(rows, "key string, value binary").coalesce(1)
    _write(spark, config, df, "tombs", compression="zstd", partitions=1)  # one partition: the order of rows
    got = _collect(_read(spark, config, "tombs", includeHeaders="true"))
    assert [(p, o, k, v, h) for p, o, k, v, h, _, _ in got] == [
        (0, i + 1, None if k is None else k.encode(), v, None) for i, (k, v) in enumerate(rows)]
    assert all(kind == LOG_APPEND_TIME for *_, kind in got)
    assert _bodies(config, "tombs", 0) == [(RECORDS_V2, "zstd")]

    values = spark.createDataFrame([(f"v{i}",) for i in range(50)], "value string").coalesce(1)
    for compression in ("zstd", "lz4", "none"):  # none: value-only and uncompressed, the fast path
        _write(spark, config, values, "packed", compression=compression, partitions=1)
    [partition] = _partitions(config, "packed")
    assert _bodies(config, "packed", partition) == [(RECORDS_V2, "zstd"), (RECORDS_V2, "lz4"), (BYTES_BATCH_V1, None)]
    got = _collect(_read(spark, config, "packed"), headers=False)
    assert [v for *_, v, _, _, _ in got] == [f"v{i}".encode() for i in range(50)] * 3
    assert [o for _, o, *_ in got] == list(range(1, 151))
