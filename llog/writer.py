"""The write path: one shared WAL blob, then one commit per partition (PROTOCOL.md section 4).

``append_shared(groups)`` encodes each topic-partition's records as one bytes-batch-v1 body,
packs the bodies into one LLS1 blob, PUTs it (the only S3 write), then commits the partitions
concurrently, each with three Oxia writes: the reserving CAS on ``meta/control``, the index
entry, and the CAS that clears ``pending``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from llog import failpoints
from llog.clients import ClientUser
from llog.codec import encode_batch, pack_shared, to_binary_array
from llog.config import Config
from llog.control import ControlState, clear_pending, initialize_partition, read_control, update_control
from llog.coordination import Coordination
from llog.errors import (
    AppendFailed, AppendOutcomeUnknown, EmptyAppend, LlogError, LogFenced, PartitionNotInitialized,
    StaleBlob, VersionConflict,
)
from llog.keys import PartitionKeys, TopicPartition, shared_wal_object
from llog.objects import ObjectStore
from llog.records import BYTES_BATCH_V1, WAL, ControlRecord, IndexEntry, PendingAppend, SinkProgress, now_ms

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AppendGroup:
    """Records for one topic-partition: a sequence of ``bytes`` or an Arrow binary array."""

    topic: str
    partition: int
    records: Sequence[bytes] | pa.Array


@dataclass(frozen=True)
class AppendResult:
    """Where a group's records landed: offsets ``start_offset..end_offset``."""

    topic: str
    partition: int
    start_offset: int
    end_offset: int
    index_key: str
    wal_uri: str

    @property
    def count(self) -> int:
        return self.end_offset - self.start_offset + 1


@dataclass(frozen=True)
class StagedSlice:
    """One topic-partition's body in an uploaded WAL blob, not yet in the log: what
    :meth:`LogWriter.upload` returns and :meth:`LogWriter.commit_staged` commits. Plain data, so
    it can travel from the process that uploaded it (a Spark task) to the one that commits."""

    topic: str
    partition: int
    msg_count: int
    body_offset: int
    body_length: int
    wal_uri: str
    created_at_ms: int


@dataclass(frozen=True)
class SinkBatch:
    """Who commits: batch ``batch_id`` of sink ``sink_id`` (a streaming query's id). Its
    progress is recorded in each reserving CAS, so a replayed batch commits nothing twice."""

    sink_id: str
    batch_id: int


@dataclass(frozen=True)
class _Commit:
    """One partition's part of a shared append, ready to commit."""

    keys: PartitionKeys
    staged: StagedSlice


def stage(objects: ObjectStore, root_prefix: str, groups: Sequence[AppendGroup]) -> list[StagedSlice]:
    """:meth:`LogWriter.upload` without a writer: needs S3 only, so a Spark task stages its
    records with no Oxia connection; the driver commits the slices."""
    return _stage(objects, root_prefix, _merge(groups, "stage"))


def _merge(groups: Sequence[AppendGroup], what: str) -> dict[TopicPartition, list[tuple[int, pa.BinaryArray]]]:
    """Validate every group before any I/O; each topic-partition's arrays in order."""
    if not groups:
        raise EmptyAppend(f"{what} needs at least one group")
    merged: dict[TopicPartition, list[tuple[int, pa.BinaryArray]]] = {}
    for i, group in enumerate(groups):
        tp = TopicPartition(group.topic, group.partition)
        merged.setdefault(tp, []).append((i, to_binary_array(group.records, f"{tp}: groups[{i}].records")))
    return merged


