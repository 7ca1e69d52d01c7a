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
"""

from __future__ import annotations

import json

import pytest

from llog import failpoints
from llog.clock import ShiftedClock
from llog.compactor import Compactor
from llog.errors import OffsetOutOfRange
from llog.gc import gc_pass
from llog.records import COMPACTED
from llog.topics import alter_topic
from tests.helpers.invariants import check_partition
from tests.helpers.retention import three_entries_retaining_two, index_entries

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
    return three_entries_retaining_two(writer, config.root_prefix, T)


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
