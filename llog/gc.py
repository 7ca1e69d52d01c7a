"""Garbage collection of shared WAL blobs (PROTOCOL.md section 9, an llog extension).

A blob under ``R/wal-shared/`` may be deleted when no index entry and no pending append of any
partition references it, and it is older than the grace period (``LLOG_GC_GRACE_MS``, by its
object time). Orphans of failed appends and of aborted sink batches qualify as well.

Why a blob cannot be referenced again between the scan and the delete: references are only
ever made by a writer (or a sink commit) to a blob it staged itself, and never to one older than
half the grace period (``LogWriter`` raises ``StaleBlob`` and uploads again instead). A blob
older than the grace period is therefore past the point where anyone may still reference it,
whatever the order of the listing, the index scan and the delete; what the scan saw
referenced stays kept. Compaction only removes references. This holds as long as the clocks of
writers and of the object store differ by much less than half the grace period.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone

from llog.coordination import Coordination
from llog.discovery import list_topics, topic_partitions
from llog.keys import PartitionKeys, TopicPartition, s3_uri, shared_wal_prefix
from llog.objects import ObjectStore
from llog.records import WAL, ControlRecord, IndexEntry


def all_partitions(coordination: Coordination, root: str) -> list[TopicPartition]:
    """Every initialized partition under ``root``."""
    return [TopicPartition(t, p) for t in list_topics(coordination, root) for p in topic_partitions(coordination, root, t)]


def referenced_blobs(coordination: Coordination, root: str, partitions: Iterable[TopicPartition]) -> set[str]:
    """The ``s3://`` URIs of the WAL blobs the partitions' index entries and pending appends
    reference (one range scan of each index)."""
    referenced: set[str] = set()
    for tp in partitions:
        keys = PartitionKeys(root, tp)
        for v in coordination.range_scan(keys.index_prefix, keys.index_end, keys.partition_key):
            entry = IndexEntry.from_json(v.value, v.key)
            if entry.type == WAL:
                referenced.add(entry.data_key)
        control = coordination.get(keys.control, keys.partition_key)
        if control is not None:
            pending = ControlRecord.from_json(control.value, control.key).pending
            if pending is not None:
                referenced.add(pending.data_key)
    return referenced


@dataclass
class GcReport:
    listed: int = 0
    referenced: int = 0
    too_young: int = 0
    deleted: int = 0
    deleted_bytes: int = 0
    deleted_uris: list[str] = field(default_factory=list, repr=False)


def collect_garbage(objects: ObjectStore, root: str, referenced: set[str], grace_ms: int,
                    now: datetime | None = None, dry_run: bool = False) -> GcReport:
    """Delete (batch deletes) the blobs under ``R/wal-shared/`` that are not in ``referenced``
    and older than ``grace_ms``. ``referenced`` comes from :func:`referenced_blobs` over every
    partition (the module doc says why any order of scan and listing is safe)."""
    if grace_ms < 1:
        raise ValueError(f"grace period must be >= 1 ms, got {grace_ms}")
    now = now or datetime.now(timezone.utc)
    bucket = objects.config.require("s3_bucket").s3_bucket
    report = GcReport()
    doomed: list[tuple[str, int]] = []
    for info in objects.list(shared_wal_prefix(root)):
        report.listed += 1
        uri = s3_uri(bucket, info.key)
        if uri in referenced:
            report.referenced += 1
        elif (now - info.last_modified).total_seconds() * 1000 < grace_ms:
            report.too_young += 1
        else:
            doomed.append((uri, info.size))
    if doomed and not dry_run:
        objects.delete_many([uri for uri, _ in doomed])
    report.deleted = len(doomed)
    report.deleted_bytes = sum(size for _, size in doomed)
    report.deleted_uris = [uri for uri, _ in doomed]
    return report
