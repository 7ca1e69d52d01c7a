"""Consumer groups (docs/protocol.md section 9): per partition, the next offset a group will read,
committed in Oxia at ``P/consumers/{group}``, so lag is visible outside the consuming job.

Commits are CAS on the version read and only move forward: a late commit (a straggling driver
replaying an old batch) never moves a group back. Moving back is deliberate:
:func:`reset_offsets` (``llog groups reset GROUP --to earliest|latest|JSON``).

``llog groups describe GROUP`` prints, per partition the group has committed, what
``kafka-consumer-groups --describe`` prints: ``CURRENT-OFFSET`` (the committed offset, the next
the group reads), ``LOG-END-OFFSET`` (the next offset to be written: high watermark + 1) and
``LAG`` (log end - committed, counted from the log start when retention removed the records the
group had not read), plus ``LOG-START-OFFSET``. A group that has read everything shows
``CURRENT-OFFSET == LOG-END-OFFSET`` and lag 0. ``llog describe TOPIC`` shows the same per group.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from llog.control import backoff
from llog.coordination import EXPECTED_ABSENT, Coordination
from llog.discovery import partitions_of, topic_records
from llog.errors import (
    CorruptRecord, InvalidOffset, LlogError, MaxRetriesExceeded, PartitionNotInitialized, TopicDeleted, TopicNotFound,
    UnknownPartition, VersionConflict,
)
from llog.keys import PartitionKeys, TopicPartition, validate_group
from llog.records import ConsumerOffset, ControlRecord, now_ms

#: Rounds of a commit or reset CAS before giving up.
_MAX_ATTEMPTS = 64
#: In a JSON reset, Kafka's "earliest" and "latest".
EARLIEST, LATEST = -2, -1
#: The longest commit metadata string stored, in UTF-8 bytes (docs/protocol.md section 9.3).
MAX_METADATA_BYTES = 4096
#: Range scans run at once by :func:`groups_with_offsets`.
_SCANS = 8


def incarnation_keys(coordination: Coordination, root: str, partitions: Iterable[TopicPartition],
                     topic_ids: Mapping[str, str] | None = None) -> dict[TopicPartition, PartitionKeys]:
    """The keys of each partition in the incarnation ``topic_ids`` names for its topic, else in
    the topic's current one (its record, read now: :class:`TopicNotFound` without one). Offsets
    belong to the incarnation they were read from (docs/protocol.md section 12): a commit on behalf of
    a deleted incarnation lands among its keys, never in a later topic of the same name."""
    partitions = list(partitions)
    ids = dict(topic_ids or {})
    unknown = {tp.topic for tp in partitions} - set(ids)
    if unknown:
        ids.update({r.topic: r.topic_id for r in topic_records(coordination, root, unknown)})
        missing = sorted(unknown - set(ids))
        if missing:
            raise TopicNotFound(missing[0])
    return {tp: PartitionKeys(root, tp, ids[tp.topic]) for tp in partitions}


def commit_offsets(coordination: Coordination, root: str, group: str, offsets: Mapping[TopicPartition, int],
                   topic_ids: Mapping[str, str] | None = None) -> dict[TopicPartition, int]:
    """Commit ``group``'s next offset to read for each partition, only forward: a partition
    already committed at or past the new offset keeps its offset. ``topic_ids``: the
    incarnation each topic's offsets were read from (default: the current one). CAS on the
    version read, one RPC per shard and round; a lost race re-reads and retries (bounded).
    Returns what this call moved."""
    keys = incarnation_keys(coordination, root, offsets, topic_ids)
    return _cas_offsets(coordination, keys, group, offsets, lambda current, new: current is None or new > current,
                        "committing offsets")


def store_offsets(coordination: Coordination, root: str, group: str, offsets: Mapping[TopicPartition, int],
                  metadata: Mapping[TopicPartition, str] | None = None) -> dict[TopicPartition, int | LlogError]:
    """Kafka's OffsetCommit (docs/protocol.md section 9.5): set ``group``'s next offset to read on
    each partition to the one given, forward or back, in the incarnation current now, with the
    commit's ``metadata`` string (section 9.3; none when not given). The caller has checked the
    committer's generation, which is what lets a commit move a group back, and the strings' size
    (:data:`MAX_METADATA_BYTES`). Each offset must lie in ``1..high watermark + 1``. Returns, per
    partition, the offset stored or the error that refused it (the others are stored all the
    same)."""
    validate_group(group)
    metadata = dict(metadata or {})
    records = {r.topic: r for r in topic_records(coordination, root, {tp.topic for tp in offsets})}
    out: dict[TopicPartition, int | LlogError] = {}
    keys: dict[TopicPartition, PartitionKeys] = {}
    for tp in offsets:
        record = records.get(tp.topic)
        if record is None or record.deleting:
            out[tp] = TopicNotFound(tp.topic)
        elif tp.partition >= record.partitions:
            out[tp] = UnknownPartition(tp.topic, tp.partition, record.partitions)
        else:
            keys[tp] = PartitionKeys(root, tp, record.topic_id)
    controls = coordination.get_many([(k.control, k.partition_key) for k in keys.values()])
    for (tp, k), control in zip(list(keys.items()), controls):
        end = 1  # a partition never written to: its log end is 1
        if control is not None:
            record = ControlRecord.from_json(control.value, k.control)
            if record.deleted:
                out[tp] = TopicDeleted(tp.topic, tp.partition, k.topic_id)
                del keys[tp]
                continue
            end = record.high_watermark + 1
        if not 1 <= offsets[tp] <= end:
            out[tp] = InvalidOffset(f"{tp}: offset {offsets[tp]} is outside 1..{end} (the log end offset, the next "
                                    f"to be written)")
            del keys[tp]
    if keys:
        _cas_offsets(coordination, keys, group, {tp: offsets[tp] for tp in keys}, lambda current, new: current != new,
                     "committing offsets", {tp: metadata.get(tp, "") for tp in keys})
        out.update({tp: offsets[tp] for tp in keys})
    return out


def reset_offsets(coordination: Coordination, root: str, group: str, to: str,
                  topics: Iterable[str] | None = None, dry_run: bool = False) -> dict[TopicPartition, int]:
    """Move ``group`` to ``to`` (backwards too): ``earliest`` (the log start offset, the first
    offset retention kept; docs/protocol.md section 10.3), ``latest`` (the log-end offset, high
    watermark + 1: nothing left to read), or JSON ``{"topic": {"partition": offset}}`` with -2
    for earliest and -1 for latest (Kafka's form). Earliest and latest apply to the partitions
    the group has committed (of ``topics``); JSON names its partitions, which must exist.
    Offsets must lie in ``log start..high watermark + 1``. Returns the offsets set (or, with
    ``dry_run``, that would be set)."""
    validate_group(group)
    if to in ("earliest", "latest"):
        found = partitions_of(coordination, root, topics)
        for topic in set(topics or ()) - {k.tp.topic for k in found}:
            raise TopicNotFound(topic)  # a named topic that does not exist: say so, not "nothing to reset"
        partitions = list(committed_offsets(coordination, root, group, [k.tp for k in found]))
        wanted = {tp: EARLIEST if to == "earliest" else LATEST for tp in partitions}
    else:
        wanted = _parse_reset(to)
        if topics is not None:
            keep = set(topics)
            wanted = {tp: o for tp, o in wanted.items() if tp.topic in keep}
    keys = incarnation_keys(coordination, root, wanted)
    bounds = log_bounds(coordination, keys)
    targets = {}
    for tp, offset in wanted.items():
        start, end = bounds[tp]
        target = start if offset == EARLIEST else end if offset == LATEST else offset
        if not start <= target <= end:
            raise InvalidOffset(f"{tp}: offset {offset} is outside {start}..{end} (the log start offset, below "
                                f"which retention removed the records, to the log-end offset, the next to be "
                                f"written)")
        targets[tp] = target
    if dry_run:
        return targets
    _cas_offsets(coordination, keys, group, targets, lambda current, new: current != new, "resetting offsets")
    return targets


def _parse_reset(raw: str) -> dict[TopicPartition, int]:
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not parsed:
        raise InvalidOffset(f"--to must be earliest, latest or JSON like {{\"orders\": {{\"0\": 17, \"1\": -2}}}}, "
                            f"got {raw!r}")
    out = {}
    for topic, offsets in parsed.items():
        if not isinstance(offsets, dict) or not offsets:
            raise InvalidOffset(f"--to: topic {topic!r} needs an object of partition to offset, like {{\"0\": 17}}")
        for partition, offset in offsets.items():
            try:
                tp = TopicPartition(topic, int(partition))
            except ValueError:
                raise InvalidOffset(f"--to: partition {partition!r} of topic {topic!r} is not a number") from None
            if not isinstance(offset, int) or isinstance(offset, bool) or (offset < 1 and offset not in (EARLIEST,
                                                                                                        LATEST)):
                raise InvalidOffset(f"--to: offset {offset!r} of {tp} must be an offset >= 1 (the next record to "
                                    f"read), -2 (earliest) or -1 (latest)")
            out[tp] = offset
    return out


def log_bounds(coordination: Coordination, keys: Mapping[TopicPartition, PartitionKeys]
                ) -> dict[TopicPartition, tuple[int, int]]:
    """Each partition's log start offset and log-end offset (high watermark + 1); a clear error
    for one that does not exist."""
    bounds = {}
    found = coordination.get_many([(k.control, k.partition_key) for k in keys.values()])
    for (tp, k), control in zip(keys.items(), found):
        if control is None:
            raise PartitionNotInitialized(tp.topic, tp.partition)
        record = ControlRecord.from_json(control.value, k.control)
        if record.deleted:
            raise TopicDeleted(tp.topic, tp.partition, k.topic_id)
        bounds[tp] = (record.log_start_offset, record.high_watermark + 1)
    return bounds


def _cas_offsets(coordination: Coordination, all_keys: Mapping[TopicPartition, PartitionKeys], group: str,
                 offsets: Mapping[TopicPartition, int], moves: Callable[[int | None, int], bool], what: str,
                 metadata: Mapping[TopicPartition, str] | None = None) -> dict[TopicPartition, int]:
    """Write each ``offsets[tp]`` (with ``metadata[tp]``, else none) where ``moves(current, new)``
    or the metadata differs, by CAS on the version read (absent: only if still absent);
    conflicts re-read and retry, bounded."""
    validate_group(group)
    metadata = metadata or {}
    todo, moved, unsure = dict(offsets), {}, set()
    for attempt in range(_MAX_ATTEMPTS):
        if not todo:
            return moved
        if attempt:
            backoff(attempt - 1)
        keys = {tp: all_keys[tp] for tp in todo}
        found = coordination.get_many([(k.consumer_group(group), k.partition_key) for k in keys.values()])
        writes = []
        for (tp, k), current in zip(keys.items(), found):
            record = None if current is None else ConsumerOffset.from_json(current.value, current.key)
            offset = None if record is None else record.offset
            if moves(offset, todo[tp]) or (tp in metadata and record is not None and record.offset == todo[tp]
                                           and record.metadata != metadata[tp]):
                writes.append((tp, k, EXPECTED_ABSENT if current is None else current.version_id))
            elif tp in unsure and offset == todo[tp]:
                moved[tp] = offset  # our attempt that failed in transit landed (or set the same)
        stamp = now_ms()
        results = coordination.put_many([(k.consumer_group(group),
                                          ConsumerOffset(todo[tp], stamp, metadata.get(tp, "")).to_json(),
                                          k.partition_key, version) for tp, k, version in writes])
        lost, unsure = {}, set()
        for (tp, _, _), result in zip(writes, results):
            if isinstance(result, VersionConflict):
                lost[tp] = todo[tp]  # re-read: a write that landed in transit then shows as done
                if result.outcome_unknown:
                    unsure.add(tp)
            else:
                moved[tp] = todo[tp]
        todo = lost
    raise MaxRetriesExceeded(f"{what} of group {group!r} on {len(todo)} partition(s)", _MAX_ATTEMPTS)


def committed_offsets(coordination: Coordination, root: str, group: str, partitions: Iterable[TopicPartition],
                      topic_ids: Mapping[str, str] | None = None) -> dict[TopicPartition, ConsumerOffset]:
    """The committed offsets of ``group`` on ``partitions`` (partitions without one are left out),
    in the incarnations ``topic_ids`` names (default: the current ones)."""
    validate_group(group)
    partitions = list(partitions)
    keys = list(incarnation_keys(coordination, root, partitions, topic_ids).values())
    found = coordination.get_many([(k.consumer_group(group), k.partition_key) for k in keys])
    return {tp: ConsumerOffset.from_json(v.value, v.key) for tp, v in zip(partitions, found) if v is not None}


def delete_offsets(coordination: Coordination, root: str, group: str,
                   partitions: Iterable[TopicPartition] | None = None) -> dict[TopicPartition, int]:
    """Delete ``group``'s committed offsets (docs/protocol.md section 9.3, delete) on
    ``partitions`` of the topics' current incarnations (default: every partition it has
    committed). Each record is deleted at the version read: a commit that lands after the read is
    later than the delete, and stays. Returns the offsets deleted."""
    validate_group(group)
    if partitions is None:
        keys = {k.tp: k for k in partitions_of(coordination, root)}
    else:
        keys = incarnation_keys(coordination, root, partitions)
    found = coordination.get_many([(k.consumer_group(group), k.partition_key) for k in keys.values()])
    deleted = {}
    for (tp, k), current in zip(keys.items(), found):
        if current is None:
            continue
        try:  # absent by now (False): an attempt of ours that failed in transit landed, or another delete did
            coordination.delete(current.key, k.partition_key, expected_version=current.version_id)
            deleted[tp] = ConsumerOffset.from_json(current.value, current.key).offset
        except VersionConflict:
            pass  # committed again since the read: that commit is later than the delete
    return deleted


def groups_with_offsets(coordination: Coordination, root: str) -> set[str]:
    """Every group that has a committed offset on some partition: one range scan of
    ``P/consumers/`` per partition of every topic (a few at a time)."""
    keys = partitions_of(coordination, root)

    def scan(k: PartitionKeys) -> list[str]:
        prefix = k.consumer_group("")
        names = [found.key[len(prefix):] for found in coordination.range_scan(prefix, prefix + "~", k.partition_key)
                 if found.key.startswith(prefix)]
        return [name for name in names if name and "/" not in name]

    with ThreadPoolExecutor(max_workers=_SCANS) as pool:
        return {group for names in pool.map(scan, keys) for group in names}


def has_offsets(coordination: Coordination, root: str, group: str) -> bool:
    """Whether ``group`` has a committed offset on some partition (one read per shard)."""
    validate_group(group)
    keys = partitions_of(coordination, root)
    return any(v is not None for v in coordination.get_many([(k.consumer_group(group), k.partition_key)
                                                            for k in keys]))


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    committed_offset: int
    committed_at_ms: int
    high_watermark: int
    #: The partition's log start offset: a committed offset below it points at records
    #: retention removed (docs/protocol.md section 10.3).
    log_start_offset: int = 1

    @property
    def log_end_offset(self) -> int:
        """Kafka's log-end offset: the offset the next record gets (``high_watermark + 1``)."""
        return self.high_watermark + 1

    @property
    def lag(self) -> int:
        """Records still in the log that the group has not read: log end - committed offset (the
        next to read), or log end - log start if retention removed records the group had not read."""
        return max(0, self.log_end_offset - max(self.committed_offset, self.log_start_offset))


