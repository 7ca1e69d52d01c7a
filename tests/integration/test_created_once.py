"""docs/protocol.md section 8, "Created once" (the interleavings of section 8.5), on real Oxia and
the S3 server.

Each test pauses one actor at a named point (``llog.failpoints.hooks``) while the hook runs the
others to completion, then lets it go on: the interleavings that broke a compacted partition
under v1.0 (an index PUT after compaction replaced or deleted the key; a reference made to a
blob GC had collected; a stale ``meta/compaction``), reproduced deterministically. Time passes
for one actor and not another through per-component clocks (``llog.clock.ShiftedClock``).

Every test ends with :func:`_settled`: the section 8 invariants hold, the partition reads back
exactly the records it should, and a GC pass dated an hour later (every unreferenced blob is
then collected) succeeds and leaves everything readable.
"""

from __future__ import annotations

import logging
import signal

import grpc
import oxia
import pytest

from llog.clock import ShiftedClock
from llog.compactor import Compactor
from llog.control import Created, read_control, tripwire
from llog.errors import StaleBlob
from llog.gc import gc_pass
from llog.reader import LogReader
from llog.records import COMPACTED, WAL, CompactionRecord
from llog.writer import LogWriter
from tests.helpers import writer_process
from tests.helpers.clocks import past_the_lag
from tests.helpers.invariants import check_partition

T = "once"
TRIPWIRE = "created behind the compaction cursor"


def _records(tag: str, n: int = 5) -> list[bytes]:
    return [f"{tag}/{i}".encode() for i in range(n)]


def _once(hooks, point: str, fn) -> None:
    """Run ``fn`` the first time ``point`` is reached (nested actors reach it too)."""

    def hook():
        del hooks[point]
        fn()

    hooks[point] = hook


def _writer(config, clock=None) -> LogWriter:
    return LogWriter(config, auto_initialize=True, clock=clock)


def _killed_writer(config, name: str, failpoint: str) -> list[bytes]:
    """A writer process appends 5 records to partition 0 and is SIGKILLed at ``failpoint``;
    returns its records (durable once reserved)."""
    proc = writer_process.start(config, name, T, [0], batches=1, records=5, failpoint=failpoint)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, err
    return [writer_process.record_value(name, 0, 0, i) for i in range(5)]


def _gc_later(config, seconds: float = 3600) -> None:
    """A GC pass dated ``seconds`` from now."""
    with LogReader(config) as reader:
        gc_pass(reader.coordination, reader.objects, config.root_prefix, config.gc_grace_ms,
                clock=ShiftedClock(seconds))


def _entries(config) -> list[tuple[str, int, int]]:
    """``(type, start, end)`` of every index entry of partition 0."""
    with LogReader(config) as reader:
        snapshot = check_partition(reader.coordination, config.root_prefix, T, 0)
    return [(e.entry.type, e.start_offset, e.end_offset) for e in snapshot.entries]


def _settled(config, expected: list[bytes]) -> None:
    with LogReader(config) as reader:
        check_partition(reader.coordination, config.root_prefix, T, 0)
        assert [r.value for r in reader.read_range(T, 0, 1)] == expected
        assert reader.coordination.get(reader.keys(T, 0).compaction, reader.keys(T, 0).partition_key) is None
        gc_pass(reader.coordination, reader.objects, config.root_prefix, config.gc_grace_ms, clock=ShiftedClock(3600))
        assert [r.value for r in reader.read_range(T, 0, 1)] == expected


# --- 1 to 5: a late index write after compaction ------------------------------------------------


def test_1_a_compactor_never_takes_an_entry_still_named_by_pending(config, writer, hooks):
    """A0, no stall: the pending appears while the compactor is between its step 0 and its
    selection. v1.0 compacted it and the next writer's index PUT replaced the COMPACTED entry."""
    first, second = _records("a"), _records("b")
    writer.append(T, 0, first)
    writer.append(T, 0, second)
    killed: list[bytes] = []
    _once(hooks, "compactor.after_recover",
          lambda: killed.extend(_killed_writer(config, "k", "writer.after_index_put")))  # pending 11..15
    with Compactor(config, clock=past_the_lag()) as compactor:
        compactor.compact_partition(T, 0)
    last = _records("c")
    writer.append(T, 0, last)  # finishes the pending: the entry exists, nothing is replaced
    assert _entries(config) == [(COMPACTED, 1, 10), (WAL, 11, 15), (WAL, 16, 20)]
    _settled(config, first + second + killed + last)


