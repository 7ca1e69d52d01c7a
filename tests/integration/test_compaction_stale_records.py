"""Compaction step 0 and a stale ``meta/compaction`` record (docs/protocol.md section 6.0): a
record whose run starts below the cursor and whose step 4 has not landed is deleted, not resumed,
so it cannot swap in a run whose lower keys now hold another compactor's COMPACTED entry that
starts below it (found by an adversarial review of v1.3's first draft, which resumed every record)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from llog.clock import ShiftedClock
from llog.compactor import Compactor
from llog.topics import create_topic
from tests.helpers.retention import current_keys, index_entries

T = "stale-rec"
AHEAD_S = 3600  # the compactors' clock: every entry written now is older than G


def _values(first: int, last: int) -> list[bytes]:
    return [f"r{n}".encode() for n in range(first, last + 1)]


def _compactor(writer, config, name: str, max_offsets: int) -> Compactor:
    return Compactor(config, writer.coordination, writer.objects, compactor_id=name, max_offsets=max_offsets,
                     clock=ShiftedClock(AHEAD_S))


def _shape(writer, keys):
    return [(e.entry.type, e.start_offset, e.end_offset) for e in index_entries(writer.coordination, keys)]


def _stale_z_then_a(config, writer, hooks, a_dies: bool):
    """Z (stale) selected 1..20 at cursor 1 and stalls past its claim; B compacts 1..10 (cursor 11);
    A selects 11..30 at cursor 11; Z then finishes 1..20 (deleting B's index/10, cursor 21); then A
    creates its record 11..30, and either dies (a_dies) or goes on."""
    create_topic(writer.coordination, config.root_prefix, T, 1)
    for first in (1, 11, 21):
        writer.append(T, 0, _values(first, first + 9))
    keys = current_keys(writer.coordination, config.root_prefix, T, 0)
    z, b, a = (_compactor(writer, config, "Z", 20), _compactor(writer, config, "B", 10),
               _compactor(writer, config, "A", 20))
    z_paused, z_go = threading.Event(), threading.Event()
    stage = {"who": "Z"}
    z_error: list[BaseException] = []

    def after_age_check():
        if threading.current_thread().name == "Z":
            z_paused.set()
            assert z_go.wait(60)
        elif stage["who"] == "A":  # A selected 11..30 and wrote its blob: now Z finishes 1..20
            z_go.set()
            z_thread.join(60)

    def z_run():
        try:  # its deadline passes while it stalls: one compaction, then it stops
            z.compact_partition(T, 0, deadline=time.monotonic() + 0.5)
        except BaseException as e:  # noqa: BLE001 - e.g. releasing a claim it no longer holds
            z_error.append(e)

    def after_cursor_move():
        if stage["who"] == "B" and threading.current_thread().name != "Z":
            time.sleep(0.4)  # past B's deadline: B does 1..10 only

    hooks["compactor.after_age_check"] = after_age_check
    hooks["compactor.after_cursor_move"] = after_cursor_move
    z_thread = threading.Thread(target=z_run, name="Z")
    z_thread.start()
    assert z_paused.wait(60)
    time.sleep(0.6)
    writer.coordination.delete(keys.compactor_claim, keys.partition_key)  # Z's session expired
    stage["who"] = "B"
    assert b.compact_partition(T, 0, deadline=time.monotonic() + 0.3).compactions == 1  # 1..10 only
    assert _shape(writer, keys) == [("COMPACTED", 1, 10), ("WAL", 11, 20), ("WAL", 21, 30)]
    stage["who"] = "A"
    if a_dies:
        def die():
            if threading.current_thread().name == "Z":
                return
            raise RuntimeError("compactor A dies after creating its record")
        hooks["compactor.after_record_create"] = die
        with pytest.raises(RuntimeError, match="A dies"):
            a.compact_partition(T, 0)
    else:
        a.compact_partition(T, 0, deadline=time.monotonic() + 0.1)
    hooks.clear()
    assert not z_thread.is_alive()
    for c in (z, a, b):
        c.close()
    return keys


def test_a_stale_record_below_the_cursor_is_deleted_and_the_entry_below_its_run_kept(config, writer, reader, hooks):
    """A's record 11..30 is below the cursor 21 that Z moved, and its step 4 never landed: the next
    compactor deletes it (v1.2's rule) instead of resuming it, whose step 5 would delete index/20,
    Z's COMPACTED 1..20, the only entry covering 1..10 (S = 1)."""
    keys = _stale_z_then_a(config, writer, hooks, a_dies=True)
    record = json.loads(writer.coordination.get(keys.compaction, keys.partition_key).value)
    assert (record["start_offset"], record["end_offset"]) == (11, 30)
    assert _shape(writer, keys) == [("COMPACTED", 1, 20), ("WAL", 21, 30)]
    with _compactor(writer, config, "C", 1000) as c:
        c.compact_partition(T, 0)
    shape = _shape(writer, keys)
    assert shape[0][1] == 1, f"offsets 1..10 (acknowledged, S = 1) lost: index is {shape}"
    assert writer.coordination.get(keys.compaction, keys.partition_key) is None
    assert [r.value for r in reader.read_range(T, 0, 1)] == _values(1, 30)
