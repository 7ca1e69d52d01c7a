"""The broker's Kafka listener (docs/kafka.md) with real Kafka clients: confluent-kafka
(librdkafka) and kafka-python, against a broker process started with ``--kafka-port``, on the
test stack. What they produce is read back by llog's own reader with its keys, headers and
timestamps; what llog's writer wrote is fetched by them. Raw protocol requests (kafka-python's
protocol classes and aiokafka's record builder) cover what a client library does not show: a
batch sent twice to two listeners, a corrupt batch, a version not served."""

from __future__ import annotations

import struct
import time
import uuid
from contextlib import ExitStack

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition as KafkaPartition

from llog.reader import LogReader
from llog.topics import create_topic
from llog.writer import AppendGroup, LogWriter
from tests.helpers.broker_process import free_port, run_broker
from tests.helpers.kafka_wire import record_batch, request



@pytest.fixture(scope="module")
def brokers(module_config):
    """Two broker processes with Kafka listeners on one root: ``(HTTP URL, Kafka bootstrap
    address)`` of each."""
    with ExitStack() as stack:
        out = []
        for _ in range(2):
            port = free_port()
            url, _ = stack.enter_context(run_broker(module_config, args=["--kafka-port", str(port)]))
            out.append((url, f"127.0.0.1:{port}"))
        yield out


@pytest.fixture(scope="module")
def lone_broker(module_config):
    """A broker with a Kafka listener alone on a root of its own: ``(HTTP URL, bootstrap)``.
    Each broker's Metadata names itself the leader of every partition, and a client refreshes
    its metadata from any broker it is connected to (a group's coordinator, say): on a shared
    root a client may move to the other broker between two fetches. A test of what one broker's
    tail cache answers needs the broker to be the only one its clients can find."""
    port = free_port()
    with run_broker(module_config.replace(root_prefix=f"t{uuid.uuid4().hex[:12]}"),
                    args=["--kafka-port", str(port)]) as (url, _):
        yield url, f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def listeners(brokers):
    return [address for _, address in brokers]


def _topic() -> str:
    return f"k{uuid.uuid4().hex[:10]}"


def _consume(bootstrap: str, topic: str, partition: int, count: int, offset: int = 1, **settings) -> list:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, **settings})
    try:
        consumer.assign([KafkaPartition(topic, partition, offset)])
        got, deadline = [], time.monotonic() + 60
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            got.append(message)
        return got
    finally:
        consumer.close()


def test_an_idempotent_producer_writes_what_llog_and_kafka_consumers_read_back(listeners, module_config):
    topic = _topic()
    producer = Producer({"bootstrap.servers": listeners[0], "enable.idempotence": True, "linger.ms": 5,
                         "compression.type": "zstd"})
    acks = []
    for i in range(500):
        headers = [("trace", f"t{i}".encode()), ("trace", None)] if i % 2 else None
        producer.produce(topic, key=f"key-{i}".encode() if i % 3 else None, value=None if i == 7 else f"v{i}".encode(),
                         headers=headers, timestamp=1_700_000_000_000 + i, partition=i % 2,
                         on_delivery=lambda err, msg: acks.append((err, msg.partition(), msg.offset())))
    assert producer.flush(60) == 0
    assert [a for a in acks if a[0] is not None] == []
    # llog's offsets, unchanged: each partition's first record is at offset 1 (docs/kafka.md section 5).
    for partition in (0, 1):
        assert sorted(o for _, p, o in acks if p == partition) == list(range(1, 251))

    with LogReader(module_config) as reader:
        records = reader.read_range(topic, 1, 1, 250)
    assert [r.value for r in records[:2]] == [b"v1", b"v3"]
    assert records[0].key == b"key-1" and records[0].timestamp == 1_700_000_000_001
    assert records[0].headers == [("trace", b"t1"), ("trace", None)]
    with LogReader(module_config) as reader:
        even = reader.read_range(topic, 0, 1, 250)
    assert even[0].key is None and even[0].headers is None  # no key, no headers: null, as llog says "none"

    got = _consume(listeners[1], topic, 1, 250)  # the other listener serves the same partition
    assert [m.offset() for m in got] == list(range(1, 251))
    assert got[3].value() is None and got[3].offset() == 4  # i == 7: the tombstone
    assert got[0].key() == b"key-1" and got[0].headers() == [("trace", b"t1"), ("trace", None)]
    assert got[0].timestamp() == (1, 1_700_000_000_001)  # CreateTime, as produced


