"""Kafka consumer groups on the listener (docs/kafka.md section 6, docs/protocol.md section 9.5)
with real clients against broker processes: confluent-kafka consumers that ``subscribe()`` split
the partitions, rebalance when one leaves, commit into llog's consumer-group records (what
``llog groups describe`` reads) and resume from them; two listeners name one coordinator, and
killing it costs the members a rebalance, never a committed offset."""

from __future__ import annotations

import datetime
import struct
import time
import uuid
from contextlib import ExitStack

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition as KafkaPartition
from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode

from llog.consumer_groups import describe_group
from llog.coordination import Coordination
from llog.topics import create_topic
from tests.helpers.broker_process import free_port, run_broker
from tests.helpers.kafka_tools import run_kafka_tool
from tests.helpers.kafka_wire import Pipeline, request

PARTITIONS = 4
#: Consumers' settings: short timeouts so a rebalance is quick; the coordinator's minimum session
#: timeout is Kafka's, 6 s.
SETTINGS = {"enable.auto.commit": False, "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500, "topic.metadata.refresh.interval.ms": 2000, "reconnect.backoff.max.ms": 1000}


def _start(stack: ExitStack, config, count: int, **settings) -> list[tuple[str, object]]:
    """``count`` broker processes with Kafka listeners: ``(bootstrap address, process)`` of each."""
    out = []
    for _ in range(count):
        port = free_port()
        _, proc = stack.enter_context(run_broker(config, args=["--kafka-port", str(port)], **settings))
        out.append((f"127.0.0.1:{port}", proc))
    return out


@pytest.fixture(scope="module")
def listeners(module_config):
    with ExitStack() as stack:
        yield [address for address, _ in _start(stack, module_config, 2)]


def _topic(config, partitions: int = PARTITIONS) -> str:
    topic = f"g{uuid.uuid4().hex[:10]}"
    with Coordination(config) as coordination:
        create_topic(coordination, config.root_prefix, topic, partitions)
    return topic


def _produce(bootstrap: str, topic: str, count: int, tag: str, partitions: int = PARTITIONS) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    failed = []
    for i in range(count):
        producer.produce(topic, f"{tag}-{i}".encode(), partition=i % partitions,
                         on_delivery=lambda err, _: err is not None and failed.append(err))
    assert producer.flush(60) == 0 and failed == []


class Member:
    """A subscribed consumer that commits what each poll returned, synchronously, before it polls
    again: what it read is committed before any rebalance can move its partitions."""

    def __init__(self, bootstrap: str, group: str, topic: str, **settings):
        self.assigned: list[set[int]] = []
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, **SETTINGS, **settings})
        self.consumer.subscribe([topic], on_assign=self._on_assign)
        self.read: list[tuple[int, int, bytes]] = []
        self.unsaved = False  # a commit failed: the next poll commits again

    def _on_assign(self, consumer, partitions):
        self.assigned.append({p.partition for p in partitions})

    @property
    def owns(self) -> set[int]:
        return self.assigned[-1] if self.assigned else set()

    def poll(self) -> None:
        messages = self.consumer.consume(num_messages=100, timeout=0.2)
        good = [m for m in messages if m.error() is None]
        self.read += [(m.partition(), m.offset(), m.value()) for m in good]
        if good or self.unsaved:
            try:
                self.consumer.commit(asynchronous=False)
                self.unsaved = False
            except KafkaException as e:  # a rebalance or a coordinator move under way: commit again
                self.unsaved = e.args[0].code() != KafkaError._NO_OFFSET
                print("commit:", e)

    def close(self) -> None:
        self.consumer.close()


