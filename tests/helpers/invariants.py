"""The invariants of docs/protocol.md section 8, checked against real Oxia (and S3 through a reader).

One checker for every test (and chaos's ``check_at_rest``): ``check_partition`` asserts no
overlap, no gaps (from the log start ``S``; the first entry may be a COMPACTED one that starts
below ``S``, docs/protocol.md section 10.3), cursor bounds, the cursor past every COMPACTED
entry when no ``meta/compaction`` record is in flight, and entry sanity for a quiescent
partition and returns a :class:`Snapshot`; ``check_monotonic`` compares two snapshots;
``check_acked_readable`` reads acknowledged appends back.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from llog.control import read_control
from llog.coordination import Coordination
from llog.discovery import topic_records
from llog.keys import PartitionKeys, TopicPartition
from llog.reader import LogReader
from llog.records import COMPACTED, WAL, CompactionCursor, IndexEntry, LocatedEntry, PendingAppend


@dataclass(frozen=True)
class Snapshot:
    tp: TopicPartition
    sequence_counter: int
    cursor: int
    entries: list[LocatedEntry]
    pending: PendingAppend | None
    #: The first offset still in the log (docs/protocol.md section 10.3).
    log_start_offset: int = 1

    @property
    def high_watermark(self) -> int:
        return self.sequence_counter - 1


def check_partition(coordination: Coordination, root: str, topic: str, partition: int,
                    topic_id: str | None = None) -> Snapshot:
    """Assert the section 8 invariants that one partition's state must satisfy at rest, in the
    incarnation ``topic_id`` (default: the topic's current one, from its record). With a
    ``meta/compaction`` record the partition is not at rest, and the cursor may be below the
    COMPACTED entry of the record's own run (between its steps 4 and 6); the rest is checked."""
    if topic_id is None:
        found = topic_records(coordination, root, [topic])
        assert found, f"topic {topic!r} has no topic record"
        topic_id = found[0].topic_id
    keys = PartitionKeys(root, TopicPartition(topic, partition), topic_id)
    control = read_control(coordination, keys).record
    cursor_value = coordination.get(keys.compaction_cursor, keys.partition_key)
    assert cursor_value is not None, f"{keys.tp}: meta/control exists but meta/compaction-cursor does not"
    cursor = CompactionCursor.from_json(cursor_value.value).offset
    entries = [LocatedEntry(keys.index_end_offset(v.key), IndexEntry.from_json(v.value, v.key))
               for v in coordination.range_scan(keys.index_prefix, keys.index_end, keys.partition_key)]
    hw, start = control.high_watermark, control.log_start_offset
    # Every control names the incarnation whose keys it lies among (section 12).
    assert control.topic_id == topic_id, f"{keys.tp}: meta/control names topic id {control.topic_id}, not {topic_id}"

    # Monotonic bounds: 1 <= S <= high watermark + 1 and S <= cursor <= sequence_counter, with S
    # the log start offset (1 until retention moves it; docs/protocol.md section 10.4).
    assert 1 <= start <= hw + 1, f"{keys.tp}: log start offset {start} outside 1..{hw + 1}"
    assert start <= cursor <= control.sequence_counter, (
        f"{keys.tp}: cursor {cursor} outside {start}..{control.sequence_counter}")

    # At rest the cursor is past every COMPACTED entry (section 8.1): one it is not past has no
    # record behind it (an orphan, review C), and no compaction run ever passes it.
    if coordination.get(keys.compaction, keys.partition_key) is None:
        for e in entries:
            assert e.entry.type != COMPACTED or e.end_offset < cursor, (
                f"{keys.tp}: cursor {cursor} is not past the COMPACTED entry {e.start_offset}..{e.end_offset} at rest "
                f"(no meta/compaction): an entry with no record behind it, which no compaction passes")

    # No duplicates / no overlap, and no gaps: entries tile S..n exactly, in key order. The first
    # may be a COMPACTED entry that starts below S and covers it: a compaction that finished
    # across a retention pass's cut (docs/protocol.md sections 6 and 10.3); offsets below S are gone.
    expected_start = start
    for i, e in enumerate(entries):
        assert e.entry.msg_count >= 1, f"{keys.tp}: entry at {e.end_offset} has msg_count {e.entry.msg_count}"
        straddles = i == 0 and e.entry.type == COMPACTED and e.start_offset < start <= e.end_offset
        assert straddles or e.start_offset == expected_start, (
            f"{keys.tp}: entry {e.start_offset}..{e.end_offset} "
            + ("overlaps" if e.start_offset < expected_start else "leaves a gap after")
            + f" offset {expected_start - 1}"
        )
        if e.entry.type == WAL:
            assert e.entry.byte_offset is not None and e.entry.byte_length, f"{keys.tp}: WAL entry without a byte range"
        expected_start = e.end_offset + 1
    covered = expected_start - 1

    # The tail beyond the index, if any, is exactly the pending append. A pending inside the
    # index is materialized: its own entry, or a COMPACTED entry covering it (v1.1: the entry was
    # created once, then compacted, before the pending was cleared).
    pending = control.pending
    if pending is not None and pending.end_offset <= covered:
        owner = next(e for e in entries if e.covers(pending.end_offset))
        assert (owner.end_offset == pending.end_offset and owner.entry == pending.to_index_entry()) or (
            owner.entry.type == COMPACTED and owner.start_offset <= pending.start_offset), (
            f"{keys.tp}: pending {pending.start_offset}..{pending.end_offset} is inside the index but "
            f"neither its own entry nor a COMPACTED one covers it (found {owner.entry.type} "
            f"{owner.start_offset}..{owner.end_offset})"
        )
    elif pending is not None:
        assert pending.start_offset == covered + 1, (
            f"{keys.tp}: pending {pending.start_offset}..{pending.end_offset} does not follow the index "
            f"(which ends at {covered})"
        )
        covered = pending.end_offset
    assert covered == hw, f"{keys.tp}: index and pending cover {start}..{covered} but the high watermark is {hw}"
    return Snapshot(keys.tp, control.sequence_counter, cursor, entries, pending, start)


def check_monotonic(before: Snapshot, after: Snapshot) -> None:
    assert after.sequence_counter >= before.sequence_counter, (
        f"{after.tp}: sequence_counter went back from {before.sequence_counter} to {after.sequence_counter}")
    assert after.cursor >= before.cursor, f"{after.tp}: cursor went back from {before.cursor} to {after.cursor}"


def check_acked_readable(reader: LogReader, acked: Iterable[tuple[str, int, int, bytes]]) -> None:
    """Every acknowledged ``(topic, partition, offset, value)`` reads back with the same bytes."""
    by_tp: dict[tuple[str, int], dict[int, bytes]] = {}
    for topic, partition, offset, value in acked:
        assert by_tp.setdefault((topic, partition), {}).setdefault(offset, value) == value, (
            f"{topic}[{partition}] offset {offset} was acknowledged twice with different values")
    for (topic, partition), expected in by_tp.items():
        got = {r.offset: r.value for r in reader.read_range(topic, partition, min(expected), max(expected))}
        lost = [o for o, v in expected.items() if got.get(o) != v]
        assert not lost, f"{topic}[{partition}]: acknowledged offsets read back wrong or lost: {lost[:10]}"