def describe_group(coordination: Coordination, root: str, group: str,
                   topics: Iterable[str] | None = None) -> list[PartitionLag]:
    """Lag of ``group`` on every partition it has committed (of ``topics``, default all)."""
    validate_group(group)
    found = partitions_of(coordination, root, topics)
    ids = {k.tp.topic: k.topic_id for k in found}
    committed = committed_offsets(coordination, root, group, [k.tp for k in found], ids)
    keys = [PartitionKeys(root, tp, ids[tp.topic]) for tp in committed]
    controls = coordination.get_many([(k.control, k.partition_key) for k in keys])
    rows = []
    for (tp, offset), k, control in zip(committed.items(), keys, controls):
        if control is None:
            raise CorruptRecord(f"{k.consumer_group(group)} exists but {k.control} does not")
        record = ControlRecord.from_json(control.value, k.control)
        rows.append(PartitionLag(tp.topic, tp.partition, offset.offset, offset.committed_at_ms, record.high_watermark,
                                 record.log_start_offset))
    return rows


def topic_group_lags(coordination: Coordination, root: str, topic: str) -> dict[str, list[PartitionLag]]:
    """Every group that has committed offsets on ``topic``, with its lag per partition (one
    range scan of ``P/consumers/`` per partition, one read of the controls)."""
    keys = partitions_of(coordination, root, [topic])
    controls = coordination.get_many([(k.control, k.partition_key) for k in keys])
    by_group: dict[str, list[PartitionLag]] = {}
    for k, control in zip(keys, controls):
        if control is None:
            continue
        record = ControlRecord.from_json(control.value, k.control)
        prefix = k.consumer_group("")
        for found in coordination.range_scan(prefix, prefix + "~", k.partition_key):
            group = found.key[len(prefix):]
            if not found.key.startswith(prefix) or "/" in group:
                continue
            offset = ConsumerOffset.from_json(found.value, found.key)
            by_group.setdefault(group, []).append(PartitionLag(
                k.tp.topic, k.tp.partition, offset.offset, offset.committed_at_ms, record.high_watermark,
                record.log_start_offset))
    return dict(sorted(by_group.items()))


