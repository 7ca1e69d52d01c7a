"""Typed Oxia records and their JSON form (docs/protocol.md section 2)."""

from __future__ import annotations

import json
import re

import pytest

from llog.errors import CorruptRecord
from llog.records import (
    COMPACTED,
    FENCED,
    OPEN,
    WAL,
    CompactionCursor,
    CompactionRecord,
    ControlRecord,
    IndexEntry,
    LocatedEntry,
    PendingAppend,
    SinkProgress,
)

DATA_KEY = "s3://llog-data/llog/wal-shared/0f8e2a"


def index_json(**changes) -> bytes:
    """A valid index entry's JSON with fields changed (None removes a field)."""
    obj = {"type": "WAL", "msg_count": 3, "data_key": DATA_KEY, "encoding": "bytes-batch-v1",
           "created_at_ms": 1_700_000_000_000, **changes}
    return json.dumps({k: v for k, v in obj.items() if v is not None}).encode()


def pending_dict(**changes) -> dict:
    obj = {"append_id": "6f1c9f0e-1111-2222-3333-444455556666", "start_offset": 8, "end_offset": 10,
           "msg_count": 3, "entry_type": "WAL", "data_key": DATA_KEY, "encoding": "bytes-batch-v1",
           "byte_offset": 120, "byte_length": 64, "created_at_ms": 5, **changes}
    return {k: v for k, v in obj.items() if v is not None}


def control_json(**changes) -> bytes:
    obj = {"log_state": "OPEN", "sequence_counter": 11, "pending": pending_dict(), **changes}
    return json.dumps(obj).encode()


# --- IndexEntry ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "entry",
    [
        IndexEntry(WAL, 3, DATA_KEY, created_at_ms=17),
        IndexEntry(WAL, 1, DATA_KEY, byte_offset=0, byte_length=20),
        IndexEntry(COMPACTED, 10_000, "s3://b/llog/t/partitions/0/data/compacted/x", created_at_ms=1),
    ],
)
def test_index_entry_roundtrip(entry):
    raw = entry.to_json()
    assert IndexEntry.from_json(raw) == entry
    assert IndexEntry.from_json(raw.decode()) == entry


def test_index_entry_omits_absent_byte_range():
    obj = json.loads(IndexEntry(WAL, 3, DATA_KEY, created_at_ms=9).to_json())
    assert obj == {"type": "WAL", "msg_count": 3, "data_key": DATA_KEY, "encoding": "bytes-batch-v1",
                   "created_at_ms": 9}


def test_index_entry_writes_byte_range():
    obj = json.loads(IndexEntry(WAL, 3, DATA_KEY, byte_offset=100, byte_length=50).to_json())
    assert (obj["byte_offset"], obj["byte_length"]) == (100, 50)


def test_index_entry_ignores_unknown_fields_and_defaults_created_at():
    entry = IndexEntry.from_json(index_json(created_at_ms=None, future_field={"x": 1}))
    assert entry == IndexEntry(WAL, 3, DATA_KEY, created_at_ms=0)


@pytest.mark.parametrize(
    "raw,problem",
    [
        (b"not json", "value is not JSON"),
        (b"\xff\xfe", "value is not JSON"),
        (b"", "value is not JSON"),
        (b"[1, 2]", "must be a JSON object, got list"),
        (b"null", "must be a JSON object, got NoneType"),
        (index_json(type="SNAPSHOT"), "unknown entry type 'SNAPSHOT'"),
        (index_json(type=None), "field 'type' must be str, got None"),
        (index_json(type=1), "field 'type' must be str"),
        (index_json(msg_count="3"), "field 'msg_count' must be int, got '3'"),
        (index_json(msg_count=3.0), "field 'msg_count' must be int"),
        (index_json(msg_count=True), "field 'msg_count' must be int, got True"),
        (index_json(msg_count=0), "msg_count must be >= 1, got 0"),
        (index_json(msg_count=-2), "msg_count must be >= 1"),
        (index_json(data_key=None), "field 'data_key' must be str"),
        (index_json(encoding=None), "field 'encoding' must be str"),
        (index_json(created_at_ms="now"), "field 'created_at_ms' must be int"),
        (index_json(byte_offset=10), "byte_offset and byte_length must be both set or both absent"),
        (index_json(byte_length=10), "both set or both absent"),
        (index_json(byte_offset="10", byte_length=4), "field 'byte_offset' must be int"),
        (index_json(byte_offset=10, byte_length=False), "field 'byte_length' must be int"),
    ],
)
def test_index_entry_rejects(raw, problem):
    with pytest.raises(CorruptRecord, match=f"^llog/t/partitions/0/index/7: .*{re.escape(problem)}"):
        IndexEntry.from_json(raw, key="llog/t/partitions/0/index/7")


