"""What a partition holds, read straight from Oxia (and one LIST from S3): the state ``llog
describe``, ``llog topics describe`` (:mod:`llog_tools.describe`) and the broker's partition
route report.

Per partition (:func:`describe_partition`): its state, the readable offsets ``log_start_offset``
(docs/protocol.md section 10.3) to ``high_watermark`` and Kafka's log-end offset (``high_watermark +
1``), the index entries, the compaction cursor, the pending append, and the bytes it keeps in
S3: its share of shared WAL blobs (the ``byte_length`` of its byte-range entries and of the
pending append) and the compacted objects its index references (one LIST of
``P/data/compacted/``), counted by the rule retention counts them by (section 3, step 2).
"""

from __future__ import annotations

from dataclasses import dataclass

from llog.control import read_control
from llog.coordination import Coordination
from llog.discovery import partitions_of, topic_records
from llog.errors import TopicNotFound
from llog.keys import PartitionKeys, TopicPartition, s3_uri
from llog.objects import ObjectStore
from llog.records import COMPACTED, CompactionCursor, IndexEntry, LocatedEntry, PendingAppend


@dataclass(frozen=True)
class PartitionDescription:
    topic: str
    partition: int
    log_state: str
    high_watermark: int
    #: Index entries of the log (ending at or after ``log_start_offset``), by kind.
    index_entries: int
    wal_entries: int
    compacted_entries: int
    compaction_cursor: int | None
    pending: PendingAppend | None
    #: ``wal_bytes + compacted_bytes``: the bytes of record bodies the partition keeps in S3; None
    #: without an object store (the compacted objects' sizes are then unknown).
    bytes: int | None = None
    #: The first offset still in the log (docs/protocol.md section 10.3; 1 until retention moves it).
    log_start_offset: int = 1
    #: Kafka's log-end offset: the offset the next record gets (``high_watermark + 1``).
    log_end_offset: int = 1
    #: Records still in the log: ``log_start_offset..high_watermark``.
    records: int = 0
    #: The partition's share of shared WAL blobs: the ``byte_length`` of its byte-range index
    #: entries and of the pending append (unless its entry is already in the index).
    wal_bytes: int = 0
    #: Sizes of the compacted objects its index references (None without an object store).
    compacted_bytes: int | None = None


def describe_partition(coordination: Coordination, root: str, topic: str, partition: int,
                       objects: ObjectStore | None = None, topic_id: str | None = None) -> PartitionDescription:
    """One partition of the topic's current incarnation (or of ``topic_id``'s), from Oxia; with
    ``objects``, also the sizes of its compacted objects (one LIST of ``P/data/compacted/``)."""
    if topic_id is None:
        found = topic_records(coordination, root, [topic])
        if not found:
            raise TopicNotFound(topic)
        topic_id = found[0].topic_id
    keys = PartitionKeys(root, TopicPartition(topic, partition), topic_id)
    control = read_control(coordination, keys).record
    start = control.log_start_offset
    # From the log start: keys below it are ones a retention pass is deleting (section 3, step 1).
    entries = [LocatedEntry(keys.index_end_offset(v.key), IndexEntry.from_json(v.value, v.key))
               for v in coordination.range_scan(keys.index(start), keys.index_end, keys.partition_key)]
    compacted = sum(e.entry.type == COMPACTED for e in entries)
    cursor = coordination.get(keys.compaction_cursor, keys.partition_key)
    wal_bytes = _wal_bytes(entries, control.pending)
    compacted_bytes = None if objects is None else _compacted_bytes(objects, keys, entries)
    return PartitionDescription(
        topic, partition, control.log_state, control.high_watermark, len(entries), len(entries) - compacted,
        compacted, CompactionCursor.from_json(cursor.value).offset if cursor else None, control.pending,
        bytes=None if compacted_bytes is None else wal_bytes + compacted_bytes,
        log_start_offset=start,
        log_end_offset=control.high_watermark + 1,
        records=max(0, control.high_watermark - start + 1),
        wal_bytes=wal_bytes,
        compacted_bytes=compacted_bytes,
    )


def _wal_bytes(entries: list[LocatedEntry], pending: PendingAppend | None) -> int:
    """Bytes of the byte-range entries (slices of shared WAL blobs), and of the pending append
    when its entry is not in the index yet (materialized but not cleared: counted once)."""
    total = sum(e.entry.byte_length for e in entries if e.entry.byte_length is not None)
    if pending is not None and pending.byte_length is not None and not any(
            e.end_offset == pending.end_offset and e.entry.data_key == pending.data_key for e in entries):
        total += pending.byte_length
    return total


def _compacted_bytes(objects: ObjectStore, keys: PartitionKeys, entries: list[LocatedEntry]) -> int:
    """Sizes of the whole objects (compacted blobs) the entries reference, from one LIST of the
    partition's compacted objects; objects no entry references (a crashed compaction's, a
    replaced one's waiting for GC) are not counted. No LIST when no entry is a whole object."""
    referenced = {e.entry.data_key for e in entries if e.entry.byte_length is None}
    if not referenced:
        return 0
    bucket = objects.config.s3_bucket
    return sum(info.size for info in objects.list(keys.compacted_prefix) if s3_uri(bucket, info.key) in referenced)


def describe_topic(coordination: Coordination, root: str, topic: str,
                   objects: ObjectStore | None = None) -> list[PartitionDescription]:
    """Every initialized partition of ``topic``, ascending."""
    return [describe_partition(coordination, root, topic, k.tp.partition, objects, k.topic_id)
            for k in partitions_of(coordination, root, [topic])]
