"""A COMPACTED entry that starts below the log start (docs/protocol.md sections 6 and 10.3).

A compaction and a retention pass of one partition never run together while both hold the
claim; a compactor (or a pass) that stalls past its claim still finishes its steps. A compactor
stalled after selecting run 1..30 finishes it across a retention cut at 11 made meanwhile, or a
pass stalled after choosing the cut 11 moves the log start after another compactor compacted
1..30: either way the partition holds one COMPACTED entry 1..30 with ``S = 11``. That shape is
allowed at rest: readers read from ``S`` (nothing below it), the next retention pass takes the
entry whole or keeps it, compaction goes on past it, GC counts it as a reference; and a
compactor that finds the record of such a run left midway finishes it rather than dropping it
as stale.

Runs that overlap (section 6): a compactor stalled after selecting 1..20 finishes it after
others compacted 1..10 and selected 11..30; the later run's step 5 keeps the stalled one's
COMPACTED 1..20 (it starts below the run, and is the only cover of 1..10), whether that run goes
on or its record is resumed by the next compactor's step 0. Two COMPACTED entries then overlap
at rest, which readers, GC, retention and the oracle accept.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace

import pytest

from llog import failpoints
from llog.clock import ShiftedClock
from llog.compactor import Compactor
from llog.errors import InconsistentReadState, OffsetOutOfRange
from llog.gc import gc_pass
from llog.records import COMPACTED, WAL, IndexEntry
from llog.topics import alter_topic, create_topic
from tests.helpers.invariants import check_partition
from tests.helpers.retention import current_keys, index_entries

T = "straddled"
#: The compactors' clock runs this far ahead: every entry written now is older than G.
AHEAD_S = 3600


def _compactor(writer, config, name: str) -> Compactor:
    return Compactor(config, writer.coordination, writer.objects, compactor_id=name, clock=ShiftedClock(AHEAD_S))


def _values(first: int, last: int) -> list[bytes]:
    return [f"r{n}".encode() for n in range(first, last + 1)]


@pytest.fixture
def three_entries(config, writer):
    """``T`` with entries 1..10, 11..20, 21..30, and ``retention.bytes`` that drops exactly the first."""
    create_topic(writer.coordination, config.root_prefix, T, 1)
    for first in (1, 11, 21):
        writer.append(T, 0, _values(first, first + 9))
    keys = current_keys(writer.coordination, config.root_prefix, T, 0)
    size = index_entries(writer.coordination, keys)[0].entry.byte_length
    alter_topic(writer.coordination, config.root_prefix, T, set_config={"retention.bytes": 2 * size})
    return keys


def _claim_lost(writer, keys) -> None:
    """What a session expiring during a long stall does: the claim key goes."""
    writer.coordination.delete(keys.compactor_claim, keys.partition_key)


def _assert_straddle_is_sound(config, writer, reader, keys) -> None:
    """One COMPACTED entry 1..30 with S = 11 and the cursor past it: the oracle accepts it, reads
    from S are right and nothing below S is returned, GC keeps its blob, the next retention pass
    drops it whole, and compaction goes on after it."""
    entries = index_entries(writer.coordination, keys)
    assert [(e.entry.type, e.start_offset, e.end_offset) for e in entries] == [(COMPACTED, 1, 30)]
    snapshot = check_partition(writer.coordination, config.root_prefix, T, 0)
    assert (snapshot.log_start_offset, snapshot.cursor) == (11, 31)
    assert [r.value for r in reader.read_range(T, 0, 11)] == _values(11, 30)
    with pytest.raises(OffsetOutOfRange) as below:
        reader.read_range(T, 0, 5, 12)
    assert below.value.below_start and below.value.log_start_offset == 11
    gc_pass(writer.coordination, writer.objects, config.root_prefix, config.gc_grace_ms, clock=ShiftedClock(AHEAD_S))
    assert [r.value for r in reader.read_range(T, 0, 11)] == _values(11, 30)  # its blob was kept

    writer.append(T, 0, _values(31, 40))
    writer.append(T, 0, _values(41, 50))
    size = index_entries(writer.coordination, keys)[-1].entry.byte_length  # of 41..50 (31..40's is the same)
    alter_topic(writer.coordination, config.root_prefix, T, set_config={"retention.bytes": size + 1})
    with _compactor(writer, config, "next") as compactor:
        done = compactor.compact_partition(T, 0, retention=True)
    # The size rule drops the straddling entry whole (its own bytes never decide), keeps 31..50.
    assert done.log_start_offset == 31 and done.retention_records == 20
    snapshot = check_partition(writer.coordination, config.root_prefix, T, 0)
    assert (snapshot.log_start_offset, snapshot.cursor) == (31, 51)
    assert [(e.entry.type, e.start_offset, e.end_offset) for e in snapshot.entries] == [(COMPACTED, 31, 50)]
    assert [r.value for r in reader.read_range(T, 0, 31)] == _values(31, 50)


def test_a_compactor_stalled_across_a_retention_cut_leaves_a_sound_straddle(config, writer, reader, hooks,
                                                                            three_entries):
    keys = three_entries
    a, b = _compactor(writer, config, "A"), _compactor(writer, config, "B")

    def stall() -> None:  # A selected 1..30 and wrote its blob; meanwhile B's retention pass
        hooks.pop("compactor.after_age_check")
        _claim_lost(writer, keys)
        assert b.retain_partition(T, 0).log_start_offset == 11

    hooks["compactor.after_age_check"] = stall
    done = a.compact_partition(T, 0)
    assert "compactor.after_age_check" not in hooks and done.compactions == 1
    a.close(), b.close()
    _assert_straddle_is_sound(config, writer, reader, keys)


def test_a_retention_pass_stalled_across_a_compaction_leaves_a_sound_straddle(config, writer, reader, hooks,
                                                                              three_entries):
    keys = three_entries
    a, b = _compactor(writer, config, "A"), _compactor(writer, config, "B")

    def stall() -> None:  # B chose to cut at 11; meanwhile A compacts 1..30
        hooks.pop("retention.before_control_update")
        _claim_lost(writer, keys)
        assert a.compact_partition(T, 0).compactions == 1

    hooks["retention.before_control_update"] = stall
    assert b.retain_partition(T, 0).log_start_offset == 11
    assert "retention.before_control_update" not in hooks
    a.close(), b.close()
    _assert_straddle_is_sound(config, writer, reader, keys)


def test_a_compaction_left_midway_across_a_retention_cut_is_finished_not_dropped(config, writer, reader, hooks,
                                                                                three_entries):
    """A swapped ``index/30`` to its COMPACTED 1..30 after B's pass moved S and the cursor to 11,
    and died before dropping the keys below. Its record starts below the cursor; the next
    compactor finishes it (on 1.2 it deleted the record as stale, compacted 11..20 again over
    the COMPACTED entry, and never got past 30 again)."""
    keys = three_entries
    a, b = _compactor(writer, config, "A"), _compactor(writer, config, "B")

    def stall() -> None:
        hooks.pop("compactor.after_age_check")
        _claim_lost(writer, keys)
        b.retain_partition(T, 0)

    def die() -> None:
        raise RuntimeError("compactor A dies after its step 4")

    hooks["compactor.after_age_check"] = stall
    hooks["compactor.after_index_overwrite"] = die
    with pytest.raises(RuntimeError, match="dies after its step 4"):
        a.compact_partition(T, 0)
    hooks.clear()
    record = json.loads(writer.coordination.get(keys.compaction, keys.partition_key).value)
    assert (record["start_offset"], record["end_offset"]) == (1, 30)
    writer.append(T, 0, _values(31, 40))
    with _compactor(writer, config, "C") as c:
        done = c.compact_partition(T, 0)
    assert done.recoveries == 1 and done.compactions == 1
    snapshot = check_partition(writer.coordination, config.root_prefix, T, 0)
    assert [(e.entry.type, e.start_offset, e.end_offset) for e in snapshot.entries] == [
        (COMPACTED, 1, 30), (COMPACTED, 31, 40)]
    assert (snapshot.log_start_offset, snapshot.cursor) == (11, 41)
    assert [r.value for r in reader.read_range(T, 0, 11)] == _values(11, 40)
    a.close(), b.close()


def test_the_oracle_still_refuses_an_entry_below_the_start_that_is_not_compacted(config, writer, three_entries):
    """Only a COMPACTED entry may start below S, and only the first: a WAL entry there is a
    retention pass's cut inside an entry, which never happens."""
    keys = three_entries
    control = json.loads(writer.coordination.get(keys.control, keys.partition_key).value)
    found = writer.coordination.get(keys.control, keys.partition_key)
    writer.coordination.put(keys.control, json.dumps({**control, "log_start_offset": 15}).encode(),
                            keys.partition_key, expected_version=found.version_id)
    writer.coordination.put(keys.compaction_cursor, b'{"offset":15}', keys.partition_key)
    writer.coordination.delete(keys.index(10), keys.partition_key)  # S = 15 inside the WAL entry 11..20
    with pytest.raises(AssertionError, match="entry 11..20 overlaps offset 14"):
        check_partition(writer.coordination, config.root_prefix, T, 0)
    assert not failpoints.hooks


