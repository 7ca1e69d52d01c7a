"""``llog sinks unpin SINK_ID --batch B --committed`` retires a pin (docs/protocol.md section 9.1,
"How long a pin lives"): the record becomes a RETIRED record of batch B, which references
nothing, so GC frees the blobs, and every later commit of the sink is judged against it: B's
replay commits nothing, an earlier batch is refused, a later one pins as usual. Also the
operator commands' lost replies, and their printed commands for a sink id starting with '-'."""

from __future__ import annotations

import re
import shlex

import grpc
import pytest

from llog.clock import ShiftedClock
from llog.errors import SinkBatchMismatch, SinkBatchNotCommitted
from llog.gc import gc_pass
from llog.reader import LogReader, ReadRequest
from llog.sink_batches import (
    SINKS_PARTITION_KEY, PinnedBatch, SinkBatchOutOfOrder, list_pins, pin_batch, sink_batch_key, unpin_committed,
)
from llog.topics import create_topic
from llog.writer import AppendGroup, LogWriter, SinkBatch, stage
from llog_tools.cli import main as llog_main
from tests.helpers.clocks import past_the_lag
from tests.helpers.pins import cli_reaches, cut as _cut, pin_clients


@pytest.fixture
def parts(config, monkeypatch):
    """A writer, clients and partition ``t[0]``; the ``llog`` command reaches the same root prefix."""
    cli_reaches(config, monkeypatch)
    with pin_clients(config) as clients:
        yield clients


def _log(config, topic: str = "t", partition: int = 0) -> list[bytes]:
    with LogReader(config) as reader:
        return reader.read_batches([ReadRequest(topic, partition, 1)])[0].table().column("value").to_pylist()


def _record(coordination, config, sink_id: str) -> PinnedBatch | None:
    found = coordination.get(sink_batch_key(config.root_prefix, sink_id), SINKS_PARTITION_KEY)
    return None if found is None else PinnedBatch.from_json(found.value, found.key)


def _bytes(values) -> dict[str, int]:
    return {"t": sum(map(len, values))}


class _LostReply(grpc.RpcError):
    """The reply of a write that landed, lost in transit (the client retries it)."""

    def code(self):
        return grpc.StatusCode.UNAVAILABLE


def _lose_the_next_reply(hooks):
    def lost():
        del hooks["coordination.after_write"]
        raise _LostReply()
    hooks["coordination.after_write"] = lost


def test_a_retired_finished_pin_keeps_its_replay_a_no_op(parts, capsys):
    """finish, then unpin --committed, then the wedged query's replay of the batch with its other
    rows: the batch stays the rows of the attempt that pinned it (v1.2's delete let the replay pin
    its own cut against the old progress: rows of both attempts)."""
    config, writer, coordination, objects = parts
    rows = [f"r{i}".encode() for i in range(6)]
    pinned = pin_batch(coordination, objects, config, "q", 4, _cut(config, objects, rows, 3), writer.clock, _bytes(rows))
    writer.commit_staged(pinned[:1], SinkBatch("q", 4))
    replay_rows = [f"row-{i}".encode() for i in range(6)]
    with pytest.raises(SinkBatchMismatch):
        pin_batch(coordination, objects, config, "q", 4, _cut(config, objects, replay_rows, 6), writer.clock,
                  _bytes(replay_rows))
    assert llog_main(["sinks", "finish", "--batch", "4", "--", "q"]) == 0
    assert llog_main(["sinks", "unpin", "--batch", "4", "--committed", "--", "q"]) == 0
    assert "retired" in capsys.readouterr().out
    retired = _record(coordination, config, "q")
    assert (retired.batch_id, retired.slices, retired.cut_uri) == (4, (), None) and retired.retired_at_ms is not None

    replay = _cut(config, objects, replay_rows, 6)
    slices = pin_batch(coordination, objects, config, "q", 4, replay, writer.clock, _bytes(replay_rows))
    assert slices == [] and writer.commit_staged(slices, SinkBatch("q", 4)) == []
    assert _log(config) == rows

    assert llog_main(["sinks", "list"]) == 0
    assert re.search(r"^q  batch 4  retired ", capsys.readouterr().out, re.M)
    assert llog_main(["sinks", "unpin", "--batch", "4", "--committed", "--", "q"]) == 0  # again: already retired
    assert "already retired" in capsys.readouterr().out
    # The retired record references nothing: the blobs neither the index nor it names are garbage.
    report = gc_pass(coordination, objects, config.root_prefix, config.gc_grace_ms, clock=past_the_lag())
    assert set(report.deleted_uris) >= {s.wal_uri for s in replay}
    assert _log(config) == rows

    nxt = pin_batch(coordination, objects, config, "q", 5, _cut(config, objects, [b"n"], 1), writer.clock, {"t": 1})
    writer.commit_staged(nxt, SinkBatch("q", 5))  # a later batch pins as usual, replacing the retired record
    assert _record(coordination, config, "q").retired_at_ms is None and _log(config) == rows + [b"n"]


