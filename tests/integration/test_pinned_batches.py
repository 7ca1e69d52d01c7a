"""Pinned sink batches (docs/protocol.md sections 9.1 and 9.2): a replay commits the pinned
cut, GC keeps what a pinned batch references, a replay long after the crash copies the slices
it pinned."""

from __future__ import annotations

import pytest

from llog.clock import ShiftedClock
from llog.coordination import Coordination
from llog.errors import ObjectNotFound
from llog.gc import gc_pass
from llog.keys import shared_wal_object
from llog.objects import ObjectStore
from llog.reader import LogReader, ReadRequest
from llog.sink_batches import SinkBatchOutOfOrder, pin_batch
from llog.writer import AppendGroup, LogWriter, SinkBatch, stage
from tests.helpers.clocks import past_the_lag


@pytest.fixture
def parts(config):
    objects = ObjectStore(config)
    with LogWriter(config, auto_initialize=True) as writer, Coordination(config) as coordination:
        writer.initialize_partition("t", 0)
        yield config, writer, coordination, objects
    objects.close()


def _cut(config, objects, values: list[bytes], pieces: int):
    """``values`` staged as ``pieces`` slices of partition 0 (one blob each): one cut of a batch."""
    size = -(-len(values) // pieces)
    return [s for i in range(0, len(values), size) for s in stage(objects, config, [AppendGroup("t", 0, values[i:i + size])])]


def _log(config) -> list[bytes]:
    with LogReader(config) as reader:
        return reader.read_batches([ReadRequest("t", 0, 1)])[0].table().column("value").to_pylist()


def test_a_replay_commits_the_pinned_cut_not_its_own(parts):
    config, writer, coordination, objects = parts
    rows = [f"r{i}".encode() for i in range(12)]
    first = _cut(config, objects, rows, 3)
    pinned = pin_batch(coordination, objects, config, "q1", 0, first, writer.clock)
    assert pinned == first
    writer.commit_staged(pinned[:1], SinkBatch("q1", 0))  # a commit that stopped after one slice
    replay = _cut(config, objects, rows[::-1], 4)  # the same rows, other slices, another order
    again = pin_batch(coordination, objects, config, "q1", 0, replay, writer.clock)
    assert again == first
    writer.commit_staged(again, SinkBatch("q1", 0))
    assert _log(config) == rows
    pin_batch(coordination, objects, config, "q1", 1, _cut(config, objects, rows, 1), writer.clock)
    with pytest.raises(SinkBatchOutOfOrder, match="commits batch 0, but batch 1 was pinned"):
        pin_batch(coordination, objects, config, "q1", 0, first, writer.clock)


def test_gc_keeps_the_blobs_of_a_pinned_batch_and_deletes_the_unreferenced(parts):
    """An hour on, GC deletes exactly the blobs nothing references (the slices of an attempt
    whose batch was pinned by another, an orphan) and keeps the pinned slice and a committed
    append's blob: the pinned batch still commits, whole."""
    config, writer, coordination, objects = parts
    rows = [b"a", b"b", b"c"]
    pinned = pin_batch(coordination, objects, config, "q2", 7, _cut(config, objects, rows, 1), writer.clock)
    lost = _cut(config, objects, rows[::-1], 2)  # the same batch staged again: the pin is not its cut
    assert pin_batch(coordination, objects, config, "q2", 7, lost, writer.clock) == pinned
    orphan = objects.put(shared_wal_object(config.root_prefix), b"an aborted append's blob")
    committed = writer.append("t", 0, [b"before"])

    report = gc_pass(coordination, objects, config.root_prefix, config.gc_grace_ms, clock=past_the_lag())
    unreferenced = {s.wal_uri for s in lost} | {orphan}
    assert len(unreferenced) == 3 and sorted(report.deleted_uris) == sorted(unreferenced)
    assert (report.listed, report.referenced, report.too_young) == (5, 2, 0)
    for uri in unreferenced:
        with pytest.raises(ObjectNotFound):
            objects.get(uri)
    assert objects.get(committed.wal_uri) and objects.get(pinned[0].wal_uri)  # kept: a replay may still commit it
    writer.commit_staged(pinned, SinkBatch("q2", 7))
    assert _log(config) == [b"before", *rows]


def test_a_replay_long_after_the_crash_commits_copies_of_the_pinned_slices(parts):
    config, writer, coordination, objects = parts
    rows = [f"x{i}".encode() for i in range(6)]
    first = pin_batch(coordination, objects, config, "q3", 2, _cut(config, objects, rows, 2), writer.clock)
    later = ShiftedClock(config.gc_grace_ms / 1000 * 0.6)  # past G/2: the pinned slices may not be referenced anew
    again = pin_batch(coordination, objects, config, "q3", 2, _cut(config, objects, rows, 3), later)
    assert len(again) == 2 and {s.wal_uri for s in again}.isdisjoint({s.wal_uri for s in first})
    assert [(s.msg_count, s.topic, s.partition) for s in again] == [(s.msg_count, s.topic, s.partition) for s in first]
    with LogWriter(config, clock=later) as late:
        late.commit_staged(again, SinkBatch("q3", 2))
    assert _log(config) == rows