def test_2_a_stalled_writer_does_not_overwrite_a_compacted_end_key(config, writer, hooks, caplog):
    """A: W stalls between its reservation and its index write; a helper finishes W's append,
    and compaction ends a run at W's end key. W's create finds the key: materialized."""
    first, late, helper = _records("a"), _records("w"), _records("h")
    writer.append(T, 0, first)

    def others():
        with _writer(config) as h:
            h.append(T, 0, helper)  # finishes W's pending 6..10 first
        with Compactor(config, clock=past_the_lag(), max_offsets=10) as compactor:  # runs 1..10, 11..15
            assert compactor.compact_partition(T, 0).records == 15

    _once(hooks, "writer.after_reserve", others)
    with _writer(config) as w:
        result = w.append(T, 0, late)
    assert (result.start_offset, result.end_offset) == (6, 10)
    assert _entries(config) == [(COMPACTED, 1, 10), (COMPACTED, 11, 15)]
    assert TRIPWIRE not in caplog.text
    _settled(config, first + late + helper)


def test_3_a_stalled_helper_does_not_overwrite_a_compacted_end_key(config, writer, hooks):
    """A, with the stalled actor a helper finishing a killed writer's append."""
    first = _records("a")
    writer.append(T, 0, first)
    killed = _killed_writer(config, "k", "writer.after_reserve")  # pending 6..10, no entry
    helper2 = _records("h2")

    def others():
        with _writer(config) as h2:
            h2.append(T, 0, helper2)  # 11..15, after finishing 6..10 itself
        with Compactor(config, clock=past_the_lag(), max_offsets=10) as compactor:  # runs 1..10, 11..15
            assert compactor.compact_partition(T, 0).records == 15

    _once(hooks, "control.before_materialize", others)
    helper = _records("h")
    with _writer(config) as h:
        assert h.append(T, 0, helper).start_offset == 16
    assert _entries(config) == [(COMPACTED, 1, 10), (COMPACTED, 11, 15), (WAL, 16, 20)]
    _settled(config, first + killed + helper2 + helper)


def _others_run_past_the_pause(config, records: list[bytes], paused_clock: ShiftedClock) -> None:
    """While an actor is paused: another writer appends ``records``, a compactor takes offsets
    1..15, then ``G + 1`` s pass for the paused actor and for a GC pass: past its budget ``D``,
    and long enough for GC to collect the blobs nothing references any more."""
    with _writer(config) as other:
        other.append(T, 0, records)
    with Compactor(config, clock=past_the_lag()) as compactor:
        assert compactor.compact_partition(T, 0).records == 15
    pause_s = config.gc_grace_ms / 1000 + 1
    _gc_later(config, pause_s)
    paused_clock.advance(pause_s)


def test_4_a_writer_stalled_past_its_budget_does_not_recreate_a_deleted_key(config, writer, hooks, caplog):
    """B: compaction deleted W's key as a lower key of a longer run and GC collected W's blob.
    A create-if-absent alone would re-create the key; the budget D stops it."""
    first, late, helper = _records("a"), _records("w"), _records("h")
    writer.append(T, 0, first)
    w_clock = ShiftedClock()
    _once(hooks, "writer.after_reserve", lambda: _others_run_past_the_pause(config, helper, w_clock))
    with _writer(config, w_clock) as w:
        result = w.append(T, 0, late)
    assert (result.start_offset, result.end_offset) == (6, 10)
    assert _entries(config) == [(COMPACTED, 1, 15)]
    assert TRIPWIRE not in caplog.text  # W never created the key (the tripwire would have removed it)
    _settled(config, first + late + helper)