def test_a_new_query_under_a_retired_sink_id_is_refused_naming_a_new_sink_id(parts, capsys):
    """The old query is gone, its last pin retired; a new query under the same llog.sink.id starts
    at batch 0, which the old progress {7, n} would make skipped: refused, every time."""
    config, writer, coordination, objects = parts
    old = [b"old-a", b"old-b"]
    pinned = pin_batch(coordination, objects, config, "job", 7, _cut(config, objects, old, 2), writer.clock, _bytes(old))
    writer.commit_staged(pinned, SinkBatch("job", 7))
    assert llog_main(["sinks", "unpin", "--batch", "7", "--committed", "--", "job"]) == 0
    new = [b"new-a", b"new-b", b"new-c"]
    for _restart in range(2):
        with pytest.raises(SinkBatchOutOfOrder, match=r"batch 7 of sink job was retired.*a new llog\.sink\.id"):
            pin_batch(coordination, objects, config, "job", 0, _cut(config, objects, new, 3), writer.clock, _bytes(new))
    assert _log(config) == old


def test_list_reports_progress_of_a_later_batch_as_such(parts, capsys):
    """A pin of batch 0 whose partition holds the sink's progress of batch 7 (the record of 7 was
    removed as unreadable, `llog sinks unpin SINK_ID`): nothing of batch 0 is committed there; a
    commit of it would skip every slice. The listing says so instead of "committed"."""
    config, writer, coordination, objects = parts
    pinned = pin_batch(coordination, objects, config, "job", 7, _cut(config, objects, [b"o"], 1), writer.clock, {"t": 1})
    writer.commit_staged(pinned, SinkBatch("job", 7))
    coordination.delete(sink_batch_key(config.root_prefix, "job"), SINKS_PARTITION_KEY)
    pin_batch(coordination, objects, config, "job", 0, _cut(config, objects, [b"n", b"m"], 2), writer.clock, {"t": 2})
    assert llog_main(["sinks", "list"]) == 0
    listed = capsys.readouterr().out
    assert "0 of 2 slice(s) committed" in listed and "progress of a later batch in t[0] (batch 7)" in listed, listed


def test_unpin_committed_keeps_a_half_committed_pin_past_the_retention(parts):
    """Batch 5 pinned over u[0] and u[1], u[0]'s slice committed (live progress {5, 1}), u[1]'s not,
    the query down past LLOG_SINK_PROGRESS_RETENTION_MS: u[1] has no progress because nothing was
    committed there, not because it expired, so the pin is kept (list and unpin agree)."""
    config, writer, coordination, objects = parts
    create_topic(coordination, config.root_prefix, "u", 2)
    first = stage(objects, config, [AppendGroup("u", 0, [b"a"]), AppendGroup("u", 1, [b"b"])])
    pinned = pin_batch(coordination, objects, config, "g", 5, first, writer.clock, {"u": 2})
    writer.commit_staged([s for s in pinned if s.partition == 0], SinkBatch("g", 5))
    later = ShiftedClock(config.sink_progress_retention_ms / 1000 + 3600)
    [summary] = list_pins(coordination, objects, config, later)
    assert (summary.committed, summary.slices) == (1, 2)
    with pytest.raises(SinkBatchNotCommitted, match=r"u\[1\]: 0 of 1.*cannot be told apart"):
        unpin_committed(coordination, objects, config, "g", 5, later)
    assert _record(coordination, config, "g").retired_at_ms is None
    replay = stage(objects, config, [AppendGroup("u", 0, [b"b"]), AppendGroup("u", 1, [b"a"])])
    writer.commit_staged(pin_batch(coordination, objects, config, "g", 5, replay, writer.clock, {"u": 2}),
                         SinkBatch("g", 5))
    assert (_log(config, "u", 0), _log(config, "u", 1)) == ([b"a"], [b"b"])


