"""A COMPACTED entry never lands without its ``meta/compaction`` record (docs/protocol.md section
6, steps 0, 3 and 4): otherwise its lower keys are never deleted and the cursor stays below it,
an overlap at rest that no run passes.

Three ways a stalled compactor ``X`` of run 1..30 (entries 1..10, 11..20, 21..30) got there on
0e97f59, each with a retention pass that moved the cursor into the run (``S = 11``):

- ``X`` passed its step 3 check, and its step 4 CAS was still on its way when a retention pass
  stalled since before ``X``'s claim moved the cursor to 11 and another compactor's step 0 deleted
  ``X``'s record as stale (its start below the cursor): the CAS then landed. Step 0 now deletes a
  record as stale only when the cursor is above ``S`` too, step 3's rule; here it resumes it.
- ``X`` stalled between creating its record and its check, a compactor having compacted 1..10
  since ``X``'s selection: a retention pass's step 0 deleted the record as stale (right), then
  moved ``S`` to the cursor, 11, and ``X``'s check passed. The check now ends with a CAS of the
  record at its version: it conflicts, ``X`` leaves.
- ``X``'s step 4 CAS landed and its reply was lost; before the retry, the stalled pass moved the
  cursor to 11, and the retry's conflict (its outcome unknown) made ``X`` delete its record as if
  another compactor had done the run. ``X`` now reads ``index/{end}`` again: its own entry, go on.

Review C's (against 4207a64): a step 4 that lands after its record went, sent by whoever holds a
copy of the record (its compactor, or one that resumed it at step 0); the record now keeps the
version each step 4 CASes at, and a record goes before its step 5 only after a fence of that
version:

- R1: a compactor ``Z`` leaving at step 3 deleted its record while ``Y``, which had resumed it,
  still sent its step 4: with a GC pass between, a COMPACTED entry naming a collected blob; the
  other way round (``Y``'s step 4 first), an orphan the cursor stays below.
- R2: a resumer whose step 4 lost to the record's own compactor took the real conflict for
  another compactor's run and deleted the record. Any conflict now reads the key again.
- R4: the oracle accepted a cursor below a COMPACTED entry at rest.

A step 4 CAS is held in transit by a wrapper of its compactor's own client's ``_send_puts`` (as
tests/integration/test_outcomes.py holds a Write back), the only way to stop it between its
check and the CAS it sends.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import grpc
import pytest

from llog.clock import ShiftedClock
from llog.compactor import Compactor
from llog.errors import VersionConflict
from llog.gc import gc_pass
from llog.records import COMPACTED, WAL, CompactionCursor, CompactionRecord
from tests.helpers.invariants import check_partition
from tests.helpers.retention import three_entries_retaining_two, index_entries

T = "kept"
#: Every actor's clock runs this far ahead: every entry written now is older than G.
AHEAD_S = 3600


def _values(first: int, last: int) -> list[bytes]:
    return [f"r{n}".encode() for n in range(first, last + 1)]


def _compactor(config, name: str, writer=None, max_offsets: int = 1000) -> Compactor:
    """A compactor with its own Oxia and S3 clients unless it shares ``writer``'s."""
    shared = {} if writer is None else {"coordination": writer.coordination, "objects": writer.objects}
    return Compactor(config, compactor_id=name, max_offsets=max_offsets, clock=ShiftedClock(AHEAD_S), **shared)


def _shape(writer, keys):
    return [(e.entry.type, e.start_offset, e.end_offset) for e in index_entries(writer.coordination, keys)]


def _cursor(writer, keys) -> int:
    found = writer.coordination.get(keys.compaction_cursor, keys.partition_key)
    return CompactionCursor.from_json(found.value, found.key).offset


def _claim_lost(writer, keys) -> None:
    """What a session expiring during a long stall does: the claim key goes."""
    writer.coordination.delete(keys.compactor_claim, keys.partition_key)


@pytest.fixture
def three_entries(config, writer):
    """``T`` with entries 1..10, 11..20, 21..30, and ``retention.bytes`` that drops exactly the first."""
    return three_entries_retaining_two(writer, config.root_prefix, T)


