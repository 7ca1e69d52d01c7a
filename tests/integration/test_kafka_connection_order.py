"""What a Kafka client may rely on when it pipelines requests on one connection (docs/kafka.md
section 2, docs/protocol.md section 9.5): every request is answered in the order sent, a
connection's produces to a partition are appended in the order sent, and its group requests
(OffsetCommit, OffsetFetch, JoinGroup, ...) take effect in the order sent, while a fetch's long
poll holds none of them back. Raw requests on one connection (tests/helpers/kafka_wire.py), to a
broker process with a Kafka listener."""

from __future__ import annotations

import datetime
import secrets
import time
import uuid

import pytest
from kio.schema.errors import ErrorCode

from llog.consumer_groups import describe_group
from llog.coordination import Coordination
from llog.reader import LogReader
from llog.topics import create_topic
from llog.writer import LogWriter
from tests.helpers.broker_process import free_port, run_broker
from tests.helpers.kafka_wire import Pipeline, record_batch


@pytest.fixture(scope="module")
def listener(module_config):
    """A broker process with a Kafka listener: its bootstrap address."""
    port = free_port()
    with run_broker(module_config, args=["--kafka-port", str(port)]):
        yield f"127.0.0.1:{port}"


def _topic(config, partitions: int, records: int = 0) -> str:
    topic = f"o{uuid.uuid4().hex[:10]}"
    with Coordination(config) as coordination:
        create_topic(coordination, config.root_prefix, topic, partitions)
    if records:
        with LogWriter(config) as writer:
            writer.append(topic, 0, [b"x"] * records)
    return topic


def _commit(pipeline: Pipeline, group: str, topic: str, offset: int) -> bytes:
    """An OffsetCommit v8 of partition 0 from a consumer that assigns partitions itself
    (generation -1, no member id), framed, not sent."""
    from kio.schema.offset_commit.v8.request import OffsetCommitRequestPartition, OffsetCommitRequestTopic

    return pipeline.frame("offset_commit", 8, group_id=group, generation_id_or_member_epoch=-1, member_id="",
                          group_instance_id=None, topics=(OffsetCommitRequestTopic(name=topic, partitions=(
                              OffsetCommitRequestPartition(partition_index=0, committed_offset=offset,
                                                           committed_leader_epoch=-1, committed_metadata=""),)),))


def _offset_fetch(pipeline: Pipeline, group: str, topic: str) -> bytes:
    from kio.schema.offset_fetch.v1.request import OffsetFetchRequestTopic

    return pipeline.frame("offset_fetch", 1, group_id=group,
                          topics=(OffsetFetchRequestTopic(name=topic, partition_indexes=(0,)),))


def test_pipelined_offset_commits_take_effect_in_the_order_sent(listener, module_config):
    """An async auto-commit then a commitSync, back to back on one connection: the group ends at
    the second, and an OffsetFetch pipelined after them reads it (H8)."""
    pairs = 300
    topic, group = _topic(module_config, 1, records=2 * pairs + 10), f"g{uuid.uuid4().hex[:8]}"
    pipeline = Pipeline(listener)
    older, answered_out_of_order = [], []
    try:
        for i in range(pairs):
            n = 2 * i + 1
            frames = [_commit(pipeline, group, topic, n), _commit(pipeline, group, topic, n + 1),
                      _offset_fetch(pipeline, group, topic)]
            first = pipeline.correlation - 2
            pipeline.sock.sendall(b"".join(frames))
            answers = [pipeline.receive() for _ in frames]
            if [c for c, _ in answers] != [first, first + 1, first + 2]:
                answered_out_of_order.append([c for c, _ in answers])
                continue
            (_, commit_n), (_, commit_next), (_, fetched) = answers
            codes = [r.topics[0].partitions[0].error_code for r in (commit_n, commit_next)]
            assert codes == [ErrorCode.none, ErrorCode.none], (i, codes)
            if fetched.topics[0].partitions[0].committed_offset != n + 1:
                older.append((n, n + 1, fetched.topics[0].partitions[0].committed_offset))
    finally:
        pipeline.close()
    assert answered_out_of_order == []
    assert older == [], (f"{len(older)} of {pairs} pairs of pipelined commits (both answered NONE) left the group "
                         f"elsewhere than the second one's offset, e.g. (first, second, fetched): {older[:5]}")
    with Coordination(module_config) as coordination:
        assert [r.committed_offset for r in describe_group(coordination, module_config.root_prefix, group, [topic])] \
            == [2 * pairs]


