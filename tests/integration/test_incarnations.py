"""Incarnations never mix (docs/protocol.md section 12): an actor paused on behalf of a topic while
the topic is deleted and created again, then let go, changes nothing the new topic shows.

Each test pauses one actor at a failpoint (``hooks``), deletes and re-creates the topic and
appends to the new one while it waits, lets it finish, and then checks the new topic as a user
would: every record acknowledged to it reads back, exactly, from offset 1; its index holds only
its own entries; its consumer groups only its own commits; a later compaction and a GC pass
work. On the v1.1 layout (one set of keys per topic name) each of these failed.
"""

from __future__ import annotations

import contextlib

import pytest

from llog.compactor import Compactor
from llog.consumer_groups import commit_offsets, committed_offsets
from llog.errors import AppendOutcomeUnknown, LlogError, TopicDeleted
from llog.coordination import Coordination
from llog.gc import gc_pass
from llog.keys import TopicPartition, partition_keys
from llog.objects import ObjectStore
from llog.reader import LogReader, ReadRequest
from llog.topics import alter_topic, create_topic, delete_topic, read_topic
from llog.writer import LogWriter
from tests.helpers.clocks import past_the_lag
from tests.integration.test_outcomes import _LostReply

T = "orders"


@pytest.fixture
def clients(config):
    config = config.replace(default_partitions=1)
    objects = ObjectStore(config)
    with LogWriter(config, auto_initialize=True) as old, LogWriter(config, auto_initialize=True) as new:
        yield config, old, new, objects
    objects.close()


def _recreate(config, coordination, objects, writer: LogWriter) -> None:
    """Delete ``T`` and create it again (one partition); as a session expiring during a long
    stall would, a paused compactor's claim goes first."""
    keys = writer.keys(T, 0)
    with contextlib.suppress(Exception):
        coordination.delete(keys.compactor_claim, keys.partition_key)
    delete_topic(coordination, objects, config.root_prefix, T, config=config, claim_wait_s=5)
    create_topic(coordination, config.root_prefix, T, 1)


def _new_records(writer: LogWriter, count: int, per_append: int = 3) -> list[bytes]:
    values = [f"new-{i}".encode() for i in range(1, count + 1)]
    for i in range(0, count, per_append):
        writer.append(T, 0, values[i:i + per_append])
    return values


def _assert_new_topic(config, objects, expected: list[bytes], ends: list[int] | None = None) -> None:
    """The re-created topic holds exactly ``expected`` at offsets 1.., its index only its own
    entries, and a GC pass an hour on neither fails nor deletes what it reads. Read by a reader
    that never saw the old topic, as a new consumer would."""
    with LogReader(config) as reader:
        table = reader.read_batches([ReadRequest(T, 0, 1)])[0].table()
        assert table.column("offset").to_pylist() == list(range(1, len(expected) + 1))
        assert table.column("value").to_pylist() == expected
        assert reader.high_watermark(T, 0) == len(expected)
        keys = reader.keys(T, 0)
        entries = reader.coordination.range_scan(keys.index_prefix, keys.index_end, keys.partition_key)
        assert [int(v.key.rsplit("/", 1)[1]) for v in entries] == (ends or list(range(3, len(expected) + 1, 3)))
        with Coordination(config) as coordination:
            gc_pass(coordination, objects, config.root_prefix, config.gc_grace_ms, clock=past_the_lag())
        assert reader.read_batches([ReadRequest(T, 0, 1)])[0].table().column("value").to_pylist() == expected


# --- hole 2: a late index create -----------------------------------------------------------------


@pytest.mark.parametrize("collide", [False, True])
def test_a_writer_paused_after_reserving_writes_nothing_into_the_new_topic(clients, hooks, collide):
    """The paused writer reserved 4..6 of the old topic. Without ``collide`` the new topic takes
    1..12 in one append meanwhile (its late create of ``index/6`` would show old records at 4..6
    of the new topic); with it, the new topic's first append comes after and ends on 6 (it would
    find the key taken and count its acknowledged records as written)."""
    config, old, new, objects = clients
    old.append(T, 0, [b"old-1", b"old-2", b"old-3"])
    expected = [f"new-{i}".encode() for i in range(1, 13 if not collide else 7)]

    def meanwhile() -> None:
        hooks.pop("writer.after_reserve")
        _recreate(config, new.coordination, objects, new)
        if not collide:
            new.append(T, 0, expected)

    hooks["writer.after_reserve"] = meanwhile
    old_id = read_topic(old.coordination, config.root_prefix, T).record.topic_id
    late = old.append(T, 0, [b"old-4", b"old-5", b"old-6"])
    # Its reservation landed before the tombstone: acknowledged in the deleted incarnation, at the
    # offsets it reserved there, and gone with it (section 12.3), never moved to the new one.
    assert "writer.after_reserve" not in hooks  # the pause happened: the topic was re-created meanwhile
    assert (late.start_offset, late.end_offset, late.duplicate) == (4, 6, False)
    assert late.index_key == partition_keys(config.root_prefix, T, 0, old_id).index(6)
    assert read_topic(new.coordination, config.root_prefix, T).record.topic_id != old_id
    if collide:
        new.append(T, 0, expected)
    _assert_new_topic(config, objects, expected, [len(expected)])