# --- LocatedEntry --------------------------------------------------------------------------------


@pytest.mark.parametrize("end,count,start", [(42, 1, 42), (42, 3, 40), (10, 10, 1)])
def test_located_entry_range(end, count, start):
    located = LocatedEntry(end, IndexEntry(WAL, count, DATA_KEY))
    assert located.start_offset == start
    assert [o for o in range(start - 2, end + 3) if located.covers(o)] == list(range(start, end + 1))


# --- PendingAppend -------------------------------------------------------------------------------


def test_pending_roundtrip():
    raw = pending_dict()
    pending = PendingAppend.from_dict(raw, "k")
    assert pending.to_dict() == raw
    assert PendingAppend.from_dict(pending.to_dict(), "k") == pending


def test_pending_without_byte_range_omits_it():
    raw = pending_dict(byte_offset=None, byte_length=None)
    pending = PendingAppend.from_dict(raw, "k")
    assert pending.byte_offset is None and pending.byte_length is None
    assert "byte_offset" not in pending.to_dict() and "byte_length" not in pending.to_dict()


def test_pending_as_index_entry():
    pending = PendingAppend.from_dict(pending_dict(), "k")
    located = pending.located()
    assert located.from_pending
    assert (located.start_offset, located.end_offset) == (8, 10)
    assert located.entry == IndexEntry(WAL, 3, DATA_KEY, "bytes-batch-v1", 5, 120, 64)
    assert IndexEntry.from_json(located.entry.to_json()) == located.entry


@pytest.mark.parametrize(
    "obj,problem",
    [
        ([1], "pending must be an object or null"),
        ("pending", "pending must be an object or null"),
        (pending_dict(append_id=None), "field 'append_id' must be str"),
        (pending_dict(start_offset="8"), "field 'start_offset' must be int"),
        (pending_dict(end_offset=10.0), "field 'end_offset' must be int"),
        (pending_dict(msg_count=True), "field 'msg_count' must be int"),
        (pending_dict(entry_type=None), "field 'entry_type' must be str"),
        (pending_dict(encoding=None), "field 'encoding' must be str"),
        (pending_dict(data_key=None), "field 'data_key' must be str"),
        (pending_dict(msg_count=2), "pending range 8..10 does not hold msg_count=2"),
        (pending_dict(end_offset=11), "pending range 8..11 does not hold msg_count=3"),
        (pending_dict(start_offset=10, end_offset=9, msg_count=0), "does not hold msg_count=0"),
    ],
)
def test_pending_rejects(obj, problem):
    with pytest.raises(CorruptRecord, match=re.escape(problem)):
        PendingAppend.from_dict(obj, "meta/control")


def test_pending_rejects_unknown_entry_type():
    with pytest.raises(CorruptRecord):
        PendingAppend.from_dict(pending_dict(entry_type="BOGUS"), "meta/control")


def test_pending_rejects_half_a_byte_range():
    with pytest.raises(CorruptRecord):
        PendingAppend.from_dict(pending_dict(byte_length=None), "meta/control")


# --- ControlRecord -------------------------------------------------------------------------------


def test_control_defaults():
    control = ControlRecord()
    assert (control.log_state, control.sequence_counter, control.pending, control.extra) == (OPEN, 1, None, {})
    assert control.high_watermark == 0
    assert json.loads(control.to_json()) == {"log_state": "OPEN", "sequence_counter": 1, "pending": None}


@pytest.mark.parametrize("counter", [1, 2, 11, 10**15])
def test_high_watermark(counter):
    assert ControlRecord(sequence_counter=counter).high_watermark == counter - 1


def test_control_roundtrip_with_pending():
    control = ControlRecord.from_json(control_json())
    assert control.pending == PendingAppend.from_dict(pending_dict(), "k")
    assert ControlRecord.from_json(control.to_json()) == control
    assert json.loads(control.to_json()) == json.loads(control_json())