class _LostReply(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def __str__(self):
        return "injected: the reply of a write was lost"


class _InTransit:
    """Wraps ``compactor``'s own ``Coordination._send_puts`` (before its first write): the first
    Write of ``key`` runs ``before()``, is sent, runs ``after()``, and with ``lose_reply`` its
    reply is lost (the retry finds the key changed, outcome unknown). Later Writes go through."""

    def __init__(self, compactor: Compactor, key: str, before: Callable[[], None] = lambda: None,
                 after: Callable[[], None] = lambda: None, lose_reply: bool = False):
        self.key, self.before, self.after, self.lose_reply = key, before, after, lose_reply
        self.send = compactor.coordination._send_puts
        self.seen = False
        compactor.coordination._send_puts = self

    def __call__(self, shard: int, requests: list) -> list:
        if self.seen or not any(r.key == self.key for r in requests):
            return self.send(shard, requests)
        self.seen = True
        self.before()
        results = self.send(shard, requests)
        self.after()
        if self.lose_reply:
            raise _LostReply()
        return results


class _StalledRetention:
    """A retention pass (its own compactor ``R``) that chose to cut at 11 and stalls before moving
    ``S`` (docs/protocol.md section 10.3 step 3), in a thread of its own, its claim lost;
    :meth:`finish` lets it go on (``S`` and the cursor to 11, ``index/10`` deleted)."""

    def __init__(self, config, writer, keys, hooks):
        self.go, paused = threading.Event(), threading.Event()
        self.done: list = []

        def stall():
            hooks.pop("retention.before_control_update")
            paused.set()
            assert self.go.wait(60)

        hooks["retention.before_control_update"] = stall
        self.compactor = _compactor(config, "R", writer)
        self.thread = threading.Thread(target=lambda: self.done.append(self.compactor.retain_partition(T, 0)),
                                       name="R")
        self.thread.start()
        assert paused.wait(60)
        _claim_lost(writer, keys)

    def finish(self) -> None:
        self.go.set()
        self.thread.join(60)
        assert not self.thread.is_alive() and self.done[0].log_start_offset == 11
        self.compactor.close()


def _compact(compactor: Compactor) -> tuple[int | None, BaseException | None]:
    """Compactions done by one pass of ``compactor``, or the error it ended with."""
    try:
        return compactor.compact_partition(T, 0).compactions, None
    except VersionConflict as e:  # a record CAS after another compactor took the record over
        return None, e


def _assert_finished_across_the_cut(config, writer, reader, keys) -> None:
    """Run 1..30 is one COMPACTED entry with no record left, ``S = 11`` and the cursor past it, and
    compaction goes on after it."""
    shape = _shape(writer, keys)
    assert shape == [(COMPACTED, 1, 30)], f"index {shape}: a COMPACTED entry over WAL entries at rest"
    assert writer.coordination.get(keys.compaction, keys.partition_key) is None
    snapshot = check_partition(writer.coordination, config.root_prefix, T, 0)
    assert (snapshot.log_start_offset, snapshot.cursor) == (11, 31)
    assert [r.value for r in reader.read_range(T, 0, 11)] == _values(11, 30)
    writer.append(T, 0, _values(31, 40))
    with _compactor(config, "next", writer) as c:
        assert c.compact_partition(T, 0).compactions == 1
    assert _shape(writer, keys) == [(COMPACTED, 1, 30), (COMPACTED, 31, 40)]
    assert check_partition(writer.coordination, config.root_prefix, T, 0).cursor == 41


def test_a_record_whose_compactor_passed_step_3_is_resumed_when_retention_moved_the_cursor(
        config, writer, reader, hooks, three_entries):
    """X selected 1..30 at cursor 1 and passed its check; its step 4 CAS is in transit while the
    stalled pass R moves S and the cursor to 11 and Y's step 0 finds X's record. The cursor is not
    above S (no compactor passed the run): Y resumes the record and finishes it; X's CAS then
    conflicts, X finds its run's entry (Y's swap) and goes on, and its record's CAS conflicts (Y
    finished it): X leaves it to Y. On 0e97f59 Y deleted the record as stale, X's CAS landed and
    left COMPACTED 1..30 over WAL 11..20 at rest, the cursor at 11 for good."""
    keys = three_entries
    retention = _StalledRetention(config, writer, keys, hooks)
    y_did = []

    def retention_then_y():
        _claim_lost(writer, keys)  # X's session expired while it stalled
        retention.finish()
        with _compactor(config, "Y", writer) as y:
            y_did.append(y.retain_partition(T, 0))  # step 0; nothing more to drop

    with _compactor(config, "X") as x:
        _InTransit(x, keys.index(30), before=retention_then_y)
        compactions, error = _compact(x)
    _assert_finished_across_the_cut(config, writer, reader, keys)
    assert (y_did[0].recoveries, y_did[0].resumed_compactions) == (1, 1)
    assert (compactions, error) == (0, None)


def test_a_compactor_whose_record_step_0_deleted_leaves_even_if_its_check_passes(
        config, writer, reader, hooks, three_entries):
    """X selected 1..30 at cursor 1; B compacted 1..10 (cursor 11) while X stalled; X created its
    record and stalled before its check. Y's retention pass: its step 0 deletes X's record as
    stale (cursor 11 above S = 1), then it moves S to 11 = the cursor. X's check of the cursor
    alone now passes (11 is not above S); its CAS of its record conflicts, and it leaves. On 0e97f59
    X's step 4 landed with no record: COMPACTED 1..30 over WAL 11..20 at rest, the cursor at 11."""
    keys = three_entries

    def b_compacts_1_to_10():
        hooks.pop("compactor.after_age_check")
        _b_compacts_1_to_10(config, writer, keys, hooks)
        hooks["compactor.after_record_create"] = y_retention_pass  # X's, next

    y_did = []

    def y_retention_pass():
        hooks.pop("compactor.after_record_create")
        _claim_lost(writer, keys)
        with _compactor(config, "Y", writer) as y:
            y_did.append(y.retain_partition(T, 0))

    hooks["compactor.after_age_check"] = b_compacts_1_to_10
    with _compactor(config, "X") as x:
        compactions, error = _compact(x)
    assert (y_did[0].recoveries, y_did[0].resumed_compactions, y_did[0].log_start_offset) == (1, 0, 11)
    shape = _shape(writer, keys)
    assert shape == [(WAL, 11, 20), (WAL, 21, 30)], f"index {shape}: a COMPACTED entry over WAL entries at rest"
    assert (compactions, error) == (0, None)
    assert writer.coordination.get(keys.compaction, keys.partition_key) is None
    snapshot = check_partition(writer.coordination, config.root_prefix, T, 0)
    assert (snapshot.log_start_offset, snapshot.cursor) == (11, 11)
    with _compactor(config, "next", writer) as c:
        assert c.compact_partition(T, 0).compactions == 1
    assert _shape(writer, keys) == [(COMPACTED, 11, 30)]
    assert [r.value for r in reader.read_range(T, 0, 11)] == _values(11, 30)


class _BStops(Exception):
    """Ends compactor B at its second selection (nothing of that run written)."""


def test_a_step_4_whose_reply_was_lost_goes_on_when_retention_moved_the_cursor(
        config, writer, reader, hooks, three_entries):
    """X's step 4 CAS lands and its reply is lost; before the retry, the stalled pass R moves S and
    the cursor to 11. The retry's conflict has an unknown outcome: X reads index/30, finds its own
    COMPACTED entry, and goes on to steps 5 and 6. On 0e97f59 X took the conflict for another
    compactor's run (the cursor past its start) and deleted its record: COMPACTED 1..30 over WAL
    11..20 at rest, the cursor at 11 for good."""
    keys = three_entries
    retention = _StalledRetention(config, writer, keys, hooks)
    with _compactor(config, "X") as x:
        _InTransit(x, keys.index(30), after=retention.finish, lose_reply=True)
        compactions, error = _compact(x)
    _assert_finished_across_the_cut(config, writer, reader, keys)
    assert (compactions, error) == (1, None)


class _AfterStep3Read:
    """Wraps ``compactor``'s own ``Coordination.get_many``: once :meth:`arm` was called, the
    first read after the next record create (step 3's read of the cursor and ``S``) returns, then
    runs ``between()`` before the compactor acts on it (leaves, or goes on)."""

    def __init__(self, compactor: Compactor, between: Callable[[], None]):
        self.get_many, self.between, self.armed = compactor.coordination.get_many, between, False
        compactor.coordination.get_many = self

    def arm(self, hooks) -> None:
        def created():
            hooks.pop("compactor.after_record_create")
            self.armed = True

        hooks["compactor.after_record_create"] = created

    def __call__(self, *args, **kwargs):
        found = self.get_many(*args, **kwargs)
        if self.armed:
            self.armed = False
            self.between()
        return found


class _Resumer:
    """Compactor ``Y`` running step 0 alone (a deadline already passed) in a thread of its own,
    its claim lost once it is in: it resumes the record it finds, and its step 4 CAS of ``key``
    is held before it is sent (:meth:`at_cas` waits for that) until :meth:`release`; with
    ``after`` set, that runs once the CAS landed, before Y's next write."""

    def __init__(self, config, writer, keys, key: str, after: Callable[[], None] | None = None):
        self.at, self.go = threading.Event(), threading.Event()
        self.done: list = []
        self.compactor = _compactor(config, "Y")

        def hold():
            self.at.set()
            assert self.go.wait(60)

        _InTransit(self.compactor, key, before=hold, after=after or (lambda: None))

        def run():
            try:
                self.done.append(self.compactor.compact_partition(T, 0, deadline=0))
            except BaseException as e:  # noqa: BLE001 - asserted by the test
                self.done.append(e)

        self.thread = threading.Thread(target=run, name="Y")
        self.thread.start()
        assert self.at.wait(60)
        _claim_lost(writer, keys)

    def release(self):
        self.go.set()
        self.thread.join(60)
        assert not self.thread.is_alive()
        self.compactor.close()
        return self.done[0]


def _b_compacts_1_to_10(config, writer, keys, hooks) -> None:
    """The stalled compactor's claim is lost, and B (max 10) compacts 1..10 (cursor 11), one run."""
    _claim_lost(writer, keys)
    selections = []

    def stop_b_after_one_run():
        selections.append(1)
        if len(selections) == 2:
            raise _BStops()

    hooks["compactor.after_select"] = stop_b_after_one_run
    with _compactor(config, "B", writer, max_offsets=10) as b, pytest.raises(_BStops):
        b.compact_partition(T, 0)
    hooks.pop("compactor.after_select")
    assert _shape(writer, keys) == [(COMPACTED, 1, 10), (WAL, 11, 20), (WAL, 21, 30)]


def _stall_after_selecting_then_b_compacts_1_to_10(config, writer, keys, hooks, then: Callable[[], None]) -> None:
    """At Z's blob age check (Z selected 1..20 at cursor 1): Z's claim is lost, B (max 10)
    compacts 1..10 (cursor 11), then ``then()``."""
    def b_compacts():
        hooks.pop("compactor.after_age_check")
        _b_compacts_1_to_10(config, writer, keys, hooks)
        then()

    hooks["compactor.after_age_check"] = b_compacts


def test_a_leaving_compactors_run_never_lands_through_a_resumer_after_its_record_went(
        config, writer, reader, hooks, three_entries):
    """Review C, R1. Z (max 20) selects 1..20 at cursor 1 and stalls; B compacts 1..10 (cursor 11);
    a retention pass R chooses S = 11 and stalls before moving it; Z creates its record, reads the
    cursor 11 above S = 1 and will leave, but stalls; R moves S to 11; Y's step 0 resumes Z's record
    (the cursor is not above S) and its step 4 CAS of index/20 is held in transit; Z leaves (deletes
    its record); a GC pass collects Z's blob, named by nothing; Y's CAS goes out. It must not land:
    on 4207a64 it did, COMPACTED 1..20 naming a deleted blob, and offsets 11..20 (>= S) were lost.
    Z's leave now fences index/20 (the version Y's CAS names) before deleting the record."""
    keys = three_entries
    parts: dict = {}

    def retention_stalls():
        parts["retention"] = _StalledRetention(config, writer, keys, hooks)
        parts["z_read"].arm(hooks)

    def retention_then_y_resumes():
        found = writer.coordination.get(keys.compaction, keys.partition_key)
        parts["z_blob"] = CompactionRecord.from_json(found.value, found.key).data_key
        parts["retention"].finish()
        parts["y"] = _Resumer(config, writer, keys, keys.index(20))

    _stall_after_selecting_then_b_compacts_1_to_10(config, writer, keys, hooks, then=retention_stalls)
    with _compactor(config, "Z", max_offsets=20) as z:
        parts["z_read"] = _AfterStep3Read(z, between=retention_then_y_resumes)
        compactions, error = _compact(z)
    assert (compactions, error) == (0, None)
    assert writer.coordination.get(keys.compaction, keys.partition_key) is None
    gc_pass(writer.coordination, writer.objects, config.root_prefix, config.gc_grace_ms, clock=ShiftedClock(AHEAD_S))
    assert writer.objects.last_modified_ms(parts["z_blob"]) is None  # collected: nothing named it
    y_did = parts["y"].release()
    shape = _shape(writer, keys)
    try:
        got = [r.value for r in reader.read_range(T, 0, 11)]
    except Exception as e:  # noqa: BLE001 - the failure is the finding
        got = e
    assert got == _values(11, 30), f"acknowledged offsets >= S = 11 lost: index {shape}, read {got!r}, Y: {y_did!r}"
    assert shape == [(WAL, 11, 20), (WAL, 21, 30)]
    assert (y_did.recoveries, y_did.resumed_compactions) == (1, 1)
    snapshot = check_partition(writer.coordination, config.root_prefix, T, 0)
    assert (snapshot.log_start_offset, snapshot.cursor) == (11, 11)
    with _compactor(config, "next", writer) as c:
        assert c.compact_partition(T, 0).compactions == 1
    assert _shape(writer, keys) == [(COMPACTED, 11, 30)]
    assert [r.value for r in reader.read_range(T, 0, 11)] == _values(11, 30)


def test_a_leaving_compactor_finishes_its_run_when_a_resumer_swapped_it_in(
        config, writer, reader, hooks, three_entries):
    """Review C, R1 the other way round: as above, but Y's step 4 CAS lands before Z leaves (Y
    stalls before its record's CAS). Z's fence of index/20 then fails and finds its own COMPACTED
    entry: Z goes on to steps 5 and 6 instead of deleting the record. On 4207a64 Z deleted it:
    COMPACTED 1..20 at rest with the cursor at 11, below it for good (no overlap left once R
    dropped index/10, so only the cursor showed it)."""
    keys = three_entries
    parts: dict = {}

    def retention_stalls():
        parts["retention"] = _StalledRetention(config, writer, keys, hooks)
        parts["z_read"].arm(hooks)

    def y_lands_then_stalls():
        parts["y_landed"].set()
        assert parts["y_go"].wait(60)

    def retention_then_y_swaps():
        parts["retention"].finish()
        parts["y_landed"], parts["y_go"] = threading.Event(), threading.Event()
        parts["y"] = _Resumer(config, writer, keys, keys.index(20), after=y_lands_then_stalls)
        parts["y"].go.set()
        assert parts["y_landed"].wait(60)

    _stall_after_selecting_then_b_compacts_1_to_10(config, writer, keys, hooks, then=retention_stalls)
    with _compactor(config, "Z", max_offsets=20) as z:
        parts["z_read"] = _AfterStep3Read(z, between=retention_then_y_swaps)
        compactions, error = _compact(z)
    parts["y_go"].set()
    y_did = parts["y"].release()
    shape = _shape(writer, keys)
    assert writer.coordination.get(keys.compaction, keys.partition_key) is None
    # Z finished 1..20, then compacted the rest, 21..30 (on 4207a64 it stopped with its record gone).
    assert (shape, compactions, error) == ([(COMPACTED, 1, 20), (COMPACTED, 21, 30)], 2, None), (
        f"index {shape}, cursor {_cursor(writer, keys)}; Z: {(compactions, error)!r}, Y: {y_did!r}")
    assert (y_did.recoveries, y_did.resumed_compactions, y_did.compactions) == (1, 1, 0)  # Z finished it under Y
    snapshot = check_partition(writer.coordination, config.root_prefix, T, 0)
    assert (snapshot.log_start_offset, snapshot.cursor) == (11, 31)
    assert [r.value for r in reader.read_range(T, 0, 11)] == _values(11, 30)


def test_a_resumer_that_loses_step_4_to_the_records_own_compactor_finishes_the_run(
        config, writer, reader, hooks, three_entries):
    """Review C, R2. A retention pass R chooses S = 11 and stalls; X selects 1..30 at cursor 1,
    passes its check, and its step 4 CAS is held in transit; Y's step 0 resumes X's record and its
    own CAS is held too; X's CAS lands (X stalls before its record's CAS); R moves S and the cursor
    to 11; Y's CAS goes out and conflicts, a real conflict with X's landed swap. Y re-reads
    index/30, finds this run's COMPACTED entry and finishes the run. On 4207a64 Y took the conflict
    for another compactor's run (the cursor past its start) and deleted the record: COMPACTED
    1..30 over WAL 11..20 at rest, the cursor at 11 for good."""
    keys = three_entries
    retention = _StalledRetention(config, writer, keys, hooks)
    parts: dict = {}

    def y_resumes():
        _claim_lost(writer, keys)  # X's session expired while it stalled
        parts["y"] = _Resumer(config, writer, keys, keys.index(30))

    def retention_then_y_conflicts():
        retention.finish()
        parts["y_did"] = parts["y"].release()

    with _compactor(config, "X") as x:
        _InTransit(x, keys.index(30), before=y_resumes, after=retention_then_y_conflicts)
        compactions, error = _compact(x)
    assert parts["y_did"].resumed_compactions == 1, parts["y_did"]
    assert (compactions, error) == (0, None)  # Y finished X's record under it
    _assert_finished_across_the_cut(config, writer, reader, keys)


def test_the_oracle_refuses_a_cursor_below_a_compacted_entry_at_rest(config, writer, reader, three_entries):
    """Review C, R4: at rest (no ``meta/compaction``) the cursor is past the end of every COMPACTED
    entry (docs/protocol.md section 8.1, "Monotonic"): one the cursor is not past is an orphan,
    which no run passes. On 4207a64 ``check_partition`` accepted it when nothing overlapped."""
    keys = three_entries
    with _compactor(config, "C", writer) as c:
        assert c.compact_partition(T, 0).compactions == 1
    assert check_partition(writer.coordination, config.root_prefix, T, 0).cursor == 31
    found = writer.coordination.get(keys.compaction_cursor, keys.partition_key)
    writer.coordination.put(keys.compaction_cursor, CompactionCursor(11).to_json(), keys.partition_key,
                            expected_version=found.version_id)  # what an orphan COMPACTED 1..30 leaves
    with pytest.raises(AssertionError, match="cursor 11 is not past the COMPACTED entry 1..30"):
        check_partition(writer.coordination, config.root_prefix, T, 0)


class _Dies(Exception):
    """Ends a compactor right after it created its record."""


def _record_from_before_v1_3(config, writer, keys, hooks) -> CompactionRecord:
    """A compactor of run 1..30 dies after creating its record; the record is then written back
    without ``end_entry_version``, as a compactor before v1.3 wrote it."""
    def die():
        raise _Dies()

    hooks["compactor.after_record_create"] = die
    with _compactor(config, "old", writer) as old, pytest.raises(_Dies):
        old.compact_partition(T, 0)
    hooks.clear()
    found = writer.coordination.get(keys.compaction, keys.partition_key)
    record = CompactionRecord.from_json(found.value, found.key)
    assert record.end_entry_version is not None
    old_form = json.loads(record.to_json())
    del old_form["end_entry_version"]
    writer.coordination.put(keys.compaction, json.dumps(old_form).encode(), keys.partition_key,
                            expected_version=found.version_id)
    return record


def test_a_record_from_before_v1_3_is_given_its_end_entry_version_and_resumed(
        config, writer, reader, hooks, three_entries):
    """docs/protocol.md section 6.0: step 0 reads index/{end}, the run's last WAL entry, puts its
    version into the record (a CAS of the record) and resumes it like any other."""
    keys = three_entries
    _record_from_before_v1_3(config, writer, keys, hooks)
    with _compactor(config, "Y", writer) as y:
        done = y.compact_partition(T, 0)
    assert (done.recoveries, done.resumed_compactions, done.compactions) == (1, 1, 0)
    assert _shape(writer, keys) == [(COMPACTED, 1, 30)]
    assert writer.coordination.get(keys.compaction, keys.partition_key) is None
    assert check_partition(writer.coordination, config.root_prefix, T, 0).cursor == 31
    assert [r.value for r in reader.read_range(T, 0, 1)] == _values(1, 30)


def test_a_record_from_before_v1_3_whose_end_entry_went_is_deleted(config, writer, reader, hooks, three_entries):
    """docs/protocol.md section 6.0: index/{end} no longer the run's last WAL entry (here a
    retention pass dropped the whole run meanwhile, S = 31): no step 4 of the record can land any
    more, and step 0 deletes it."""
    keys = three_entries
    _record_from_before_v1_3(config, writer, keys, hooks)
    writer.append(T, 0, _values(31, 40))
    writer.coordination.delete_range(keys.index(1), keys.index(31), keys.partition_key)  # what the pass deleted
    found = writer.coordination.get(keys.control, keys.partition_key)
    control = json.loads(found.value)
    writer.coordination.put(keys.control, json.dumps({**control, "log_start_offset": 31}).encode(),
                            keys.partition_key, expected_version=found.version_id)
    with _compactor(config, "Y", writer) as y:
        done = y.compact_partition(T, 0)
    assert (done.recoveries, done.resumed_compactions, done.compactions) == (1, 0, 1)
    assert _shape(writer, keys) == [(COMPACTED, 31, 40)]
    assert writer.coordination.get(keys.compaction, keys.partition_key) is None
    assert check_partition(writer.coordination, config.root_prefix, T, 0).cursor == 41


def test_a_run_selected_at_the_version_a_fence_took_is_left_and_compacted_again(
        config, writer, reader, hooks, three_entries):
    """docs/protocol.md section 6.0, a fence's cost: Z (max 20) selects 1..20 at cursor 1 and
    stalls; B compacts 1..10 (cursor 11); X (max 10) selects 11..20 at cursor 11, at the same
    version of index/20 as Z, and stalls before its record; Z creates its record, finds the
    cursor passed and leaves, fencing index/20. X's record then passes step 3 (the cursor at its
    start), and its step 4 conflicts with the fence: index/20 still holds the run's last WAL
    entry, so X deletes its record and leaves (no InconsistentReadState, no record left to wedge
    every step 0); the next compactor compacts the run."""
    keys = three_entries
    x_at, x_go, x_did, parts = threading.Event(), threading.Event(), [], {}

    def x_stalls():
        if threading.current_thread().name == "X":
            hooks.pop("compactor.after_age_check")
            x_at.set()
            assert x_go.wait(60)

    def x_selects_11_to_20():
        hooks["compactor.after_age_check"] = x_stalls
        parts["x"] = x = _compactor(config, "X", writer, max_offsets=10)
        parts["thread"] = threading.Thread(target=lambda: x_did.append(x.compact_partition(T, 0)), name="X")
        parts["thread"].start()
        assert x_at.wait(60)
        _claim_lost(writer, keys)

    _stall_after_selecting_then_b_compacts_1_to_10(config, writer, keys, hooks, then=x_selects_11_to_20)
    with _compactor(config, "Z", max_offsets=20) as z:
        assert _compact(z) == (0, None)
    assert writer.coordination.get(keys.compaction, keys.partition_key) is None
    x_go.set()
    parts["thread"].join(60)
    parts["x"].close()
    assert x_did and x_did[0].compactions == 0, x_did
    assert writer.coordination.get(keys.compaction, keys.partition_key) is None
    assert _shape(writer, keys) == [(COMPACTED, 1, 10), (WAL, 11, 20), (WAL, 21, 30)]
    with _compactor(config, "next", writer) as c:
        assert c.compact_partition(T, 0).compactions == 1
    assert _shape(writer, keys) == [(COMPACTED, 1, 10), (COMPACTED, 11, 30)]
    assert check_partition(writer.coordination, config.root_prefix, T, 0).cursor == 31
    assert [r.value for r in reader.read_range(T, 0, 1)] == _values(1, 30)
