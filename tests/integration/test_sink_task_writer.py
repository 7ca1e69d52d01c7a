"""A sink task's staging without Spark: many blobs per task, uploads overlapping, order kept; the
count keyed rows of a batch are placed by is one for the whole batch."""

from __future__ import annotations

import pyarrow as pa
import pytest

from llog.coordination import Coordination
from llog.errors import PartitionCountMismatch
from llog.partitioner import kafka_partitions
from llog.topics import read_topic
from llog.writer import LogWriter
from llog_sink.commit import commit_batch
from llog.process_clients import close_all
from llog_sink.rows import KEY, VALUE, SinkLayout
from llog_sink.task_writer import write_task


def test_many_blobs_per_task_commit_in_the_order_written(config, reader):
    config = config.replace(batch_max_bytes=500)
    layout = SinkLayout(topic_option="tasks", has_topic_column=False, has_partition_column=True, partitions=1)
    batches = [pa.record_batch({"value": pa.array([f"v{b * 100 + i:05d}".encode() for i in range(100)]),
                                "partition": pa.array([i % 2 for i in range(100)], pa.int32())})
               for b in range(30)]
    try:
        _stage_and_commit(config, layout, batches, reader)
    finally:
        close_all()  # the kept clients must not outlive this test's stack


def _stage_and_commit(config, layout, batches, reader):
    message = write_task(iter(batches), layout, config, task_id=0, batch_id=0, sink_id="q")
    assert message.records == 3000 and message.blobs == 30 and len(message.slices) == 60
    done = commit_batch(config, [message], 0)
    assert (done.records, done.slices, done.skipped_slices) == (3000, 60, 0)
    for p in (0, 1):
        values = [r.value for r in reader.read_range("tasks", p, 1)]
        assert values == [f"v{n:05d}".encode() for n in range(p, 3000, 2)]
    assert commit_batch(config, [message], 0).skipped_slices == 60  # the replay


def test_a_batch_whose_tasks_placed_keyed_rows_by_different_counts_is_refused(config, reader):
    """docs/protocol.md section 11.6: each task reads the count afresh; a batch whose tasks read
    different counts (the topic grew while it ran) commits nothing; one count for all commits."""
    config = config.replace(default_partitions=2)
    layout = SinkLayout(topic_option="keyed", has_topic_column=False, has_partition_column=False, partitions=None,
                        record_columns=(KEY, VALUE))

    def rows(batch: int, task: int) -> list[pa.RecordBatch]:
        keys = [f"k{batch}-{task}-{i}".encode() for i in range(200)]
        return [pa.record_batch({"key": pa.array(keys), "value": pa.array(keys)})]

    try:
        first = write_task(iter(rows(0, 0)), layout, config, task_id=0, batch_id=0, sink_id="q")
        assert first.placed_by == {"keyed": 2}  # no topic yet: the default
        commit_batch(config, [first], 0)
        with Coordination(config) as coordination:
            assert read_topic(coordination, config.root_prefix, "keyed").record.partitions == 2  # created with it
        before = write_task(iter(rows(1, 1)), layout, config, task_id=1, batch_id=1, sink_id="q")
        with LogWriter(config, auto_initialize=True) as writer:
            writer.append("keyed", 4, [b"grows it"])
        after = write_task(iter(rows(1, 0)), layout, config, task_id=0, batch_id=1, sink_id="q")
        assert (before.placed_by, after.placed_by) == ({"keyed": 2}, {"keyed": 5})
        hws = [reader.high_watermark("keyed", p) for p in range(5)]
        with pytest.raises(PartitionCountMismatch, match=r"placed the rows of topic 'keyed' by \[2, 5\] partition"):
            commit_batch(config, [after, before], 1)
        with pytest.raises(PartitionCountMismatch, match=r"by 2 partition\(s\), but the topic now has 5"):
            commit_batch(config, [before], 1)
        assert [reader.high_watermark("keyed", p) for p in range(5)] == hws  # nothing committed
        commit_batch(config, [after], 1)  # the batch again, placed by one count: the topic's
    finally:
        close_all()
    keys = {p: [r.key for r in reader.read_range("keyed", p, 1) if r.key] for p in range(5)}
    for p, placed in keys.items():
        batch1 = [k for k in placed if k.startswith(b"k1-")]
        assert not batch1 or set(kafka_partitions(pa.array(batch1, pa.binary()), 5).tolist()) == {p}
    assert sum(k.startswith(b"k1-0-") for p in keys for k in keys[p]) == 200
