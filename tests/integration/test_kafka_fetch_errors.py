"""A Kafka Fetch whose partition has an error (docs/kafka.md section 8) carries an empty record
set, as Kafka's broker answers: librdkafka refuses a null one ("invalid MessageSetSize -1") as a
parse failure of the whole response and sends the fetch again, forever, so the error never
reaches it (here: OFFSET_OUT_OF_RANGE never reaches ``auto.offset.reset``)."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, TopicPartition as KafkaPartition

from llog.topics import create_topic
from llog.writer import LogWriter
from tests.helpers.broker_process import free_port, run_broker


def test_a_fetch_past_the_log_end_resets_a_librdkafka_consumer_to_the_earliest(module_config):
    topic = f"k{uuid.uuid4().hex[:10]}"
    with LogWriter(module_config) as writer:
        create_topic(writer.coordination, module_config.root_prefix, topic, 1)
        writer.append(topic, 0, [b"first", b"second"])
    port = free_port()
    with run_broker(module_config, args=["--kafka-port", str(port)]):
        consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": f"g{uuid.uuid4().hex[:6]}",
                             "enable.auto.commit": False, "auto.offset.reset": "earliest"})
        try:
            consumer.assign([KafkaPartition(topic, 0, 1000)])  # past the log end: OFFSET_OUT_OF_RANGE
            got, deadline = [], time.monotonic() + 30
            while len(got) < 2 and time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is not None and message.error() is None:
                    got.append((message.offset(), message.value()))
        finally:
            consumer.close()
    assert got == [(1, b"first"), (2, b"second")]