def _prometheus(url: str, line_start: str) -> float:
    import httpx

    text = httpx.get(f"{url}/metrics/prometheus", timeout=30).text
    line = next((x for x in text.splitlines() if x.startswith(line_start)), None)
    return float(line.split()[-1]) if line else 0.0


def _fetched_from_cache(url: str) -> float:
    return _prometheus(url, 'leaderless_log_kafka_fetch_partitions_total{source="tail_cache"}')


def _as_seen(messages: list) -> list:
    return [(m.offset(), m.key(), m.value(), m.headers(), m.timestamp()) for m in messages]


def test_the_broker_that_produced_answers_fetches_from_its_tail_cache_as_the_log_would(brokers):
    """Records a Kafka client produced (keys, headers, times, a tombstone) and records an HTTP
    client produced (values: Kafka reads their entry's time as LogAppendTime), fetched from the
    broker that produced them, which answers from its tail cache, and from the other broker,
    which reads Oxia and S3: the same messages, to the timestamp and its kind."""
    import httpx

    (url, bootstrap), (_, other) = brokers
    topic = _topic()
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(40):
        producer.produce(topic, key=b"k%d" % i if i % 2 else None, value=None if i == 9 else b"v%d" % i,
                         headers=[("h", b"%d" % i)] if i % 3 == 0 else None, partition=0,
                         timestamp=1_700_000_000_000 + i if i % 5 else 0)
    assert producer.flush(30) == 0
    for batch in range(3):
        response = httpx.post(f"{url}/produce", json={"topic_partitions": [
            {"topic": topic, "partition": 0, "records": [f"http-{batch}-{i}" for i in range(5)]}]}, timeout=30)
        assert response.status_code == 200, response.text
    before = _fetched_from_cache(url)
    cached = _consume(bootstrap, topic, 0, 55)
    assert _fetched_from_cache(url) > before  # answered from memory, not from Oxia and S3
    from_log = _consume(other, topic, 0, 55)
    assert _as_seen(cached) == _as_seen(from_log)
    assert [m.offset() for m in cached] == list(range(1, 56))
    assert cached[9].value() is None and cached[3].key() == b"k3" and cached[3].headers() == [("h", b"3")]
    assert cached[1].timestamp() == (1, 1_700_000_000_001)
    assert {m.timestamp()[0] for m in cached[40:]} == {2}  # LogAppendTime: the entry's created_at_ms


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_each_codec_produced_by_librdkafka_is_read_by_kafka_python(listeners, codec):
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KPPartition

    topic = _topic()
    producer = Producer({"bootstrap.servers": listeners[1], "compression.type": codec, "linger.ms": 5})
    acks = []
    for i in range(200):
        producer.produce(topic, f"{codec}-{i}".encode() * 20, key=b"k", partition=0,
                         on_delivery=lambda err, msg: acks.append((err, msg.offset())))
    assert producer.flush(60) == 0
    assert sorted(acks, key=lambda a: a[1]) == [(None, o) for o in range(1, 201)]
    consumer = KafkaConsumer(bootstrap_servers=listeners[0], enable_auto_commit=False, consumer_timeout_ms=20_000)
    consumer.assign([KPPartition(topic, 0)])
    consumer.seek(KPPartition(topic, 0), 1)
    got = [m for _, m in zip(range(200), consumer)]
    consumer.close()
    assert [(m.offset, m.key, m.value) for m in got] == [(o, b"k", f"{codec}-{o - 1}".encode() * 20)
                                                         for o in range(1, 201)]


@pytest.mark.parametrize("codec", ["gzip", "zstd"])  # kafka-python's other codecs need libraries llog does not use
def test_kafka_python_produces_with_its_own_codecs(listeners, codec):
    from kafka import KafkaProducer

    topic = _topic()
    producer = KafkaProducer(bootstrap_servers=listeners[1], compression_type=codec, linger_ms=5)
    futures = [producer.send(topic, key=b"k", value=f"{codec}-{i}".encode() * 20, partition=0) for i in range(200)]
    producer.flush(60)
    offsets = [f.get(timeout=60).offset for f in futures]
    producer.close()
    assert offsets == list(range(1, 201))
    got = _consume(listeners[0], topic, 0, 200)
    assert [m.value() for m in got] == [f"{codec}-{i}".encode() * 20 for i in range(200)]