def test_a_reservation_in_doubt_when_its_topic_is_deleted_is_unknown_not_written_again(clients, hooks):
    """The writer's reserving CAS lands in the old topic, its reply is lost, and the topic is
    deleted and created again before the writer looks. Its records may be in the deleted topic
    (they are: the delete's fence finished the append, and a reader could read them there), so
    the append is reported in doubt, not moved to the new topic (the same records in both)."""
    config, old, new, objects = clients
    old.append(T, 0, [b"old-1", b"old-2", b"old-3"])

    def lose_the_reservations_reply() -> None:
        del hooks["writer.before_reserve_cas"]

        def lost() -> None:
            del hooks["coordination.after_write"]
            _recreate(config, new.coordination, objects, new)
            raise _LostReply()

        hooks["coordination.after_write"] = lost

    hooks["writer.before_reserve_cas"] = lose_the_reservations_reply
    with pytest.raises(AppendOutcomeUnknown):
        old.append(T, 0, [b"old-4", b"old-5", b"old-6"])
    _assert_new_topic(config, objects, _new_records(new, 6))


def test_a_helper_paused_before_materializing_writes_nothing_into_the_new_topic(clients, hooks):
    config, old, new, objects = clients
    old.append(T, 0, [b"old-1", b"old-2", b"old-3"])
    hooks["writer.after_reserve"] = lambda: (_ for _ in ()).throw(RuntimeError("writer dies after reserving"))
    with pytest.raises(RuntimeError):
        old.append(T, 0, [b"old-4", b"old-5", b"old-6"])  # left pending at 4..6
    hooks.pop("writer.after_reserve")
    expected: list[bytes] = []

    def meanwhile() -> None:
        hooks.pop("control.before_materialize")
        _recreate(config, new.coordination, objects, new)
        expected.extend(_new_records(new, 6))

    hooks["control.before_materialize"] = meanwhile
    # Step 0 finishes the pending append, paused before its create; back, it finds the tombstone
    # and stops (section 12.3).
    with Compactor(config, clock=past_the_lag()) as compactor, pytest.raises(TopicDeleted, match="was deleted"):
        compactor.compact_partition(T, 0)
    assert "control.before_materialize" not in hooks  # the pause happened
    _assert_new_topic(config, objects, expected)


# --- hole 3: a compactor or retention pass stalled past its claim ---------------------------------


@pytest.mark.parametrize("point", ["compactor.after_select", "compactor.after_age_check",
                                   "compactor.after_index_overwrite", "compactor.after_delete_range"])
def test_a_compactor_paused_across_a_recreate_changes_nothing_in_the_new_topic(clients, hooks, point):
    config, old, new, objects = clients
    for i in range(3):
        old.append(T, 0, [f"old-{3 * i + j}".encode() for j in range(1, 4)])
    expected: list[bytes] = []

    def meanwhile() -> None:
        hooks.pop(point)
        _recreate(config, new.coordination, objects, new)
        expected.extend(_new_records(new, 12))

    hooks[point] = meanwhile
    # It stops when its next step finds the incarnation gone (section 12.3); the error says which
    # key it missed, and depends on the step, so only llog's own errors are let through.
    with Compactor(config, clock=past_the_lag()) as compactor, contextlib.suppress(LlogError):
        compactor.compact_partition(T, 0)
    assert point not in hooks  # the pause happened
    _assert_new_topic(config, objects, expected)
    # The new topic compacts as any other (a stale meta/compaction record would wedge it).
    with Compactor(config, clock=past_the_lag()) as compactor:
        done = compactor.compact_partition(T, 0)
    assert done.compactions >= 1 and done.records == 12
    _assert_compacted(config, expected)