def _until(members: list[Member], done, what: str, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"not within {timeout_s:.0f} s: {what}"
        for member in members:
            member.poll()


def _split(members: list[Member]) -> bool:
    owned = [m.owns for m in members]
    return all(owned) and set().union(*owned) == set(range(PARTITIONS)) and sum(map(len, owned)) == PARTITIONS


def _committed(config, group: str, topic: str) -> dict[int, int]:
    with Coordination(config) as coordination:
        return {r.partition: r.committed_offset for r in describe_group(coordination, config.root_prefix, group, [topic])}


def _find_coordinator(address: str, group: str) -> tuple[int, int, str, int]:
    """FindCoordinator v0, raw: ``(error code, node id, host, port)``."""
    key = group.encode()
    data = request(address, 10, 0, struct.pack(">h", len(key)) + key)
    code, node = struct.unpack(">hi", data[:6])
    length = struct.unpack(">h", data[6:8])[0]
    return code, node, data[8:8 + length].decode(), struct.unpack(">i", data[8 + length:12 + length])[0]


def test_a_group_of_two_splits_the_partitions_rebalances_when_one_leaves_and_resumes_from_its_commits(
        listeners, module_config):
    topic, group = _topic(module_config), f"grp{uuid.uuid4().hex[:8]}"
    a, b = Member(listeners[0], group, topic), Member(listeners[1], group, topic)
    members = [a, b]
    try:
        _until(members, lambda: _split(members), "the two members split the partitions")
        first = (set(a.owns), set(b.owns))
        _produce(listeners[0], topic, 200, "one")
        _until(members, lambda: len(a.read) + len(b.read) >= 200, "200 records read by the two")
        assert {p for p, _, _ in a.read} <= first[0] and {p for p, _, _ in b.read} <= first[1]
        assert a.read and b.read

        b.close()  # LeaveGroup: a rebalance gives every partition to a
        members = [a]
        _until(members, lambda: a.owns == set(range(PARTITIONS)), "a owns every partition after b left")
        _produce(listeners[1], topic, 200, "two")
        _until(members, lambda: len(a.read) + len(b.read) >= 400, "400 records read")
        for _ in range(5):  # anything read twice would show up now
            a.poll()
        read = a.read + b.read
        assert len(read) == 400 and len({(p, o) for p, o, _ in read}) == 400  # every record once
        assert sorted(v for _, _, v in read) == sorted([f"one-{i}".encode() for i in range(200)]
                                                       + [f"two-{i}".encode() for i in range(200)])
    finally:
        for member in members:
            member.close()

    # What llog groups describe prints: the next offset to read, everything read (log end = 101).
    committed = _committed(module_config, group, topic)
    assert committed == {p: 101 for p in range(PARTITIONS)}

    _produce(listeners[0], topic, 40, "three")
    c = Member(listeners[1], group, topic)
    try:
        _until([c], lambda: len(c.read) >= 40, "a restarted member reads what was produced after the commits")
        for _ in range(5):
            c.poll()
        assert sorted(v for _, _, v in c.read) == sorted(f"three-{i}".encode() for i in range(40))
        assert min(o for _, o, _ in c.read) == 101  # resumed from the committed offsets, not from earliest
        kafka_view = c.consumer.committed([KafkaPartition(topic, p) for p in range(PARTITIONS)], timeout=30)
        assert {tp.partition: tp.offset for tp in kafka_view} == _committed(module_config, group, topic) \
            == {p: 111 for p in range(PARTITIONS)}
    finally:
        c.close()


def test_a_consumer_that_assigns_commits_while_the_group_has_no_members_and_a_stale_generation_is_refused(
        listeners, module_config):
    topic, group = _topic(module_config, 1), f"grp{uuid.uuid4().hex[:8]}"
    _produce(listeners[0], topic, 10, "x", partitions=1)
    consumer = Consumer({"bootstrap.servers": listeners[1], "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[KafkaPartition(topic, 0, 7)], asynchronous=False)
        assert _committed(module_config, group, topic) == {0: 7}
        consumer.commit(offsets=[KafkaPartition(topic, 0, 3)], asynchronous=False)  # back: Kafka's rule
        assert _committed(module_config, group, topic) == {0: 3}
        with pytest.raises(KafkaException):  # past the log end (11)
            consumer.commit(offsets=[KafkaPartition(topic, 0, 50)], asynchronous=False)
        assert _committed(module_config, group, topic) == {0: 3}
    finally:
        consumer.close()


def test_the_commit_metadata_string_is_stored_with_its_offset_and_goes_with_it(listeners, module_config):
    """OffsetCommit's metadata comes back from OffsetFetch (kafka-python's and librdkafka's), on
    any listener; a later commit without one, or an llog commit, leaves none (docs/protocol.md
    section 9.3); one over 4096 bytes is OFFSET_METADATA_TOO_LARGE."""
    from kafka import KafkaConsumer, OffsetAndMetadata
    from kafka import TopicPartition as PyPartition

    from llog.consumer_groups import commit_offsets
    from llog.keys import TopicPartition

    topic, group = _topic(module_config, 2), f"grp{uuid.uuid4().hex[:8]}"
    _produce(listeners[0], topic, 10, "x", partitions=2)
    consumer = Consumer({"bootstrap.servers": listeners[0], "group.id": group, "enable.auto.commit": False})
    reader = KafkaConsumer(bootstrap_servers=listeners[1], group_id=group, enable_auto_commit=False)
    try:
        reader.commit({PyPartition(topic, 0): OffsetAndMetadata(4, "partition-time=1700000000000", -1),
                       PyPartition(topic, 1): OffsetAndMetadata(6, "ünïcode", -1)})

        def fetched(partition: int) -> tuple[int, str]:  # kafka-python's OffsetFetch, on the other listener
            found = reader.committed(PyPartition(topic, partition), metadata=True)
            return found.offset, found.metadata

        assert [fetched(0), fetched(1)] == [(4, "partition-time=1700000000000"), (6, "ünïcode")]
        # confluent-kafka sends its string with a NUL at the end and reads one back up to a NUL (as
        # C strings go), so it reads back its own strings only.
        consumer.commit(offsets=[KafkaPartition(topic, 0, 4, metadata="from librdkafka")], asynchronous=False)
        assert consumer.committed([KafkaPartition(topic, 0)], timeout=30)[0].metadata == "from librdkafka"

        consumer.commit(offsets=[KafkaPartition(topic, 0, 4)], asynchronous=False)  # same offset, no metadata
        assert fetched(0) == (4, "")
        with Coordination(module_config) as coordination:  # llog's own commit (HTTP broker, Spark source)
            commit_offsets(coordination, module_config.root_prefix, group, {TopicPartition(topic, 1): 8})
        assert fetched(1) == (8, "")

        with pytest.raises(KafkaException) as refused:
            consumer.commit(offsets=[KafkaPartition(topic, 0, 5, metadata="m" * 4097)], asynchronous=False)
        assert refused.value.args[0].code() == KafkaError.OFFSET_METADATA_TOO_LARGE
        assert _committed(module_config, group, topic) == {0: 4, 1: 8}
    finally:
        consumer.close()
        reader.close()


def test_two_listeners_name_the_same_coordinator(listeners):
    for _ in range(3):
        group = f"grp{uuid.uuid4().hex[:8]}"
        answers = {_find_coordinator(address, group) for address in listeners}
        assert len(answers) == 1, answers
        code, node, host, port = answers.pop()
        assert code == 0 and f"{host}:{port}" in listeners


def test_the_admin_client_lists_and_describes_groups(listeners, module_config):
    topic, group = _topic(module_config), f"grp{uuid.uuid4().hex[:8]}"
    a, b = Member(listeners[0], group, topic), Member(listeners[1], group, topic)
    try:
        _until([a, b], lambda: _split([a, b]), "the two members split the partitions")
        admin = AdminClient({"bootstrap.servers": ",".join(listeners)})
        listed = admin.list_consumer_groups(request_timeout=30).result(60)
        assert group in {g.group_id for g in listed.valid}, (listed.valid, listed.errors)
        described = admin.describe_consumer_groups([group], request_timeout=30)[group].result(60)
        assert described.state.name == "STABLE"
        assigned = {m.member_id: {tp.partition for tp in m.assignment.topic_partitions} for m in described.members}
        assert sorted(assigned.values(), key=min) == sorted([a.owns, b.owns], key=min)
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_killing_the_coordinator_costs_a_rebalance_never_a_committed_offset(module_config, how):
    """kill -9: the group moves once the coordinator's Oxia session expires (4 s here). A stop
    (SIGTERM) deletes the claims (the listener releases them, and its closing Oxia session would
    too): the group moves at once, and the session timeout is set far past this test's bounds
    (5 min), so that only that lets it move."""
    # A root of its own: no listener but these two is registered, so the group must move to the survivor.
    module_config = module_config.replace(root_prefix=f"t{uuid.uuid4().hex[:12]}")
    topic, group = _topic(module_config), f"grp{uuid.uuid4().hex[:8]}"
    with ExitStack() as stack:
        started = _start(stack, module_config, 2, LLOG_OXIA_SESSION_TIMEOUT_MS=4000 if how == "kill" else 300_000)
        addresses = [address for address, _ in started]
        bootstrap = ",".join(addresses)
        a, b = Member(bootstrap, group, topic), Member(bootstrap, group, topic)
        members = [a, b]
        try:
            _until(members, lambda: _split(members), "the two members split the partitions")
            _produce(bootstrap, topic, 200, "one")
            _until(members, lambda: len(a.read) + len(b.read) >= 200, "200 records read")
            before = _committed(module_config, group, topic)
            assert before == {p: 51 for p in range(PARTITIONS)}

            code, node, host, port = _find_coordinator(addresses[0], group)
            assert code == 0
            coordinator = addresses.index(f"{host}:{port}")
            survivor = addresses[1 - coordinator]
            if how == "kill":
                started[coordinator][1].kill()  # kill -9
            else:
                started[coordinator][1].terminate()
            started[coordinator][1].wait(60)
            rebalances, read_before = len(a.assigned) + len(b.assigned), (len(a.read), len(b.read))

            _produce(survivor, topic, 200, "two")
            everything = {f"one-{i}".encode() for i in range(200)} | {f"two-{i}".encode() for i in range(200)}
            _until(members, lambda: (len(a.assigned) + len(b.assigned) > rebalances and _split(members)
                                     and {v for _, _, v in a.read + b.read} == everything and not a.unsaved
                                     and not b.unsaved and _committed(module_config, group, topic)
                                     == {p: 101 for p in range(PARTITIONS)}),
                   "the members moved to the surviving listener, rebalanced, read on and committed", timeout_s=120)
            after_kill = [v for _, _, v in a.read[read_before[0]:] + b.read[read_before[1]:]]
            # Nothing read before the kill is read again: the committed offsets survived it. (What
            # was read while the coordinator was away and not yet committed may be read twice.)
            assert set(after_kill) == {f"two-{i}".encode() for i in range(200)}
            code, node, host, port = _find_coordinator(survivor, group)
            assert code == 0 and f"{host}:{port}" == survivor
        finally:
            for member in members:
                member.close()
        assert _committed(module_config, group, topic) == {p: 101 for p in range(PARTITIONS)}


# --- raw requests (kio's types, as the listener's own) ---------------------------------------------

def _join(raw: Pipeline, group: str, member_id: str = "", instance: str | None = None, metadata: bytes = b"m"):
    from kio.schema.join_group.v5.request import JoinGroupRequestProtocol

    response = raw.call("join_group", 5, group_id=group, session_timeout=datetime.timedelta(seconds=6),
                           rebalance_timeout=datetime.timedelta(seconds=10), member_id=member_id,
                           group_instance_id=instance, protocol_type="consumer",
                           protocols=(JoinGroupRequestProtocol(name="range", metadata=metadata),))
    return response


def _sync(raw: Pipeline, group: str, generation: int, member_id: str, instance: str | None = None,
          assignments: dict[str, bytes] | None = None):
    from kio.schema.sync_group.v3.request import SyncGroupRequestAssignment

    response = raw.call("sync_group", 3, group_id=group, generation_id=generation, member_id=member_id,
                           group_instance_id=instance, assignments=tuple(
                               SyncGroupRequestAssignment(member_id=m, assignment=a)
                               for m, a in (assignments or {}).items()))
    return response


def _commit(raw: Pipeline, group: str, topic: str, generation: int, member_id: str, offset: int,
            instance: str | None = None) -> ErrorCode:
    from kio.schema.offset_commit.v8.request import OffsetCommitRequestPartition, OffsetCommitRequestTopic

    response = raw.call("offset_commit", 8, group_id=group, generation_id_or_member_epoch=generation,
                           member_id=member_id, group_instance_id=instance, topics=(OffsetCommitRequestTopic(
                               name=topic, partitions=(OffsetCommitRequestPartition(
                                   partition_index=0, committed_offset=offset, committed_leader_epoch=-1,
                                   committed_metadata=""),)),))
    return response.topics[0].partitions[0].error_code


def _heartbeat(raw: Pipeline, group: str, generation: int, member_id: str, instance: str | None = None) -> ErrorCode:
    response = raw.call("heartbeat", 4, group_id=group, generation_id=generation, member_id=member_id,
                           group_instance_id=instance)
    return response.error_code


def test_generations_fence_commits_and_a_silent_member_is_removed_after_its_session_timeout(
        listeners, module_config):
    from kio.schema.sync_group.v3.request import SyncGroupRequestAssignment

    topic, group = _topic(module_config, 1), f"grp{uuid.uuid4().hex[:8]}"
    _produce(listeners[0], topic, 10, "x", partitions=1)
    _, _, host, port = _find_coordinator(listeners[0], group)
    raw = Pipeline(f"{host}:{port}")
    try:
        first = _join(raw, group)
        assert first.error_code == ErrorCode.member_id_required and first.member_id  # KIP-394
        joined = _join(raw, group, first.member_id)
        assert joined.error_code == ErrorCode.none and joined.leader == first.member_id
        assert [m.member_id for m in joined.members] == [first.member_id]
        member, generation = first.member_id, joined.generation_id
        synced = raw.call("sync_group", 3, group_id=group, generation_id=generation, member_id=member,
                             group_instance_id=None, assignments=(SyncGroupRequestAssignment(
                                 member_id=member, assignment=b"mine"),))
        assert synced.error_code == ErrorCode.none and synced.assignment == b"mine"

        assert _commit(raw, group, topic, generation, member, 9) == ErrorCode.none
        assert _commit(raw, group, topic, generation - 1, member, 4) == ErrorCode.illegal_generation
        assert _commit(raw, group, topic, -1, "", 4) == ErrorCode.unknown_member_id  # the group has a member
        assert _committed(module_config, group, topic) == {0: 9}
        assert _commit(raw, group, topic, generation, member, 5) == ErrorCode.none  # back, by its member
        assert _committed(module_config, group, topic) == {0: 5}
        assert _heartbeat(raw, group, generation, member) == ErrorCode.none
        assert _heartbeat(raw, group, generation + 1, member) == ErrorCode.illegal_generation

        # No heartbeat for longer than the session timeout (6 s): the member is removed.
        deadline = time.monotonic() + 30
        time.sleep(6.5)
        while (code := _heartbeat(raw, group, generation, member)) == ErrorCode.none:
            assert time.monotonic() < deadline, "the silent member was not removed"
            time.sleep(7)
        assert code == ErrorCode.unknown_member_id
        # The coordinator knows the group without the member, or (its claim released once the group
        # was unused for 5 s) no longer knows it, which Kafka answers ILLEGAL_GENERATION.
        assert _commit(raw, group, topic, generation, member, 8) in (ErrorCode.unknown_member_id,
                                                                     ErrorCode.illegal_generation)
        assert _commit(raw, group, topic, -1, "", 8) == ErrorCode.none  # no members now: assign()'s commit
        assert _committed(module_config, group, topic) == {0: 8}
    finally:
        raw.close()


def _kafka_tool(main: str, *args: str) -> str:
    """Run one of Kafka 4.4's own tools (its jars, as the benches resolve them: from Maven Central
    the first time on a machine); its output."""
    done = run_kafka_tool(main, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_kafkas_own_console_consumer_and_consumer_groups_tool(listeners, module_config):
    """Kafka 4.4's Java client joins a group and commits; ``kafka-consumer-groups --describe``
    prints the offsets ``llog groups describe`` prints."""
    topic, group = _topic(module_config), f"grp{uuid.uuid4().hex[:8]}"
    _produce(listeners[0], topic, 40, "java")
    out = _kafka_tool("org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server", listeners[1],
                      "--topic", topic, "--group", group, "--from-beginning", "--max-messages", "40",
                      "--timeout-ms", "60000")
    assert sorted(out.split()) == sorted(f"java-{i}" for i in range(40))
    assert _committed(module_config, group, topic) == {p: 11 for p in range(PARTITIONS)}
    out = _kafka_tool("org.apache.kafka.tools.consumer.group.ConsumerGroupCommand", "--bootstrap-server",
                      ",".join(listeners), "--describe", "--group", group)
    rows = [line.split() for line in out.splitlines() if line.startswith(group)]
    assert {int(r[2]): (int(r[3]), int(r[4]), int(r[5])) for r in rows} == {p: (11, 11, 0) for p in range(PARTITIONS)}


def test_kafka_python_consumers_share_a_group_with_librdkafka_ones(listeners, module_config):
    """kafka-python's own implementation of the classic protocol, in one group with librdkafka."""
    from kafka import KafkaConsumer

    topic, group = _topic(module_config), f"grp{uuid.uuid4().hex[:8]}"
    a = Member(listeners[0], group, topic)
    b = KafkaConsumer(topic, bootstrap_servers=listeners[1], group_id=group, enable_auto_commit=False,
                      auto_offset_reset="earliest", session_timeout_ms=6000, heartbeat_interval_ms=500)
    read_b: list[tuple[int, int, bytes]] = []

    def poll_b():
        # Short polls: kafka-python 3.0.12 drops a join that finishes after its poll's timeout and
        # joins again at once, with nothing changed. Kafka's coordinator answers such a join with
        # the current generation; one that rebalanced instead would rebalance at every poll.
        for records in b.poll(timeout_ms=200).values():
            read_b.extend((r.partition, r.offset, r.value) for r in records)
        if read_b:
            b.commit()

    try:
        deadline = time.monotonic() + 90
        while not (a.owns and b.assignment() and len(a.owns) + len(b.assignment()) == PARTITIONS
                   and not a.owns & {tp.partition for tp in b.assignment()}):
            assert time.monotonic() < deadline, "the two consumers did not split the partitions"
            a.poll()
            poll_b()
        _produce(listeners[0], topic, 100, "mixed")
        while len(a.read) + len(read_b) < 100:
            assert time.monotonic() < deadline + 60, "the records were not read"
            a.poll()
            poll_b()
        read = a.read + read_b
        assert sorted(v for _, _, v in read) == sorted(f"mixed-{i}".encode() for i in range(100))
        assert {p for p, _, _ in read_b} == {tp.partition for tp in b.assignment()}
    finally:
        b.close()
        a.close()
    assert _committed(module_config, group, topic) == {p: 26 for p in range(PARTITIONS)}


# --- static members, claims that go, DeleteGroups and OffsetDelete, ListGroups ---------------------

def _coordinator_address(listeners: list[str], group: str) -> str:
    code, _, host, port = _find_coordinator(listeners[0], group)
    assert code == ErrorCode.none
    return f"{host}:{port}"


def test_a_static_member_back_with_a_new_member_id_fences_the_old_one_without_a_rebalance(
        listeners, module_config):
    """KIP-345: a member joining with a known ``group.instance.id`` takes its place; the old member
    id is FENCED_INSTANCE_ID; unchanged metadata in a Stable group is no rebalance; LeaveGroup by
    instance id removes it."""
    topic, group = _topic(module_config, 1), f"grp{uuid.uuid4().hex[:8]}"
    _produce(listeners[0], topic, 10, "x", partitions=1)
    raw = Pipeline(_coordinator_address(listeners, group))
    try:
        first = _join(raw, group, instance="host-1")  # a static member gets no MEMBER_ID_REQUIRED
        assert first.error_code == ErrorCode.none and first.leader == first.member_id
        old, generation = first.member_id, first.generation_id
        assert _sync(raw, group, generation, old, "host-1", {old: b"mine"}).assignment == b"mine"
        assert _commit(raw, group, topic, generation, old, 4, "host-1") == ErrorCode.none

        again = _join(raw, group, instance="host-1")  # restarted: same instance, no member id
        new = again.member_id
        assert again.error_code == ErrorCode.none and new != old
        assert again.generation_id == generation  # no rebalance
        assert again.leader == old and again.members == ()  # it is not asked to assign again
        synced = _sync(raw, group, generation, new, "host-1")
        assert synced.error_code == ErrorCode.none and synced.assignment == b"mine"

        assert _heartbeat(raw, group, generation, old, "host-1") == ErrorCode.fenced_instance_id
        assert _commit(raw, group, topic, generation, old, 9, "host-1") == ErrorCode.fenced_instance_id
        assert _sync(raw, group, generation, old, "host-1").error_code == ErrorCode.fenced_instance_id
        assert _join(raw, group, old, "host-1").error_code == ErrorCode.fenced_instance_id
        assert _committed(module_config, group, topic) == {0: 4}
        assert _heartbeat(raw, group, generation, new, "host-1") == ErrorCode.none
        assert _commit(raw, group, topic, generation, new, 9, "host-1") == ErrorCode.none

        changed = _join(raw, group, new, "host-1", metadata=b"other")  # new metadata: a rebalance
        assert changed.error_code == ErrorCode.none and changed.generation_id == generation + 1
        assert changed.leader == new and [m.group_instance_id for m in changed.members] == ["host-1"]

        from kio.schema.leave_group.v4.request import MemberIdentity
        left = raw.call("leave_group", 4, group_id=group, members=(
            MemberIdentity(member_id="", group_instance_id="host-1"),
            MemberIdentity(member_id="", group_instance_id="host-2")))
        assert [m.error_code for m in left.members] == [ErrorCode.none, ErrorCode.unknown_member_id]
        assert _heartbeat(raw, group, generation + 1, new, "host-1") == ErrorCode.unknown_member_id
    finally:
        raw.close()


def test_a_static_librdkafka_consumer_restarted_keeps_its_partitions_and_its_session_still_expires(
        listeners, module_config):
    """librdkafka with ``group.instance.id``: a closed static member does not leave; the next
    consumer with its instance id takes its place and reads on from its commits; once that one
    is closed, the session timeout removes it."""
    topic, group = _topic(module_config), f"grp{uuid.uuid4().hex[:8]}"
    _produce(listeners[0], topic, 40, "one")
    admin = AdminClient({"bootstrap.servers": ",".join(listeners)})

    def members():
        described = admin.describe_consumer_groups([group], request_timeout=30)[group].result(60)
        return [(m.group_instance_id, {tp.partition for tp in m.assignment.topic_partitions})
                for m in described.members]

    first = Member(listeners[0], group, topic, **{"group.instance.id": "static-1"})
    try:
        _until([first], lambda: len(first.read) >= 40 and not first.unsaved, "the static member read 40")
        assert members() == [("static-1", set(range(PARTITIONS)))]
    finally:
        first.close()
    assert members() == [("static-1", set(range(PARTITIONS)))]  # a static member does not leave on close

    _produce(listeners[0], topic, 40, "two")
    second = Member(listeners[1], group, topic, **{"group.instance.id": "static-1"})
    try:
        _until([second], lambda: len(second.read) >= 40, "the restarted static member read on")
        assert sorted(v for _, _, v in second.read) == sorted(f"two-{i}".encode() for i in range(40))
        assert second.assigned == [set(range(PARTITIONS))] and members() == [("static-1", set(range(PARTITIONS)))]
    finally:
        second.close()
    deadline = time.monotonic() + 30
    while members():
        assert time.monotonic() < deadline, "the static member's session did not expire"
        time.sleep(1)


def _claim(config, group: str):
    from llog.keys import KAFKA_PARTITION_KEY, kafka_group_key

    with Coordination(config) as coordination:
        return coordination.get(kafka_group_key(config.root_prefix, group), KAFKA_PARTITION_KEY)


def test_the_claim_goes_when_the_last_member_leaves_and_the_group_is_joined_again_elsewhere(
        listeners, module_config):
    group = f"grp{uuid.uuid4().hex[:8]}"
    address = _coordinator_address(listeners, group)
    raw = Pipeline(address)
    try:
        member = _join(raw, group, instance="only")
        assert member.error_code == ErrorCode.none
        from kio.schema.leave_group.v4.request import MemberIdentity
        left = raw.call("leave_group", 4, group_id=group, members=(
            MemberIdentity(member_id=member.member_id, group_instance_id="only"),))
        assert left.error_code == ErrorCode.none and left.members[0].error_code == ErrorCode.none
    finally:
        raw.close()
    deadline = time.monotonic() + 30
    while _claim(module_config, group) is not None:
        assert time.monotonic() < deadline, "the claim of a group with no members was not released"
        time.sleep(0.5)

    other = next(a for a in listeners if a != address)
    code, _, host, port = _find_coordinator(other, group)  # free: the listener asked claims it
    assert code == ErrorCode.none and f"{host}:{port}" == other
    raw = Pipeline(other)
    try:
        first = _join(raw, group)
        joined = _join(raw, group, first.member_id)
        assert joined.error_code == ErrorCode.none and joined.generation_id == 1
    finally:
        raw.close()


def _groups_tool(*args: str) -> str:
    """``kafka-consumer-groups`` (Kafka 4.4's, as test_kafka_cli.py runs it): its stdout and stderr."""
    done = run_kafka_tool("org.apache.kafka.tools.consumer.group.ConsumerGroupCommand", *args, timeout_s=120)
    return done.stdout + done.stderr


def _listed(listeners: list[str], group: str) -> list[str]:
    """The state of ``group`` in each listener's ListGroups answer that lists it."""
    states = []
    for address in listeners:
        raw = Pipeline(address)
        try:
            response = raw.call("list_groups", 4, states_filter=())
        finally:
            raw.close()
        assert response.error_code == ErrorCode.none
        states += [g.group_state for g in response.groups if g.group_id == group]
    return states


def test_kafka_consumer_groups_deletes_offsets_and_groups_as_kafka_does(listeners, module_config):
    """``--delete-offsets`` refuses a topic a member subscribes to and deletes another's;
    ``--delete`` refuses a group with members, then deletes it; ``--list`` shows a group that only
    has offsets, once."""
    subscribed, other = _topic(module_config, 2), _topic(module_config, 1)
    group = f"grp{uuid.uuid4().hex[:8]}"
    _produce(listeners[0], subscribed, 10, "s", partitions=2)
    _produce(listeners[0], other, 10, "o", partitions=1)
    bootstrap = ",".join(listeners)
    member = Member(listeners[0], group, subscribed)
    try:
        _until([member], lambda: member.owns == {0, 1}, "the member owns both partitions")
        _until([member], lambda: len(member.read) == 10, "the member read the records")
        member.consumer.commit(offsets=[KafkaPartition(other, 0, 6)], asynchronous=False)
        assert _committed(module_config, group, subscribed) == {0: 6, 1: 6}
        assert _committed(module_config, group, other) == {0: 6}

        out = _groups_tool("--bootstrap-server", bootstrap, "--delete-offsets", "--group", group, "--topic", subscribed)
        assert "GroupSubscribedToTopicException" in out or "subscribed" in out.lower(), out
        assert _committed(module_config, group, subscribed) == {0: 6, 1: 6}
        out = _groups_tool("--bootstrap-server", bootstrap, "--delete-offsets", "--group", group, "--topic", other)
        assert "Request succeeded for deleting offsets" in out and "Error" not in out, out
        assert _committed(module_config, group, other) == {}

        out = _groups_tool("--bootstrap-server", bootstrap, "--delete", "--group", group)
        assert "GroupNotEmptyException" in out or "not empty" in out.lower(), out
        assert _committed(module_config, group, subscribed) == {0: 6, 1: 6}
    finally:
        member.close()

    # The member is gone: the group only has offsets. It is listed, by one listener, as Empty.
    assert group in _groups_tool("--bootstrap-server", bootstrap, "--list").split()
    assert _listed(listeners, group) == ["Empty"]
    out = _groups_tool("--bootstrap-server", bootstrap, "--delete", "--group", group)
    assert f"Deletion of requested consumer groups ('{group}') was successful." in out, out
    assert _committed(module_config, group, subscribed) == {}
    assert _listed(listeners, group) == []


def test_the_admin_client_deletes_a_group_and_lists_offset_only_groups_once(listeners, module_config):
    """A group committed by llog itself (what the HTTP broker and the Spark source write) is
    listed, once across the listeners, and confluent-kafka's ``delete_consumer_groups`` deletes it."""
    from llog.consumer_groups import commit_offsets
    from llog.keys import TopicPartition

    topic, group = _topic(module_config, 1), f"grp{uuid.uuid4().hex[:8]}"
    _produce(listeners[0], topic, 10, "x", partitions=1)
    with Coordination(module_config) as coordination:
        commit_offsets(coordination, module_config.root_prefix, group, {TopicPartition(topic, 0): 5})
    admin = AdminClient({"bootstrap.servers": ",".join(listeners)})
    listed = admin.list_consumer_groups(request_timeout=30).result(60)
    assert [g.state.name for g in listed.valid if g.group_id == group] == ["EMPTY"], (listed.valid, listed.errors)
    assert _listed(listeners, group) == ["Empty"]
    described = admin.describe_consumer_groups([group], request_timeout=30)[group].result(60)
    assert described.state.name == "EMPTY" and described.members == []

    admin.delete_consumer_groups([group], request_timeout=30)[group].result(60)
    assert _committed(module_config, group, topic) == {}
    with pytest.raises(KafkaException) as refused:  # it no longer exists
        admin.delete_consumer_groups([group], request_timeout=30)[group].result(60)
    assert refused.value.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND
