"""A sink task's staging without Spark: many blobs per task, uploads overlapping, order kept."""

from __future__ import annotations

import pyarrow as pa

from llog_sink.commit import commit_batch
from llog.process_clients import close_all
from llog_sink.rows import SinkLayout
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