def test_finish_whose_reply_is_lost_reports_the_pin_finished(parts, capsys, hooks):
    """The finish's CAS lands and its reply is lost; the retry conflicts with its own write: the
    record holds what was written, so the command carries on and commits the cut."""
    config, writer, coordination, objects = parts
    pinned = pin_batch(coordination, objects, config, "q", 4, _cut(config, objects, [b"a", b"b"], 2), writer.clock)
    writer.commit_staged(pinned[:1], SinkBatch("q", 4))
    hooks["sink_batches.before_finish_cas"] = lambda: _lose_the_next_reply(hooks)
    rc = llog_main(["sinks", "finish", "--batch", "4", "--", "q"])
    hooks.clear()
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "1 slice(s) of the pinned cut committed now, 1 before" in captured.out
    assert _record(coordination, config, "q").finished_at_ms is not None and _log(config) == [b"a", b"b"]


def test_unpin_committed_whose_reply_is_lost_reports_the_pin_retired(parts, capsys, hooks):
    config, writer, coordination, objects = parts
    pinned = pin_batch(coordination, objects, config, "q", 2, _cut(config, objects, [b"a"], 1), writer.clock, {"t": 1})
    writer.commit_staged(pinned, SinkBatch("q", 2))
    hooks["sink_batches.before_unpin_cas"] = lambda: _lose_the_next_reply(hooks)
    rc = llog_main(["sinks", "unpin", "--batch", "2", "--committed", "--", "q"])
    hooks.clear()
    captured = capsys.readouterr()
    assert rc == 0 and "retired" in captured.out, (rc, captured.err)
    assert _record(coordination, config, "q").retired_at_ms is not None


def test_the_commands_printed_for_a_sink_id_starting_with_a_dash_run_verbatim(parts, capsys):
    """A sink id follows the topic name rule, which allows a leading '-': the command the
    mismatch error prints, and the one the not-committed error prints, run as printed."""
    config, writer, coordination, objects = parts
    pinned = pin_batch(coordination, objects, config, "-q", 4, _cut(config, objects, [b"a", b"b"], 2), writer.clock,
                       {"t": 2})
    writer.commit_staged(pinned[:1], SinkBatch("-q", 4))
    with pytest.raises(SinkBatchNotCommitted) as kept:
        unpin_committed(coordination, objects, config, "-q", 4, writer.clock)
    with pytest.raises(SinkBatchMismatch) as refused:
        pin_batch(coordination, objects, config, "-q", 4, _cut(config, objects, [b"ccc"], 1), writer.clock, {"t": 3})
    for message in (str(kept.value), str(refused.value)):
        command = re.search(r"`(llog sinks finish [^`]*)`", message).group(1)
        assert llog_main(shlex.split(command)[1:]) == 0, (command, capsys.readouterr().err)
    assert _record(coordination, config, "-q").finished_at_ms is not None and _log(config) == [b"a", b"b"]


