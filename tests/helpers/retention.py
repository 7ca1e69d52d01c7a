"""Helpers for the topic and retention tests (docs/protocol.md section 10): what is left of a partition in
Oxia and S3, and the entries Kafka's size rule keeps (the invariants, from the log start offset,
are ``tests.helpers.invariants.check_partition``)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from llog.coordination import EXPECTED_ABSENT, Coordination
from llog.discovery import topic_records
from llog.keys import TOPICS_PARTITION_KEY, PartitionKeys, TopicPartition, s3_uri, topic_key
from llog.objects import ObjectStore
from llog.records import ACTIVE, ControlRecord, IndexEntry, LocatedEntry, TopicRecord
from llog.topics import alter_topic, create_topic


def current_keys(coordination: Coordination, root: str, topic: str, partition: int) -> PartitionKeys:
    """The partition's keys in the topic's current incarnation (its record's ``topic_id``)."""
    found = topic_records(coordination, root, [topic])
    assert found, f"topic {topic!r} has no topic record"
    return PartitionKeys(root, TopicPartition(topic, partition), found[0].topic_id)


def record_only(coordination: Coordination, root: str, topic: str, partitions: int) -> TopicRecord:
    """A topic whose create stopped after writing its record (docs/protocol.md section 10.2, create):
    the record, and no partition initialized."""
    record = TopicRecord(topic, str(uuid.uuid4()), partitions, {}, ACTIVE, 1, 1)
    coordination.put(topic_key(root, topic), record.to_json(), TOPICS_PARTITION_KEY, EXPECTED_ABSENT)
    return record


def keys_left(coordination: Coordination, keys: PartitionKeys) -> list[str]:
    """Every Oxia key of the partition (``meta/*``, ``index/*``, ``consumers/*``, the claim): one
    range scan of ``[P//, P/~/)``, which holds both ranges a topic delete removes and the
    tombstone it keeps (docs/protocol.md section 12)."""
    return [v.key for v in coordination.range_scan(f"{keys.base}//", f"{keys.base}/~/", keys.partition_key)]


def check_deleted(coordination: Coordination, keys: PartitionKeys) -> ControlRecord:
    """Assert a delete left exactly the partition's tombstone (section 12): ``meta/control`` with
    ``log_state`` DELETED and the incarnation's ``topic_id``, and no other key. Returns it."""
    left = keys_left(coordination, keys)
    assert left == [keys.control], f"{keys.tp} of {keys.topic_id}: keys left after the delete: {left}"
    found = coordination.get(keys.control, keys.partition_key)
    tombstone = ControlRecord.from_json(found.value, found.key)
    assert tombstone.deleted and tombstone.topic_id == keys.topic_id, (
        f"{keys.tp}: meta/control after the delete is {tombstone.log_state} of {tombstone.topic_id}, "
        f"not a tombstone of {keys.topic_id}")
    return tombstone


def index_entries(coordination: Coordination, keys: PartitionKeys) -> list[LocatedEntry]:
    """The partition's index, in offset order."""
    return [LocatedEntry(keys.index_end_offset(v.key), IndexEntry.from_json(v.value, v.key))
            for v in coordination.range_scan(keys.index_prefix, keys.index_end, keys.partition_key)]


def compacted_objects(objects: ObjectStore, keys: PartitionKeys) -> dict[str, int]:
    """The partition's compacted objects, ``s3://`` URI to size."""
    bucket = objects.config.s3_bucket
    return {s3_uri(bucket, info.key): info.size for info in objects.list(keys.compacted_prefix)}


def entry_sizes(objects: ObjectStore, keys: PartitionKeys, entries: Sequence[LocatedEntry]) -> list[int]:
    """Each entry's bytes as retention counts them (docs/protocol.md section 10.3, step 2): its
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


def three_entries_retaining_two(writer, root: str, topic: str) -> PartitionKeys:
    """``topic`` created with one partition holding entries 1..10, 11..20, 21..30 (values
    ``r1``..``r30``), and ``retention.bytes`` that drops exactly the first; its keys."""
    create_topic(writer.coordination, root, topic, 1)
    for first in (1, 11, 21):
        writer.append(topic, 0, [f"r{n}".encode() for n in range(first, first + 10)])
    keys = current_keys(writer.coordination, root, topic, 0)
    size = index_entries(writer.coordination, keys)[0].entry.byte_length
    alter_topic(writer.coordination, root, topic, set_config={"retention.bytes": 2 * size})
    return keys