def test_control_preserves_unknown_fields():
    sinks = {"query-1": {"batch_id": 7, "end_offset": 10}}
    raw = control_json(sinks=sinks, zz_future=[1, "two"], pending=None)
    control = ControlRecord.from_json(raw)
    assert control.extra == {"sinks": sinks, "zz_future": [1, "two"]}
    # A CAS writes them back unchanged, also after changing the known fields.
    updated = control.with_changes(sequence_counter=20, log_state=FENCED)
    obj = json.loads(updated.to_json())
    assert obj == {"log_state": "FENCED", "sequence_counter": 20, "pending": None, "sinks": sinks,
                   "zz_future": [1, "two"]}
    assert ControlRecord.from_json(updated.to_json()).extra == control.extra


DAY_MS = 24 * 3600 * 1000


def test_sink_progress_drops_other_sinks_idle_longer_than_the_retention():
    now = 100 * DAY_MS
    control = ControlRecord.from_json(control_json(pending=None, sinks={
        "fresh": {"batch_id": 3, "slices": 1, "committed_at_ms": now - 7 * DAY_MS},
        "idle": {"batch_id": 9, "slices": 2, "committed_at_ms": now - 7 * DAY_MS - 1},
        "untimed": {"batch_id": 1, "slices": 1},
        "not-progress": "someone else's",
    }))
    updated = control.with_sink_progress("me", SinkProgress(5, 1, now), retention_ms=7 * DAY_MS)
    assert json.loads(updated.to_json())["sinks"] == {
        "fresh": {"batch_id": 3, "slices": 1, "committed_at_ms": now - 7 * DAY_MS},
        "untimed": {"batch_id": 1, "slices": 1, "committed_at_ms": now},  # expires a retention from now
        "not-progress": "someone else's",
        "me": {"batch_id": 5, "slices": 1, "committed_at_ms": now},
    }
    assert updated.sink_progress("me") == SinkProgress(5, 1, now) and updated.sink_progress("idle") is None
    # Its own entry is replaced, whatever its age.
    again = updated.with_sink_progress("me", SinkProgress(6, 2, now + 30 * DAY_MS), retention_ms=7 * DAY_MS)
    assert json.loads(again.to_json())["sinks"] == {"not-progress": "someone else's",
                                                    "me": {"batch_id": 6, "slices": 2, "committed_at_ms": now + 30 * DAY_MS}}


def test_sink_progress_time_must_be_an_integer():
    raw = control_json(pending=None, sinks={"q": {"batch_id": 1, "slices": 1, "committed_at_ms": "yesterday"}})
    with pytest.raises(CorruptRecord, match="committed_at_ms"):
        ControlRecord.from_json(raw).sink_progress("q")
    with pytest.raises(ValueError, match="committed_at_ms"):
        ControlRecord().with_sink_progress("q", SinkProgress(1, 1), retention_ms=DAY_MS)


def test_control_without_pending_field():
    control = ControlRecord.from_json(b'{"log_state": "FENCED", "sequence_counter": 5}')
    assert control.pending is None and control.fenced and control.high_watermark == 4


def test_fenced_flag():
    assert ControlRecord(log_state=FENCED).fenced
    assert not ControlRecord(log_state=OPEN).fenced


@pytest.mark.parametrize(
    "raw,problem",
    [
        (b"{", "value is not JSON"),
        (b'"OPEN"', "must be a JSON object, got str"),
        (control_json(log_state="CLOSED"), "unknown log_state 'CLOSED'"),
        (control_json(log_state="open"), "unknown log_state 'open'"),
        (control_json(log_state=None), "field 'log_state' must be str"),
        (control_json(sequence_counter=0), "sequence_counter must be >= 1, got 0"),
        (control_json(sequence_counter="11"), "field 'sequence_counter' must be int"),
        (control_json(sequence_counter=None), "field 'sequence_counter' must be int"),
        (control_json(pending=[]), "pending must be an object or null"),
        (control_json(pending=pending_dict(msg_count=4)), "does not hold msg_count=4"),
    ],
)
def test_control_rejects(raw, problem):
    with pytest.raises(CorruptRecord, match=f"^llog/t/partitions/0/meta/control: .*{re.escape(problem)}"):
        ControlRecord.from_json(raw, key="llog/t/partitions/0/meta/control")


# --- CompactionCursor ----------------------------------------------------------------------------


