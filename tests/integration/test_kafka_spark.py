"""Spark's own Kafka connector (``spark-sql-kafka-0-10``, resolved as ``bench kafka`` resolves it)
against the broker's Kafka listener (docs/kafka.md): a batch write with ``format("kafka")`` read
back with ``format("llog")`` (keys, headers, timestamps), the llog sink's records read with
``format("kafka")``, and a streaming query in Spark's real-time mode reading and writing llog
through the listener."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition as KafkaPartition

from bench.kafka import SPARK_KAFKA
from jobs.local_spark import local_spark
from tests.helpers.broker_process import free_port, run_broker


@pytest.fixture(scope="module")
def bootstrap(module_config):
    port = free_port()
    with run_broker(module_config, args=["--kafka-port", str(port)]):
        yield f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def spark():
    session = local_spark("llog-kafka-connector-tests", packages=SPARK_KAFKA)
    yield session
    session.stop()


def _topic() -> str:
    return f"s{uuid.uuid4().hex[:10]}"


def _llog(spark, config):
    return spark.read.format("llog").options(**{k.lower(): v for k, v in config.to_options().items()})


def test_format_kafka_writes_what_format_llog_reads_with_keys_headers_and_times(spark, bootstrap, module_config):
    topic = _topic()
    rows = spark.sql("""
        SELECT CAST(CONCAT('k', id) AS BINARY) AS key, CAST(CONCAT('v', id) AS BINARY) AS value,
               CAST(id % 2 AS INT) AS partition,
               ARRAY(NAMED_STRUCT('key', 'h', 'value', CAST(CONCAT('x', id) AS BINARY))) AS headers
        FROM range(200)""")
    rows.write.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("topic", topic) \
        .option("includeHeaders", "true").save()
    read = (_llog(spark, module_config).option("topics", topic).option("includeHeaders", "true").load()
            .selectExpr("CAST(key AS STRING) AS k", "CAST(value AS STRING) AS v", "partition", "offset",
                        "headers", "timestamp").collect())
    assert sorted(r.k for r in read) == sorted(f"k{i}" for i in range(200))
    by_key = {r.k: r for r in read}
    assert by_key["k7"].v == "v7" and by_key["k7"].partition == 1
    assert [(h["key"], h["value"]) for h in by_key["k7"].headers] == [("h", b"x7")]
    assert sorted(r.offset for r in read if r.partition == 0) == list(range(1, 101))  # llog's offsets, from 1
    assert all(abs(r.timestamp.timestamp() - time.time()) < 600 for r in read)  # the producer's CreateTime


def test_format_kafka_reads_what_the_llog_sink_wrote(spark, bootstrap, module_config):
    topic = _topic()
    (spark.range(300).selectExpr("CAST(id AS STRING) AS value", "CAST(id % 3 AS INT) AS partition")
     .write.format("llog").options(**{k.lower(): v for k, v in module_config.to_options().items()})
     .option("topic", topic).option("partitions", 3).mode("append").save())
    read = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
            .option("startingOffsets", "earliest").load()
            .selectExpr("CAST(value AS STRING) AS v", "partition", "offset", "timestampType").collect())
    assert sorted(int(r.v) for r in read) == list(range(300))
    assert {(r.partition, r.offset) for r in read} == {(p, o) for p in range(3) for o in range(1, 101)}
    assert {r.timestampType for r in read} == {1}  # LogAppendTime: the sink's records carry no event time


def test_a_real_time_mode_query_reads_and_writes_llog_through_the_listener(spark, bootstrap, module_config, tmp_path):
    from llog.topics import create_topic
    from llog.writer import LogWriter

    source, target = _topic(), _topic()
    with LogWriter(module_config) as writer:
        for topic in (source, target):
            create_topic(writer.coordination, module_config.root_prefix, topic, 1)
    producer = Producer({"bootstrap.servers": bootstrap})
    for topic in (source, target):
        producer.produce(topic, b"first", partition=0)
    assert producer.flush(30) == 0
    query = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", source).option("startingOffsets", json.dumps({source: {"0": 2}})).load()
             .selectExpr("key", "UPPER(CAST(value AS STRING)) AS value")
             .writeStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("topic", target)
             .option("checkpointLocation", str(tmp_path / "ck")).outputMode("update")
             .trigger(realTime="10 seconds").start())
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "rtm", "enable.auto.commit": False})
    try:
        deadline = time.monotonic() + 120
        while not query.status["isTriggerActive"] and time.monotonic() < deadline:
            assert query.exception() is None, query.exception()
            time.sleep(0.2)
        for i in range(20):
            producer.produce(source, f"m{i}".encode(), partition=0)
        assert producer.flush(30) == 0
        consumer.assign([KafkaPartition(target, 0, 2)])
        got = []
        while len(got) < 20 and time.monotonic() < deadline:
            assert query.exception() is None, query.exception()
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got.append(message.value())
        assert sorted(got) == sorted(f"M{i}".encode() for i in range(20))
    finally:
        consumer.close()
        query.stop()
