"""What the driver does with a batch's commit messages: commit every staged slice, exactly once.

Slices are taken in task order, and within a task in the order written, so each partition's
slices get offsets in a fixed order. A streaming query commits as sink ``queryId``, batch
``batchId``: the batch's slices are pinned in Oxia before the first is committed
(:mod:`llog.sink_batches`), and each reserving CAS records how far the batch got in that
partition (docs/protocol.md section 9.1), so a replayed batch, after a driver crash or a commit
that failed halfway, commits only what is missing of the pinned slices, however Spark cut the
replay. ``abort`` commits nothing; its blobs are left for garbage collection.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from llog import failpoints
from llog.config import Config
from llog.errors import PartitionCountMismatch
from llog.process_clients import log_writer
from llog.records import TopicRecord
from llog.sink_batches import pin_batch
from llog.topics import TopicCache
from llog.writer import SinkBatch
from llog_sink.task_writer import SinkCommitMessage

log = logging.getLogger(__name__)

#: If set, every batch commit appends its :class:`BatchCommit` as one JSON line to this file.
METRICS_FILE_ENV = "LLOG_SINK_METRICS_FILE"

@dataclass(frozen=True)
class BatchCommit:
    """What one batch commit did: the sink's progress metrics."""

    batch_id: int
    records: int
    bytes: int
    blobs: int
    slices: int
    skipped_slices: int
    partitions: int
    stage_s_max: float
    commit_s: float
    cas_conflicts: int

    def describe(self) -> str:
        return (f"llog sink: batch {self.batch_id} committed {self.records} records ({self.bytes} bytes) in "
                f"{self.slices - self.skipped_slices} slice(s) of {self.blobs} blob(s) to {self.partitions} "
                f"partition(s) in {self.commit_s:.3f} s; {self.skipped_slices} slice(s) were already committed; "
                f"{self.cas_conflicts} CAS conflict(s); slowest task staged for {self.stage_s_max:.3f} s")


def sink_partition_count(record: TopicRecord | None, topic: str, partitions: int | None, default: int) -> int:
    """The partition count a sink places ``topic``'s rows by: its record's; for a topic without
    one, the ``partitions`` option, else ``LLOG_DEFAULT_PARTITIONS`` (it is created with that
    count when the first batch commits, or more on first use for rows naming higher partitions).
    A ``partitions`` option that disagrees with the topic is refused (:class:`PartitionCountMismatch`): its keyed rows would land elsewhere than other
    writers' (docs/protocol.md section 10.2)."""
    if record is None:
        return partitions or default
    if partitions is not None and partitions != record.partitions:
        raise PartitionCountMismatch(
            f"the sink's option partitions={partitions} disagrees with topic {topic!r}, which has "
            f"{record.partitions} partition(s): keyed rows would go to other partitions than other writers' "
            f"(drop the option to use the topic's count, or `llog topics alter {topic} --partitions "
            f"{partitions}` to grow the topic)")
    return record.partitions


def check_partition_count(topics: TopicCache, topic: str, partitions: int, explicit: bool = True) -> None:
    """At commit: ``topic`` has the count the batch's rows were placed by; else
    :class:`PartitionCountMismatch` (the topic was created with another count meanwhile, or grew:
    write the batch again, or restart the query, to place rows by the new count). A missing topic
    is created, if allowed, with that count: ``explicit`` (the ``partitions`` option), or on first
    use (docs/protocol.md section 10.2)."""
    # Fresh: a record cached in this (reused) worker would hide the very change this checks.
    record = topics.require(topic, create_partitions=partitions if explicit else None, fresh=True,
                            highest=partitions - 1)
    if record.partitions != partitions:
        raise PartitionCountMismatch(
            f"this batch placed the rows of topic {topic!r} by {partitions} partition(s), but the topic now has "
            f"{record.partitions} (created by another writer meanwhile, or grown): nothing of the batch is "
            f"committed; write it again (a streaming query: restart it) to place rows by the topic's count")


