"""Retention (docs/protocol.md section 10.3): move a partition's log start offset past whole index
entries older than ``retention.ms`` or beyond ``retention.bytes``, then delete those entries.

A pass runs under the partition's compactor claim, after compaction's recovery (step 0), so
never alongside a compaction of the partition (:meth:`llog.compactor.Compactor.compact_partition`
and :meth:`~llog.compactor.Compactor.retain_partition` call :func:`apply_retention`). Its order:
``log_start_offset`` first (CAS, only forward), then the compaction cursor (only forward), then
the index keys below the new start. Readers that come after the first step get
``OffsetOutOfRange`` naming the readable range; readers that were midway find a gap at the low
end, read ``meta/control`` again and get the same error (``llog.reader``). The blobs the dropped
entries referenced are left to GC, which collects them after the grace period.

Whatever ``retention.ms`` says, an entry younger than the GC grace period ``G`` is never
dropped: an index key deleted once must never be created again (docs/protocol.md section 8, "Created
once"), and a late create of it can land until ``G`` after its blob was written.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from llog import failpoints
from llog.clock import SYSTEM, Clock
from llog.config import Config
from llog.control import read_control, update_control
from llog.coordination import Coordination
from llog.errors import VersionConflict
from llog.keys import PartitionKeys, s3_uri
from llog.objects import ObjectStore
from llog.records import CompactionCursor, IndexEntry, LocatedEntry

log = logging.getLogger(__name__)


@dataclass
class PartitionRetention:
    """What one retention pass of a partition did."""

    log_start_offset: int = 1
    #: Offsets, index entries and body bytes this pass dropped, and why (``time`` and/or ``size``).
    records: int = 0
    entries: int = 0
    bytes: int = 0
    reasons: tuple[str, ...] = ()


def finish_retention(coordination: Coordination, keys: PartitionKeys, log_start_offset: int | None = None) -> int:
    """docs/protocol.md section 10.3, step 1: the compaction cursor to at least the log start offset
    (CAS, only forward), then the index keys below it deleted. Idempotent: any compactor's
    recovery runs it, so a pass that crashed after moving the start is finished. Returns the
    log start offset."""
    pk = keys.partition_key
    if log_start_offset is None:
        log_start_offset = read_control(coordination, keys).record.log_start_offset
    if log_start_offset <= 1:
        return log_start_offset
    for _ in range(16):
        found = coordination.get(keys.compaction_cursor, pk)
        if found is None:
            break
        cursor = CompactionCursor.from_json(found.value, found.key)
        if cursor.offset >= log_start_offset:
            break
        try:
            coordination.put(keys.compaction_cursor, CompactionCursor(log_start_offset).to_json(), pk,
                             expected_version=found.version_id)
            break
        except VersionConflict:
            continue  # a compactor stalled past its claim moved it: read again
    # Keys of entries ending below the start. A pass cuts at entry ends; a COMPACTED entry that
    # starts below the start (a compaction finished across the cut, docs/protocol.md section
    # 10.3) ends at or past it, and stays.
    coordination.delete_range(keys.index(0), keys.index(log_start_offset), pk)
    return log_start_offset


def apply_retention(coordination: Coordination, objects: ObjectStore, keys: PartitionKeys, config: Config,
                    retention_ms: int, retention_bytes: int, clock: Clock = SYSTEM) -> PartitionRetention:
    """One retention pass of a partition (docs/protocol.md section 10.3). The caller holds the
    partition's compactor claim and has run compaction's recovery."""
    start = finish_retention(coordination, keys)
    done = PartitionRetention(log_start_offset=start)
    if retention_ms < 0 and retention_bytes < 0:
        return done
    pk = keys.partition_key
    entries = [LocatedEntry(keys.index_end_offset(v.key), IndexEntry.from_json(v.value, v.key))
               for v in coordination.range_scan(keys.index(start), keys.index_end, pk)]
    if not entries:
        return done
    sizes = _entry_bytes(objects, keys, entries) if retention_bytes >= 0 else [e.entry.byte_length or 0 for e in entries]
    now = clock.now_ms()
    young_from = now - config.gc_grace_ms  # created at or after this: never dropped
    expired_before = now - retention_ms if retention_ms >= 0 else None
    left = sum(sizes)
    dropped: list[LocatedEntry] = []
    reasons: set[str] = set()
    for located, size in zip(entries, sizes):
        created = located.entry.created_at_ms
        if created >= young_from:
            break
        by_time = expired_before is not None and created < expired_before
        by_size = retention_bytes >= 0 and left - size >= retention_bytes
        if not (by_time or by_size):
            break
        reasons.add("time" if by_time else "size")
        dropped.append(located)
        left -= size
    if not dropped:
        return done
    new_start = dropped[-1].end_offset + 1
    failpoints.hit("retention.before_control_update")
    update_control(coordination, keys,
                   lambda control: None if control.log_start_offset >= new_start
                   else control.with_extra(log_start_offset=new_start),
                   "moving log_start_offset", config, clock)
    finish_retention(coordination, keys, new_start)
    done.log_start_offset = new_start
    done.records = new_start - start
    done.entries = len(dropped)
    # Sizes were only counted exactly for the size rule; otherwise a compacted object's is listed now.
    done.bytes = sum(sizes[:len(dropped)]) if retention_bytes >= 0 else sum(_entry_bytes(objects, keys, dropped))
    done.reasons = tuple(sorted(reasons))
    log.info("%s: retention (%s) dropped offsets %d..%d (%d entries, %d bytes); log start offset is now %d",
             keys.tp, "+".join(done.reasons), start, new_start - 1, done.entries, done.bytes, new_start)
    return done


def _entry_bytes(objects: ObjectStore, keys: PartitionKeys, entries: list[LocatedEntry]) -> list[int]:
    """Each entry's body bytes: its ``byte_length``, or for a whole object (a compacted blob) the
    object's size, from one LIST of the partition's compacted objects."""
    sizes: dict[str, int] = {}
    if any(e.entry.byte_length is None for e in entries):
        bucket = objects.config.s3_bucket
        sizes = {s3_uri(bucket, info.key): info.size for info in objects.list(keys.compacted_prefix)}
    return [e.entry.byte_length if e.entry.byte_length is not None else sizes.get(e.entry.data_key, 0)
            for e in entries]