def test_pipelined_produces_are_appended_in_the_order_sent(listener, module_config):
    """Windows of five produce requests in flight, as an idempotent producer with
    ``max.in.flight=5`` sends them: partition 0 gets the idempotent producer's batches (each
    sequence after the one before, so a batch appended before its predecessor would be
    refused), partition 1 plain batches in the same requests. Both hold the values in the order
    sent, and each request's base offsets follow the one before."""
    from kio.schema.produce.v8.request import PartitionProduceData, TopicProduceData

    topic, producer_id = _topic(module_config, 2), 1 + secrets.randbelow(2 ** 62 - 1)
    windows, in_flight, sequence, sent = 40, 5, 0, []
    pipeline = Pipeline(listener)
    bases: list[tuple[int, int]] = []
    try:
        for w in range(windows):
            frames, correlations = [], []
            for r in range(in_flight):
                values = [f"{w}-{r}-{k}".encode() for k in range(1 + (w + r) % 3)]
                sent.append(values)
                frames.append(pipeline.frame("produce", 8, transactional_id=None, acks=-1,
                                             timeout=datetime.timedelta(seconds=30), topic_data=(TopicProduceData(
                                                 name=topic, partition_data=(
                                                     PartitionProduceData(index=0, records=record_batch(values, producer_id,
                                                                                                  sequence)),
                                                     PartitionProduceData(index=1, records=record_batch(values)))),)))
                correlations.append(pipeline.correlation)
                sequence += len(values)
            pipeline.sock.sendall(b"".join(frames))
            answers = [pipeline.receive() for _ in frames]
            assert [c for c, _ in answers] == correlations  # answered in the order sent
            for _, response in answers:
                parts = {p.index: p for p in response.responses[0].partition_responses}
                assert [parts[p].error_code for p in (0, 1)] == [ErrorCode.none] * 2, (w, parts)
                bases.append((parts[0].base_offset, parts[1].base_offset))
    finally:
        pipeline.close()
    expected = [v for values in sent for v in values]
    with LogReader(module_config) as reader:
        for partition in (0, 1):
            assert [r.value for r in reader.read_range(topic, partition, 1)] == expected, partition
    starts = [1 + sum(map(len, sent[:i])) for i in range(len(sent))]
    assert bases == [(s, s) for s in starts]


def test_a_long_poll_holds_back_no_later_request_and_is_still_answered_first(listener, module_config):
    """A fetch parked in the long poll, then a commit and an ApiVersions on the same connection:
    the commit takes effect while the fetch waits (fetches overlap the ordered requests), and
    the answers come in the order sent."""
    from kio.schema.fetch.v11.request import FetchPartition, FetchTopic

    topic, group = _topic(module_config, 1, records=5), f"g{uuid.uuid4().hex[:8]}"
    pipeline = Pipeline(listener)
    try:
        wait = datetime.timedelta(seconds=3)
        fetch = pipeline.frame("fetch", 11, replica_id=-1, max_wait=wait, min_bytes=1, max_bytes=1 << 20,
                               isolation_level=0, session_id=0, session_epoch=-1, topics=(FetchTopic(
                                   topic=topic, partitions=(FetchPartition(partition=0, current_leader_epoch=-1,
                                                                           fetch_offset=6, log_start_offset=-1,
                                                                           partition_max_bytes=1 << 20),)),),
                               forgotten_topics_data=(), rack_id="")
        frames = [fetch, _commit(pipeline, group, topic, 4), pipeline.frame("api_versions", 3,
                                                                            client_software_name="test",
                                                                            client_software_version="1")]
        started = time.monotonic()
        pipeline.sock.sendall(b"".join(frames))
        committed = None
        with Coordination(module_config) as coordination:
            while time.monotonic() - started < 2.5 and committed is None:
                rows = describe_group(coordination, module_config.root_prefix, group, [topic])
                committed = rows[0].committed_offset if rows and rows[0].committed_offset else None
                time.sleep(0.05)
        assert committed == 4, "the commit waited for the fetch's long poll"
        answers = [pipeline.receive() for _ in frames]
        assert time.monotonic() - started >= 2.5  # the fetch did wait
        assert [c for c, _ in answers] == [pipeline.correlation - 2, pipeline.correlation - 1, pipeline.correlation]
        assert answers[1][1].topics[0].partitions[0].error_code == ErrorCode.none
    finally:
        pipeline.close()


def test_a_closed_connection_leaves_no_task_behind():
    """A connection's task is the listener's to cancel at stop while the connection is open, and
    no longer once it is closed: twenty connections that each sent a request and closed leave
    nothing in the listener's set (each request runs in a task of its own, which is not the
    connection's)."""
    import asyncio
    import struct
    from types import SimpleNamespace

    from broker_lite.kafka.server import KafkaListener

    app = SimpleNamespace(config=SimpleNamespace(root_prefix="unused"), max_request_bytes=1 << 20,
                          metrics=SimpleNamespace(observe_kafka_request=lambda *_: None))
    listener = KafkaListener(app, "127.0.0.1", 0)

    def api_versions_v0(correlation_id: int) -> bytes:
        body = struct.pack(">hhih", 18, 0, correlation_id, 4) + b"test"
        return struct.pack(">i", len(body)) + body

    async def scenario() -> int:
        server = await asyncio.start_server(listener._serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        for n in range(20):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(api_versions_v0(n))
            await writer.drain()
            await reader.readexactly(struct.unpack(">i", await reader.readexactly(4))[0])
            writer.close()
            await writer.wait_closed()
        deadline = time.monotonic() + 5
        while listener._connections and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        server.close()
        await server.wait_closed()
        return len(listener._connections)

    assert asyncio.run(scenario()) == 0, "closed connections' tasks are kept in KafkaListener._connections"