def test_finish_of_a_cut_whose_topic_lost_partitions_marks_nothing_and_names_the_way_out(parts, capsys):
    """Batch 3 pinned over u[0] and u[1], u[0]'s slice committed; u is re-created with 1 partition.
    finish refuses before marking (UnknownPartition naming `llog topics alter`); once the partition
    is added back, finish commits the cut."""
    from llog.topics import delete_topic

    config, writer, coordination, objects = parts
    root = config.root_prefix
    create_topic(coordination, root, "u", 2)
    staged = stage(objects, config, [AppendGroup("u", 0, [b"a"]), AppendGroup("u", 1, [b"b"])])
    pinned = pin_batch(coordination, objects, config, "s", 3, staged, writer.clock, {"u": 2})
    writer.commit_staged([s for s in pinned if s.partition == 0], SinkBatch("s", 3))
    delete_topic(coordination, objects, root, "u")
    create_topic(coordination, root, "u", 1)
    capsys.readouterr()
    assert llog_main(["sinks", "finish", "--batch", "3", "--", "s"]) == 1
    err = capsys.readouterr().err
    assert "u[1] does not exist" in err and "nothing marked" in err and "llog topics alter u --partitions N" in err, err
    assert _record(coordination, config, "s").finished_at_ms is None
    assert llog_main(["topics", "alter", "u", "--partitions", "2"]) == 0
    assert llog_main(["sinks", "finish", "--batch", "3", "--", "s"]) == 0
    assert "2 slice(s) of the pinned cut committed now" in capsys.readouterr().out
    assert (_log(config, "u", 0), _log(config, "u", 1)) == ([b"a"], [b"b"])


def test_finish_moves_an_inline_cut_that_the_mark_would_push_past_the_budget_to_a_cut_object(parts):
    """An inline pin a few bytes under 64 KiB: `finished_at_ms` would pass PINNED_INLINE_MAX_BYTES
    (section 2), so the finished record names a cut object holding the same cut."""
    from dataclasses import replace

    from llog.sink_batches import PINNED_INLINE_MAX_BYTES, finish_pinned

    config, writer, coordination, objects = parts
    [one] = _cut(config, objects, [b"a"], 1)
    slices = [replace(one, body_offset=10**6 + i) for i in range(3000)]
    pinned = PinnedBatch("big", 1, tuple(slices), writer.clock.now_ms(), {"t": (3000, None)})
    while len(pinned.inline_json()) > PINNED_INLINE_MAX_BYTES - 10:
        pinned = replace(pinned, slices=pinned.slices[:-1])
    assert len(pinned.inline_json()) > PINNED_INLINE_MAX_BYTES - 40
    pinned = replace(pinned, rows={"t": (len(pinned.slices), None)})
    coordination.put(sink_batch_key(config.root_prefix, "big"), pinned.inline_json(), SINKS_PARTITION_KEY)
    finished = finish_pinned(coordination, objects, config, "big", 1, writer.clock)
    record = _record(coordination, config, "big")
    assert record.cut_uri is not None and record.finished_at_ms is not None
    assert finished.slices == pinned.slices


def _past_retention(config) -> ShiftedClock:
    return ShiftedClock(config.sink_progress_retention_ms / 1000 + 3600)


def _another_sink_commits(config, objects, coordination, clock, partition: int) -> None:
    """Sink ``other`` commits one row into ``u[partition]`` at ``clock``: the commit drops every
    other sink's entry there that is older than LLOG_SINK_PROGRESS_RETENTION_MS (section 9.1)."""
    with LogWriter(config, clock=clock) as other:
        staged = stage(objects, config, [AppendGroup("u", partition, [b"x"])], clock=clock)
        other.commit_staged(pin_batch(coordination, objects, config, "other", 0, staged, clock, {"u": 1}),
                            SinkBatch("other", 0))


def _pin_over_u(parts, commit_partitions: tuple[int, ...]) -> list:
    """Sink g pins batch 5 over u[0] (row a) and u[1] (row b) and commits the slices of
    ``commit_partitions``; then the driver is gone."""
    config, writer, coordination, objects = parts
    create_topic(coordination, config.root_prefix, "u", 2)
    first = stage(objects, config, [AppendGroup("u", 0, [b"a"]), AppendGroup("u", 1, [b"b"])])
    pinned = pin_batch(coordination, objects, config, "g", 5, first, writer.clock, {"u": 2})
    writer.commit_staged([s for s in pinned if s.partition in commit_partitions], SinkBatch("g", 5))
    return pinned


