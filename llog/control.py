"""``meta/control`` and the three steps that change it for an append (docs/protocol.md section 4):
:func:`reserve` (4.3), :func:`materialize` (4.4) and :func:`clear` (4.5).

Each step is one function, written once and used by every actor that takes it: the writer (for
all its partitions in lockstep, one RPC per shard and step), and the helpers that finish
another's pending append (:func:`finish_pending`: a writer meeting a pending, fencing, the
compactor's step 0). The v1.1 rules live here and nowhere else:

- the blob's age is checked immediately before every reserving CAS attempt (:func:`reserve`);
- an index entry is *created* only if absent, and only within the materialization budget
  ``D = G/4`` of sending the request that showed its pending; past it, ``meta/control`` is read
  again and the create repeated only while the pending still names the append
  (:func:`materialize`);
- the tripwire: a create that succeeded behind the compaction cursor is deleted again
  (:func:`tripwire`).

:func:`update_control` is the CAS loop for other changes (fencing); it finishes a pending append
first, through the same functions.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llog import failpoints
from llog.clock import SYSTEM, Clock
from llog.config import Config
from llog.coordination import EXPECTED_ABSENT, Coordination
from llog.errors import MaxRetriesExceeded, PartitionNotInitialized, StaleBlob, TopicDeleted, VersionConflict
from llog.keys import PartitionKeys
from llog.records import CompactionCursor, ControlRecord, PendingAppend

log = logging.getLogger(__name__)

#: Backoff between CAS attempts: full jitter, growing from 2 ms to at most 200 ms.
_BACKOFF_BASE_S = 0.002
_BACKOFF_CAP_S = 0.2


@dataclass(frozen=True)
class ControlState:
    """``meta/control`` as read (or as written by a CAS), with the version a CAS must name and
    ``seen_at``: when the request that showed it was sent, by the reader's monotonic clock (the
    start of a materialization budget, section 4.4). Unknown (-inf) counts as long ago."""

    record: ControlRecord
    version: int
    seen_at: float = float("-inf")


@dataclass(frozen=True)
class Created:
    """An index entry :func:`materialize` created (the key was absent), for :func:`tripwire`."""

    keys: PartitionKeys
    end_offset: int
    version: int


class _BudgetSpent(Exception):
    """Raised by a create's guard: the budget ran out before this attempt could be sent."""


def backoff(attempt: int) -> None:
    time.sleep(random.uniform(0, min(_BACKOFF_CAP_S, _BACKOFF_BASE_S * 2 ** attempt)))


def read_control(coordination: Coordination, keys: PartitionKeys, clock: Clock = SYSTEM) -> ControlState:
    """Section 5.1: a missing record means the partition is not initialized; a tombstone, that
    its incarnation was deleted (:class:`TopicDeleted`, section 12)."""
    state = read_controls(coordination, [keys], clock)[0]
    if state is None:
        raise PartitionNotInitialized(keys.tp.topic, keys.tp.partition)
    if state.record.deleted:
        raise TopicDeleted(keys.tp.topic, keys.tp.partition, keys.topic_id)
    return state


def read_controls(coordination: Coordination, keys: Sequence[PartitionKeys], clock: Clock = SYSTEM
                  ) -> list[ControlState | None]:
    """Several ``meta/control`` records in one Read RPC per shard; None where one is missing."""
    seen_at = clock.monotonic()
    found = coordination.get_many([(k.control, k.partition_key) for k in keys])
    return [None if f is None else ControlState(ControlRecord.from_json(f.value, k.control), f.version_id, seen_at)
            for k, f in zip(keys, found)]


def initialize_partition(coordination: Coordination, keys: PartitionKeys) -> bool:
    """Section 4.1: create the cursor and ``meta/control`` only if absent. Idempotent; racing
    initializers are fine. The cursor goes first, so an existing control implies a cursor. The
    control names the incarnation's ``topic_id`` (section 10.1). A deleted incarnation's
    tombstone is never replaced (section 12). Returns True if this call created
    ``meta/control``."""
    absent = EXPECTED_ABSENT
    try:
        coordination.put(keys.compaction_cursor, CompactionCursor(1).to_json(), keys.partition_key, absent)
    except VersionConflict:
        pass
    control = ControlRecord().with_extra(topic_id=keys.topic_id, log_start_offset=1)
    try:
        coordination.put(keys.control, control.to_json(), keys.partition_key, absent)
        return True
    except VersionConflict:
        return False


def check_blob_age(what: str, data_key: str, created_at_ms: int, config: Config, clock: Clock,
                   advice: str = "upload the records again") -> None:
    """Sections 4.3, 6.3 and 9, the age rule: a reference may be made to a blob only while it
    is younger than ``G/2``; otherwise :class:`StaleBlob` (GC may be about to collect it)."""
    age = clock.now_ms() - created_at_ms
    if age > config.gc_grace_ms // 2:
        raise StaleBlob(f"{what}: {data_key} was written {age} ms ago, more than {config.gc_grace_ms // 2} ms (half "
                        f"of LLOG_GC_GRACE_MS); nothing references it: {advice}")


