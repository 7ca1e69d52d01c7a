"""upload + commit_staged: staging without Oxia, and sink progress making replays exactly-once."""

from __future__ import annotations

import time

import pytest

from llog.clock import ShiftedClock
from llog.control import read_control
from llog.errors import StaleBlob
from llog.records import now_ms
from llog.topics import read_topic
from llog.writer import AppendGroup, LogWriter, SinkBatch
from tests.helpers.invariants import check_partition


def _staged(writer, topic: str, tag: str):
    """Two blobs: blob 1 holds partitions 0 and 1, blob 2 partition 0 again."""
    first = writer.upload([AppendGroup(topic, 0, [f"{tag}-a{i}".encode() for i in range(3)]),
                           AppendGroup(topic, 1, [f"{tag}-b{i}".encode() for i in range(2)])])
    second = writer.upload([AppendGroup(topic, 0, [f"{tag}-c{i}".encode() for i in range(4)])])
    return first + second


def _values(reader, topic, partition):
    return [r.value for r in reader.read_range(topic, partition, 1)]


def test_upload_alone_writes_nothing_to_oxia(config, writer, reader):
    writer.upload([AppendGroup("staged", 0, [b"x"])])
    # The topic is not even created (the only write is the root prefix's deployment record,
    # llog.deployment, which a writer makes once before it first writes).
    assert read_topic(writer.coordination, config.root_prefix, "staged") is None


def test_commit_staged_in_order_and_replay_commits_nothing_twice(config, writer, reader):
    staged = _staged(writer, "staged", "q")
    batch = SinkBatch("query-1", 7)
    results = writer.commit_staged(staged, batch)
    assert [(r.partition, r.start_offset, r.end_offset) for r in results] == [(0, 1, 3), (1, 1, 2), (0, 4, 7)]
    assert writer.commit_staged(staged, batch) == [None, None, None]  # the replay
    assert _values(reader, "staged", 0) == [b"q-a0", b"q-a1", b"q-a2", b"q-c0", b"q-c1", b"q-c2", b"q-c3"]
    assert _values(reader, "staged", 1) == [b"q-b0", b"q-b1"]
    control = read_control(writer.coordination, writer.keys("staged", 0)).record
    progress = control.sink_progress("query-1")
    assert (progress.batch_id, progress.slices) == (7, 2) and abs(progress.committed_at_ms - now_ms()) < 60_000
    # The next batch commits; another sink's batch 7 is its own.
    assert writer.commit_staged(_staged(writer, "staged", "r"), SinkBatch("query-1", 8))[0].start_offset == 8
    assert writer.commit_staged(_staged(writer, "staged", "s"), SinkBatch("query-2", 7))[0].start_offset == 15
    for p in (0, 1):
        check_partition(writer.coordination, config.root_prefix, "staged", p)


def test_replay_after_a_partial_commit_commits_only_the_rest(writer, reader):
    staged = _staged(writer, "partial", "q")
    batch = SinkBatch("query-1", 0)
    # As if the first commit died after partition 0's first slice: commit just that one.
    assert writer.commit_staged(staged[:1], batch)[0].end_offset == 3
    results = writer.commit_staged(staged, batch)
    assert results[0] is None and results[1].start_offset == 1 and results[2].start_offset == 4
    assert _values(reader, "partial", 0) == [b"q-a0", b"q-a1", b"q-a2", b"q-c0", b"q-c1", b"q-c2", b"q-c3"]


def test_a_blob_that_ages_past_half_the_grace_period_during_the_commit_is_not_referenced(config, writer, hooks):
    clock = ShiftedClock()
    with LogWriter(config, writer.coordination, writer.objects, auto_initialize=True, clock=clock) as w:
        staged = w.upload([AppendGroup("aging", 0, [b"x"])])
        # The writer stalls just before its reserving CAS for the grace period, as if its CAS
        # loop had been stuck that long: the age check right before the CAS refuses the blob.
        hooks["writer.before_reserve_cas"] = lambda: clock.advance(config.gc_grace_ms / 1000)
        with pytest.raises(StaleBlob, match=r"aging\[0\]: .* upload the records again"):
            w.commit_staged(staged, SinkBatch("q", 0))
    control = read_control(writer.coordination, writer.keys("aging", 0)).record
    assert control.sequence_counter == 1 and control.pending is None and control.sink_progress("q") is None


def test_a_sink_idle_past_the_retention_loses_its_progress(config, writer):
    with type(writer)(config.replace(sink_progress_retention_ms=1), writer.coordination, writer.objects,
                      auto_initialize=True) as short:
        short.commit_staged(short.upload([AppendGroup("retained", 0, [b"a"])]), SinkBatch("old-query", 0))
        time.sleep(0.01)
        short.commit_staged(short.upload([AppendGroup("retained", 0, [b"b"])]), SinkBatch("new-query", 0))
    control = read_control(writer.coordination, writer.keys("retained", 0)).record
    assert control.sink_progress("old-query") is None and control.sink_progress("new-query").batch_id == 0
    check_partition(writer.coordination, config.root_prefix, "retained", 0)


def test_a_blob_older_than_half_the_grace_period_is_not_committed(config, writer):
    staged = writer.upload([AppendGroup("stale", 0, [b"x"])])
    old = [type(s)(**{**s.__dict__, "created_at_ms": s.created_at_ms - config.gc_grace_ms}) for s in staged]
    with pytest.raises(StaleBlob, match="upload the records again"):
        writer.commit_staged(old, SinkBatch("q", 0))
    # Refused before anything is written to the topic: it is not even created.
    assert read_topic(writer.coordination, config.root_prefix, "stale") is None
