"""format("llog") into topics created on first use (docs/protocol.md sections 10.2 and 11.6), from real
Spark into real Oxia and S3, with the default ``LLOG_DEFAULT_PARTITIONS=1``: a batch write and a
streaming query whose ``partition`` column names 0..3 of a new topic create it with 4 partitions
and land every row where it names; a later write naming a higher partition grows it; a topic
created explicitly refuses it."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest
from pyspark.errors import PySparkException
from pyspark.sql import functions as F

from llog.coordination import Coordination
from llog.partitioner import kafka_partitions
from llog.topics import create_topic, read_topic
from jobs.local_spark import local_spark


@pytest.fixture(scope="module")
def spark():
    session = local_spark("llog-sink-auto-topics-tests")
    yield session
    session.stop()


@pytest.fixture
def config(config):
    return config.replace(default_partitions=1)


def _options(config) -> dict[str, str]:
    return {k.lower(): v for k, v in config.to_options().items()}


def _record(config, topic: str):
    with Coordination(config) as coordination:
        return read_topic(coordination, config.root_prefix, topic).record


def _log(reader, topic: str, partition: int) -> list[bytes]:
    return [r.value for r in reader.read_range(topic, partition, 1)] if reader.high_watermark(topic, partition) else []


def test_a_batch_write_with_a_partition_column_creates_and_grows_the_topic(spark, config, reader):
    df = spark.range(0, 2000, 1, 3).select(F.col("id").cast("string").alias("value"),
                                           (F.col("id") % 4).cast("int").alias("partition"))
    df.write.format("llog").options(**_options(config)).option("topic", "orders").mode("append").save()
    record = _record(config, "orders")
    assert (record.partitions, record.auto_created) == (4, True)
    for p in range(4):
        assert _log(reader, "orders", p) == [str(i).encode() for i in range(p, 2000, 4)]

    more = spark.createDataFrame([(f"late{p}", p) for p in range(6)], "value string, partition int").coalesce(2)
    more.write.format("llog").options(**_options(config)).option("topic", "orders").mode("append").save()
    assert _record(config, "orders").partitions == 6
    assert [_log(reader, "orders", p)[-1] for p in range(6)] == [f"late{p}".encode() for p in range(6)]

    # Keyed rows without a partition column go by the grown count, all of the write by one count.
    keyed = spark.createDataFrame([(f"k{i}", f"keyed{i}") for i in range(600)], "key string, value string")
    keyed.coalesce(3).write.format("llog").options(**_options(config)).option("topic", "orders").mode("append").save()
    keys = {p: [r.key for r in reader.read_range("orders", p, 1) if r.key is not None] for p in range(6)}
    assert sorted(k for p in keys for k in keys[p]) == sorted(f"k{i}".encode() for i in range(600))
    for p, in_partition in keys.items():  # where Kafka's partitioner puts them, by 6
        assert set(kafka_partitions(pa.array(in_partition, pa.binary()), 6).tolist()) == {p}


def test_a_topic_created_explicitly_refuses_a_partition_column_past_its_count(spark, config, reader):
    with Coordination(config) as coordination:
        create_topic(coordination, config.root_prefix, "fixed", 2)
    df = spark.createDataFrame([("a", 0), ("b", 2)], "value string, partition int").coalesce(1)
    with pytest.raises(PySparkException, match=r"fixed\[2\] does not exist: .* created explicitly"):
        df.write.format("llog").options(**_options(config)).option("topic", "fixed").mode("append").save()
    assert _record(config, "fixed").partitions == 2
    assert [reader.high_watermark("fixed", p) for p in range(2)] == [0, 0]  # nothing of the batch committed


def test_a_stream_with_a_partition_column_into_a_new_topic_lands_every_row(spark, config, reader, tmp_path):
    rows = 500
    query = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", rows).option("startTimestamp", 0)
             .option("numPartitions", 2).load()
             .select(F.col("value").cast("string").alias("value"),
                     (F.col("value") % 4).cast("int").alias("partition"))
             .writeStream.format("llog").options(**_options(config)).option("topic", "rated")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="0 seconds").start())
    try:
        deadline = time.monotonic() + 240
        while not (query.lastProgress and query.lastProgress["batchId"] >= 2):
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, "three batches did not commit within 240 s"
            time.sleep(0.5)
    finally:
        query.stop()
    assert query.exception() is None
    record = _record(config, "rated")
    assert (record.partitions, record.auto_created) == (4, True)
    values = {p: [int(v) for v in _log(reader, "rated", p)] for p in range(4)}
    for p, in_partition in values.items():
        assert in_partition and all(v % 4 == p for v in in_partition)
    written = sorted(v for in_partition in values.values() for v in in_partition)
    assert written == list(range(len(written))) and len(written) % rows == 0 and len(written) >= 3 * rows
