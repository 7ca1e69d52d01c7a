"""Kafka's own CLI tools (``kafka-tools`` 4.4, the jars ``bench kafka`` resolves into
``.cache/kafka``) against the broker's Kafka listener (docs/kafka.md): ``kafka-topics`` creates,
lists and describes a topic, ``kafka-console-producer`` writes lines that
``kafka-console-consumer`` reads back, and llog's reader sees them."""

from __future__ import annotations

import uuid

import pytest

from bench.kafka_broker import kafka_jars
from llog.reader import LogReader
from tests.helpers.broker_process import free_port, run_broker
from tests.helpers.kafka_tools import run_kafka_tool

TOPICS = "org.apache.kafka.tools.TopicCommand"
CONSOLE_PRODUCER = "org.apache.kafka.tools.ConsoleProducer"
CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"


@pytest.fixture(scope="module")
def bootstrap(module_config):
    kafka_jars()  # resolved before the broker starts, once per machine
    port = free_port()
    with run_broker(module_config, args=["--kafka-port", str(port)]):
        yield f"127.0.0.1:{port}"


def _tool(main: str, *args: str, stdin: str | None = None) -> str:
    done = run_kafka_tool(main, *args, stdin=stdin, timeout_s=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def test_kafka_topics_creates_lists_and_describes(bootstrap):
    topic = f"cli{uuid.uuid4().hex[:8]}"
    assert f"Created topic {topic}." in _tool(TOPICS, "--bootstrap-server", bootstrap, "--create", "--topic", topic,
                                               "--partitions", "3", "--config", "retention.ms=120000")
    assert topic in _tool(TOPICS, "--bootstrap-server", bootstrap, "--list").split()
    described = _tool(TOPICS, "--bootstrap-server", bootstrap, "--describe", "--topic", topic)
    assert "PartitionCount: 3" in described and "retention.ms=120000" in described
    assert described.count("Leader: 0") == 3


def test_the_console_producer_writes_what_the_console_consumer_and_llog_read(bootstrap, module_config):
    topic = f"cli{uuid.uuid4().hex[:8]}"
    _tool(TOPICS, "--bootstrap-server", bootstrap, "--create", "--topic", topic, "--partitions", "1")
    lines = [f"line {i}" for i in range(10)]
    _tool(CONSOLE_PRODUCER, "--bootstrap-server", bootstrap, "--topic", topic, stdin="\n".join(lines) + "\n")
    consumed = _tool(CONSOLE_CONSUMER, "--bootstrap-server", bootstrap, "--topic", topic, "--partition", "0",
                     "--offset", "earliest", "--max-messages", "10", "--timeout-ms", "60000",
                     "--formatter-property", "print.offset=true")
    assert consumed.splitlines() == [f"Offset:{i + 1}\tline {i}" for i in range(10)]
    with LogReader(module_config) as reader:
        assert [r.value for r in reader.read_range(topic, 0, 1)] == [line.encode() for line in lines]