def test_5_a_helper_stalled_past_its_budget_does_not_recreate_a_deleted_key(config, writer, hooks, caplog):
    """B, with the stalled actor a helper: it re-reads control and finds the append finished.
    Its own append's blob is as old as its pause now (past G/2): refused, nothing reserved."""
    first = _records("a")
    writer.append(T, 0, first)
    killed = _killed_writer(config, "k", "writer.after_reserve")
    helper2, helper = _records("h2"), _records("h")
    h_clock = ShiftedClock()
    # The killed writer's blob and H's own are collected.
    _once(hooks, "control.before_materialize", lambda: _others_run_past_the_pause(config, helper2, h_clock))
    with _writer(config, h_clock) as h, pytest.raises(StaleBlob, match="upload the records again"):
        h.append(T, 0, helper)
    assert _entries(config) == [(COMPACTED, 1, 15)]
    assert TRIPWIRE not in caplog.text
    _settled(config, first + killed + helper2)


# --- 6 to 8: the lag, the budget, a create whose reply was lost ----------------------------------


def test_6_entries_younger_than_the_lag_stay_and_a_writer_within_its_budget_finds_its_key(config, writer, hooks,
                                                                                            caplog):
    first, late, helper = _records("a"), _records("w"), _records("h")
    writer.append(T, 0, first)
    with Compactor(config) as compactor:  # the real clock: nothing is older than G
        assert compactor.compact_partition(T, 0).compactions == 0

    def others():
        with _writer(config) as h:
            h.append(T, 0, helper)  # materializes W's entry

    _once(hooks, "writer.after_reserve", others)
    with _writer(config) as w:
        assert w.append(T, 0, late).start_offset == 6  # within D: its create finds the key
    with Compactor(config) as compactor:
        assert compactor.compact_partition(T, 0).compactions == 0
    assert _entries(config) == [(WAL, 1, 5), (WAL, 6, 10), (WAL, 11, 15)]
    assert TRIPWIRE not in caplog.text
    _settled(config, first + late + helper)


def test_7_a_writer_past_its_budget_with_its_pending_still_set_materializes_after_reading_again(config, hooks,
                                                                                                 caplog):
    clock = ShiftedClock()
    _once(hooks, "writer.after_reserve", lambda: clock.advance(0.3 * config.gc_grace_ms / 1000))
    records = _records("w")
    caplog.set_level(logging.INFO, logger="llog.control")
    with _writer(config, clock) as w:
        assert w.append(T, 0, records).end_offset == 5
        assert read_control(w.coordination, w.keys(T, 0)).record.pending is None
    assert "materialization budget" in caplog.text
    assert _entries(config) == [(WAL, 1, 5)]
    _settled(config, records)


