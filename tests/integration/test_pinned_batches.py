"""Pinned sink batches (docs/protocol.md sections 9.1 and 9.2): a replay commits the pinned
cut, GC keeps what a pinned batch references, a replay long after the crash copies the slices
it pinned."""

from __future__ import annotations

import pytest

from llog.clock import ShiftedClock
from llog.coordination import Coordination
from llog.gc import gc_pass
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


def test_gc_keeps_the_blobs_of_a_pinned_batch(parts):
    config, writer, coordination, objects = parts
    rows = [b"a", b"b", b"c"]
    pinned = pin_batch(coordination, objects, config, "q2", 7, _cut(config, objects, rows, 1), writer.clock)
    report = gc_pass(coordination, objects, config.root_prefix, config.gc_grace_ms, clock=past_the_lag())
    assert pinned[0].wal_uri not in report.deleted_uris
    assert objects.get(pinned[0].wal_uri)  # still there, an hour on: a replay may still commit it


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
