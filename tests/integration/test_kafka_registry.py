"""The Kafka listeners' registry and group claims in Oxia (docs/protocol.md section 9.5) on the
real stack: a listener that takes its session as lost while the session in fact lives (its
registry scans fail, its Oxia heartbeats do not) registers anew without leaving a second
registration behind, and serves its groups again (in process); a coordinator whose claim is
gone commits nothing (a broker process)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from kio.schema.errors import ErrorCode

from broker_lite.kafka.registry import REFRESH_S, Listener, ListenerRegistry
from llog.consumer_groups import describe_group
from llog.coordination import Coordination
from llog.errors import CoordinationError
from llog.keys import KAFKA_PARTITION_KEY, kafka_group_key, kafka_listener_key
from llog.records import now_ms
from llog.topics import create_topic
from llog.writer import LogWriter
from tests.helpers.broker_process import free_port, run_broker
from tests.helpers.kafka_wire import Pipeline


async def _until(done, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"not within {timeout_s:.0f} s: {what}"
        await asyncio.sleep(0.05)


def test_a_listener_whose_scans_fail_past_its_session_timeout_serves_its_groups_again(config, hooks):
    """The wedge the review noted: the listener re-registered under a new node id while its old
    registration and claims lived on, and adopted a claim only when its node id matched, so its
    groups bounced FindCoordinator -> NOT_COORDINATOR until a restart."""
    group = f"g{uuid.uuid4().hex[:8]}"

    async def scenario() -> None:
        with Coordination(config) as mine, Coordination(config) as theirs:
            # A session timeout of 1 s as the listener sees it; the Oxia session itself (the
            # config's, 30 s) keeps heartbeating throughout.
            listener = ListenerRegistry(mine, config.root_prefix, "127.0.0.1", 9092, "broker-a", 1_000)
            other = ListenerRegistry(theirs, config.root_prefix, "127.0.0.1", 9093, "broker-b", 30_000)
            await listener.start()
            await other.start()
            try:
                assert (await listener.coordinator(group)).node_id == listener.node_id and listener.holds(group)
                first = listener.me
                failing = True

                def scan_fails() -> None:
                    if failing:
                        raise CoordinationError("test: the registry scan fails")

                hooks["kafka_registry.before_refresh_scan"] = scan_fails
                await _until(lambda: listener.me is not first, "the listener took its session as lost",
                             3 * REFRESH_S + 5)
                failing = False
                assert not listener.holds(group)  # given up with the session taken as lost

                # Served again: FindCoordinator names this listener, which holds the claim, and
                # another listener reads the claim as naming it too.
                holder = await listener.coordinator(group)
                assert (holder.node_id, holder.broker_id) == (listener.node_id, "broker-a")
                assert listener.holds(group)
                seen = await other.coordinator(group, claim=False)
                assert (seen.node_id, seen.broker_id) == (listener.node_id, "broker-a")
                # One registration per listener: the other's next scan lists two brokers.
                await asyncio.sleep(REFRESH_S + 0.5)
                assert sorted((b.node_id, b.broker_id) for b in other.brokers()) == sorted(
                    [(listener.node_id, "broker-a"), (other.node_id, "broker-b")])
            finally:
                await listener.stop()
                await other.stop()

    asyncio.run(scenario())


def test_records_an_earlier_registration_of_this_listener_left_behind_are_deleted(config):
    """Where deleting the old registration and claims failed when the session was taken as lost,
    what they left (under an old node id, with this listener's broker id) is found and deleted:
    the group's claim when the group is looked up, the registration at the next refresh."""
    group = f"g{uuid.uuid4().hex[:8]}"

    async def scenario() -> None:
        with Coordination(config) as mine:
            listener = ListenerRegistry(mine, config.root_prefix, "127.0.0.1", 9092, "broker-a", 30_000)
            await listener.start()
            try:
                old = Listener(listener.node_id + 7, "127.0.0.1", 9092, "broker-a", now_ms())
                await asyncio.to_thread(mine.claim, kafka_listener_key(config.root_prefix, old.node_id),
                                        old.to_json(), KAFKA_PARTITION_KEY)
                await asyncio.to_thread(mine.claim, kafka_group_key(config.root_prefix, group), old.to_json(),
                                        KAFKA_PARTITION_KEY)
                holder = await listener.coordinator(group)
                assert holder.node_id == listener.node_id and listener.holds(group)
                await asyncio.sleep(REFRESH_S + 0.5)
                assert [b.node_id for b in listener.brokers()] == [listener.node_id]
                assert await asyncio.to_thread(mine.get, kafka_listener_key(config.root_prefix, old.node_id),
                                               KAFKA_PARTITION_KEY) is None
            finally:
                await listener.stop()

    asyncio.run(scenario())


def test_a_coordinator_whose_claim_is_gone_commits_nothing(config):
    """The state a coordinator finds when it resumes after a pause longer than its session: its
    claim gone with the session and the group claimed by another listener, its registration
    perhaps not yet noticed as gone. A commit it serves then is NOT_COORDINATOR and writes
    nothing, before any refresh could tell it (docs/protocol.md section 9.5, timing rule)."""
    from kio.schema.offset_commit.v8.request import OffsetCommitRequestPartition, OffsetCommitRequestTopic

    topic, group = f"o{uuid.uuid4().hex[:10]}", f"g{uuid.uuid4().hex[:8]}"
    with Coordination(config) as coordination:
        create_topic(coordination, config.root_prefix, topic, 1)
    with LogWriter(config) as writer:
        writer.append(topic, 0, [b"x"] * 10)

    def commit(pipeline: Pipeline, offset: int) -> ErrorCode:
        pipeline.send("offset_commit", 8, group_id=group, generation_id_or_member_epoch=-1, member_id="",
                      group_instance_id=None, topics=(OffsetCommitRequestTopic(name=topic, partitions=(
                          OffsetCommitRequestPartition(partition_index=0, committed_offset=offset,
                                                       committed_leader_epoch=-1, committed_metadata=""),)),))
        return pipeline.receive()[1].topics[0].partitions[0].error_code

    port = free_port()
    with run_broker(config, args=["--kafka-port", str(port)]), Coordination(config) as other:
        pipeline = Pipeline(f"127.0.0.1:{port}")
        try:
            assert commit(pipeline, 3) == ErrorCode.none  # claims the group
            key = kafka_group_key(config.root_prefix, group)
            claim = other.get(key, KAFKA_PARTITION_KEY)
            assert claim is not None
            # The session's end deletes the claim; another listener claims the group.
            assert other.delete(key, KAFKA_PARTITION_KEY, claim.version_id)
            other.claim(key, Listener(99, "127.0.0.1", 1, "another-broker", now_ms()).to_json(), KAFKA_PARTITION_KEY)
            assert commit(pipeline, 7) == ErrorCode.not_coordinator
        finally:
            pipeline.close()
        assert [r.committed_offset for r in describe_group(other, config.root_prefix, group, [topic])] == [3]


@pytest.mark.parametrize("node_id_after", ["the same", "another"])
def test_a_lookup_that_straddles_a_re_registration_leaves_the_live_claim_alone(config, node_id_after):
    """A FindCoordinator lookup that starts as node ``me`` (coordinator() captures it and reads
    the claim in a thread) while the listener takes its session as lost, registers anew, and a
    second lookup claims the group under the new registration. The first lookup then meets that
    claim: same broker id, another node id than the one it started as. It is the live claim of
    the current registration, not one left under an old node id (docs/protocol.md section 9.5,
    refresh), and must not be deleted: were it, another listener would claim the group while
    this one still lists it as held, and two listeners would coordinate one group. The listener
    registers anew under the same node id (the lookup adopts the new claim as its own), or under
    another (the lookup meets a claim with its broker id under a node id not the one it began as)."""
    group = f"g{uuid.uuid4().hex[:8]}"

    async def scenario():
        loop = asyncio.get_running_loop()
        with Coordination(config) as mine, Coordination(config) as theirs:
            a = ListenerRegistry(mine, config.root_prefix, "127.0.0.1", 1111, "broker-a", 30_000)
            b = ListenerRegistry(theirs, config.root_prefix, "127.0.0.1", 2222, "broker-b", 30_000)
            first = ListenerRegistry(theirs, config.root_prefix, "127.0.0.1", 3333, "broker-c", 30_000)
            if node_id_after == "another":  # node 0 is free again when a registers anew
                await first.start()
            await a.start()
            await b.start()
            if node_id_after == "another":
                await first.stop()
            began_as = a.node_id
            try:
                read_claim, release = a._coordinator, a._release
                raced, stolen = [], []

                def straddling(g, me, claim):  # the lost session and a second lookup run meanwhile
                    if not raced:
                        raced.append(True)
                        asyncio.run_coroutine_threadsafe(a._lost("test: the registry scans failed"), loop).result(30)
                        asyncio.run_coroutine_threadsafe(a.coordinator(g), loop).result(30)
                    return read_claim(g, me, claim)

                def release_then_b_looks(claims, me, version):  # b asks right after any claim goes
                    release(claims, me, version)
                    if claims and not stolen:
                        stolen.append(True)
                        asyncio.run_coroutine_threadsafe(b.coordinator(group), loop).result(30)

                a._coordinator, a._release = straddling, release_then_b_looks
                holder = await a.coordinator(group)
                found = await asyncio.to_thread(mine.get, kafka_group_key(config.root_prefix, group),
                                                KAFKA_PARTITION_KEY)
                assert raced and (a.node_id == began_as) == (node_id_after == "the same")
                assert not (a.holds(group) and b.holds(group)), (
                    f"both listeners hold {group}: a's lookup answered {holder}, the claim is "
                    f"{found.value if found else None}")
                assert a.holds(group) and (holder.node_id, holder.broker_id) == (a.node_id, "broker-a")
                assert found is not None and Listener.from_json(found.value, found.key).node_id == a.node_id
            finally:
                a._coordinator, a._release = read_claim, release
                await a.stop()
                await b.stop()

    asyncio.run(scenario())


def _claimed_group_with_offsets(config, pipeline: Pipeline, topic: str, group: str, other: Coordination) -> None:
    """``group`` committed at offset 3 through ``pipeline``'s listener (which claims it), then its
    claim gone with the listener's session and taken by another listener, as a coordinator finds
    it when it resumes after a pause longer than its session."""
    from kio.schema.offset_commit.v8.request import OffsetCommitRequestPartition, OffsetCommitRequestTopic

    pipeline.send("offset_commit", 8, group_id=group, generation_id_or_member_epoch=-1, member_id="",
                  group_instance_id=None, topics=(OffsetCommitRequestTopic(name=topic, partitions=(
                      OffsetCommitRequestPartition(partition_index=0, committed_offset=3, committed_leader_epoch=-1,
                                                   committed_metadata=""),)),))
    assert pipeline.receive()[1].topics[0].partitions[0].error_code == ErrorCode.none
    key = kafka_group_key(config.root_prefix, group)
    claim = other.get(key, KAFKA_PARTITION_KEY)
    assert claim is not None
    assert other.delete(key, KAFKA_PARTITION_KEY, claim.version_id)
    other.claim(key, Listener(99, "127.0.0.1", 1, "another-broker", now_ms()).to_json(), KAFKA_PARTITION_KEY)


def test_a_coordinator_whose_claim_is_gone_deletes_no_group_and_no_offsets(config):
    """DeleteGroups and OffsetDelete read the group's claim before they delete, as a commit does
    before its CAS (docs/protocol.md section 9.5, delete): a coordinator that lost it while
    paused answers NOT_COORDINATOR and leaves the offsets of a group another listener serves."""
    from kio.schema.offset_delete.v0.request import OffsetDeleteRequestPartition, OffsetDeleteRequestTopic

    topic = f"o{uuid.uuid4().hex[:10]}"
    groups = [f"g{uuid.uuid4().hex[:8]}" for _ in range(2)]
    with Coordination(config) as coordination:
        create_topic(coordination, config.root_prefix, topic, 1)
    with LogWriter(config) as writer:
        writer.append(topic, 0, [b"x"] * 10)

    port = free_port()
    with run_broker(config, args=["--kafka-port", str(port)]), Coordination(config) as other:
        pipeline = Pipeline(f"127.0.0.1:{port}")
        try:
            _claimed_group_with_offsets(config, pipeline, topic, groups[0], other)
            pipeline.send("delete_groups", 1, groups_names=(groups[0],))
            deleted = pipeline.receive()[1].results[0].error_code
            _claimed_group_with_offsets(config, pipeline, topic, groups[1], other)
            pipeline.send("offset_delete", 0, group_id=groups[1], topics=(OffsetDeleteRequestTopic(
                name=topic, partitions=(OffsetDeleteRequestPartition(partition_index=0),)),))
            answer = pipeline.receive()[1]
            offset_deleted = (answer.error_code, answer.topics[0].partitions[0].error_code if answer.topics else None)
        finally:
            pipeline.close()
        left = {g: [r.committed_offset for r in describe_group(other, config.root_prefix, g, [topic])] for g in groups}
    assert left == {groups[0]: [3], groups[1]: [3]}, (
        f"a coordinator without the claim deleted offsets: DeleteGroups {deleted!r}, OffsetDelete {offset_deleted!r}")
    assert deleted == ErrorCode.not_coordinator
    assert offset_deleted[0] == ErrorCode.not_coordinator