def test_records_written_by_llog_are_fetched_by_kafka_consumers_with_their_append_time(listeners, module_config):
    topic = _topic()
    with LogWriter(module_config) as writer:
        create_topic(writer.coordination, module_config.root_prefix, topic, 1)
        writer.append(topic, 0, [b"a", b"b", b"c"])
        writer.append_shared([AppendGroup(topic, 0, [b"d"], keys=[b"kd"], timestamps=[1_600_000_000_000])])
    got = _consume(listeners[0], topic, 0, 4)
    assert [(m.offset(), m.value(), m.key()) for m in got] == [(1, b"a", None), (2, b"b", None), (3, b"c", None),
                                                              (4, b"d", b"kd")]
    kind, at = got[0].timestamp()
    assert kind == 2 and abs(at - time.time() * 1000) < 600_000  # LogAppendTime: the entry's created_at_ms
    assert got[3].timestamp() == (1, 1_600_000_000_000)


def test_offsets_earliest_latest_and_by_time(listeners, module_config):
    topic = _topic()
    with LogWriter(module_config) as writer:
        create_topic(writer.coordination, module_config.root_prefix, topic, 1)
        writer.append_shared([AppendGroup(topic, 0, [b"x"] * 5, timestamps=[1000, 2000, 3000, 4000, 5000])])
    consumer = Consumer({"bootstrap.servers": listeners[0], "group.id": "offsets"})
    try:
        assert consumer.get_watermark_offsets(KafkaPartition(topic, 0), timeout=30) == (1, 6)
        found = consumer.offsets_for_times([KafkaPartition(topic, 0, 2500)], timeout=30)
        assert found[0].offset == 3  # the first record at or after 2500 ms: 3000 ms, at offset 3
        past = consumer.offsets_for_times([KafkaPartition(topic, 0, 9999)], timeout=30)
        assert past[0].offset == -1  # none at or after: -1, as Kafka answers
    finally:
        consumer.close()


def test_the_http_consume_of_the_same_broker_returns_what_a_kafka_client_produced(brokers):
    """Records with keys and headers, produced here by a Kafka client, are answered by the HTTP
    consume with them (from the tail cache, which holds them too)."""
    import httpx

    url, bootstrap = brokers[0]
    topic = _topic()
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, b"v", key=b"k", headers=[("h", b"x")], partition=0, timestamp=1_650_000_000_000)
    assert producer.flush(30) == 0
    body = httpx.post(f"{url}/consume", json={"topic_partitions": [{"topic": topic, "partition": 0, "fetch_offset": 1}]},
                      timeout=30).json()
    (record,) = body["results"][0]["records"]
    assert record == {"offset": 1, "payload": "v", "key": "k", "headers": [{"key": "h", "value": "x"}],
                      "timestamp": 1_650_000_000_000}


#: The consumer's fetch.wait.max.ms in the long-poll test, and how soon after its ack a record must
#: reach the waiting fetch: a fetch not woken would answer only when its wait ends.
LONG_POLL_WAIT_S, WOKEN_WITHIN_S = 15, 3


def _long_polls_waiting(url: str) -> int:
    import httpx

    return httpx.get(f"{url}/metrics", timeout=30).json()["http"]["consume_long_poll_waiters_current"]