def format_offsets(group: str, offsets: Mapping[TopicPartition, int], dry_run: bool = False) -> str:
    """The table ``llog groups reset`` prints."""
    if not offsets:
        return f"group {group!r}: nothing to reset"
    header = ("TOPIC", "PARTITION", "NEW_OFFSET")
    table = [header] + [(tp.topic, str(tp.partition), str(o)) for tp, o in sorted(offsets.items())]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = [f"group {group}: {'would reset' if dry_run else 'reset'} {len(offsets)} partition(s)"]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    return "\n".join(lines)


#: The columns of ``llog groups describe``: ``kafka-consumer-groups --describe``'s, and the log start.
GROUP_COLUMNS = ("TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-START-OFFSET", "LOG-END-OFFSET", "LAG")


def format_group(group: str, rows: list[PartitionLag]) -> str:
    if not rows:
        return f"group {group!r} has no committed offsets"
    table = [GROUP_COLUMNS] + [(r.topic, str(r.partition), str(r.committed_offset)
                                + (" (below log start)" if r.committed_offset < r.log_start_offset else ""),
                                str(r.log_start_offset), str(r.log_end_offset), str(r.lag)) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(GROUP_COLUMNS))]
    lines = [f"group {group}: {len(rows)} partition(s), total lag {sum(r.lag for r in rows)}"]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    return "\n".join(lines)