# --- A stale compactor's COMPACTED entry that starts below a later run (section 6 step 5) -------

OVERTAKEN = "overtaken"


def _limited_compactor(writer, config, name: str, max_offsets: int) -> Compactor:
    return Compactor(config, writer.coordination, writer.objects, compactor_id=name, max_offsets=max_offsets,
                     clock=ShiftedClock(AHEAD_S))


def _shape(writer, keys) -> list[tuple[str, int, int]]:
    return [(e.entry.type, e.start_offset, e.end_offset) for e in index_entries(writer.coordination, keys)]


def _stale_run_lands_below_a_later_run(config, writer, hooks, later_dies: bool = False):
    """Entries 1..10, 11..20, 21..30, S = 1. Z selects 1..20 at cursor 1 and stalls past its
    claim; B compacts 1..10 (cursor 11); A selects 11..30 at cursor 11 and writes its blob; then
    Z finishes 1..20 (B's ``index/10`` deleted, cursor 21; Z's record is gone before A can create
    its own); A goes on, or (``later_dies``) dies after creating its record, leaving it for the
    next compactor's step 0. Z's COMPACTED 1..20 is then the only entry covering 1..10, and it
    lies in A's range 11..30."""
    create_topic(writer.coordination, config.root_prefix, OVERTAKEN, 1)
    for first in (1, 11, 21):
        writer.append(OVERTAKEN, 0, _values(first, first + 9))
    keys = current_keys(writer.coordination, config.root_prefix, OVERTAKEN, 0)
    z, b, a = (_limited_compactor(writer, config, "Z", 20), _limited_compactor(writer, config, "B", 10),
               _limited_compactor(writer, config, "A", 20))
    z_paused, z_go = threading.Event(), threading.Event()
    stage = {"who": "Z"}
    z_errors: list[BaseException] = []

    def after_age_check() -> None:
        if threading.current_thread().name == "Z":
            z_paused.set()
            assert z_go.wait(60)
        elif stage["who"] == "A":  # A selected 11..30 and wrote its blob: now Z finishes 1..20
            z_go.set()
            z_thread.join(60)

    def z_run() -> None:
        try:  # its deadline passes while it stalls: one compaction, then it stops
            z.compact_partition(OVERTAKEN, 0, deadline=time.monotonic() + 0.5)
        except BaseException as e:  # noqa: BLE001 - reported below
            z_errors.append(e)

    def after_cursor_move() -> None:
        if stage["who"] == "B" and threading.current_thread().name != "Z":
            time.sleep(0.4)  # past B's deadline: B compacts 1..10 only

    hooks["compactor.after_age_check"] = after_age_check
    hooks["compactor.after_cursor_move"] = after_cursor_move
    z_thread = threading.Thread(target=z_run, name="Z")
    z_thread.start()
    assert z_paused.wait(60)
    time.sleep(0.6)
    _claim_lost(writer, keys)  # Z's session expired during its stall
    stage["who"] = "B"
    assert b.compact_partition(OVERTAKEN, 0, deadline=time.monotonic() + 0.3).compactions == 1
    assert _shape(writer, keys) == [(COMPACTED, 1, 10), (WAL, 11, 20), (WAL, 21, 30)]
    stage["who"] = "A"
    if later_dies:
        def die() -> None:
            if threading.current_thread().name != "Z":
                raise RuntimeError("compactor A dies after creating its record")

        hooks["compactor.after_record_create"] = die
        with pytest.raises(RuntimeError, match="A dies"):
            a.compact_partition(OVERTAKEN, 0)
    else:
        a.compact_partition(OVERTAKEN, 0, deadline=time.monotonic() + 0.1)
    hooks.clear()
    z_thread.join(60)
    assert not z_thread.is_alive() and not z_errors, z_errors
    for c in (z, a, b):
        c.close()
    return keys


