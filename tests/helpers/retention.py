"""Helpers for the topic and retention tests (docs/topics.md): what is left of a partition in
Oxia and S3, the entries Kafka's size rule keeps, and the section 8 invariants checked from the
log start offset (docs/topics.md section 4) instead of from 1."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llog.control import read_control
from llog.coordination import Coordination
from llog.keys import PartitionKeys, TopicPartition, s3_uri
from llog.objects import ObjectStore
from llog.records import COMPACTED, WAL, CompactionCursor, IndexEntry, LocatedEntry, PendingAppend


def partition_keys(root: str, topic: str, partition: int) -> PartitionKeys:
    return PartitionKeys(root, TopicPartition(topic, partition))


def keys_left(coordination: Coordination, keys: PartitionKeys) -> list[str]:
    """Every Oxia key of the partition (``meta/*``, ``index/*``, ``consumers/*``, the claim): one
    range scan of ``[P//, P/~/)``, the range a topic delete removes (docs/topics.md section 2)."""
    return [v.key for v in coordination.range_scan(*keys.subtree, keys.partition_key)]


def index_entries(coordination: Coordination, keys: PartitionKeys) -> list[LocatedEntry]:
    """The partition's index, in offset order."""
    return [LocatedEntry(keys.index_end_offset(v.key), IndexEntry.from_json(v.value, v.key))
            for v in coordination.range_scan(keys.index_prefix, keys.index_end, keys.partition_key)]


def compacted_objects(objects: ObjectStore, keys: PartitionKeys) -> dict[str, int]:
    """The partition's compacted objects, ``s3://`` URI to size."""
    bucket = objects.config.s3_bucket
    return {s3_uri(bucket, info.key): info.size for info in objects.list(keys.compacted_prefix)}


def entry_sizes(objects: ObjectStore, keys: PartitionKeys, entries: Sequence[LocatedEntry]) -> list[int]:
    """Each entry's bytes as retention counts them (docs/topics.md section 3, step 2): its
    ``byte_length``, or for a whole object (a compacted blob) the object's size."""
    sizes = compacted_objects(objects, keys)
    return [e.entry.byte_length if e.entry.byte_length is not None else sizes[e.entry.data_key] for e in entries]


def first_kept_by_size(sizes: Sequence[int], retention_bytes: int) -> int:
    """Kafka's rule, computed independently of ``llog.retention``: the oldest entries go while
    the ones after them still hold at least ``retention_bytes``; the index of the first entry
    kept (``len(sizes)``: all go)."""
    first = 0
    while first < len(sizes) and sum(sizes[first + 1:]) >= retention_bytes:
        first += 1
    return first


@dataclass(frozen=True)
class RetainedSnapshot:
    tp: TopicPartition
    log_start_offset: int
    sequence_counter: int
    cursor: int
    entries: list[LocatedEntry]
    pending: PendingAppend | None

    @property
    def high_watermark(self) -> int:
        return self.sequence_counter - 1


def check_retained_partition(coordination: Coordination, root: str, topic: str, partition: int) -> RetainedSnapshot:
    """``tests.helpers.invariants.check_partition`` from the log start offset ``S``
    (docs/topics.md section 4): ``1 <= S <= high_watermark + 1``, ``S <= cursor <=
    sequence_counter``, no index key below ``S``, and the entries and the pending append tile
    ``S..high_watermark`` exactly, with no overlap."""
    keys = partition_keys(root, topic, partition)
    control = read_control(coordination, keys).record
    start, hw = control.log_start_offset, control.high_watermark
    found = coordination.get(keys.compaction_cursor, keys.partition_key)
    assert found is not None, f"{keys.tp}: meta/control exists but meta/compaction-cursor does not"
    cursor = CompactionCursor.from_json(found.value).offset
    entries = index_entries(coordination, keys)

    assert 1 <= start <= hw + 1, f"{keys.tp}: log start offset {start} outside 1..{hw + 1}"
    assert start <= cursor <= control.sequence_counter, (
        f"{keys.tp}: cursor {cursor} outside the log start offset {start}..{control.sequence_counter}")
    expected = start
    for e in entries:
        assert e.entry.msg_count >= 1, f"{keys.tp}: entry at {e.end_offset} has msg_count {e.entry.msg_count}"
        assert e.start_offset == expected, (
            f"{keys.tp}: entry {e.start_offset}..{e.end_offset} "
            + ("overlaps (or lies below the log start)" if e.start_offset < expected else "leaves a gap after")
            + f" offset {expected - 1} (log start offset {start})")
        if e.entry.type == WAL:
            assert e.entry.byte_offset is not None and e.entry.byte_length, f"{keys.tp}: WAL entry without a byte range"
        expected = e.end_offset + 1
    covered = expected - 1
    pending = control.pending
    if pending is not None and pending.end_offset <= covered:
        owner = next(e for e in entries if e.covers(pending.end_offset))
        assert owner.end_offset == pending.end_offset or owner.entry.type == COMPACTED, (
            f"{keys.tp}: pending {pending.start_offset}..{pending.end_offset} is inside the index but no entry owns it")
    elif pending is not None:
        assert pending.start_offset == covered + 1, (
            f"{keys.tp}: pending {pending.start_offset}..{pending.end_offset} does not follow the index "
            f"(which ends at {covered})")
        covered = pending.end_offset
    assert covered == hw, f"{keys.tp}: index and pending cover {start}..{covered} but the high watermark is {hw}"
    return RetainedSnapshot(keys.tp, start, control.sequence_counter, cursor, entries, pending)