def _stage(objects: ObjectStore, root_prefix: str,
           merged: dict[TopicPartition, list[tuple[int, pa.BinaryArray]]]) -> list[StagedSlice]:
    """Section 4.2: one bytes-batch-v1 body per topic-partition, packed into one LLS1 blob, PUT."""
    bodies = []
    for tp, arrays in merged.items():
        values = arrays[0][1] if len(arrays) == 1 else pa.concat_arrays([a for _, a in arrays])
        bodies.append((tp.topic, tp.partition, encode_batch(values)))
    created_at_ms = now_ms()
    pieces, _, slices = pack_shared(bodies, created_at_ms)
    wal_uri = objects.put(shared_wal_object(root_prefix), pieces)
    failpoints.hit("writer.after_blob_put")
    return [StagedSlice(s.topic, s.partition, s.msg_count, s.body_offset, s.body_length, wal_uri, created_at_ms)
            for s in slices]


class LogWriter(ClientUser):
    """Appends records to topic-partitions. Thread-safe; reuse one per process.

    With ``auto_initialize`` a partition is created on its first append (as Kafka creates
    topics on first use); without it, appending to a partition that was never initialized raises
    :class:`PartitionNotInitialized`.
    """

    def __init__(self, config: Config, coordination: Coordination | None = None,
                 objects: ObjectStore | None = None, auto_initialize: bool = False, max_workers: int = 16):
        super().__init__(config.require("oxia_service_address", "s3_bucket"), coordination, objects, max_workers,
                         "llog-commit")
        self.auto_initialize = auto_initialize

    def initialize_partition(self, topic: str, partition: int) -> bool:
        """Section 4.1. Returns True if this call created the partition."""
        return initialize_partition(self.coordination, self.keys(topic, partition))

    def append(self, topic: str, partition: int, records: Sequence[bytes] | pa.Array) -> AppendResult:
        """Append to one partition (a shared append of one group)."""
        return self.append_shared([AppendGroup(topic, partition, records)])[0]

    def append_shared(self, groups: Sequence[AppendGroup]) -> list[AppendResult]:
        """Append every group through one shared WAL blob; one result per group, in order.

        Groups of the same topic-partition are written as one body, in the order given, and
        get consecutive offsets. Input is validated before anything is written. If some
        partitions commit and others fail, :class:`AppendFailed` carries both; if all fail,
        the first error is raised (e.g. :class:`LogFenced`). A partition that fails before its
        offsets are reserved leaves nothing but the unreferenced blob (garbage collection removes
        it); one that fails after is durable as ``pending``, and the next writer finishes it.
        """
        merged = _merge(groups, "append_shared")
        staged = _stage(self.objects, self.config.root_prefix, merged)
        commits = [_Commit(self.keys(s.topic, s.partition), s) for s in staged]
        committed, contended, errors = self._commit_together(commits)
        futures = [self._pool.submit(self._commit, c) for c in contended]
        for commit, future in zip(contended, futures):
            try:
                committed[commit.keys.tp] = future.result()
            except Exception as e:  # noqa: BLE001 - reported per partition below
                errors[(commit.keys.tp.topic, commit.keys.tp.partition)] = e

        results: list[tuple[int, AppendResult]] = []
        wal_uri = staged[0].wal_uri
        for tp, arrays in merged.items():
            if tp not in committed:
                continue
            start, index_key = committed[tp]
            for i, values in arrays:
                results.append((i, AppendResult(tp.topic, tp.partition, start, start + len(values) - 1,
                                                index_key, wal_uri)))
                start += len(values)
        ordered = [r for _, r in sorted(results, key=lambda x: x[0])]
        if errors:
            if not ordered:
                raise next(iter(errors.values()))
            raise AppendFailed(ordered, errors)
        return ordered

    def upload(self, groups: Sequence[AppendGroup]) -> list[StagedSlice]:
        """Section 4.2 only: encode the groups and PUT them as one shared WAL blob. Nothing is
        written to Oxia; until :meth:`commit_staged` commits the slices, the blob is garbage.
        Groups of one topic-partition become one body, in the order given."""
        return _stage(self.objects, self.config.root_prefix, _merge(groups, "upload"))

    def commit_staged(self, staged: Sequence[StagedSlice], sink: SinkBatch | None = None) -> list[AppendResult | None]:
        """Sections 4.3 to 4.5 for slices :meth:`upload` staged, here or in other processes.
        One result per slice; ``None`` where ``sink`` had committed that slice before.

        Partitions commit concurrently; the slices of one partition commit one after another in
        the order given, and with ``sink`` slice ``n`` of a partition records progress
        ``(batch_id, n + 1)`` in its reserving CAS. Replaying the same batch with the same slices
        (a restarted query, a commit that failed halfway) skips what is committed and commits
        the rest, so every slice lands exactly once. A slice older than half the GC grace
        period raises :class:`StaleBlob` before anything is committed. Failures are reported as
        :meth:`append_shared` reports them.
        """
        if not staged:
            return []
        now = now_ms()
        stale = [s for s in staged if self._stale(s, now)]
        if stale:
            raise StaleBlob(f"{len(stale)} staged slice(s), first in {stale[0].wal_uri}, were uploaded more than "
                            f"{self.config.gc_grace_ms // 2} ms ago (half of LLOG_GC_GRACE_MS); upload the records "
                            f"again")
        by_partition: dict[TopicPartition, list[int]] = {}
        for i, s in enumerate(staged):
            by_partition.setdefault(TopicPartition(s.topic, s.partition), []).append(i)
        results: list[AppendResult | None] = [None] * len(staged)

        def commit_partition(tp: TopicPartition, indexes: list[int]) -> None:
            keys = self.keys(tp.topic, tp.partition)
            for n, i in enumerate(indexes):
                done = self._commit(_Commit(keys, staged[i]), sink and (sink, n))
                if done is not None:
                    start, index_key = done
                    results[i] = AppendResult(tp.topic, tp.partition, start, start + staged[i].msg_count - 1,
                                              index_key, staged[i].wal_uri)
                    failpoints.hit("writer.after_staged_slice")

        futures = {tp: self._pool.submit(commit_partition, tp, ix) for tp, ix in by_partition.items()}
        errors: dict[tuple[str, int], BaseException] = {}
        for tp, future in futures.items():
            try:
                future.result()
            except Exception as e:  # noqa: BLE001 - reported per partition below
                errors[(tp.topic, tp.partition)] = e
        if errors:
            committed = [r for r in results if r is not None]
            if not committed and len(errors) == len(futures):
                raise next(iter(errors.values()))
            raise AppendFailed(committed, errors)
        return results

    # --- all partitions at once (section 4.3 to 4.5, uncontended) ------------------------------

    def _commit_together(self, commits: list[_Commit]):
        """Sections 4.3 to 4.5 for every partition in lockstep: read all controls, CAS all
        reservations, put all index entries, CAS all clears, each step one RPC per shard.

        Returns ``(committed, contended, errors)``: what committed; the partitions left to
        :meth:`_commit`'s own CAS loop (not initialized, fenced, holding someone's pending append,
        or whose reservation lost a race: nothing of theirs was reserved); and the partitions
        that failed after their reservation may have landed, which must not be retried (the next
        writer finishes a reservation left pending). A reservation whose reply was lost is
        looked for before it is left to retry, so it is never made twice.
        """
        coordination, pk = self.coordination, lambda c: c.keys.partition_key
        committed: dict[TopicPartition, tuple[int, str]] = {}
        errors: dict[tuple[str, int], BaseException] = {}
        try:
            controls = coordination.get_many([(c.keys.control, pk(c)) for c in commits])
        except LlogError:
            return committed, commits, errors  # nothing reserved yet
        contended, ready = [], []
        for commit, found in zip(commits, controls):
            state = found and ControlState(ControlRecord.from_json(found.value, found.key), found.version_id)
            if state is None or state.record.pending is not None or state.record.fenced:
                contended.append(commit)
            else:
                ready.append((commit, state, self._pending(commit, str(uuid.uuid4()), state.record.sequence_counter)))

        def fail(batch, error: BaseException):
            for commit, *_ in batch:
                errors[(commit.keys.tp.topic, commit.keys.tp.partition)] = error
            return committed, contended, errors

        try:
            reservations = coordination.put_many([
                (c.keys.control, state.record.with_changes(sequence_counter=p.end_offset + 1, pending=p).to_json(),
                 pk(c), state.version) for c, state, p in ready])
        except LlogError as e:
            return fail(ready, e)
        reserved = []
        for (commit, state, pending), result in zip(ready, reservations):
            if isinstance(result, VersionConflict):
                if not result.outcome_unknown:
                    contended.append(commit)
                    continue
                try:
                    current = read_control(coordination, commit.keys)
                    landed = self._find_landed_reservation(commit.keys, pending.append_id, [pending.start_offset],
                                                           current, commit)
                except LlogError as e:
                    fail([(commit,)], e)
                    continue
                if landed is None:
                    contended.append(commit)
                elif current.record.pending is None or current.record.pending.append_id != pending.append_id:
                    # Landed, and someone else already finished it.
                    committed[commit.keys.tp] = (pending.start_offset, commit.keys.index(pending.end_offset))
                else:
                    reserved.append((commit, current, pending))
            else:
                reserved.append((commit, ControlState(state.record.with_changes(
                    sequence_counter=pending.end_offset + 1, pending=pending), result), pending))
        if not reserved:
            return committed, contended, errors
        failpoints.hit("writer.after_reserve")

        try:
            coordination.put_many([(c.keys.index(p.end_offset), p.to_index_entry().to_json(), pk(c), None)
                                   for c, _, p in reserved])
            failpoints.hit("writer.after_index_put")
            clears = coordination.put_many([(c.keys.control, state.record.with_changes(pending=None).to_json(),
                                             pk(c), state.version) for c, state, _ in reserved])
        except LlogError as e:
            return fail(reserved, e)
        for (commit, _, pending), result in zip(reserved, clears):
            try:
                if isinstance(result, VersionConflict):  # e.g. fenced meanwhile: clear through the CAS loop
                    clear_pending(coordination, commit.keys, pending.append_id,
                                  read_control(coordination, commit.keys), self.config.cas_max_attempts)
            except LlogError as e:
                fail([(commit,)], e)
                continue
            committed[commit.keys.tp] = (pending.start_offset, commit.keys.index(pending.end_offset))
        return committed, contended, errors

    def _stale(self, s: StagedSlice, now: int) -> bool:
        """Whether referencing ``s``'s blob now could race GC (the age rule, :mod:`llog.gc`)."""
        return now - s.created_at_ms > self.config.gc_grace_ms // 2

    @staticmethod
    def _pending(commit: _Commit, append_id: str, start: int) -> PendingAppend:
        s = commit.staged
        return PendingAppend(
            append_id=append_id, start_offset=start, end_offset=start + s.msg_count - 1, msg_count=s.msg_count,
            data_key=s.wal_uri, entry_type=WAL, encoding=BYTES_BATCH_V1, created_at_ms=s.created_at_ms,
            byte_offset=s.body_offset, byte_length=s.body_length,
        )

    # --- one partition (section 4.3 to 4.5) ---------------------------------------------------

    def _commit(self, commit: _Commit, sink: tuple[SinkBatch, int] | None = None) -> tuple[int, str] | None:
        """One partition through the CAS loop: ``(start_offset, index_key)``, or None when
        ``sink`` (a sink batch and this slice's number in it) shows the slice committed."""
        keys, s = commit.keys, commit.staged
        append_id = str(uuid.uuid4())
        already = False

        def reserve(control: ControlRecord) -> ControlRecord | None:
            nonlocal already
            if control.fenced:
                raise LogFenced(keys.tp.topic, keys.tp.partition)
            if sink is not None:
                (batch, slice_no), progress = sink, control.sink_progress(sink[0].sink_id)
                if progress is not None and progress.covers(batch.batch_id, slice_no):
                    already = True
                    return None
                control = control.with_sink_progress(
                    batch.sink_id, SinkProgress(batch.batch_id, slice_no + 1, now_ms()),
                    self.config.sink_progress_retention_ms)
            if self._stale(s, now_ms()):  # checked again at each attempt: a long CAS loop ages the blob too
                raise StaleBlob(f"{keys.tp}: {s.wal_uri} was uploaded more than {self.config.gc_grace_ms // 2} ms "
                                f"ago (half of LLOG_GC_GRACE_MS); upload the records again")
            reserved.append(control.sequence_counter)
            return control.with_changes(sequence_counter=control.sequence_counter + s.msg_count,
                                         pending=self._pending(commit, append_id, control.sequence_counter))

        def landed(current: ControlState) -> ControlState | None:
            nonlocal landed_start
            landed_start = self._find_landed_reservation(keys, append_id, reserved, current, commit)
            return None if landed_start is None else current

        reserved: list[int] = []  # the start offset each CAS attempt proposed
        landed_start: int | None = None
        state = self._reserve(keys, reserve, landed)
        if already:
            return None
        pending = state.record.pending
        if pending is None or pending.append_id != append_id:
            # The reservation landed in transit and someone else already finished it.
            return landed_start, keys.index(landed_start + s.msg_count - 1)
        failpoints.hit("writer.after_reserve")

        entry = pending.to_index_entry()
        self.coordination.put(keys.index(pending.end_offset), entry.to_json(), keys.partition_key)
        failpoints.hit("writer.after_index_put")
        clear_pending(self.coordination, keys, append_id, state, self.config.cas_max_attempts)
        return pending.start_offset, keys.index(pending.end_offset)

    def _reserve(self, keys: PartitionKeys, reserve, landed) -> ControlState:
        try:
            return update_control(self.coordination, keys, reserve, self.config.cas_max_attempts,
                                  "reserving offsets", on_outcome_unknown=landed)
        except PartitionNotInitialized:
            if not self.auto_initialize:
                raise
            self.initialize_partition(keys.tp.topic, keys.tp.partition)
            return update_control(self.coordination, keys, reserve, self.config.cas_max_attempts,
                                  "reserving offsets", on_outcome_unknown=landed)

    def _owner(self, keys: PartitionKeys, offset: int, current: ControlState) -> IndexEntry | None:
        """The index entry (or pending append) covering ``offset``, if any."""
        found = self.coordination.ceiling(keys.index(offset), keys.partition_key, keys.index_prefix)
        if found is not None:
            entry = IndexEntry.from_json(found.value, found.key)
            if keys.index_end_offset(found.key) - entry.msg_count + 1 <= offset:
                return entry
        pending = current.record.pending
        if pending is not None and pending.start_offset <= offset <= pending.end_offset:
            return pending.to_index_entry()
        return None

    def _find_landed_reservation(self, keys: PartitionKeys, append_id: str, reserved: list[int],
                                 current: ControlState, commit: _Commit) -> int | None:
        """After a reserving CAS failed in transit and then conflicted: did an attempt land?
        Returns the start offset of the one that did, or None.

        For each start offset an attempt proposed, look at what now owns that offset. Ours
        (``pending`` names this append, or the index entry points at this append's bytes): it
        landed. Another WAL append, or nobody because the counter never got there: that attempt
        did not land. If every attempt is accounted for as not landed, the CAS loop goes on;
        otherwise (say the range was compacted meanwhile) :class:`AppendOutcomeUnknown`.
        """
        if current.record.pending is not None and current.record.pending.append_id == append_id:
            return current.record.pending.start_offset
        undecided = []
        for start in reserved:
            if current.record.sequence_counter <= start:
                continue
            owner = self._owner(keys, start, current)
            if owner is not None and owner.data_key == commit.staged.wal_uri and owner.byte_offset == commit.staged.body_offset:
                return start
            if owner is None or owner.type != WAL:
                undecided.append(start)
        if not undecided:
            return None
        raise AppendOutcomeUnknown(
            f"reserving offsets on {keys.tp} failed in transit and the log has moved on; the append "
            f"({commit.staged.msg_count} records in {commit.staged.wal_uri}) may or may not be in the log"
        )