def _assert_overlap_is_sound(config, writer, reader, keys) -> None:
    """Z's COMPACTED 1..20 kept, A's COMPACTED 11..30 after it: the oracle accepts the overlap,
    every offset reads back, GC runs and keeps both blobs, and a retention pass that drops the
    first entry leaves the second across the new log start."""
    shape = _shape(writer, keys)
    assert shape and shape[0][1] == 1, f"offsets 1..10 (acknowledged, S = 1) lost: index is {shape}"
    assert shape == [(COMPACTED, 1, 20), (COMPACTED, 11, 30)]
    snapshot = check_partition(writer.coordination, config.root_prefix, OVERTAKEN, 0)
    assert (snapshot.log_start_offset, snapshot.cursor) == (1, 31)
    assert [r.value for r in reader.read_range(OVERTAKEN, 0, 1)] == _values(1, 30)
    try:
        gc_pass(writer.coordination, writer.objects, config.root_prefix, config.gc_grace_ms,
                clock=ShiftedClock(AHEAD_S))
    except InconsistentReadState as e:
        pytest.fail(f"GC pass refused: {e}")
    assert [r.value for r in reader.read_range(OVERTAKEN, 0, 1)] == _values(1, 30)  # both blobs kept

    writer.append(OVERTAKEN, 0, _values(31, 40))
    size = index_entries(writer.coordination, keys)[-1].entry.byte_length
    alter_topic(writer.coordination, config.root_prefix, OVERTAKEN, set_config={"retention.bytes": size + 1})
    with _compactor(writer, config, "next") as compactor:  # a deadline already passed: retention only
        done = compactor.compact_partition(OVERTAKEN, 0, retention=True, deadline=time.monotonic())
    assert done.log_start_offset == 21 and done.retention_records == 20
    snapshot = check_partition(writer.coordination, config.root_prefix, OVERTAKEN, 0)
    assert [(e.entry.type, e.start_offset, e.end_offset) for e in snapshot.entries] == [
        (COMPACTED, 11, 30), (WAL, 31, 40)]
    assert [r.value for r in reader.read_range(OVERTAKEN, 0, 21)] == _values(21, 40)


