"""Pinned sink batches (docs/protocol.md sections 9.1 and 9.2): a replay commits the pinned
cut, GC keeps what a pinned batch references, a replay long after the crash copies the slices
it pinned."""

from __future__ import annotations

import time

import pytest

from llog.clock import ShiftedClock
from llog.coordination import Coordination
from llog.errors import ClockSkew, ObjectNotFound, SinkBatchMismatch, StaleBlob
from llog.gc import gc_pass
from llog.keys import shared_wal_object
from llog.objects import ObjectStore
from llog.reader import LogReader, ReadRequest
from llog.sink_batches import SINKS_PARTITION_KEY, SinkBatchOutOfOrder, pin_batch, sink_batch_key
from llog.topics import create_topic
from llog.writer import AppendGroup, LogWriter, SinkBatch, stage
from llog.process_clients import log_writer
from llog_sink.commit import commit_batch
from llog_sink.task_writer import SinkCommitMessage
from tests.helpers.clocks import past_the_lag
from tests.helpers.pins import cut as _cut, pin_clients


@pytest.fixture
def parts(config):
    with pin_clients(config) as clients:
        yield clients


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


# --- H1: (sink id, batch id) names exactly one commit (docs/protocol.md section 9.1) ---------------


def _staged(config, objects, topic: str, values: list[bytes]):
    return stage(objects, config, [AppendGroup(topic, 0, values)]) if values else []


def test_a_second_write_of_a_batch_with_other_rows_is_refused_before_anything_commits(parts):
    """Two writes under one (sink id, batch id): the second is not a replay of the first (other
    topics, other counts, a non-empty write against an empty pin) and is refused loudly."""
    config, writer, coordination, objects = parts
    for topic in ("alerts", "audit"):
        create_topic(coordination, config.root_prefix, topic, 1)
    first = _staged(config, objects, "alerts", [b"a1", b"a2"])
    writer.commit_staged(pin_batch(coordination, objects, config, "w1", 0, first, writer.clock), SinkBatch("w1", 0))
    cases = {"another topic": _staged(config, objects, "audit", [b"u1", b"u2"]),
             "another count": _staged(config, objects, "alerts", [b"a1", b"a2", b"a3"]),
             "nothing against rows": []}
    for slices in cases.values():
        with pytest.raises(SinkBatchMismatch, match=r"sink w1 batch 0 was pinned with alerts: 2 record\(s\); .*not a "
                                                    r"replay"):
            pin_batch(coordination, objects, config, "w1", 0, slices, writer.clock)
    # Rows against an empty pin: refused too.
    pin_batch(coordination, objects, config, "w2", 0, [], writer.clock)
    with pytest.raises(SinkBatchMismatch, match=r"sink w2 batch 0 was pinned with no rows; this commit carries "
                                                r"audit: 1 record\(s\)"):
        pin_batch(coordination, objects, config, "w2", 0, _staged(config, objects, "audit", [b"u3"]), writer.clock)
    with LogReader(config) as reader:
        assert reader.high_watermark("audit", 0) == 0 and reader.high_watermark("alerts", 0) == 2


def test_a_real_replay_with_the_same_rows_cut_otherwise_is_still_a_replay(parts):
    config, writer, coordination, objects = parts
    rows = [f"v{i}".encode() for i in range(9)]
    first = _cut(config, objects, rows, 3)
    pin_batch(coordination, objects, config, "w3", 4, first, writer.clock)
    assert pin_batch(coordination, objects, config, "w3", 4, _cut(config, objects, rows[::-1], 2),
                     writer.clock) == first


# --- H4: the driver judges a staged blob's age by the S3 server's clock too (sections 9.1, 9.2) ------


def test_an_executor_clock_ahead_cannot_make_the_driver_commit_a_collected_blob(config):
    """G = 4 s, an executor 4 s ahead: its blob looks 0.1 s old by its stamp when GC, by the S3
    server's Last-Modified, has already collected it. The driver refuses it; nothing is acked."""
    config = config.replace(gc_grace_ms=4000)
    objects = ObjectStore(config)
    try:
        with Coordination(config) as coordination:
            create_topic(coordination, config.root_prefix, "t", 1)
            log_writer(config).check_deployment("the test")  # the driver's writer, ready: its commit is quick
            slices = stage(objects, config, [AppendGroup("t", 0, [b"r1", b"r2"])], clock=ShiftedClock(4.0))
            time.sleep(4.1)  # by the S3 server older than G; by the stamp younger than G/4 (no copy)
            report = gc_pass(coordination, objects, config.root_prefix, config.gc_grace_ms)
            assert [s.wal_uri for s in slices] == report.deleted_uris
            with pytest.raises(StaleBlob, match=r"do not exist"):
                commit_batch(config, [SinkCommitMessage(0, "q-h4", slices, records=2)], 0)
            with LogReader(config) as reader:
                assert reader.high_watermark("t", 0) == 0
            assert coordination.get(sink_batch_key(config.root_prefix, "q-h4"), SINKS_PARTITION_KEY) is None
    finally:
        objects.close()


def test_a_stamp_in_the_future_beyond_the_allowed_skew_is_refused(config):
    config = config.replace(gc_grace_ms=4000)
    objects = ObjectStore(config)
    try:
        with Coordination(config) as coordination:
            create_topic(coordination, config.root_prefix, "t", 1)
        log_writer(config).check_deployment("the test")
        slices = stage(objects, config, [AppendGroup("t", 0, [b"r1"])], clock=ShiftedClock(60.0))
        with pytest.raises(ClockSkew, match=r"in the future"):
            commit_batch(config, [SinkCommitMessage(0, "q-h4b", slices, records=1)], 0)
        with LogReader(config) as reader:
            assert reader.high_watermark("t", 0) == 0
    finally:
        objects.close()
