"""A compaction whose selection the cursor passed (docs/protocol.md section 6, steps 0 and 3): a
compactor that stalled past its claim after selecting a run, while another compacted from the same
cursor, finds the cursor past its run's start (and above ``S``) once its record exists, and leaves
the run (step 3); a record left by a compactor that died before that check is stale and deleted by
the next compactor's step 0, not resumed. Otherwise its COMPACTED entry, starting below a run
selected meanwhile, would be deleted by that run's step 5 with the only cover of its first offsets
(review-a F1: the resumed variant against v1.3's first draft, the live one also against 12c6307)."""

from __future__ import annotations

import json
import threading
import time

from llog.clock import ShiftedClock
from llog.compactor import Compactor
from llog.gc import gc_pass
from llog.topics import create_topic
from tests.helpers.invariants import check_partition
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


def _z_stalls_past_its_claim(config, writer, hooks, z_dies: bool = False, a_selects: bool = True):
    """Z (max 20 offsets) selected 1..20 at cursor 1 and stalls past its claim; B (max 10) compacts
    1..10 (cursor 11); with ``a_selects``, A selects 11..30 and writes its blob. Then Z goes on: it
    creates its record and dies there (``z_dies``, before anything after the create) or goes on;
    then A goes on."""
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
        elif stage["who"] == "A":  # A selected 11..30 and wrote its blob: now Z goes on
            z_go.set()
            z_thread.join(60)

    def after_record_create():
        if z_dies and threading.current_thread().name == "Z":
            raise RuntimeError("compactor Z dies after creating its record")

    def z_run():
        try:  # its deadline passes while it stalls: one compaction, then it stops
            z.compact_partition(T, 0, deadline=time.monotonic() + 0.5)
        except BaseException as e:  # noqa: BLE001 - e.g. releasing a claim it no longer holds
            z_error.append(e)

    def after_cursor_move():
        if stage["who"] == "B" and threading.current_thread().name != "Z":
            time.sleep(0.4)  # past B's deadline: B does 1..10 only

    hooks["compactor.after_age_check"] = after_age_check
    hooks["compactor.after_record_create"] = after_record_create
    hooks["compactor.after_cursor_move"] = after_cursor_move
    z_thread = threading.Thread(target=z_run, name="Z")
    z_thread.start()
    assert z_paused.wait(60)
    time.sleep(0.6)
    writer.coordination.delete(keys.compactor_claim, keys.partition_key)  # Z's session expired
    stage["who"] = "B"
    assert b.compact_partition(T, 0, deadline=time.monotonic() + 0.3).compactions == 1  # 1..10 only
    assert _shape(writer, keys) == [("COMPACTED", 1, 10), ("WAL", 11, 20), ("WAL", 21, 30)]
    if a_selects:
        stage["who"] = "A"
        a.compact_partition(T, 0, deadline=time.monotonic() + 0.1)
    else:
        z_go.set()
        z_thread.join(60)
    hooks.clear()
    assert not z_thread.is_alive()
    assert [str(e) for e in z_error] == (["compactor Z dies after creating its record"] if z_dies else [])
    for c in (z, a, b):
        c.close()
    return keys


def test_a_stale_record_below_the_cursor_is_deleted_not_resumed(config, writer, reader, hooks):
    """Z died between creating its record 1..20 and its own check of the cursor (section 6 step 3),
    which B had moved to 11. The next compactor's step 0 applies the same rule: the record starts
    below the cursor and its step 4 has not landed, so it is stale and deleted, not resumed (a
    resumed record of a run the cursor passed is what step 3 refuses: its COMPACTED entry could
    start below a run selected meanwhile, whose step 5 would delete it)."""
    keys = _z_stalls_past_its_claim(config, writer, hooks, z_dies=True, a_selects=False)
    record = json.loads(writer.coordination.get(keys.compaction, keys.partition_key).value)
    assert (record["start_offset"], record["end_offset"]) == (1, 20)
    with _compactor(writer, config, "C", 1000) as c:
        done = c.compact_partition(T, 0)
    assert (done.recoveries, done.resumed_compactions, done.compactions) == (1, 0, 1)
    assert _shape(writer, keys) == [("COMPACTED", 1, 10), ("COMPACTED", 11, 30)]
    assert writer.coordination.get(keys.compaction, keys.partition_key) is None
    assert [r.value for r in reader.read_range(T, 0, 1)] == _values(1, 30)


def test_a_compactor_whose_selection_the_cursor_passed_leaves_its_run(config, writer, reader, hooks):
    """Review-a F1, live: Z selected 1..20 at cursor 1 and stalled past its claim; B compacted 1..10
    (cursor 11) and A selected 11..30. Z, back, creates its record and finds the cursor past its
    start and above S: it deletes its record and leaves (section 6 step 3). On 12c6307 and 3af78e8
    Z finished 1..20 (index/10 deleted, cursor 21) and A's step 5 then deleted index/20, Z's
    COMPACTED 1..20, the only entry covering 1..10: acknowledged records lost, GC stopped."""
    keys = _z_stalls_past_its_claim(config, writer, hooks)
    shape = _shape(writer, keys)
    assert shape == [("COMPACTED", 1, 10), ("COMPACTED", 11, 30)], (
        f"offsets 1..10 (acknowledged, S = 1) lost: index is {shape}")
    assert writer.coordination.get(keys.compaction, keys.partition_key) is None
    snapshot = check_partition(writer.coordination, config.root_prefix, T, 0)
    assert (snapshot.log_start_offset, snapshot.cursor) == (1, 31)
    assert [r.value for r in reader.read_range(T, 0, 1)] == _values(1, 30)
    # GC goes on (3af78e8: "no index entry covers offsets 1..10; garbage collection stops").
    gc_pass(writer.coordination, writer.objects, config.root_prefix, config.gc_grace_ms, clock=ShiftedClock(AHEAD_S))
    assert [r.value for r in reader.read_range(T, 0, 1)] == _values(1, 30)
