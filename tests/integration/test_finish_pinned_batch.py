"""The operator's way out of a sink whose replay truly differs (docs/protocol.md sections 9.1
and 9.2, docs/spark-sink.md): ``llog sinks finish SINK_ID --batch B`` commits the rest of the
pinned cut and marks the pin finished, so the replay of batch B commits nothing more; it refuses
a batch that is not the pinned one and a pin that changed while it worked."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from llog.clock import ShiftedClock
from llog.coordination import Coordination
from llog.discovery import topic_partitions
from llog.deployment import MAX_SKEW_FRACTION
from llog.errors import (
    OffsetOutOfRange, SinkBatchMismatch, SinkBatchNotCommitted, SinkBatchNotPinned, SinkFinishUnsafe,
)
from llog.gc import gc_pass
from llog.reader import LogReader, ReadRequest
from llog.sink_batches import (
    SINKS_PARTITION_KEY, PinnedBatch, finish_pinned, pin_batch, sink_batch_key, unpin_committed,
)
from llog.topics import create_topic, delete_topic
from llog.writer import AppendGroup, LogWriter, SinkBatch, stage
from llog_tools.cli import main as llog_main
from tests.helpers import driver_process
from tests.helpers.clocks import past_the_lag
from tests.helpers.pins import cli_reaches, cut as _cut, pin_clients
from tests.helpers.invariants import check_partition


@pytest.fixture
def parts(config, monkeypatch):
    """A writer, clients and partition ``t[0]``; the ``llog`` command reaches the same root prefix."""
    cli_reaches(config, monkeypatch)
    with pin_clients(config) as clients:
        yield clients


def _log(config) -> list[bytes]:
    with LogReader(config) as reader:
        return reader.read_batches([ReadRequest("t", 0, 1)])[0].table().column("value").to_pylist()


def _pin(coordination, config, sink_id: str) -> PinnedBatch:
    found = coordination.get(sink_batch_key(config.root_prefix, sink_id), SINKS_PARTITION_KEY)
    return PinnedBatch.from_json(found.value, found.key)


def test_a_replay_with_other_rows_is_refused_until_the_operator_finishes_the_pinned_cut(parts, capsys):
    config, writer, coordination, objects = parts
    rows = [f"r{i}".encode() for i in range(6)]
    pinned = pin_batch(coordination, objects, config, "q", 4, _cut(config, objects, rows, 3), writer.clock,
                       {"t": sum(map(len, rows))})
    writer.commit_staged(pinned[:1], SinkBatch("q", 4))  # the driver died after one slice
    replay_rows = [f"row-{i}".encode() for i in range(6)]  # the restarted query formats values otherwise
    replay = _cut(config, objects, replay_rows, 2)
    for _restart in range(2):  # on every restart, and nothing of the replay is committed
        with pytest.raises(SinkBatchMismatch) as refused:
            pin_batch(coordination, objects, config, "q", 4, replay, writer.clock, {"t": sum(map(len, replay_rows))})
    message = str(refused.value)
    assert "sink q batch 4 was pinned with t: 6 record(s) of 12 byte(s)" in message
    assert "this commit carries t: 6 record(s) of 30 byte(s)" in message
    assert "1 of the pinned cut's 3 slice(s) are committed (t[0]: 1 of 3)" in message
    assert "llog sinks finish --batch 4 -- q" in message
    assert _log(config) == rows[:2]
    assert llog_main(["sinks", "unpin", "q"]) == 1  # a readable pin is kept: not the way out

    assert llog_main(["sinks", "finish", "q", "--batch", "4"]) == 0
    out = capsys.readouterr().out
    assert "sink q batch 4: 2 slice(s) of the pinned cut committed now, 1 before" in out
    assert "drops its own rows" in out
    assert _log(config) == rows  # the pinned cut, whole, once
    assert _pin(coordination, config, "q").finished_at_ms is not None

    again = pin_batch(coordination, objects, config, "q", 4, replay, writer.clock, {"t": sum(map(len, replay_rows))})
    assert again == pinned  # the replay goes through: it commits the pinned cut, all of it already there
    assert writer.commit_staged(again, SinkBatch("q", 4)) == [None, None, None]
    assert _log(config) == rows  # none of the replay's rows: batch 4 is the rows of the attempt that pinned it
    assert llog_main(["sinks", "finish", "q", "--batch", "4"]) == 0  # run again: nothing left to commit
    assert "0 slice(s) of the pinned cut committed now, 3 before" in capsys.readouterr().out

    report = gc_pass(coordination, objects, config.root_prefix, config.gc_grace_ms, clock=past_the_lag())
    assert sorted(report.deleted_uris) == sorted({s.wal_uri for s in replay})  # the replay's blobs are garbage
    assert _log(config) == rows

    # The next batch is pinned afresh and checked as any: a finished pin covers its own batch only.
    nxt = pin_batch(coordination, objects, config, "q", 5, _cut(config, objects, [b"n"], 1), writer.clock, {"t": 1})
    assert _pin(coordination, config, "q").finished_at_ms is None
    with pytest.raises(SinkBatchMismatch):
        pin_batch(coordination, objects, config, "q", 5, _cut(config, objects, [b"m", b"m"], 1), writer.clock,
                  {"t": 2})
    writer.commit_staged(nxt, SinkBatch("q", 5))
    assert _log(config) == rows + [b"n"]


def test_finish_refuses_a_batch_that_is_not_the_pinned_one(parts, capsys):
    config, writer, coordination, objects = parts
    assert llog_main(["sinks", "finish", "none", "--batch", "0"]) == 1
    assert "sink none has no pinned batch" in capsys.readouterr().err
    pinned = pin_batch(coordination, objects, config, "q", 4, _cut(config, objects, [b"a", b"b"], 2), writer.clock)
    writer.commit_staged(pinned[:1], SinkBatch("q", 4))
    before = coordination.get(sink_batch_key(config.root_prefix, "q"), SINKS_PARTITION_KEY)
    for wrong in ("3", "5"):
        assert llog_main(["sinks", "finish", "q", "--batch", wrong]) == 1
        assert f"sink q has batch 4 pinned, not batch {wrong}" in capsys.readouterr().err
    after = coordination.get(sink_batch_key(config.root_prefix, "q"), SINKS_PARTITION_KEY)
    assert after.version_id == before.version_id and _log(config) == [b"a"]


def test_finish_refuses_a_pin_that_changed_while_it_was_read(parts, capsys, hooks):
    """The query moved on between the operator's read and the CAS (another finish, its own next
    batch): the CAS on the version read fails, and nothing is marked or committed."""
    config, writer, coordination, objects = parts
    pinned = pin_batch(coordination, objects, config, "q", 4, _cut(config, objects, [b"a", b"b"], 2), writer.clock)
    writer.commit_staged(pinned, SinkBatch("q", 4))

    def the_query_moves_on():
        pin_batch(coordination, objects, config, "q", 5, _cut(config, objects, [b"c", b"d"], 2), writer.clock)

    hooks["sink_batches.before_finish_cas"] = the_query_moves_on
    assert llog_main(["sinks", "finish", "q", "--batch", "4"]) == 1
    assert "changed while it was read" in capsys.readouterr().err
    now = _pin(coordination, config, "q")
    assert (now.batch_id, now.finished_at_ms) == (5, None) and _log(config) == [b"a", b"b"]


def test_list_shows_pins_and_unpin_committed_retires_only_a_committed_one(parts, capsys, hooks):
    """Pins of sink ids never written again stay (docs/protocol.md section 9.1, "How long a pin
    lives"): the operator sees them and retires one whose cut is committed, by CAS."""
    config, writer, coordination, objects = parts
    half = pin_batch(coordination, objects, config, "q.t.1", 2, _cut(config, objects, [b"a", b"b"], 2), writer.clock)
    writer.commit_staged(half[:1], SinkBatch("q.t.1", 2))
    done = pin_batch(coordination, objects, config, "q.t.0", 2, _cut(config, objects, [b"c", b"d"], 2), writer.clock)
    writer.commit_staged(done, SinkBatch("q.t.0", 2))
    assert llog_main(["sinks", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["q.t.0", "q.t.1"]
    assert "2 of 2 slice(s) committed  committed" in lines[0]
    assert "1 of 2 slice(s) committed  half-committed" in lines[1]

    assert llog_main(["sinks", "unpin", "q.t.1", "--batch", "2"]) == 2  # --batch needs --committed
    assert llog_main(["sinks", "unpin", "q.t.1", "--batch", "2", "--committed"]) == 1  # a replay still needs it
    assert "1 of the pinned cut's 2 slice(s) are committed" in capsys.readouterr().err
    assert llog_main(["sinks", "unpin", "q.t.0", "--batch", "1", "--committed"]) == 1  # not the pinned batch
    assert "sink q.t.0 has batch 2 pinned, not batch 1" in capsys.readouterr().err

    def the_sink_commits_again():
        nxt = pin_batch(coordination, objects, config, "q.t.0", 3, _cut(config, objects, [b"e"], 1), writer.clock)
        writer.commit_staged(nxt, SinkBatch("q.t.0", 3))

    hooks["sink_batches.before_unpin_cas"] = the_sink_commits_again
    assert llog_main(["sinks", "unpin", "q.t.0", "--batch", "2", "--committed"]) == 1
    assert "changed while it was read" in capsys.readouterr().err
    assert _pin(coordination, config, "q.t.0").batch_id == 3
    hooks.clear()
    assert llog_main(["sinks", "unpin", "q.t.0", "--batch", "3", "--committed"]) == 0
    retired = _pin(coordination, config, "q.t.0")
    assert (retired.batch_id, retired.slices) == (3, ()) and retired.retired_at_ms is not None
    assert _pin(coordination, config, "q.t.1").batch_id == 2  # the other is kept
    assert sorted(_log(config)) == [b"a", b"c", b"d", b"e"]


def test_a_query_whose_code_changed_before_its_replay_goes_on_after_the_operator_finishes_the_batch(
        config, reader, tmp_path):
    """End to end with Spark: the driver dies after a slice of batch 0 is committed; the query is
    restarted with other code (each value prefixed) and fails on the replay of batch 0, naming the
    command; the operator runs it; the query then goes on. Batch 0 holds the first attempt's rows
    once, the later batches the new code's rows once."""
    rows, batches = 300, 3

    def run(*extra, failpoint=None):
        return driver_process.run(config, ["tests.helpers.sink_query", "--topic", "out", "--checkpoint",
                                           str(tmp_path / "ck"), "--rows", str(rows), "--batches", str(batches),
                                           *extra], failpoint)

    first = run(failpoint="writer.after_staged_slice")
    assert first.returncode == -signal.SIGKILL, f"not killed after a committed slice: {first.stderr[-3000:]}"
    changed = run("--value-prefix", "v2-")
    assert changed.returncode != 0 and "SinkBatchMismatch" in changed.stderr, changed.stderr[-3000:]
    command = re.search(r"`(llog sinks finish --batch 0 -- \S+)`", changed.stderr)
    assert command, changed.stderr[-3000:]
    assert re.search(r"[1-9]\d* of the pinned cut's \d+ slice\(s\) are committed", changed.stderr)

    env = {**os.environ, "LLOG_SETTINGS_FILE": "/nonexistent", **config.to_options()}
    done = subprocess.run([sys.executable, "-m", "llog_tools", *command.group(1).split()[1:]], env=env,
                          capture_output=True, text=True, timeout=120, cwd=driver_process.REPO)
    assert done.returncode == 0, done.stderr
    assert "of the pinned cut committed now" in done.stdout

    again = run("--value-prefix", "v2-")
    assert again.returncode == 0, again.stderr[-3000:]
    values = []
    with Coordination(config) as coordination:
        for p in topic_partitions(coordination, config.root_prefix, "out"):
            if not check_partition(coordination, config.root_prefix, "out", p).high_watermark:
                continue
            values += [v.decode() for v in
                       reader.read_batches([ReadRequest("out", p, 1)])[0].table().column("value").to_pylist()]
    old = sorted(int(v) for v in values if not v.startswith("v2-"))
    new = sorted(int(v[3:]) for v in values if v.startswith("v2-"))
    assert old == list(range(rows)), "batch 0 is not the first attempt's rows, each once"
    assert new[:1] == [rows] and new == list(range(rows, new[-1] + 1)) and len(new) >= (batches - 1) * rows, \
        "the later batches are not the new code's rows, each once"


def test_a_finished_pin_long_after_the_crash_commits_copies_and_stays_finished(parts):
    """The cut is finished when its slices are past G/2 (the query stayed down): the commit copies
    them into a new blob and re-pins them (the age rule, section 9.1), and the re-pinned record is
    still finished, so the query's replay with its other rows is still let through."""
    config, writer, coordination, objects = parts
    rows = [f"x{i}".encode() for i in range(6)]
    first = pin_batch(coordination, objects, config, "q", 2, _cut(config, objects, rows, 2), writer.clock, {"t": 12})
    later = ShiftedClock(config.gc_grace_ms / 1000 * 0.6)
    finish_pinned(coordination, objects, config, "q", 2, later)
    copies = pin_batch(coordination, objects, config, "q", 2, [], later, replay_only=True)
    assert {s.wal_uri for s in copies}.isdisjoint({s.wal_uri for s in first})
    assert _pin(coordination, config, "q").finished_at_ms is not None
    with LogWriter(config, clock=later) as late:
        late.commit_staged(copies, SinkBatch("q", 2))
        replay = pin_batch(coordination, objects, config, "q", 2, _cut(config, objects, [b"other"], 1), later, {"t": 5})
        assert replay == copies and late.commit_staged(replay, SinkBatch("q", 2)) == [None, None]
    assert _log(config) == rows
    with pytest.raises(SinkBatchNotPinned, match="sink q has batch 2 pinned, not batch 3: nothing done"):
        pin_batch(coordination, objects, config, "q", 3, [], later, replay_only=True)


def _u_committed(parts, sink_id: str, batch_id: int, partitions: int = 2) -> None:
    """Topic u with ``partitions`` partitions; batch ``batch_id`` of ``sink_id`` (one row per
    partition, ``p0``, ``p1``...) pinned and wholly committed."""
    config, writer, coordination, objects = parts
    create_topic(coordination, config.root_prefix, "u", partitions)
    staged = stage(objects, config, [AppendGroup("u", p, [f"p{p}".encode()]) for p in range(partitions)])
    writer.commit_staged(pin_batch(coordination, objects, config, sink_id, batch_id, staged, writer.clock,
                                   {"u": 2 * partitions}), SinkBatch(sink_id, batch_id))


def _u_log(config, partition: int) -> list[bytes]:
    with LogReader(config) as reader:
        try:
            return reader.read_batches([ReadRequest("u", partition, 1)])[0].table().column("value").to_pylist()
        except OffsetOutOfRange:  # nothing in it
            return []


def test_finish_refuses_a_pin_past_the_retention_with_a_partition_without_progress(parts, capsys):
    """Batch 5 wholly committed; past LLOG_SINK_PROGRESS_RETENTION_MS another sink commits into
    u[1], which drops g's entry there. Whether u[1]'s slice is committed cannot be told, so finish
    refuses (nothing marked; it would write p1 again), and a replay that differs is refused
    without naming finish."""
    config, writer, coordination, objects = parts
    _u_committed(parts, "g", 5)
    later = ShiftedClock(config.sink_progress_retention_ms / 1000 + 3600)
    with LogWriter(config, clock=later) as other:
        staged = stage(objects, config, [AppendGroup("u", 1, [b"x"])], clock=later)
        other.commit_staged(pin_batch(coordination, objects, config, "other", 0, staged, later, {"u": 1}),
                            SinkBatch("other", 0))
    with pytest.raises(SinkFinishUnsafe, match=r"u\[1\].*cannot be told.*nothing marked"):
        finish_pinned(coordination, objects, config, "g", 5, later)
    assert _pin(coordination, config, "g").finished_at_ms is None
    replay = stage(objects, config, [AppendGroup("u", 0, [b"other"])], clock=later)
    with pytest.raises(SinkBatchMismatch) as refused:
        pin_batch(coordination, objects, config, "g", 5, replay, later, {"u": 5})
    message = str(refused.value)
    assert "llog sinks finish --batch" not in message and "cannot be told" in message, message
    assert _u_log(config, 1) == [b"p1", b"x"]


def test_finish_refuses_a_pin_whose_topic_was_created_after_it(parts, capsys):
    """Batch 2 of sink s wholly committed into u, then u is deleted and created again: the new
    incarnation holds no progress of batch 2, so unpin --committed keeps the pin, without naming
    finish; finish itself refuses (nothing marked): the topic was created after the pin, and the
    batch's rows may belong to the deleted topic."""
    config, writer, coordination, objects = parts
    _u_committed(parts, "s", 2, partitions=1)
    delete_topic(coordination, objects, config.root_prefix, "u")
    later = ShiftedClock(config.gc_grace_ms * MAX_SKEW_FRACTION / 1000 + 60)
    create_topic(coordination, config.root_prefix, "u", 1, clock=later)
    with pytest.raises(SinkBatchNotCommitted) as kept:
        unpin_committed(coordination, objects, config, "s", 2, later)
    assert "u[0]: 0 of 1" in str(kept.value) and "finish" not in str(kept.value), kept.value
    assert llog_main(["sinks", "finish", "--batch", "2", "--", "s"]) == 1
    err = capsys.readouterr().err
    assert "created" in err and "after the batch was pinned" in err, err
    assert "nothing marked" in err, err
    assert _pin(coordination, config, "s").finished_at_ms is None
    assert _u_log(config, 0) == []