class _LostReply(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def __str__(self):
        return "injected: the reply of a write that landed was lost"


def test_8_a_create_whose_first_attempt_landed_counts_as_materialized(config):
    with _writer(config) as w:
        w.append(T, 0, _records("a"))
        send, lost = w.coordination._send_puts, []

        def lose_the_reply_of_the_first_create(shard, requests):
            results = send(shard, requests)
            if not lost and any(r.expected_version_id == oxia.EXPECTED_RECORD_DOES_NOT_EXIST for r in requests):
                lost.append(requests[0].key)
                raise _LostReply()
            return results

        w.coordination._send_puts = lose_the_reply_of_the_first_create
        result = w.append(T, 0, _records("b"))
    assert lost == [w.keys(T, 0).index(10)]
    assert (result.start_offset, result.end_offset) == (6, 10)
    assert _entries(config) == [(WAL, 1, 5), (WAL, 6, 10)]
    _settled(config, _records("a") + _records("b"))


def test_the_tripwire_deletes_a_create_that_landed_behind_the_cursor(config, writer, caplog):
    """Section 8: if the timing assumption is broken anyway and a create of a compacted-away
    key lands, the creator deletes it again (at the version it created) and logs an error."""
    records = _records("a") + _records("b")
    writer.append(T, 0, records[:5])
    writer.append(T, 0, records[5:])
    keys, coordination = writer.keys(T, 0), writer.coordination
    wal_entry = coordination.get(keys.index(5), keys.partition_key).value
    with Compactor(config, clock=past_the_lag()) as compactor:
        assert compactor.compact_partition(T, 0).records == 10
    late = coordination.put(keys.index(5), wal_entry, keys.partition_key, oxia.EXPECTED_RECORD_DOES_NOT_EXIST)
    with pytest.raises(AssertionError, match="overlaps"):
        _entries(config)  # the partition is broken until the tripwire acts
    # Key 10 is behind the cursor too, but at another version (compaction's entry): left alone.
    assert tripwire(coordination, [Created(keys, 5, late), Created(keys, 10, late)]) == 1
    assert TRIPWIRE in caplog.text
    assert _entries(config) == [(COMPACTED, 1, 10)]
    _settled(config, records)


# --- related holes: late references to a collected blob, a stale compaction record ---------------


def test_a_compactor_stalled_after_its_age_check_does_not_reference_a_collected_blob(config, writer, hooks):
    records = _records("a") + _records("b")
    writer.append(T, 0, records[:5])
    writer.append(T, 0, records[5:])
    clock = past_the_lag()

    def stall():
        _gc_later(config)  # collects the compacted blob: nothing references it yet
        clock.advance(config.gc_grace_ms / 1000)

    _once(hooks, "compactor.after_age_check", stall)
    with Compactor(config, clock=clock) as compactor, pytest.raises(StaleBlob, match="left for GC"):
        compactor.compact_partition(T, 0)
    assert _entries(config) == [(WAL, 1, 5), (WAL, 6, 10)]
    _settled(config, records)


def test_a_writer_stalled_before_its_reserving_cas_does_not_reference_a_collected_blob(config, writer, hooks):
    first = _records("a")
    writer.append(T, 0, first)
    clock = ShiftedClock()

    def stall():
        _gc_later(config)  # collects W's blob: nothing references it yet
        clock.advance(config.gc_grace_ms / 1000)

    _once(hooks, "writer.before_reserve_cas", stall)
    with _writer(config, clock) as w, pytest.raises(StaleBlob, match="upload the records again"):
        w.append(T, 0, _records("lost"))
    with LogReader(config) as reader:
        assert reader.high_watermark(T, 0) == 5  # nothing reserved, nothing acknowledged
    _settled(config, first)


def test_a_compactor_stalled_past_its_claim_leaves_no_record_that_wedges_the_partition(config, writer, hooks):
    records = _records("a") + _records("b") + _records("c")
    for i in range(0, 15, 5):
        writer.append(T, 0, records[i:i + 5])
    keys = writer.keys(T, 0)

    def claim_expires_and_another_compacts(records: int):
        def hook():
            writer.coordination.delete(keys.compactor_claim, keys.partition_key)  # as when its session expires
            with Compactor(config, clock=past_the_lag()) as other:
                assert other.compact_partition(T, 0).records == records
        return hook

    # The stalled compactor goes on with its run 1..10: its record is created (the key is
    # absent), its index CAS fails, and it deletes the record again.
    _once(hooks, "compactor.after_select", claim_expires_and_another_compacts(15))
    with Compactor(config, clock=past_the_lag(), max_offsets=10) as stalled:
        assert stalled.compact_partition(T, 0).compactions == 0
    assert writer.coordination.get(keys.compaction, keys.partition_key) is None

    # Had it died right after creating that record, the next compactor deletes it (its run
    # starts below the cursor) instead of resuming it, and compacts on.
    more = _records("d")
    writer.append(T, 0, more)
    _once(hooks, "compactor.after_select", claim_expires_and_another_compacts(5))

    def die():
        raise SystemExit("killed after creating its record")

    _once(hooks, "compactor.after_record_create", die)
    with Compactor(config, clock=past_the_lag(), max_offsets=10) as stalled, pytest.raises(SystemExit):
        stalled.compact_partition(T, 0)
    stale = writer.coordination.get(keys.compaction, keys.partition_key)
    assert stale is not None and CompactionRecord.from_json(stale.value).start_offset == 16
    with Compactor(config, clock=past_the_lag()) as next_one:
        done = next_one.compact_partition(T, 0)
    assert (done.recoveries, done.compactions) == (1, 0)  # deleted the stale record; 16..20 was done
    writer.append(T, 0, _records("e"))
    with Compactor(config, clock=past_the_lag()) as next_one:
        assert next_one.compact_partition(T, 0).records == 5  # not wedged
    assert _entries(config) == [(COMPACTED, 1, 15), (COMPACTED, 16, 20), (COMPACTED, 21, 25)]
    _settled(config, records + more + _records("e"))
