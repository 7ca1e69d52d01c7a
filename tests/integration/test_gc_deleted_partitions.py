"""GC over a partition deleted after its discovery (docs/protocol.md sections 9.2 and 12.5).

A GC pass (and each task of the compaction job) finds the partitions first, then reads their
``meta/control`` and scans their indexes. A topic delete in between tombstones a partition and
deletes its keys; a writer whose reservation landed before the delete then creates its index key
late: debris under the dead incarnation, which the index scan finds starting above the log start.
A tombstoned control, at the first read or at the read again, means the partition references
nothing: the pass skips its index, finishes, and collects what is old and unreferenced, and nothing
the live topics reference.
"""

from __future__ import annotations

import pytest

from compaction_job.job import compact_group
from llog.coordination import Coordination
from llog.gc import gc_pass
from llog.keys import partition_keys
from llog.objects import ObjectStore
from llog.reader import LogReader
from llog.topics import create_topic, delete_topic
from llog.writer import LogWriter
from tests.helpers.clocks import past_the_lag

GONE, KEPT = "gone", "kept"


@pytest.fixture
def clients(config):
    config = config.replace(default_partitions=1)
    objects = ObjectStore(config)
    with Coordination(config) as coordination, LogWriter(config) as writer:
        yield config, coordination, objects, writer
    objects.close()


def _delete_with_a_late_create(config, coordination, objects, writer, hooks) -> str:
    """Append 27..40 to ``GONE`` with the writer held after its reservation while the topic is
    deleted (the delete's fence finishes the append), so its own index create lands late, under
    the deleted incarnation: debris. Returns the append's blob."""
    def delete_meanwhile() -> None:
        hooks.pop("writer.after_reserve")
        delete_topic(coordination, objects, config.root_prefix, GONE, config=config)

    hooks["writer.after_reserve"] = delete_meanwhile
    late = writer.append(GONE, 0, [b"y"] * 14)
    assert "writer.after_reserve" not in hooks and late.end_offset == 40
    return late.wal_uri


def _two_topics(config, coordination, writer) -> tuple[str, list[str], list[bytes]]:
    """``GONE`` with offsets 1..26 (its topic id and blob), ``KEPT`` with three appends (its values)."""
    gone = create_topic(coordination, config.root_prefix, GONE, 1)
    create_topic(coordination, config.root_prefix, KEPT, 1)
    blobs = [writer.append(GONE, 0, [b"x"] * 26).wal_uri]
    kept = [f"kept-{i}".encode() for i in range(9)]
    for i in range(0, 9, 3):
        writer.append(KEPT, 0, kept[i:i + 3])
    return gone.topic_id, blobs, kept


@pytest.mark.parametrize("point", ["gc.before_control_read", "gc.before_index_scan"])
def test_a_gc_pass_skips_a_partition_deleted_after_its_discovery(clients, hooks, point):
    """The delete (and the late create) runs after the pass found the partitions: before it
    reads their controls (it reads the tombstone), or between that read and the index scan (it
    reads the control again on the "gap" and finds the tombstone). The pass finishes, collects
    the deleted topic's blobs (its debris references nothing) and keeps every blob of the live
    topic."""
    config, coordination, objects, writer = clients
    topic_id, gone_blobs, kept = _two_topics(config, coordination, writer)

    def meanwhile() -> None:
        hooks.pop(point)
        gone_blobs.append(_delete_with_a_late_create(config, coordination, objects, writer, hooks))

    hooks[point] = meanwhile
    report = gc_pass(coordination, objects, config.root_prefix, config.gc_grace_ms, clock=past_the_lag())
    assert point not in hooks
    debris = partition_keys(config.root_prefix, GONE, 0, topic_id)
    assert [k.key for k in coordination.range_scan(debris.index_prefix, debris.index_end, debris.partition_key)] \
        == [debris.index(40)], "the late create was expected to leave index/40 as debris"
    assert set(report.deleted_uris) == set(gone_blobs)
    with LogReader(config) as reader:
        assert [r.value for r in reader.read_range(KEPT, 0, 1)] == kept


def test_a_compaction_job_task_skips_a_partition_deleted_after_the_driver_planned_it(clients, hooks):
    """The job's driver planned the partition (its topic id); the topic is deleted before the
    task reads its references. The task's scan skips it, and the partition counts as nothing
    to compact, not as a failure."""
    config, coordination, objects, writer = clients
    topic_id, gone_blobs, _ = _two_topics(config, coordination, writer)

    def meanwhile() -> None:
        hooks.pop("gc.before_control_read")
        gone_blobs.append(_delete_with_a_late_create(config, coordination, objects, writer, hooks))

    hooks["gc.before_control_read"] = meanwhile
    done = compact_group(config, [(GONE, 0, topic_id, True, True)], 1000, None)
    assert "gc.before_control_read" not in hooks
    assert [c for c in done["compactions"] if "error" in c] == []
    assert not set(done["referenced"]) & set(gone_blobs)