# --- step 3: reserve ------------------------------------------------------------------------


def reserve(coordination: Coordination, reservations: Sequence[tuple[PartitionKeys, ControlState, ControlRecord]],
            config: Config, clock: Clock = SYSTEM) -> list[ControlState | VersionConflict]:
    """Section 4.3: CAS each ``(keys, state read, new record)`` on the version read, one RPC per
    shard. Each new record's ``pending`` is the append; its blob's age is checked immediately
    before the CAS is sent, and again before any retry of it (:class:`StaleBlob` if too old; its
    ``outcomes``, per reservation, say which CASes landed, which were never sent, and which may
    have landed: an earlier attempt of a retried one may have). Returns per reservation the state
    it wrote (``seen_at`` = when the CAS was first sent, the start of the writer's budget) or
    the :class:`VersionConflict` (``outcome_unknown`` when an attempt failed in transit)."""

    def age_check() -> None:
        for keys, _, new in reservations:
            check_blob_age(f"reserving offsets on {keys.tp}", new.pending.data_key, new.pending.created_at_ms,
                           config, clock)

    failpoints.hit("writer.before_reserve_cas")
    sent_at = clock.monotonic()
    results = coordination.put_many([(k.control, new.to_json(), k.partition_key, state.version)
                                     for k, state, new in reservations], guard=age_check)
    return [r if isinstance(r, VersionConflict) else ControlState(new, r, sent_at)
            for (_, _, new), r in zip(reservations, results)]


# --- step 4: materialize --------------------------------------------------------------------


def materialize(coordination: Coordination, items: Sequence[tuple[PartitionKeys, ControlState]], config: Config,
                clock: Clock = SYSTEM) -> tuple[list[ControlState | None], list[Created]]:
    """Section 4.4 for the pending append each ``(keys, state)`` shows: create
    ``index/{end_offset}`` only if absent, one RPC per shard.

    Only within the budget ``D = G/4`` of ``state.seen_at`` (checked immediately before each
    attempt). Past it nothing is written: ``meta/control`` is read again, and the create is
    repeated with a fresh budget only if ``pending`` still names the append. "Created" and
    "exists" both mean materialized. Returns, per item, the state the clear (4.5) must start
    from, or None when someone else already finished the append; and what this call created.
    """
    budget_s = config.gc_grace_ms / 4 / 1000
    out: list[ControlState | None] = [None] * len(items)
    created: list[Created] = []
    todo = [(i, keys, state) for i, (keys, state) in enumerate(items) if state.record.pending is not None]
    for attempt in range(config.cas_max_attempts):
        if not todo:
            return out, created
        failpoints.hit("control.before_materialize")
        now = clock.monotonic()
        ready = [t for t in todo if now - t[2].seen_at < budget_s]
        late = [t for t in todo if now - t[2].seen_at >= budget_s]
        if ready:
            oldest = min(state.seen_at for _, _, state in ready)

            def within_budget() -> None:
                if clock.monotonic() - oldest >= budget_s:
                    raise _BudgetSpent()

            try:
                results = coordination.put_many(
                    [(k.index(s.record.pending.end_offset), s.record.pending.to_index_entry().to_json(),
                      k.partition_key, EXPECTED_ABSENT) for _, k, s in ready],
                    guard=within_budget)
            except _BudgetSpent:
                late += ready  # some creates may have landed: then the key exists, which is fine
            else:
                for (i, keys, state), result in zip(ready, results):
                    out[i] = state  # created, or the key exists: materialized either way
                    if not isinstance(result, VersionConflict):
                        created.append(Created(keys, state.record.pending.end_offset, result))
        if late:
            log.info("materialization budget of %.1f s spent for %d pending append(s); reading meta/control again",
                     budget_s, len(late))
            fresh = read_controls(coordination, [keys for _, keys, _ in late], clock)
            todo = []
            for (i, keys, state), current in zip(late, fresh):
                pending = current.record.pending if current is not None else None
                if pending is not None and pending.append_id == state.record.pending.append_id:
                    todo.append((i, keys, current))  # still ours to finish, with a fresh budget
        else:
            todo = []
    if todo:
        raise MaxRetriesExceeded(f"materializing {len(todo)} pending append(s), first on {todo[0][1].tp}",
                                 config.cas_max_attempts)
    return out, created