def test_a_compaction_never_deletes_an_entry_that_starts_below_its_run(config, writer, reader, hooks):
    """Step 5 deletes a key in the run's range only if its entry starts at or above the run's
    start: Z's COMPACTED 1..20 stays (on f2a79e7 A's delete_range removed it, and 1..10 with it)."""
    keys = _stale_run_lands_below_a_later_run(config, writer, hooks)
    _assert_overlap_is_sound(config, writer, reader, keys)


def test_a_resumed_record_below_the_cursor_keeps_the_entry_below_its_run(config, writer, reader, hooks):
    """Step 0 resumes A's record 11..30 although the cursor (21, moved by Z) passed its start;
    its step 5 leaves Z's COMPACTED 1..20 alone."""
    keys = _stale_run_lands_below_a_later_run(config, writer, hooks, later_dies=True)
    record = json.loads(writer.coordination.get(keys.compaction, keys.partition_key).value)
    assert (record["start_offset"], record["end_offset"]) == (11, 30)
    assert _shape(writer, keys) == [(COMPACTED, 1, 20), (WAL, 21, 30)]
    with _compactor(writer, config, "C") as c:
        assert c.compact_partition(OVERTAKEN, 0).resumed_compactions == 1
    assert writer.coordination.get(keys.compaction, keys.partition_key) is None
    _assert_overlap_is_sound(config, writer, reader, keys)


def test_the_oracle_refuses_an_overlap_other_than_two_compacted_entries_in_start_order(config, writer,
                                                                                     three_entries):
    """Only a COMPACTED entry may overlap the entry before it, and only a COMPACTED one that starts
    before it: a WAL entry never overlaps at rest, and neither entry holds the other."""
    keys, pk = three_entries, three_entries.partition_key
    wal = IndexEntry.from_json(writer.coordination.get(keys.index(10), pk).value)

    def put(end: int, entry_type: str, msg_count: int) -> None:
        fields = {"byte_offset": None, "byte_length": None} if entry_type == COMPACTED else {}
        entry = replace(wal, type=entry_type, msg_count=msg_count, **fields)
        writer.coordination.put(keys.index(end), entry.to_json(), pk)

    put(30, WAL, 20)  # a WAL entry 11..30 over the WAL entry 11..20
    with pytest.raises(AssertionError, match="entry 11..30 overlaps offset 20"):
        check_partition(writer.coordination, config.root_prefix, T, 0)
    put(20, COMPACTED, 20)  # COMPACTED 1..20 and 5..30: allowed
    writer.coordination.delete(keys.index(10), pk)
    put(30, COMPACTED, 26)
    check_partition(writer.coordination, config.root_prefix, T, 0)
    put(30, COMPACTED, 30)  # COMPACTED 1..20 and 1..30: the later one holds the earlier
    with pytest.raises(AssertionError, match="entry 1..30 overlaps offset 20"):
        check_partition(writer.coordination, config.root_prefix, T, 0)
    put(20, WAL, 10)  # a WAL entry 11..20 under a COMPACTED 5..30
    put(10, WAL, 10)
    put(30, COMPACTED, 26)
    with pytest.raises(AssertionError, match="entry 5..30 overlaps offset 20"):
        check_partition(writer.coordination, config.root_prefix, T, 0)
