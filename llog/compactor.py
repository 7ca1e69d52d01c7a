"""Compaction (docs/protocol.md section 6): rewrite a run of WAL entries of one partition as one
compacted blob, one bytes-batch-v1 body, and swap the index over to it without a moment in which
any offset is unreadable.

Per partition: take the ephemeral ``meta/compactor-claim`` (skip the partition if someone holds
it), finish a pending append (:func:`llog.control.finish_pending`, with the materialization
budget), resume a ``meta/compaction`` record left by a crashed compactor (step 4 deletes it
instead if no step 4 of it can land any more; one whose run the cursor passed while above the
log start, step 3's rule, is stale: fenced and deleted at once, or resumed if its step 4 landed,
section 6.0; one whose start a retention pass's cursor passed is resumed; one written before
v1.3, without ``end_entry_version``, is given one first), then compact run after run until none
is left or the deadline passes, and release the claim with a versioned delete.

**Fence before a record goes** (section 6.0): every step 4 of a record, by its compactor or by one
that resumed it, is a CAS of ``index/{end}`` at the version selected in step 1 (the record's
``end_entry_version``). Before a record in WRITING_COMPACTED_INDEX is deleted (stale, or its
compactor leaving at step 3), ``index/{end}`` is written again at that version with the value it
holds, so no step 4 of the record still on its way can land after the record went (and GC took
its blob); a fence that finds the run's COMPACTED entry resumes the record instead.

Each compaction:

1. From ``meta/compaction-cursor``, select WAL entries starting exactly at the cursor, stopping
   at a gap, a COMPACTED entry, the offsets limit, the entry still named by ``pending``, or the
   first entry not older than the grace period ``G`` (the compaction lag: an index key that
   compaction deletes can then never be created late, section 8 "Created once").
2. Fetch each source blob once (range GETs), concatenate the bodies with Arrow, PUT one blob.
3. Check the blob's age immediately before creating ``meta/compaction`` (state
   WRITING_COMPACTED_INDEX; it must not exist), and again before any retry of the create. A blob
   PUT more than half the GC grace period ago is not referenced (``StaleBlob``; GC collects it
   and the next run compacts again): the age rule of :mod:`llog.gc`, kept as writers keep it.
   Then read the cursor and the log start: a cursor past the run's start and above the log
   start means another compactor compacted from this run's cursor after the selection (this one
   stalled past its claim): the record is deleted (fenced first) and the partition left, so no
   COMPACTED entry of this run can land inside a run selected meanwhile, whose step 5 would
   delete it. Last, a CAS of the record at its version (value unchanged): a conflict (another
   compactor's step 0 deleted it as stale or resumed it) leaves the partition, so no COMPACTED
   entry lands without its record.
4. CAS ``index/{end}`` from the run's last WAL entry to the COMPACTED entry, at the record's
   ``end_entry_version``; state DELETING_OLD. Any conflict reads the key again: this run's
   COMPACTED entry in place is a step 4 of this record, landed (this one's after a lost reply,
   or the other sender's): go on.
   Readers now see the COMPACTED entry overlapping the WAL entries below it; both hold the same
   bytes, and the reader takes each offset from the first entry that covers it. Anything else:
   no step 4 of the record can land any more; if the cursor moved past the run's start (another
   compactor did this run, or retention dropped it, while this one stalled past its claim) or
   the key still holds the run's last WAL entry (fenced), the record is deleted and the
   partition left. A run that a retention pass cut into meanwhile (the entry unchanged)
   is finished: its COMPACTED entry then starts below the log start, which section 10.3 allows.
   (No other compactor can have compacted a first part of it after step 3's check.)
5. ``delete_range(index/{start}, index/{end})``: the lower keys only; state UPDATING_CURSOR.
6. Move the cursor to ``end + 1`` (only forward), delete ``meta/compaction``.

Every step is idempotent and checks what the previous one left, so any compactor resumes any
record. The records of a compacted run keep their bytes, offsets, keys, headers and event times;
their ``created_at_ms`` becomes the newest of the run's entries (a compacted body has one). The
body is bytes-batch-v1 when every entry is and the topic is uncompressed, records-v2 otherwise
(docs/protocol.md section 11.4).
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import time
import uuid
from dataclasses import dataclass

from llog import failpoints
from llog.clients import ClientUser
from llog.clock import Clock
from llog.codec import COMPRESSION_CODES, concat_records, encode_body
from llog.config import Config
from llog.control import check_blob_age, finish_pending, read_control
from llog.coordination import EXPECTED_ABSENT, Coordination, Versioned
from llog.errors import ClaimHeld, CorruptRecord, InconsistentReadState, TopicDeleted, VersionConflict
from llog.keys import PartitionKeys, partition_keys
from llog.objects import ObjectStore
from llog.progress import TaskFactory, silent
from llog.reader import LogReader
from llog.retention import apply_retention, finish_retention
from llog.topics import TopicSettings
from llog.records import (
    COMPACTED, DELETING_OLD, UPDATING_CURSOR, WAL, WRITING_COMPACTED_INDEX, CompactionCursor,
    CompactionRecord, ControlRecord, IndexEntry, LocatedEntry,
)

log = logging.getLogger(__name__)

#: Offsets and body bytes one compaction takes at most, by default (a run is held in memory).
DEFAULT_MAX_OFFSETS = 1_000_000
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
#: Crash points, in the order a compaction reaches them (``LLOG_FAILPOINT``).
FAILPOINTS = (
    "compactor.after_blob_put",
    "compactor.after_record_create",
    "compactor.after_index_overwrite",
    "compactor.after_delete_range",
    "compactor.after_cursor_move",
)


@dataclass
class PartitionCompaction:
    """What compacting one partition did."""

    topic: str
    partition: int
    skipped_claimed: bool = False
    recoveries: int = 0
    #: Of the recoveries, ``meta/compaction`` records step 0 found (docs/protocol.md section 6.0):
    #: a compactor stopped between its record's create and its delete, resumed or deleted as stale.
    resumed_compactions: int = 0
    compactions: int = 0
    records: int = 0
    bytes: int = 0
    source_gets: int = 0
    source_entries: int = 0
    #: Retention (docs/protocol.md section 10.3): the log start offset after this run, and the
    #: offsets, index entries and bytes it dropped.
    log_start_offset: int = 1
    retention_records: int = 0
    retention_entries: int = 0
    retention_bytes: int = 0


class Compactor(ClientUser):
    """Compacts partitions; one instance per process is enough (thread-safe)."""

    def __init__(self, config: Config, coordination: Coordination | None = None, objects: ObjectStore | None = None,
                 compactor_id: str | None = None, max_offsets: int = DEFAULT_MAX_OFFSETS,
                 max_bytes: int = DEFAULT_MAX_BYTES, max_workers: int = 8, clock: Clock | None = None):
        if max_offsets < 1 or max_bytes < 1:
            raise ValueError(f"max_offsets and max_bytes must be >= 1, got {max_offsets} and {max_bytes}")
        super().__init__(config.require("oxia_service_address", "s3_bucket"), coordination, objects, max_workers,
                         "llog-compact", clock)
        self.reader = LogReader(config, self.coordination, self.objects, max_workers)
        self.compactor_id = compactor_id or f"{config.client_identifier or socket.gethostname()}-{uuid.uuid4().hex[:8]}"
        self.max_offsets = max_offsets
        self.max_bytes = max_bytes

    def close(self) -> None:
        self.reader.close()
        super().close()

    # --- one partition ------------------------------------------------------------------------

    def compact_partition(self, topic: str, partition: int, deadline: float | None = None,
                          retention: bool = False, progress: TaskFactory = silent,
                          topic_id: str | None = None) -> PartitionCompaction:
        """Claim the partition, recover, with ``retention`` run a retention pass
        (docs/protocol.md section 10.3), compact until nothing is left or ``time.monotonic()``
        passes ``deadline``, release the claim. ``progress`` (:mod:`llog.progress`; ``llog
        compact`` passes :func:`llog_tools.progress.task`) counts the records compacted. ``topic_id``:
        the incarnation to compact (default: the topic's current one)."""
        return self._under_claim(topic, partition, topic_id, deadline, retention, compact=True, progress=progress)

    def retain_partition(self, topic: str, partition: int, topic_id: str | None = None) -> PartitionCompaction:
        """A retention pass alone (``llog retention``): claim, recover, retention, release."""
        return self._under_claim(topic, partition, topic_id, None, retention=True, compact=False)

    def _under_claim(self, topic: str, partition: int, topic_id: str | None, deadline: float | None, retention: bool,
                     compact: bool, progress: TaskFactory = silent) -> PartitionCompaction:
        keys = self.keys(topic, partition) if topic_id is None else partition_keys(self.config.root_prefix, topic,
                                                                                     partition, topic_id)
        done = PartitionCompaction(topic, partition)
        self.check_deployment(f"compactor {self.compactor_id}")
        claim = json.dumps({"compactor_id": self.compactor_id, "claimed_at_ms": self.clock.now_ms()}).encode()
        try:
            claim_version = self.coordination.claim(keys.compactor_claim, claim, keys.partition_key)
        except ClaimHeld:
            done.skipped_claimed = True
            return done
        try:
            state = read_control(self.coordination, keys, self.clock)  # step 0
            if state.record.pending is not None:
                finish_pending(self.coordination, [(keys, state)], self.config, self.clock)
                done.recoveries += 1
            in_flight = self.coordination.get(keys.compaction, keys.partition_key)
            if in_flight is not None:
                record = CompactionRecord.from_json(in_flight.value, in_flight.key)
                if self._recover_record(keys, record, in_flight.version_id):
                    done.resumed_compactions += 1
                done.recoveries += 1
            done.log_start_offset = finish_retention(self.coordination, keys)  # a pass that crashed midway
            failpoints.hit("compactor.after_recover")
            if retention:
                # Read fresh: retention deletes, so it never acts on a setting older than now.
                settings = TopicSettings.of(topic, self.topics.get(topic, fresh=True), self.config)
                kept = apply_retention(self.coordination, self.objects, keys, self.config, settings.retention_ms,
                                       settings.retention_bytes, self.clock)
                done.log_start_offset = kept.log_start_offset
                done.retention_records, done.retention_entries, done.retention_bytes = kept.records, kept.entries, kept.bytes
            if compact:
                with progress(f"compacting {keys.tp}", unit="records") as compacted:
                    while deadline is None or time.monotonic() < deadline:
                        if not self._compact_next(keys, done):
                            break
                        compacted.update(completed=done.records)
        except BaseException:
            with contextlib.suppress(Exception):  # the claim expires with the session anyway
                self.coordination.release(keys.compactor_claim, keys.partition_key, claim_version)
            raise
        self.coordination.release(keys.compactor_claim, keys.partition_key, claim_version)
        return done

    # --- one compaction -----------------------------------------------------------------------

    def _select(self, keys: PartitionKeys, cursor: int, control: ControlRecord) -> list[tuple[LocatedEntry, int]]:
        """Step 1: WAL entries (with their versions) from exactly ``cursor``, contiguous, at most
        ``max_offsets`` offsets and ``max_bytes`` of bodies (but at least one entry), none of
        them named by ``control.pending`` and each older than the grace period ``G``."""
        pk = keys.partition_key
        pending_from = control.pending.start_offset if control.pending is not None else None
        young_from = self.clock.now_ms() - self.config.gc_grace_ms  # created at or after this: too young
        found = self.coordination.range_scan(keys.index(cursor), keys.index(cursor + self.max_offsets), pk)
        if not found:
            first = self.coordination.ceiling(keys.index(cursor), pk, keys.index_prefix)
            found = [first] if first is not None else []
        run, position, size = [], cursor, 0
        for v in found:
            located = LocatedEntry(keys.index_end_offset(v.key), IndexEntry.from_json(v.value, v.key))
            if located.entry.type != WAL or located.start_offset != position:
                break
            if (pending_from is not None and located.end_offset >= pending_from) \
                    or located.entry.created_at_ms >= young_from:
                break
            size += located.entry.byte_length or 0
            if run and size > self.max_bytes:
                break
            run.append((located, v.version_id))
            position = located.end_offset + 1
        return run

    def _compact_next(self, keys: PartitionKeys, done: PartitionCompaction) -> bool:
        cursor, control = self._cursor_and_control(keys)
        run = self._select(keys, cursor.offset, control)
        if not run:
            return False
        failpoints.hit("compactor.after_select")
        entries = [located for located, _ in run]
        before = self.objects.stats["get"] + self.objects.stats["range_get"]
        parts = self.reader.entry_values(entries)
        done.source_gets += self.objects.stats["get"] + self.objects.stats["range_get"] - before
        done.source_entries += len(entries)
        body = encode_body(concat_records([records for records, _ in parts]), self._compression(keys, parts))
        put_at = self.clock.now_ms()
        data_key = self.objects.put(keys.compacted_object(), body.pieces)  # step 2
        failpoints.hit("compactor.after_blob_put")

        def age_check() -> None:  # step 3, immediately before every attempt of the create
            check_blob_age(f"{keys.tp}: compaction", data_key, put_at, self.config, self.clock,
                           "it is left for GC and the run is compacted again next time")

        age_check()  # a slow PUT fails here already, before anything else is done
        failpoints.hit("compactor.after_age_check")
        start, end = entries[0].start_offset, entries[-1].end_offset
        record = CompactionRecord(
            compaction_id=str(uuid.uuid4()), state=WRITING_COMPACTED_INDEX, start_offset=start, end_offset=end,
            msg_count=end - start + 1, data_key=data_key, encoding=body.encoding,
            created_at_ms=max(e.entry.created_at_ms for e in entries), last_entry_start_offset=entries[-1].start_offset,
            end_entry_version=run[-1][1],
        )
        version = self.coordination.put(keys.compaction, record.to_json(), keys.partition_key,
                                        expected_version=EXPECTED_ABSENT, guard=age_check)
        failpoints.hit("compactor.after_record_create")
        version = self._may_go_on(keys, record, version)
        if version is None:
            return False
        if not self._finish(keys, record, version):
            return False
        done.compactions += 1
        done.records += record.msg_count
        done.bytes += body.length
        return True

    def _compression(self, keys: PartitionKeys, parts: list) -> str:
        """The compacted body's compression: the topic's, or if that is none the strongest of the
        run's bodies, so compacting never inflates what was written compressed."""
        configured = self.topics.compression(keys.tp.topic)
        if configured != "none":
            return configured
        return max((compression for _, compression in parts), key=COMPRESSION_CODES.__getitem__, default="none")

    def _finish(self, keys: PartitionKeys, record: CompactionRecord, version: int) -> bool:
        """Steps 4 to 6 from the record's state (a fresh compaction, or one being resumed).
        False if no step 4 of the record can land any more (another compactor did this run,
        retention dropped its end, or a fence took its version): the record is deleted, section
        6.4. False too if a CAS of the record conflicts: another compactor resumed the record (or
        finished it) meanwhile, and finishes it; this one leaves it to them."""
        pk = keys.partition_key
        if record.state == WRITING_COMPACTED_INDEX:
            if not self._overwrite_end_entry(keys, record):
                log.warning("%s: compaction %s of %d..%d left: index/%d left the version it was selected at (another "
                            "compactor did this run, retention dropped its end, or a fence); deleting the record",
                            keys.tp, record.compaction_id, record.start_offset, record.end_offset, record.end_offset)
                self._delete_record(keys, version)
                return False
            record = record.with_state(DELETING_OLD)
            version = self._move_record(keys, record, version)
            if version is None:
                return False
            failpoints.hit("compactor.after_index_overwrite")
        if record.state == DELETING_OLD:
            if record.start_offset < record.end_offset:
                self.coordination.delete_range(keys.index(record.start_offset), keys.index(record.end_offset), pk)
            record = record.with_state(UPDATING_CURSOR)
            version = self._move_record(keys, record, version)
            if version is None:
                return False
            failpoints.hit("compactor.after_delete_range")
        cursor = self._cursor(keys)
        if cursor.offset < record.end_offset + 1:  # only ever forward
            self.coordination.put(keys.compaction_cursor, CompactionCursor(record.end_offset + 1).to_json(), pk,
                                  expected_version=cursor.version)
        failpoints.hit("compactor.after_cursor_move")
        self._delete_record(keys, version)
        return True

    def _move_record(self, keys: PartitionKeys, record: CompactionRecord, version: int) -> int | None:
        """CAS ``record`` (its next state) at ``version``; its new version, or None on a conflict:
        another compactor resumed the record (its step 4 sent by both, section 6 step 4) or
        finished it, and goes on with it."""
        try:
            return self.coordination.put(keys.compaction, record.to_json(), keys.partition_key,
                                         expected_version=version)
        except VersionConflict:
            log.info("%s: compaction %s of %d..%d: its record moved on under this compactor (another one resumed "
                     "it); left to that one", keys.tp, record.compaction_id, record.start_offset, record.end_offset)
            return None

    def _may_go_on(self, keys: PartitionKeys, record: CompactionRecord, version: int) -> int | None:
        """Section 6 step 3, once the record exists: the cursor and ``S``, then a CAS of the
        record at ``version``, its value unchanged; returns the record's new version, or None if
        the run is left. A cursor past the run's start and above ``S`` (:func:`_cursor_passed`):
        the record is deleted, fenced first (:meth:`_fence_end_entry`), and the run left; unless
        the fence finds the run's step 4 landed (a compactor resumed the record at step 0 and
        swapped it in), and the run goes on to step 5. The CAS conflicts: another compactor's step 0
        deleted the record as stale (this one stalled between its create and here) or resumed
        it; the run is left and nothing deleted. Step 0 deletes a stale record at the version it
        read, so of that delete and this CAS one lands; and a record that was there from a
        cursor read that passed is never found stale (while it exists the cursor moves only by a
        retention pass, to ``S``): no COMPACTED entry of this run lands without its record."""
        cursor, control = self._cursor_and_control(keys)
        if _cursor_passed(record, cursor.offset, control.log_start_offset):
            log.warning("%s: compaction %s of %d..%d left: the cursor moved to %d (log start %d) after the run was "
                        "selected, so another compactor compacted from its start meanwhile (this one stalled past its "
                        "claim); deleting the record", keys.tp, record.compaction_id, record.start_offset,
                        record.end_offset, cursor.offset, control.log_start_offset)
            if self._fence_end_entry(keys, record):
                log.warning("%s: compaction %s of %d..%d: a compactor that resumed its record swapped it in meanwhile; "
                            "finishing the run instead", keys.tp, record.compaction_id, record.start_offset,
                            record.end_offset)
                return version
            self._delete_record(keys, version)
            return None
        try:
            return self.coordination.put(keys.compaction, record.to_json(), keys.partition_key,
                                         expected_version=version)
        except VersionConflict:
            log.warning("%s: compaction %s of %d..%d left: its record (version %d) was deleted as stale or resumed by "
                        "another compactor's recovery while this one stalled past its claim", keys.tp,
                        record.compaction_id, record.start_offset, record.end_offset, version)
            return None

    def _recover_record(self, keys: PartitionKeys, record: CompactionRecord, version: int) -> bool:
        """Section 6.0: resume a ``meta/compaction`` record found at ``version`` (steps 4 to 6),
        or delete it; True if it was resumed. A record without ``end_entry_version`` is given one
        first (:meth:`_adopt_end_entry_version`). A stale one (:meth:`_stale`) is fenced
        (:meth:`_fence_end_entry`): deleted, unless its step 4 landed meanwhile, and it is
        resumed."""
        if record.state == WRITING_COMPACTED_INDEX and record.end_entry_version is None:
            adopted = self._adopt_end_entry_version(keys, record, version)
            if adopted is None:
                return False
            record, version = adopted
        if self._stale(keys, record) and not self._fence_end_entry(keys, record):
            self._delete_record(keys, version)
            return False
        self._finish(keys, record, version)
        return True

    def _stale(self, keys: PartitionKeys, record: CompactionRecord) -> bool:
        """Section 6.0: a record before step 4 whose run the cursor passed while above ``S``
        (step 3's rule, :func:`_cursor_passed`) is stale: another compactor compacted from its
        start, and its own compactor died or stalls before its check (whose CAS of the record
        then conflicts, and it leaves). It goes only through a fence, which also finds a step 4
        that landed (then it is resumed). A record whose start a cursor at or below ``S`` passed
        (a retention pass moved it) is resumed: its compactor may have passed its check and its
        step 4 may still land, and without the record that entry would stay over its lower keys
        at rest."""
        if record.state != WRITING_COMPACTED_INDEX:
            return False
        cursor, control = self._cursor_and_control(keys)
        return _cursor_passed(record, cursor.offset, control.log_start_offset)

    def _adopt_end_entry_version(self, keys: PartitionKeys, record: CompactionRecord,
                                 version: int) -> tuple[CompactionRecord, int] | None:
        """Section 6.0, a record before step 4 written before v1.3 (no ``end_entry_version``):
        ``index/{end}`` is this run's COMPACTED entry: returned as it is (step 4 landed, no
        version needed); the run's last WAL entry: its version goes into the record, by a CAS
        of the record at ``version`` (a conflict: someone else moved the record on, None);
        anything else: no step 4 of it can land any more (that WAL entry is never created
        again), the record is deleted, None. Returns the record and its version."""
        current = self.coordination.get(keys.index(record.end_offset), keys.partition_key)
        if self._is_ours(record, current):
            return record, version
        if current is not None and _is_last_entry(record, IndexEntry.from_json(current.value, current.key)):
            adopted = record.with_end_entry_version(current.version_id)
            try:
                return adopted, self.coordination.put(keys.compaction, adopted.to_json(), keys.partition_key,
                                                      expected_version=version)
            except VersionConflict:
                log.warning("%s: compaction %s of %d..%d (a record without end_entry_version) changed while it was "
                            "given one; left to whoever changed it", keys.tp, record.compaction_id,
                            record.start_offset, record.end_offset)
                return None
        log.warning("%s: compaction %s of %d..%d (a record without end_entry_version) can no longer swap index/%d "
                    "in (it no longer holds the run's last WAL entry); deleting the record", keys.tp,
                    record.compaction_id, record.start_offset, record.end_offset, record.end_offset)
        self._delete_record(keys, version)
        return None

    def _fence_end_entry(self, keys: PartitionKeys, record: CompactionRecord) -> bool:
        """Section 6.0, "Fence before a record goes", before a record in state
        WRITING_COMPACTED_INDEX is deleted: True if ``index/{end}`` holds this run's COMPACTED
        entry (its step 4 landed: resume the record, delete nothing). Else ``index/{end}`` is made
        to leave ``end_entry_version``, at which every step 4 of the record CASes: at that version
        it is written again with the value read (same entry, new version); missing or at another
        version it has left it already. Returns False once no step 4 of the record can land: only
        then may the record go."""
        key, pk = keys.index(record.end_offset), keys.partition_key
        current = self.coordination.get(key, pk)
        if self._is_ours(record, current):
            return True
        if current is None or current.version_id != record.end_entry_version:
            return False
        try:
            self.coordination.put(key, current.value, pk, expected_version=record.end_entry_version)
            return False
        except VersionConflict:  # it left the version meanwhile: a step 4 of the record, or anything else
            return self._is_ours(record, self.coordination.get(key, pk))

    def _is_ours(self, record: CompactionRecord, found: Versioned | None) -> bool:
        """``found`` (``index/{end}`` read) is this record's COMPACTED entry (its ``data_key``,
        which no other record names): its step 4 landed."""
        if found is None:
            return False
        entry = IndexEntry.from_json(found.value, found.key)
        return entry.type == COMPACTED and entry.data_key == record.data_key

    def _delete_record(self, keys: PartitionKeys, version: int) -> None:
        """Delete ``meta/compaction`` only at ``version`` (a record someone else wrote since stays)."""
        try:
            self.coordination.delete(keys.compaction, keys.partition_key, expected_version=version)
        except VersionConflict:
            pass

    def _overwrite_end_entry(self, keys: PartitionKeys, record: CompactionRecord) -> bool:
        """Step 4: ``index/{end}`` becomes the COMPACTED entry, by CAS at the record's
        ``end_entry_version`` (the version selected in step 1; by the record's compactor and by
        any resumer alike). True if this record's entry is in place (this CAS, one done before a
        crash or whose reply was lost, or the other sender's). False if no step 4 of the record
        can land any more: the key left that version, and the cursor passed the run's start
        (another compactor did the run, or retention dropped its end) or the key still holds the
        run's last WAL entry (fenced). Anything else: :class:`InconsistentReadState`."""
        key, pk = keys.index(record.end_offset), keys.partition_key
        current = self.coordination.get(key, pk)
        if self._is_ours(record, current):
            return True  # done before a crash
        if current is not None and current.version_id == record.end_entry_version:
            try:
                self.coordination.put(key, record.index_entry().to_json(), pk, expected_version=record.end_entry_version)
                return True
            except VersionConflict as e:
                # Section 6 step 4, any conflict: this CAS whose reply was lost landed, or the
                # record's other sender's did (its compactor and a resumer both send it).
                current = self.coordination.get(key, pk)
                if self._is_ours(record, current):
                    log.info("%s: compaction %s: the swap of %s landed (%s)", keys.tp, record.compaction_id, key,
                             "its reply was lost" if e.outcome_unknown else "sent by another compactor of the record")
                    return True
        if self._cursor(keys).offset > record.start_offset:
            return False
        if current is not None and _is_last_entry(record, IndexEntry.from_json(current.value, key)):
            return False  # fenced: another record whose run ends here went
        found = "nothing" if current is None else IndexEntry.from_json(current.value, key).type
        raise InconsistentReadState(f"{keys.tp}: compaction {record.compaction_id} of "
                                    f"{record.start_offset}..{record.end_offset} expected the WAL entry "
                                    f"{record.last_entry_start_offset}..{record.end_offset} at {key}, found {found} "
                                    f"with the cursor not past {record.start_offset}")

    def _cursor_and_control(self, keys: PartitionKeys) -> tuple["_CursorState", ControlRecord]:
        """The cursor and ``meta/control``, in one read."""
        cursor, control = self.coordination.get_many([(keys.compaction_cursor, keys.partition_key),
                                                      (keys.control, keys.partition_key)])
        if cursor is None or control is None:
            raise CorruptRecord(f"{keys.tp}: meta/compaction-cursor or meta/control is missing (the partition was "
                                f"not initialized)")
        record = ControlRecord.from_json(control.value, control.key)
        if record.deleted:  # the topic was deleted while this compactor held the claim (section 12)
            raise TopicDeleted(keys.tp.topic, keys.tp.partition, keys.topic_id)
        return _CursorState(CompactionCursor.from_json(cursor.value, cursor.key).offset, cursor.version_id), record

    def _cursor(self, keys: PartitionKeys) -> "_CursorState":
        found = self.coordination.get(keys.compaction_cursor, keys.partition_key)
        if found is None:
            raise CorruptRecord(f"{keys.compaction_cursor} is missing (the partition was not initialized)")
        return _CursorState(CompactionCursor.from_json(found.value, found.key).offset, found.version_id)


def _is_last_entry(record: CompactionRecord, entry: IndexEntry) -> bool:
    """``entry``, found at ``index/{end}``, is the run's last WAL entry (its shape)."""
    return entry.type == WAL and record.end_offset - entry.msg_count + 1 == record.last_entry_start_offset


def _cursor_passed(record: CompactionRecord, cursor: int, log_start_offset: int) -> bool:
    """Section 6 step 3's rule, also step 0's: the cursor moved past the run's start and is
    above the log start ``S``. Then a compactor compacted from the cursor this run was selected
    at after the selection, and a run that started below this one may have finished across its
    start (its COMPACTED entry inside this run's keys, the entries below this run's start that
    it replaced gone): this run is left, so its step 5 never deletes that entry. A cursor at or
    below ``S`` was moved by a retention pass, and the run goes on (its COMPACTED entry may
    start below ``S``, section 10.3)."""
    return cursor > record.start_offset and cursor > log_start_offset


@dataclass(frozen=True)
class _CursorState:
    offset: int
    version: int