def test_a_long_poll_returns_as_soon_as_a_record_is_produced(brokers):
    """A fetch waiting at the partition's end on one broker is woken by a record produced through
    the other (its probe sees the high watermark move): the record arrives within
    :data:`WOKEN_WITHIN_S` of its ack, long before the fetch's wait would have ended."""
    (_, producing), (consuming_url, consuming) = brokers
    topic = _topic()
    producer = Producer({"bootstrap.servers": producing, "linger.ms": 0})
    producer.produce(topic, b"first", partition=0)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": consuming, "group.id": "lp",
                         "fetch.wait.max.ms": LONG_POLL_WAIT_S * 1000})
    try:
        assigned = time.monotonic()  # no fetch of this consumer begins before
        consumer.assign([KafkaPartition(topic, 0, 2)])
        assert consumer.poll(1.0) is None  # nothing past offset 1 yet: the fetch waits
        while _long_polls_waiting(consuming_url) < 1:  # held by the broker, not answered yet
            assert time.monotonic() - assigned < 10, "the consumer's fetch is not waiting on the broker"
            time.sleep(0.05)
        producer.produce(topic, b"second", partition=0)
        assert producer.flush(30) == 0
        acked = time.monotonic()
        # A fetch that was not woken would answer at least this long after the ack.
        assert assigned + LONG_POLL_WAIT_S - acked > 2 * WOKEN_WITHIN_S, "the produce came too late to tell"
        message = None
        while message is None and time.monotonic() < acked + LONG_POLL_WAIT_S + 15:
            message = consumer.poll(0.05)
        waited = time.monotonic() - acked
        assert message is not None and message.error() is None
        assert (message.offset(), message.value()) == (2, b"second")
        assert waited < WOKEN_WITHIN_S, f"the record came {waited:.1f} s after its ack: the waiting fetch was not woken"
    finally:
        consumer.close()


