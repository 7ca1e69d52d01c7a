"""What the driver does with a batch's commit messages: commit every staged slice, exactly once.

Slices are taken in task order, and within a task in the order written, so each partition's
slices get offsets in a fixed order. A streaming query commits as sink ``queryId``, batch
``batchId``: each reserving CAS records how far the batch got in that partition (PROTOCOL.md
section 9), so a replayed batch, after a driver crash or a commit that failed halfway, commits
only what is missing. ``abort`` commits nothing; its blobs are left for garbage collection.
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
from llog.writer import SinkBatch
from llog.process_clients import log_writer
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


def commit_batch(config: Config, messages: Sequence[SinkCommitMessage | None], batch_id: int) -> BatchCommit:
    """Commit the slices of ``messages`` (see module doc) and report what was done."""
    started = time.perf_counter()
    ordered = sorted((m for m in messages if m is not None), key=lambda m: m.task_id)
    slices = [s for m in ordered for s in m.slices]
    sink_ids = {m.sink_id for m in ordered}
    if len(sink_ids) > 1:
        raise ValueError(f"one batch carries commit messages of several sinks: {sorted(map(str, sink_ids))}")
    sink_id = next(iter(sink_ids), None)
    writer = log_writer(config)
    conflicts_before = writer.coordination.stats["cas_conflict"]
    failpoints.hit("sink.before_commit")
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