@pytest.mark.parametrize("offset", [1, 42, 10**18])
def test_cursor_roundtrip(offset):
    cursor = CompactionCursor(offset)
    assert json.loads(cursor.to_json()) == {"offset": offset}
    assert CompactionCursor.from_json(cursor.to_json()) == cursor


def test_cursor_default_and_unknown_fields():
    assert CompactionCursor().offset == 1
    assert CompactionCursor.from_json(b'{"offset": 5, "extra": true}') == CompactionCursor(5)


@pytest.mark.parametrize(
    "raw,problem",
    [(b"", "not JSON"), (b"5", "must be a JSON object"), (b"{}", "field 'offset' must be int"),
     (b'{"offset": "5"}', "field 'offset' must be int"), (b'{"offset": true}', "field 'offset' must be int")],
)
def test_cursor_rejects(raw, problem):
    with pytest.raises(CorruptRecord, match=re.escape(problem)):
        CompactionCursor.from_json(raw)


def test_sink_progress_refuses_a_new_sink_when_the_partition_holds_its_most_live_entries():
    """docs/protocol.md section 9.1: `sinks` is bounded whatever the workload (one entry per write of
    every query that wrote in the retention period would grow without bound), and no live entry is
    dropped for it: its sink's replay of a batch would write the batch again."""
    from llog.errors import SinkProgressFull
    from llog.records import MAX_SINKS_PER_PARTITION

    now = 100 * DAY_MS
    sinks = {f"q{i}": {"batch_id": 1, "slices": 1, "committed_at_ms": now - i} for i in range(MAX_SINKS_PER_PARTITION)}
    control = ControlRecord.from_json(control_json(pending=None, sinks={**sinks, "not-progress": "someone else's"}))
    with pytest.raises(SinkProgressFull, match=f"progress of {MAX_SINKS_PER_PARTITION} sinks"):
        control.with_sink_progress("me", SinkProgress(5, 1, now), retention_ms=7 * DAY_MS)
    updated = control.with_sink_progress("q7", SinkProgress(5, 1, now), retention_ms=7 * DAY_MS)  # a known sink
    kept = json.loads(updated.to_json())["sinks"]
    assert len(kept) == MAX_SINKS_PER_PARTITION + 1 and "not-progress" in kept
    assert updated.sink_progress("q7") == SinkProgress(5, 1, now)
    later = control.with_sink_progress("me", SinkProgress(5, 1, now + 8 * DAY_MS), retention_ms=7 * DAY_MS)
    assert set(json.loads(later.to_json())["sinks"]) == {"me", "not-progress"}  # the expired ones went


# --- CompactionRecord ----------------------------------------------------------------------------

def compaction_dict(**changes) -> dict:
    obj = {"compaction_id": "0c1d2e3f-1111-2222-3333-444455556666", "state": "WRITING_COMPACTED_INDEX",
           "start_offset": 1, "end_offset": 30, "msg_count": 30, "data_key": DATA_KEY, "encoding": "bytes-batch-v1",
           "created_at_ms": 5, "last_entry_start_offset": 21, "end_entry_version": 42, **changes}
    return {k: v for k, v in obj.items() if v is not None}


def test_a_compaction_record_keeps_the_version_its_step_4_cases_at():
    record = CompactionRecord.from_json(json.dumps(compaction_dict()).encode())
    assert record.end_entry_version == 42
    assert CompactionRecord.from_json(record.to_json()) == record
    assert json.loads(record.with_state("DELETING_OLD").to_json())["end_entry_version"] == 42


def test_a_compaction_record_from_before_v1_3_has_no_end_entry_version():
    """docs/protocol.md section 6: step 0 gives such a record one; until then it is None, and
    written back without the field."""
    record = CompactionRecord.from_json(json.dumps(compaction_dict(end_entry_version=None)).encode())
    assert record.end_entry_version is None
    assert "end_entry_version" not in json.loads(record.to_json())
    assert record.with_end_entry_version(7).end_entry_version == 7


@pytest.mark.parametrize("version", [-1, "42", True, 1.5])
def test_a_compaction_record_with_a_bad_end_entry_version_is_refused(version):
    with pytest.raises(CorruptRecord, match="end_entry_version"):
        CompactionRecord.from_json(json.dumps(compaction_dict(end_entry_version=version)).encode())