def test_a_retention_pass_paused_across_a_recreate_changes_nothing_in_the_new_topic(clients, hooks):
    config, old, new, objects = clients
    for i in range(3):
        old.append(T, 0, [f"old-{3 * i + j}".encode() for j in range(1, 4)])
    with Coordination(config) as coordination:
        alter_topic(coordination, config.root_prefix, T, set_config={"retention.ms": 0})
    expected: list[bytes] = []

    def meanwhile() -> None:
        hooks.pop("retention.before_control_update")
        _recreate(config, new.coordination, objects, new)
        expected.extend(_new_records(new, 12))

    hooks["retention.before_control_update"] = meanwhile
    with Compactor(config, clock=past_the_lag()) as compactor, pytest.raises(TopicDeleted, match="was deleted"):
        compactor.retain_partition(T, 0)
    assert "retention.before_control_update" not in hooks  # the pause happened
    with LogReader(config) as fresh:
        assert fresh.offsets(T, 0) == (1, 12)
    _assert_new_topic(config, objects, expected)


def _assert_compacted(config, expected: list[bytes]) -> None:
    with LogReader(config) as reader:
        assert reader.read_batches([ReadRequest(T, 0, 1)])[0].table().column("value").to_pylist() == expected


# --- hole 4: group offsets ------------------------------------------------------------------------


def test_a_group_commit_for_a_deleted_topic_never_shows_in_the_new_one(clients):
    """A consumer read the old topic to 51 and commits after the delete: the new topic, whose high
    watermark is 10, must not start the group at 51 (it would skip the new records)."""
    config, old, new, objects = clients
    old.append(T, 0, [f"old-{i}".encode() for i in range(1, 51)])
    tp = TopicPartition(T, 0)
    with Coordination(config) as coordination:
        old_id = read_topic(coordination, config.root_prefix, T).record.topic_id
        _recreate(config, coordination, objects, new)
        new.append(T, 0, [f"new-{i}".encode() for i in range(1, 11)])
        commit_offsets(coordination, config.root_prefix, "billing", {tp: 51}, {T: old_id})
        assert committed_offsets(coordination, config.root_prefix, "billing", [tp]) == {}
        commit_offsets(coordination, config.root_prefix, "billing", {tp: 4})
        assert committed_offsets(coordination, config.root_prefix, "billing", [tp])[tp].offset == 4


# --- one G per deployment (docs/protocol.md section 9) -------------------------------------------------


def test_a_writer_compactor_or_gc_with_another_grace_period_is_refused_naming_both(config):
    from llog.errors import GraceMismatch

    with LogWriter(config, auto_initialize=True) as first:
        first.append(T, 0, [b"a"])
    other = config.replace(gc_grace_ms=config.gc_grace_ms * 6)
    with LogWriter(other, auto_initialize=True) as writer, \
            pytest.raises(GraceMismatch, match=rf"LLOG_GC_GRACE_MS={other.gc_grace_ms}, .* set up with "
                                               rf"{config.gc_grace_ms}"):
        writer.append(T, 0, [b"b"])
    with Compactor(other) as compactor, pytest.raises(GraceMismatch):
        compactor.compact_partition(T, 0)
    objects = ObjectStore(other)
    try:
        with Coordination(other) as coordination, pytest.raises(GraceMismatch):
            gc_pass(coordination, objects, other.root_prefix, other.gc_grace_ms)
    finally:
        objects.close()
    with LogReader(config) as reader:  # nothing was written by the refused ones
        assert reader.read_batches([ReadRequest(T, 0, 1)])[0].table().column("value").to_pylist() == [b"a"]


def test_a_clock_far_from_the_s3_servers_is_refused(config):
    from llog.clock import ShiftedClock
    from llog.deployment import check_clock
    from llog.errors import ClockSkew

    objects = ObjectStore(config)
    try:
        assert check_clock(objects, config, ShiftedClock(0)) == 0  # this machine's clock is the server's
        off = config.gc_grace_ms * 0.05 / 1000 + 4  # the allowance, the Date header's 2 s of slack, and 2 s more
        with pytest.raises(ClockSkew, match=r"clock is \+\d+\.\d s off the S3 server's"):
            check_clock(objects, config, ShiftedClock(off))
        check_clock(objects, config, ShiftedClock(off), refuse=False)  # a reader is only warned
    finally:
        objects.close()