def placed_by(messages: Sequence[SinkCommitMessage]) -> dict[str, int]:
    """By topic, the one partition count the batch's tasks placed its rows by (docs/protocol.md
    section 11.6); tasks that read different counts (the topic grew while the batch ran) are
    refused (:class:`PartitionCountMismatch`): keyed rows of one batch go by one count."""
    counts: dict[str, set[int]] = {}
    for m in messages:
        for topic, count in m.placed_by.items():
            counts.setdefault(topic, set()).add(count)
    for topic, seen in counts.items():
        if len(seen) > 1:
            raise PartitionCountMismatch(
                f"the tasks of this batch placed the rows of topic {topic!r} by {sorted(seen)} partition(s): the "
                f"topic grew while they ran; nothing of the batch is committed: write it again (a streaming "
                f"query: restart it)")
    return {topic: seen.pop() for topic, seen in counts.items()}


def topic_bytes(messages: Sequence[SinkCommitMessage]) -> dict[str, int]:
    """By topic, the sum of the record sizes the tasks staged (docs/protocol.md section 9.1);
    a topic some task staged without counting them (a message from an older llog) is left out,
    and only its record count is compared with a pinned batch's."""
    sizes: dict[str, int] = {}
    uncounted: set[str] = set()
    for m in messages:
        counted = getattr(m, "topic_bytes", None) or {}
        uncounted.update(s.topic for s in m.slices if s.topic not in counted)
        for topic, n in counted.items():
            sizes[topic] = sizes.get(topic, 0) + n
    return {topic: n for topic, n in sizes.items() if topic not in uncounted}


def commit_batch(config: Config, messages: Sequence[SinkCommitMessage | None], batch_id: int,
                 partitions: int | None = None) -> BatchCommit:
    """Commit the slices of ``messages`` (see module doc) and report what was done. With
    ``partitions`` (the ``partitions`` option), every topic written must have that many
    partitions, and is created with them if missing (:func:`check_partition_count`); without,
    every topic whose rows the tasks placed by a count (:func:`placed_by`) must have that count,
    and is created on first use with it if missing. Both are checked before anything is
    committed; a topic that rows name partitions of is created on first use, or grown, by the
    commit itself (docs/protocol.md section 10.2)."""
    started = time.perf_counter()
    ordered = sorted((m for m in messages if m is not None), key=lambda m: m.task_id)
    slices = [s for m in ordered for s in m.slices]
    sink_ids = {m.sink_id for m in ordered}
    if len(sink_ids) > 1:
        raise ValueError(f"one batch carries commit messages of several sinks: {sorted(map(str, sink_ids))}")
    sink_id = next(iter(sink_ids), None)
    writer = log_writer(config)
    if partitions is not None:
        for topic in sorted({s.topic for s in slices}):
            check_partition_count(writer.topics, topic, partitions)
    for topic, count in sorted(placed_by(ordered).items()):
        check_partition_count(writer.topics, topic, count, explicit=False)
    conflicts_before = writer.coordination.stats["cas_conflict"]
    failpoints.hit("sink.before_commit")
    if sink_id:  # a replay commits the cut its first attempt pinned, whatever its own tasks did
        slices = pin_batch(writer.coordination, writer.objects, writer.config, sink_id, batch_id, slices, writer.clock,
                           topic_bytes(ordered))
    results = writer.commit_staged(slices, SinkBatch(sink_id, batch_id) if sink_id else None)
    failpoints.hit("sink.after_commit")
    done = BatchCommit(
        batch_id=batch_id,
        records=sum(m.records for m in ordered), bytes=sum(m.bytes for m in ordered),
        blobs=sum(m.blobs for m in ordered), slices=len(slices),
        skipped_slices=sum(r is None for r in results),
        partitions=len({(s.topic, s.partition) for s in slices}),
        stage_s_max=max((m.stage_s for m in ordered), default=0.0),
        commit_s=time.perf_counter() - started,
        cas_conflicts=writer.coordination.stats["cas_conflict"] - conflicts_before,
    )
    log.info(done.describe())
    print(done.describe(), file=sys.stderr, flush=True)  # Python workers' logging is not configured
    metrics_file = os.environ.get(METRICS_FILE_ENV)
    if metrics_file:
        with open(metrics_file, "a") as f:
            f.write(json.dumps(dataclasses.asdict(done)) + "\n")
    return done