def _replay_over_u(parts, clock) -> None:
    config, _, coordination, objects = parts
    with LogWriter(config, clock=clock) as back:
        replay = stage(objects, config, [AppendGroup("u", 0, [b"a"]), AppendGroup("u", 1, [b"b"])], clock=clock)
        back.commit_staged(pin_batch(coordination, objects, config, "g", 5, replay, clock, {"u": 2}), SinkBatch("g", 5))


def test_unpin_committed_keeps_a_pin_never_committed_whatever_its_age(parts, capsys):
    """The driver pinned batch 3 and died before its first reserving CAS; the query stays down past
    LLOG_SINK_PROGRESS_RETENTION_MS. No partition holds progress of batch 3: absent progress cannot
    be told from evicted progress, so the pin is kept (list says so in unpin's words) and the
    query's replay writes the batch's rows."""
    config, writer, coordination, objects = parts
    rows = [b"r0", b"r1"]
    pin_batch(coordination, objects, config, "q", 3, _cut(config, objects, rows, 2), writer.clock, _bytes(rows))
    later = _past_retention(config)
    with pytest.raises(SinkBatchNotCommitted) as kept:
        unpin_committed(coordination, objects, config, "q", 3, later)
    message = str(kept.value)
    assert "0 of the pinned cut's 2 slice(s) are committed" in message, message
    assert "cannot be told apart" in message and "2 blob(s)" in message and "from GC" in message, message
    assert "replaces it" in message and "finish" not in message, message
    assert _record(coordination, config, "q").retired_at_ms is None
    [summary] = list_pins(coordination, objects, config, later)
    assert summary.kept is not None and summary.kept in message
    with LogWriter(config, clock=later) as back:  # the query comes back and replays batch 3
        replay = [s for value in rows for s in stage(objects, config, [AppendGroup("t", 0, [value])], clock=later)]
        back.commit_staged(pin_batch(coordination, objects, config, "q", 3, replay, later, _bytes(rows)),
                           SinkBatch("q", 3))
    assert _log(config) == rows


def test_unpin_committed_keeps_a_half_committed_pin_whose_progress_was_evicted(parts):
    """Batch 5's u[0] slice is committed, u[1]'s is not; past the retention another sink commits
    into u[0], which drops g's entry there. No partition holds progress of batch 5 now: the pin is
    kept, and the replay writes u[1]'s row (u[0]'s again too: the evicted progress is what a
    query back after the retention loses, section 9.1)."""
    config, writer, coordination, objects = parts
    _pin_over_u(parts, (0,))
    later = _past_retention(config)
    _another_sink_commits(config, objects, coordination, later, 0)
    with pytest.raises(SinkBatchNotCommitted, match=r"u\[0\]: 0 of 1, u\[1\]: 0 of 1.*cannot be told apart"):
        unpin_committed(coordination, objects, config, "g", 5, later)
    _replay_over_u(parts, later)
    assert _log(config, "u", 1) == [b"b"]


def test_a_committed_pin_whose_progress_was_evicted_in_one_partition_is_kept_naming_no_finish(parts, capsys):
    """Batch 5 wholly committed; past the retention another sink commits into u[1], which drops
    g's entry there. u[1]'s slice is not proven committed: the pin is kept, and neither unpin's
    refusal nor the listing offers `llog sinks finish`, which would write u[1]'s row again."""
    config, writer, coordination, objects = parts
    _pin_over_u(parts, (0, 1))
    later = _past_retention(config)
    _another_sink_commits(config, objects, coordination, later, 1)
    with pytest.raises(SinkBatchNotCommitted) as kept:
        unpin_committed(coordination, objects, config, "g", 5, later)
    message = str(kept.value)
    assert "u[0]: 1 of 1, u[1]: 0 of 1" in message and "cannot be told apart" in message, message
    assert "finish" not in message, message
    [summary] = [p for p in list_pins(coordination, objects, config, later) if p.sink_id == "g"]
    assert summary.kept is not None and summary.kept in message and "finish" not in summary.kept
    assert _log(config, "u", 1) == [b"b", b"x"]
