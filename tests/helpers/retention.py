"""Helpers for the topic and retention tests (docs/topics.md): what is left of a partition in
Oxia and S3, and the entries Kafka's size rule keeps (the invariants, from the log start offset,
are ``tests.helpers.invariants.check_partition``)."""

from __future__ import annotations

from collections.abc import Sequence

from llog.coordination import Coordination
from llog.keys import PartitionKeys, TopicPartition, s3_uri
from llog.objects import ObjectStore
from llog.records import IndexEntry, LocatedEntry


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