def tripwire(coordination: Coordination, created: Sequence[Created]) -> int:
    """Section 8, the tripwire: after creates that succeeded, read the compaction cursors; an
    entry created behind its cursor means the timing assumption was broken (its key had been
    compacted and deleted). Every offset below the cursor has a COMPACTED entry, so the WAL key
    is redundant: delete it (only at the version created) and log an error. Returns how many."""
    if not created:
        return 0
    failpoints.hit("control.before_tripwire")
    cursors = coordination.get_many([(c.keys.compaction_cursor, c.keys.partition_key) for c in created])
    removed = 0
    for c, cursor in zip(created, cursors):
        if cursor is None or CompactionCursor.from_json(cursor.value, cursor.key).offset <= c.end_offset:
            continue
        log.error("%s: index entry %d was created behind the compaction cursor: a write landed later than the "
                  "timing assumption allows (docs/protocol.md section 8); deleting it again", c.keys.tp, c.end_offset)
        try:
            coordination.delete(c.keys.index(c.end_offset), c.keys.partition_key, expected_version=c.version)
            removed += 1
        except VersionConflict:
            pass  # compaction replaced or removed it meanwhile
    return removed


# --- step 5: clear --------------------------------------------------------------------------


def clear(coordination: Coordination, items: Sequence[tuple[PartitionKeys, str, ControlState]], config: Config,
          clock: Clock = SYSTEM) -> dict[str, ControlState]:
    """Section 4.5: CAS ``pending = null`` for each ``(keys, append_id, state)``, only while the
    pending still names ``append_id`` (else someone else finished it). One RPC per shard; a
    conflict re-reads and retries, bounded. Returns, by control key, the states this call wrote."""
    todo = list(items)
    written: dict[str, ControlState] = {}
    for attempt in range(config.cas_max_attempts):
        todo = [(k, a, s) for k, a, s in todo if s.record.pending is not None and s.record.pending.append_id == a]
        if not todo:
            return written
        failpoints.hit("control.before_clear")
        sent_at = clock.monotonic()
        cleared = [s.record.with_changes(pending=None) for _, _, s in todo]
        results = coordination.put_many([(k.control, record.to_json(), k.partition_key, s.version)
                                         for (k, _, s), record in zip(todo, cleared)])
        for (k, _, _), record, r in zip(todo, cleared, results):
            if not isinstance(r, VersionConflict):
                written[k.control] = ControlState(record, r, sent_at)
        conflicted = [t for t, r in zip(todo, results) if isinstance(r, VersionConflict)]
        if not conflicted:
            return written
        backoff(attempt)
        fresh = read_controls(coordination, [k for k, _, _ in conflicted], clock)
        todo = [(k, a, s) for (k, a, _), s in zip(conflicted, fresh) if s is not None]
    raise MaxRetriesExceeded(f"clearing pending appends, first on {todo[0][0].tp}", config.cas_max_attempts)


# --- steps 4 and 5 for someone else's append ---------------------------------------------------


def finish_pending(coordination: Coordination, items: Sequence[tuple[PartitionKeys, ControlState]], config: Config,
                   clock: Clock = SYSTEM) -> list[PendingAppend | None]:
    """Sections 4.4 and 4.5 for the pending append each state shows (a crashed or slow
    writer's): materialize with the budget counted from the read that showed it, then clear.
    Whoever comes next does this. Returns per item the append it found pending, if any."""
    items = [(k, s) for k, s in items]
    states, created = materialize(coordination, items, config, clock)
    tripwire(coordination, created)
    clear(coordination, [(k, s.record.pending.append_id, s) for (k, _), s in zip(items, states) if s is not None],
          config, clock)
    return [s.record.pending for _, s in items]


def update_control(
    coordination: Coordination,
    keys: PartitionKeys,
    change: Callable[[ControlRecord], ControlRecord | None],
    what: str,
    config: Config | None = None,
    clock: Clock = SYSTEM,
) -> ControlState:
    """The CAS loop for changes other than an append's own steps (fencing).

    Reads the record, finishes a pending append first (:func:`finish_pending`), asks ``change``
    for the new record (None: nothing to write; it may raise), and CASes it on the version read.
    A conflict re-reads and retries after a jittered backoff, bounded. Unknown fields are
    preserved by ``ControlRecord``.
    """
    config = config or coordination.config
    last_error: BaseException | None = None
    for attempt in range(config.cas_max_attempts):
        state = read_control(coordination, keys, clock)
        if state.record.pending is not None:
            finish_pending(coordination, [(keys, state)], config, clock)
            continue
        new = change(state.record)
        if new is None:
            return state
        try:
            version = coordination.put(keys.control, new.to_json(), keys.partition_key, state.version)
            return ControlState(new, version)
        except VersionConflict as e:
            last_error = e
            backoff(attempt)
    raise MaxRetriesExceeded(f"{what} on {keys.tp}", config.cas_max_attempts, last_error)
