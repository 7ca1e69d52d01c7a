"""``llog describe TOPIC``: per partition, its state, high watermark, index entries, compaction
cursor and pending append, read straight from Oxia."""

from __future__ import annotations

from dataclasses import dataclass

from llog.control import read_control
from llog.coordination import Coordination
from llog.discovery import topic_partitions
from llog.keys import PartitionKeys, TopicPartition, s3_uri
from llog.objects import ObjectStore
from llog.records import COMPACTED, CompactionCursor, IndexEntry, PendingAppend


@dataclass(frozen=True)
class PartitionDescription:
    topic: str
    partition: int
    log_state: str
    high_watermark: int
    index_entries: int
    wal_entries: int
    compacted_entries: int
    compaction_cursor: int | None
    pending: PendingAppend | None
    #: Bytes of the record bodies the index references: slices of shared WAL blobs, plus the
    #: compacted objects when the description was given an object store (else None).
    bytes: int | None = None


def describe_partition(coordination: Coordination, root: str, topic: str, partition: int,
                       objects: ObjectStore | None = None) -> PartitionDescription:
    """One partition, from Oxia; with ``objects``, also its size (one LIST of its compacted
    objects)."""
    keys = PartitionKeys(root, TopicPartition(topic, partition))
    control = read_control(coordination, keys).record
    entries = [IndexEntry.from_json(v.value, v.key)
               for v in coordination.range_scan(keys.index_prefix, keys.index_end, keys.partition_key)]
    compacted = sum(e.type == COMPACTED for e in entries)
    cursor = coordination.get(keys.compaction_cursor, keys.partition_key)
    size = None
    if objects is not None:
        referenced = {e.data_key for e in entries if e.byte_length is None}
        size = sum(e.byte_length for e in entries if e.byte_length is not None) + sum(
            o.size for o in objects.list(keys.compacted_prefix) if s3_uri(objects.config.s3_bucket, o.key) in referenced)
    return PartitionDescription(
        topic, partition, control.log_state, control.high_watermark, len(entries), len(entries) - compacted,
        compacted, CompactionCursor.from_json(cursor.value).offset if cursor else None, control.pending, size,
    )


def describe_topic(coordination: Coordination, root: str, topic: str,
                   objects: ObjectStore | None = None) -> list[PartitionDescription]:
    return [describe_partition(coordination, root, topic, p, objects)
            for p in topic_partitions(coordination, root, topic)]


def format_descriptions(topic: str, rows: list[PartitionDescription]) -> str:
    if not rows:
        return f"topic {topic!r} has no initialized partitions"
    header = ("PARTITION", "STATE", "HIGH_WATERMARK", "INDEX_ENTRIES", "WAL", "COMPACTED", "CURSOR", "PENDING")
    table = [header] + [
        (str(r.partition), r.log_state, str(r.high_watermark), str(r.index_entries), str(r.wal_entries),
         str(r.compacted_entries), "-" if r.compaction_cursor is None else str(r.compaction_cursor),
         f"{r.pending.start_offset}..{r.pending.end_offset}" if r.pending else "-")
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = [f"topic {topic}: {len(rows)} partition(s)"]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    return "\n".join(lines)
