"""Garbage collection of blobs (docs/protocol.md section 9, an llog extension).

A shared WAL blob (``R/wal-shared/``) may be deleted when no index entry and no pending append
of any partition references it, and it is older than the grace period (``LLOG_GC_GRACE_MS``, by
its object time). Orphans of failed appends and of aborted sink batches qualify as well. So may
a partition's compacted blob (``P/data/compacted/``) that neither its index nor its
``meta/compaction`` record references: the orphan of a compactor that died between writing the
blob and creating the record.

Why a blob cannot be referenced again between the scan and the delete (the age rule): references
are only ever made by a writer (or a sink commit, or a compactor) to a blob it wrote itself, and
never to one older than half the grace period (``LogWriter`` and ``Compactor`` check the age
immediately before the reserving CAS or the record create, raise ``StaleBlob`` and write again
instead). An index entry is created only from a pending that still references its blob, within
the materialization budget, and never again once compaction removed it (docs/protocol.md sections 4.4, 6.1 and 8: the compaction lag ``G``). So a pass proceeds in this order:

1. Take the pass's time ``began`` first, before any partition is discovered. A blob is collected
   only if it was older than the grace period at ``began``: every reference to it was then made
   before the pass started, so its partition is discovered and its scan sees the reference,
   however long discovery and the scans take. (Measuring age at the listing, after the scans,
   would be safe only while the scans took less than half the grace period.)
2. Per partition, read ``pending`` and ``meta/compaction`` before scanning the index: a pending
   append gets its index entry before it is cleared, and a compaction record's blob gets its
   COMPACTED entry before the record is deleted, so a reference moves from those records to the
   index and never back, and reading in this order cannot miss one that moves in between. The
   scan fails on a gap in the index (offsets no entry covers): the index is damaged, and a blob
   that looks unreferenced may hold the only copy of those records, so nothing is collected.
3. List the blobs and batch-delete the unreferenced ones older than the grace period at
   ``began``. Compaction otherwise only removes references to WAL blobs.

This holds while the clocks of writers and of the object store differ by much less than half the
grace period, and while every GC uses a grace period at least the one writers use
(:func:`check_grace`). Readers that resolved an entry just before compaction swapped it and GC
deleted its blob find the blob gone; they resolve the offsets again (``llog.reader``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone

from llog import failpoints
from llog.clock import SYSTEM, Clock
from llog.config import Config
from llog.coordination import Coordination
from llog.deployment import pass_gate
from llog.discovery import partitions_of
from llog.errors import GraceBelowG, InconsistentReadState, RootPrefixMismatch
from llog.keys import PartitionKeys, s3_uri, shared_wal_prefix, sink_cut_prefix
from llog.objects import _DELETE_BATCH, ObjectInfo, ObjectStore
from llog.progress import TaskFactory, silent, track
from llog.records import CompactionRecord, ControlRecord, IndexEntry
from llog.sink_batches import pinned_references

#: Prefixes listed at once (the shared WAL prefix, and each partition's compacted blobs).
_LIST_THREADS = 16


def check_grace(grace_ms: int, config: Config) -> int:
    """``grace_ms`` if it is at least the ``gc_grace_ms`` writers use (they refuse blobs older
    than half of it, which is what makes collecting safe); else :class:`GraceBelowG`."""
    if grace_ms < config.gc_grace_ms:
        raise GraceBelowG(f"grace period {grace_ms} ms is below LLOG_GC_GRACE_MS={config.gc_grace_ms} ms, the one "
                          f"writers use (they refuse blobs older than half of it); a shorter one could delete "
                          f"blobs a writer is still committing")
    return grace_ms


def check_root(root: str, config: Config) -> str:
    """``root`` if it is ``config``'s root prefix, the one whose ``G`` the deployment gate
    checked (docs/protocol.md section 9.2, step 4); else :class:`RootPrefixMismatch`."""
    if root != config.root_prefix:
        raise RootPrefixMismatch(f"GC was asked to collect under root prefix {root!r}, but its config's is "
                                 f"{config.root_prefix!r}, the one whose LLOG_GC_GRACE_MS the deployment gate "
                                 f"checked; collect with a config of root prefix {root!r}")
    return root


def all_partitions(coordination: Coordination, root: str) -> list[PartitionKeys]:
    """Every initialized partition of every live topic incarnation under ``root`` (a deleted
    incarnation's keys, and whatever lands among them late, reference nothing: section 12)."""
    return partitions_of(coordination, root)


def referenced_blobs(coordination: Coordination, root: str, partitions: Iterable[PartitionKeys],
                     progress: TaskFactory = silent) -> set[str]:
    """The ``s3://`` URIs of the blobs the partitions reference: their pending appends and
    compaction records (one multi-key read, first), then their index entries (one range scan
    each). Raises :class:`InconsistentReadState` if an index has a gap (module doc).

    A partition whose ``meta/control`` is a tombstone references nothing (docs/protocol.md
    section 9.2, step 3): its topic was deleted after the partitions were found, and whatever
    its keys hold now is debris (section 12.5), so its index is not scanned, or, when the
    tombstone shows at the read again that a "gap" makes, not scanned further.
    ``progress`` (:mod:`llog.progress`) counts the partitions scanned."""
    keys = list(partitions)
    referenced: set[str] = set()
    failpoints.hit("gc.before_control_read")
    records = coordination.get_many([(key, k.partition_key) for k in keys for key in (k.control, k.compaction)])
    live: list[tuple[PartitionKeys, int]] = []  # each partition to scan, with its log start offset
    for k, control, compaction in zip(keys, records[0::2], records[1::2]):
        record = ControlRecord.from_json(control.value, control.key) if control is not None else None
        if record is not None and record.deleted:
            continue  # deleted since it was found: a tombstone references nothing (section 12.5)
        if record is not None and record.pending is not None:
            referenced.add(record.pending.data_key)
        live.append((k, record.log_start_offset if record is not None else 1))
        if compaction is not None:
            referenced.add(CompactionRecord.from_json(compaction.value, compaction.key).data_key)
    failpoints.hit("gc.before_index_scan")
    for k, start in track(live, "gc: reading references", len(keys), unit="partitions", progress=progress):
        referenced |= _index_references(coordination, k, start)
    return referenced


def _index_references(coordination: Coordination, keys: PartitionKeys, start: int) -> set[str]:
    """The blobs ``keys``' index entries reference, with ``start`` its log start offset when its
    ``meta/control`` was read. Raises :class:`InconsistentReadState` on a gap in ``start..``;
    an index that starts above ``start`` is no gap when ``meta/control``, read again, has the
    log start at or past its first offset (a retention pass in between), or is a tombstone (a
    delete in between: nothing is referenced, section 9.2)."""
    referenced: set[str] = set()
    covered = start - 1  # offsets below the log start are gone (docs/protocol.md section 10.3)
    for v in coordination.range_scan(keys.index_prefix, keys.index_end, keys.partition_key):
        entry, end = IndexEntry.from_json(v.value, v.key), keys.index_end_offset(v.key)
        if end < start:
            referenced.add(entry.data_key)  # left by a retention pass midway; still a reference
            continue
        first = end - entry.msg_count + 1
        if first > covered + 1 and covered == start - 1:
            again = _control_again(coordination, keys)
            if again is not None and again.deleted:
                return set()  # deleted between the reads: its keys are debris (section 12.5)
            if again is not None and again.log_start_offset >= first:
                covered = first - 1  # a retention pass moved the start between the reads: not a gap
        if first > covered + 1:
            raise InconsistentReadState(
                f"{keys.tp}: no index entry covers offsets {covered + 1}..{end - entry.msg_count}; garbage "
                f"collection stops, since a blob that looks unreferenced may hold the only copy of them")
        covered = max(covered, end)
        referenced.add(entry.data_key)
    return referenced


def _control_again(coordination: Coordination, keys: PartitionKeys) -> ControlRecord | None:
    """``keys``' ``meta/control`` read again (None: missing)."""
    control = coordination.get(keys.control, keys.partition_key)
    return None if control is None else ControlRecord.from_json(control.value, control.key)


@dataclass
class GcReport:
    listed: int = 0
    referenced: int = 0
    too_young: int = 0
    deleted: int = 0
    deleted_bytes: int = 0
    deleted_uris: list[str] = field(default_factory=list, repr=False)
    #: Pinned sink batches that could not be read (keys): while there are any, no WAL blob and
    #: no sink cut is deleted (docs/protocol.md section 9.2); ``llog sinks unpin`` removes one.
    unreadable_pins: list[str] = field(default_factory=list)
    #: Unreferenced blobs old enough to go, kept because a pin could not be read.
    kept_for_unreadable_pins: int = 0


def gc_figures(report: GcReport, prefix: str = "") -> dict[str, tuple[str, float]]:
    """A pass's numbers for :func:`llog.metrics.write_run_metrics` (names after ``prefix``)."""
    return {
        prefix + "listed_objects": ("Blobs GC listed", report.listed),
        prefix + "referenced_objects": ("Listed blobs that something references", report.referenced),
        prefix + "too_young_objects": ("Unreferenced blobs younger than the grace period", report.too_young),
        prefix + "deleted_objects": ("Blobs GC deleted (or would delete, in a dry run)", report.deleted),
        prefix + "deleted_bytes": ("Bytes of the blobs GC deleted", report.deleted_bytes),
        prefix + "unreadable_pins": ("Pinned sink batches GC could not read (it kept every WAL blob)",
                                     len(report.unreadable_pins)),
    }


def collect_garbage(objects: ObjectStore, root: str, referenced: set[str], grace_ms: int,
                    now: datetime | None = None, dry_run: bool = False,
                    partitions: Iterable[PartitionKeys] = (), progress: TaskFactory = silent,
                    unreadable_pins: Iterable[str] = ()) -> GcReport:
    """Delete (batch deletes) the blobs under ``R/wal-shared/``, the sink cuts
    ``R/sink-cuts/{uuid}``, and the compacted blobs of ``partitions``, that are not in
    ``referenced`` and were older than ``grace_ms`` at ``now``,
    the time taken before the partitions behind ``referenced`` were discovered (module doc;
    :func:`gc_pass` does all of it in order). ``partitions`` must be among those whose
    references ``referenced`` holds. ``progress`` (:mod:`llog.progress`) counts the blobs
    examined, then those deleted. With ``unreadable_pins`` (pinned records that could not be
    read: each may reference any WAL blob), no WAL blob and no sink cut is deleted. ``root`` must
    be ``objects.config``'s root prefix and ``grace_ms`` at least its ``G`` (section 9.2, step 4),
    or nothing is listed or deleted."""
    check_root(root, objects.config)
    check_grace(grace_ms, objects.config)
    now = now or datetime.now(timezone.utc)
    bucket = objects.config.require("s3_bucket").s3_bucket
    report = GcReport(unreadable_pins=list(unreadable_pins))
    doomed: list[tuple[str, int]] = []
    compacted = [k.compacted_prefix for k in partitions]
    cuts = sink_cut_prefix(root)
    pinnable = (shared_wal_prefix(root), cuts)  # what a pinned batch may reference (section 9.1)
    with ThreadPoolExecutor(max_workers=_LIST_THREADS, thread_name_prefix="llog-gc-list") as pool, \
            progress("gc: examining blobs", unit="blobs") as examined:
        # The shared WAL blobs stream by while the partitions' (smaller) listings run alongside. A
        # blob or a cut is a direct child of its prefix: a topic of that name has its compacted
        # blobs deeper under it, candidates only through its own partition's listing.
        def children(prefix: str) -> Iterator[ObjectInfo]:
            return (info for info in objects.list(prefix) if "/" not in info.key[len(prefix):])

        for info in itertools.chain(children(shared_wal_prefix(root)), children(cuts), itertools.chain.from_iterable(
                pool.map(lambda prefix: list(objects.list(prefix)), compacted))):
            examined()
            report.listed += 1
            uri = s3_uri(bucket, info.key)
            if uri in referenced:
                report.referenced += 1
            elif (now - info.last_modified).total_seconds() * 1000 < grace_ms:
                report.too_young += 1
            elif report.unreadable_pins and info.key.startswith(pinnable):
                report.kept_for_unreadable_pins += 1
            else:
                doomed.append((uri, info.size))
    if doomed and not dry_run:
        uris = [uri for uri, _ in doomed]
        with progress("gc: deleting blobs", len(uris), unit="blobs") as deleted:
            # The requests delete_many would send for all of them at once (one bucket), one by one.
            for i in range(0, len(uris), _DELETE_BATCH):
                deleted(objects.delete_many(uris[i:i + _DELETE_BATCH]))
    report.deleted = len(doomed)
    report.deleted_bytes = sum(size for _, size in doomed)
    report.deleted_uris = [uri for uri, _ in doomed]
    return report


def gc_pass(coordination: Coordination, objects: ObjectStore, root: str, grace_ms: int,
            dry_run: bool = False, clock: Clock = SYSTEM, progress: TaskFactory = silent) -> GcReport:
    """One whole pass in the safe order (module doc): time, discovery, references, listing.
    ``progress`` (:mod:`llog.progress`; ``llog gc`` passes :func:`llog_tools.progress.task`) shows
    each step. ``root`` must be ``objects.config``'s root prefix and ``grace_ms`` at least its
    ``G`` (section 9.2, step 4): checked first, before anything is read."""
    check_root(root, objects.config)
    check_grace(grace_ms, objects.config)
    pass_gate(objects.config, coordination, objects, "gc")  # before its time: a clock off is refused first
    began = datetime.fromtimestamp(clock.now_ms() / 1000, timezone.utc)
    with progress("gc: finding partitions", unit="partitions") as found:
        partitions = all_partitions(coordination, root)
        found(len(partitions))
    # Pinned sink batches first: their references move to pending appends, then to the index.
    pins = pinned_references(coordination, objects, root)
    referenced = set(pins.uris) | referenced_blobs(coordination, root, partitions, progress)
    failpoints.hit("gc.after_scan")
    return collect_garbage(objects, root, referenced, grace_ms, now=began, dry_run=dry_run, partitions=partitions,
                           progress=progress, unreadable_pins=pins.unreadable)
