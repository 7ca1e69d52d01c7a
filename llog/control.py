"""``meta/control``: reading it, creating it, the one CAS loop that changes it, and finishing a
pending append (PROTOCOL.md sections 4 and 7).

Every change to ``meta/control`` (reserving offsets, clearing ``pending``, fencing) goes
through :func:`update_control`, so conflict handling, backoff and the preservation of unknown
fields live in one place.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import oxia

from llog.coordination import Coordination
from llog.errors import MaxRetriesExceeded, PartitionNotInitialized, VersionConflict
from llog.keys import PartitionKeys
from llog.records import CompactionCursor, ControlRecord, PendingAppend

#: Backoff between CAS attempts: full jitter, growing from 2 ms to at most 200 ms.
_BACKOFF_BASE_S = 0.002
_BACKOFF_CAP_S = 0.2


@dataclass(frozen=True)
class ControlState:
    """``meta/control`` as read, with the version a CAS must name."""

    record: ControlRecord
    version: int


def backoff(attempt: int) -> None:
    time.sleep(random.uniform(0, min(_BACKOFF_CAP_S, _BACKOFF_BASE_S * 2 ** attempt)))


def read_control(coordination: Coordination, keys: PartitionKeys) -> ControlState:
    """Section 5.1: a missing record means the partition is not initialized."""
    found = coordination.get(keys.control, keys.partition_key)
    if found is None:
        raise PartitionNotInitialized(keys.tp.topic, keys.tp.partition)
    return ControlState(ControlRecord.from_json(found.value, keys.control), found.version_id)


def initialize_partition(coordination: Coordination, keys: PartitionKeys) -> bool:
    """Section 4.1: create the cursor and ``meta/control`` only if absent. Idempotent; racing
    initializers are fine. The cursor goes first, so an existing control implies a cursor.
    Returns True if this call created ``meta/control``."""
    absent = oxia.EXPECTED_RECORD_DOES_NOT_EXIST
    try:
        coordination.put(keys.compaction_cursor, CompactionCursor(1).to_json(), keys.partition_key, absent)
    except VersionConflict:
        pass
    try:
        coordination.put(keys.control, ControlRecord().to_json(), keys.partition_key, absent)
        return True
    except VersionConflict:
        return False


def update_control(
    coordination: Coordination,
    keys: PartitionKeys,
    change: Callable[[ControlRecord], ControlRecord | None],
    max_attempts: int,
    what: str,
    finish_pending: bool = True,
    on_outcome_unknown: Callable[[ControlState], ControlState | None] | None = None,
) -> ControlState:
    """The one CAS loop on ``meta/control``.

    Reads the record, finishes a pending append first when ``finish_pending`` (section 4.3),
    asks ``change`` for the new record (None: nothing to write; it may raise, e.g.
    :class:`LogFenced`), and CASes it on the version read. A conflict re-reads and retries
    after a jittered backoff, at most ``max_attempts`` times. When a CAS failed in transit and
    then conflicted, ``on_outcome_unknown`` is given the fresh state and may return the state
    that proves the CAS landed. Unknown fields are preserved by ``ControlRecord``.
    """
    last_error: BaseException | None = None
    for attempt in range(max_attempts):
        state = read_control(coordination, keys)
        if finish_pending and state.record.pending is not None:
            finish_pending_append(coordination, keys, state, max_attempts)
            continue
        new = change(state.record)
        if new is None:
            return state
        try:
            version = coordination.put(keys.control, new.to_json(), keys.partition_key, state.version)
            return ControlState(new, version)
        except VersionConflict as e:
            last_error = e
            if e.outcome_unknown and on_outcome_unknown is not None:
                landed = on_outcome_unknown(read_control(coordination, keys))
                if landed is not None:
                    return landed
            backoff(attempt)
    raise MaxRetriesExceeded(f"{what} on {keys.tp}", max_attempts, last_error)


def clear_pending(coordination: Coordination, keys: PartitionKeys, append_id: str, state: ControlState,
                  max_attempts: int) -> None:
    """Section 4.5: CAS ``pending = null``, only while it still names ``append_id``."""
    for attempt in range(max_attempts):
        pending = state.record.pending
        if pending is None or pending.append_id != append_id:
            return  # someone else finished it
        try:
            coordination.put(keys.control, state.record.with_changes(pending=None).to_json(),
                             keys.partition_key, state.version)
            return
        except VersionConflict:
            backoff(attempt)
            state = read_control(coordination, keys)
    raise MaxRetriesExceeded(f"clearing pending {append_id} on {keys.tp}", max_attempts)


def finish_pending_append(coordination: Coordination, keys: PartitionKeys, state: ControlState,
                          max_attempts: int) -> PendingAppend | None:
    """Sections 4.4 and 4.5 for the append ``state`` shows as pending: write its index entry
    (unconditionally: the same value every time) and clear it. Whoever comes next after a
    crashed writer does this. Returns the append it finished, if any."""
    pending = state.record.pending
    if pending is None:
        return None
    coordination.put(keys.index(pending.end_offset), pending.to_index_entry().to_json(), keys.partition_key)
    clear_pending(coordination, keys, pending.append_id, state, max_attempts)
    return pending
