"""Exactly-once whatever the replay's cut (docs/protocol.md section 9.1): a streaming query into
llog is killed after its commit of a batch stopped halfway, and restarted from its checkpoint
so that Spark replays the batch cut differently (other tasks, another order, rows placed by
task id, splits re-planned from a compacted index). Every row of every batch must then be in
the topic exactly once.

Without the pinned cut, the replay's progress ("slice n of this batch is committed") counted
slices of another cut: it skipped rows it never wrote and wrote rows already written.
"""

from __future__ import annotations

import collections
import re
import signal

from llog.compactor import Compactor
from llog.coordination import Coordination
from llog.discovery import topic_partitions
from llog.reader import ReadRequest
from llog.writer import LogWriter
from tests.helpers import driver_process
from tests.helpers.clocks import past_the_lag
from tests.helpers.invariants import check_partition

ROWS, BATCHES = 300, 3


def _run(config, checkpoint, *extra: str, failpoint: str | None = None):
    return driver_process.run(config, ["tests.helpers.sink_query", "--topic", "out", "--checkpoint", str(checkpoint),
                                       "--rows", str(ROWS), "--batches", str(BATCHES), *extra], failpoint)


def _crash_then_replay(config, tmp_path, first: list[str], replay: list[str]) -> None:
    checkpoint = tmp_path / "ck"
    run = _run(config, checkpoint, *first, failpoint="writer.after_staged_slice")
    assert run.returncode == -signal.SIGKILL, f"not killed after a committed slice: {run.stderr[-3000:]}"
    if replay is not None:
        run = _run(config, checkpoint, *replay)
        assert run.returncode == 0, run.stderr[-3000:]
        # The sink logs its skipped slices on every commit, 0 when it skipped none: a replay skips some.
        assert "is a replay cut differently" in run.stderr or re.search(
            r"[1-9]\d* slice\(s\) were already committed", run.stderr), run.stderr[-3000:]


def _values(config, reader) -> list[int]:
    values = []
    with Coordination(config) as coordination:
        for p in topic_partitions(coordination, config.root_prefix, "out"):
            if not check_partition(coordination, config.root_prefix, "out", p).high_watermark:
                continue
            batches = reader.read_batches([ReadRequest("out", p, 1)])[0]
            values += [int(v) for v in batches.table().column("value").to_pylist()]
    return values


def _assert_every_row_once(values: list[int]) -> None:
    counts = collections.Counter(values)
    twice = sorted(v for v, c in counts.items() if c > 1)
    assert not twice, f"{len(twice)} row(s) written twice, first {twice[:10]}"
    missing = sorted(set(range(max(values) + 1)) - set(values))
    assert not missing, f"{len(missing)} row(s) missing, first {missing[:10]}"
    assert len(values) % ROWS == 0 and len(values) >= BATCHES * ROWS


def test_a_replay_with_other_tasks_after_a_shuffle_commits_every_row_once(config, reader, tmp_path):
    """First attempt: 2 input tasks, shuffled into 2; the replay: 3 input tasks, shuffled into 5
    (rows by rand()): other slices, other partitions for the unkeyed rows, another order."""
    _crash_then_replay(config, tmp_path, ["--unkeyed", "--input-partitions", "2", "--shuffle", "2"],
                       ["--unkeyed", "--input-partitions", "3", "--shuffle", "5"])
    _assert_every_row_once(_values(config, reader))


def test_an_llog_to_llog_replay_after_compaction_commits_every_row_once(config, reader, tmp_path):
    """The source topic is compacted between the crash and the replay: the replay's splits are
    cut at other index entries (minPartitions cuts a batch's 300 offsets into shares of 75 at
    entry ends: at 70, 147, ... over 7-offset entries; at 75, 150, ... inside one compacted
    entry), so its tasks hold other rows. Rows are keyed (value % 3), so each partition gets a
    slice from each of the 4 tasks and the kill after the first round of the lockstep commit
    leaves every partition with one of its four slices committed."""
    with LogWriter(config, auto_initialize=True) as writer:
        for start in range(0, ROWS * BATCHES, 7):
            writer.append("src", 0, [str(v).encode() for v in range(start, min(start + 7, ROWS * BATCHES))])
    _crash_then_replay(config, tmp_path, ["--source-topic", "src", "--input-partitions", "4"], None)
    with Compactor(config, clock=past_the_lag()) as compactor:
        assert compactor.compact_partition("src", 0).compactions >= 1
    run = _run(config, tmp_path / "ck", "--source-topic", "src", "--input-partitions", "4")
    assert run.returncode == 0, run.stderr[-3000:]
    _assert_every_row_once(_values(config, reader))