def test_a_long_poll_on_several_partitions_woken_by_one_returns_each_record_once(lone_broker):
    """A consumer waits on three partitions at their end; each produce to one of them (on the
    same broker) wakes its fetch, which reads that partition again from the tail cache and keeps
    the others' answers: every record arrives, once, in order, and the metrics show the woken
    reads answered from memory. The fetch waits up to 30 s (the broker's cap): a record that
    did not wake it would only come once that wait ends, past each record's 15 s here. The broker is alone on its root: with another one, the
    consumer may move there and read from the log (the ``lone_broker`` fixture)."""
    url, bootstrap = lone_broker
    topic = _topic()
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for partition in range(3):
        producer.produce(topic, b"start", partition=partition)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g{uuid.uuid4().hex[:6]}",
                         "fetch.wait.max.ms": 30_000})
    try:
        consumer.assign([KafkaPartition(topic, partition, 2) for partition in range(3)])
        assert consumer.poll(1.0) is None  # every partition at its end: the fetch waits
        before = _fetched_from_cache(url)
        got = []
        for i in range(12):
            producer.produce(topic, b"r%d" % i, partition=(0, 2)[i % 2])
            assert producer.flush(30) == 0
            deadline, message = time.monotonic() + 15, None
            while message is None and time.monotonic() < deadline:
                message = consumer.poll(0.5)
            assert message is not None and message.error() is None, f"record {i} did not wake the waiting fetch"
            got.append((message.partition(), message.offset(), message.value()))
        assert got == [((0, 2)[i % 2], 2 + i // 2, b"r%d" % i) for i in range(12)]
        assert consumer.poll(0.5) is None  # nothing twice
        # Each record's read came from memory, but for a pass that found the partition's log
        # start older than LOG_START_MAX_AGE_S (1 s) when it looked: that pass reads the log, as
        # the cache's rule says, and a machine loaded to 8 stalled one read that long.
        assert _fetched_from_cache(url) - before >= 12 - 3
    finally:
        consumer.close()


# --- raw requests ---------------------------------------------------------------------------------

def _produce_v8(topic: str, partition: int, batch: bytes) -> bytes:
    """A Produce v8 body (acks -1) of one partition's batch (non-flexible: plain strings and arrays)."""
    name = topic.encode()
    return (struct.pack(">hhi", -1, -1, 30_000) + struct.pack(">i", 1) + struct.pack(">h", len(name)) + name
            + struct.pack(">i", 1) + struct.pack(">i", partition) + struct.pack(">i", len(batch)) + batch)


def _produce_result(response: bytes) -> tuple[int, int]:
    """``(error code, base offset)`` of a Produce v8 response's one partition."""
    pos = 4  # topics array length
    name_length = struct.unpack(">h", response[pos:pos + 2])[0]
    pos += 2 + name_length + 4  # the name, then the partitions array length
    _, code, base = struct.unpack(">ihq", response[pos:pos + 14])
    return code, base


def test_a_batch_sent_again_to_another_listener_is_written_once(listeners, module_config):
    topic = _topic()
    with LogWriter(module_config) as writer:
        create_topic(writer.coordination, module_config.root_prefix, topic, 1)
    first = record_batch([b"a", b"b"], 4242, 0)
    assert _produce_result(request(listeners[0], 0, 8, _produce_v8(topic, 0, first))) == (0, 1)
    # The same batch again, as a producer retrying after a lost answer, to the other listener.
    assert _produce_result(request(listeners[1], 0, 8, _produce_v8(topic, 0, first))) == (0, 1)
    assert _produce_result(request(listeners[1], 0, 8, _produce_v8(topic, 0, record_batch([b"c"], 4242, 2)))) == (0, 3)
    code, _ = _produce_result(request(listeners[0], 0, 8, _produce_v8(topic, 0, record_batch([b"d"], 4242, 9))))
    assert code == 45  # OUT_OF_ORDER_SEQUENCE_NUMBER: a gap
    with LogReader(module_config) as reader:
        assert [r.value for r in reader.read_range(topic, 0, 1)] == [b"a", b"b", b"c"]


def test_sequences_wrap_after_2147483647_and_batches_after_the_wrap_are_written(listeners, module_config):
    """Kafka's producer sequence is an int32 that wraps to 0 (docs/protocol.md section 9.4): the
    batches after the wrap are written, not answered DUPLICATE_SEQUENCE_NUMBER (which the Java
    client completes as delivered) and dropped. A producer may start anywhere, so these start
    near the end of the sequence space, as one that has sent 2^31 records would be."""
    topic = _topic()
    with LogWriter(module_config) as writer:
        create_topic(writer.coordination, module_config.root_prefix, topic, 2)
    end = 2 ** 31 - 1

    def produce(partition: int, producer: int, sequence: int, values: list[bytes], at: int = 0) -> tuple[int, int]:
        batch = record_batch(values, producer, sequence)
        return _produce_result(request(listeners[at], 0, 8, _produce_v8(topic, partition, batch)))

    # Partition 0: a batch ending at 2147483647, then 0, then 3.
    assert produce(0, 5151, end - 9, [b"w%d" % i for i in range(10)]) == (0, 1)
    assert produce(0, 5151, 0, [b"a0", b"a1", b"a2"], at=1) == (0, 11)
    assert produce(0, 5151, 3, [b"b0", b"b1"]) == (0, 14)
    assert produce(0, 5151, 3, [b"b0", b"b1"], at=1) == (0, 14)  # the last batch again: its offset
    assert produce(0, 5151, end - 9, [b"w%d" % i for i in range(10)])[0] == 46  # older, known written
    assert produce(0, 5151, 6, [b"gap"])[0] == 45  # OUT_OF_ORDER_SEQUENCE_NUMBER: 5 expected
    # Partition 1: a batch straddling the wrap (2147483645..2147483647, 0, 1), then 2.
    assert produce(1, 5252, end - 2, [b"s%d" % i for i in range(5)]) == (0, 1)
    assert produce(1, 5252, 0, [b"inside"])[0] == 45  # inside the last batch
    assert produce(1, 5252, 2, [b"t0"], at=1) == (0, 6)
    with LogReader(module_config) as reader:
        assert [r.value for r in reader.read_range(topic, 0, 1)] == \
            [b"w%d" % i for i in range(10)] + [b"a0", b"a1", b"a2", b"b0", b"b1"]
        assert [r.value for r in reader.read_range(topic, 1, 1)] == [b"s%d" % i for i in range(5)] + [b"t0"]


def test_a_corrupt_batch_is_refused_and_nothing_is_written(brokers, listeners, module_config):
    def corrupt_answers() -> float:
        return _prometheus(brokers[0][0], 'leaderless_log_kafka_partition_errors_total{api="Produce",error="corrupt_message"}')

    before = corrupt_answers()
    topic = _topic()
    with LogWriter(module_config) as writer:
        create_topic(writer.coordination, module_config.root_prefix, topic, 1)
    batch = bytearray(record_batch([b"good", b"bad"]))
    batch[-1] ^= 0xFF  # a record byte: the CRC no longer matches
    code, _ = _produce_result(request(listeners[0], 0, 8, _produce_v8(topic, 0, bytes(batch))))
    assert code == 2  # CORRUPT_MESSAGE
    with LogReader(module_config) as reader:
        assert reader.high_watermark(topic, 0) == 0
    assert corrupt_answers() == before + 1  # counted by API and error, for Prometheus


def test_api_versions_of_a_version_not_served_lists_what_is(listeners):
    response = request(listeners[0], 18, 99, b"")
    code, count = struct.unpack(">hi", response[:6])
    assert code == 35  # UNSUPPORTED_VERSION, with the v0 list
    served = {struct.unpack(">hhh", response[6 + 6 * i:12 + 6 * i]) for i in range(count)}
    assert (0, 3, 12) in served and (1, 4, 12) in served and (18, 0, 4) in served


def test_a_producer_to_a_topic_that_does_not_exist_creates_it(listeners, module_config):
    topic = _topic()
    producer = Producer({"bootstrap.servers": listeners[0]})
    errors = []
    producer.produce(topic, b"v", on_delivery=lambda err, msg: errors.append(err))
    assert producer.flush(30) == 0 and errors == [None]
    from llog.coordination import Coordination
    from llog.discovery import topic_records

    with Coordination(module_config) as coordination:
        (record,) = topic_records(coordination, module_config.root_prefix, [topic])
    assert record.partitions == module_config.default_partitions and record.auto_created


def test_an_unknown_partition_is_unknown_topic_or_partition(listeners, module_config):
    topic = _topic()
    with LogWriter(module_config) as writer:
        create_topic(writer.coordination, module_config.root_prefix, topic, 1)
    code, _ = _produce_result(request(listeners[0], 0, 8, _produce_v8(topic, 5, record_batch([b"x"]))))
    assert code == KafkaError.UNKNOWN_TOPIC_OR_PART  # 3, as librdkafka names it
    consumer = Consumer({"bootstrap.servers": listeners[0], "group.id": "u"})
    try:
        assert consumer.list_topics(topic, timeout=30).topics[topic].partitions.keys() == {0}
    finally:
        consumer.close()


def test_the_admin_client_creates_describes_grows_and_deletes_topics(listeners, module_config):
    from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic

    admin = AdminClient({"bootstrap.servers": listeners[0]})
    topic = _topic()
    assert admin.create_topics([NewTopic(topic, 3, config={"retention.ms": "60000"})])[topic].result(30) is None
    again = admin.create_topics([NewTopic(topic, 3)])[topic].exception(30)
    assert again.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS
    bad = _topic()
    refused = admin.create_topics([NewTopic(bad, 1, config={"no.such.setting": "1"})])[bad].exception(30)
    assert refused.args[0].code() == KafkaError.INVALID_CONFIG

    (configs,) = admin.describe_configs([ConfigResource("topic", topic)]).values()
    found = {name: (entry.value, entry.source) for name, entry in configs.result(30).items()}
    assert found["retention.ms"] == ("60000", 1)  # the topic's own setting (DYNAMIC_TOPIC_CONFIG)
    assert found["cleanup.policy"] == ("delete", 5)  # the default (DEFAULT_CONFIG)

    cluster = admin.describe_cluster().result(30)  # both listeners of the root, registered in Oxia
    assert {f"{n.host}:{n.port}" for n in cluster.nodes} == set(listeners)

    assert admin.create_partitions([NewPartitions(topic, 5)])[topic].result(30) is None
    shrink = admin.create_partitions([NewPartitions(topic, 2)])[topic].exception(30)
    assert shrink.args[0].code() == KafkaError.INVALID_PARTITIONS
    from llog.coordination import Coordination
    from llog.discovery import topic_records

    with Coordination(module_config) as coordination:
        (record,) = topic_records(coordination, module_config.root_prefix, [topic])
    assert record.partitions == 5 and record.config == {"retention.ms": 60000} and not record.auto_created

    assert admin.delete_topics([topic])[topic].result(60) is None
    assert topic not in admin.list_topics(timeout=30).topics
    gone = admin.delete_topics([topic])[topic].exception(30)
    assert gone.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
