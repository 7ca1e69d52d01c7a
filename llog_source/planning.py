"""Driver-side planning: which partitions exist, where each read starts and ends, how much one
micro-batch takes, and how a batch splits into Spark tasks. Reads Oxia only, never record bytes.

Offsets here are Kafka-style positions: the *next* offset to read. A partition with high
watermark ``hw`` is at position ``hw + 1``; an empty one at 1 (llog offsets start at 1).
``earliest`` is a partition's log start offset (docs/protocol.md section 10.3): retention removes the
offsets below it, and a query positioned there has lost them (``failOnDataLoss``).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from pyspark.sql.datasource import InputPartition

from llog.coordination import Coordination, Versioned
from llog.discovery import initialized, list_topics, record_keys, topic_records
from llog.errors import LlogError
from llog.keys import PartitionKeys, TopicPartition
from llog.records import ControlRecord
from llog_source.options import EARLIEST, LATEST, InvalidSourceOption, OffsetSpec, Subscription

Positions = dict[TopicPartition, int]


@dataclass(frozen=True)
class LlogSplit(InputPartition):
    """One Spark task's read: offsets ``start..end`` (inclusive) of one topic-partition."""

    topic: str
    partition: int
    start: int
    end: int
    #: The topic incarnation the offsets were planned in (docs/protocol.md section 12).
    topic_id: str | None = None

    @property
    def count(self) -> int:
        return self.end - self.start + 1


@dataclass(frozen=True)
class LlogSplits(InputPartition):
    """Small splits one Spark task reads one after the other (:func:`pack`)."""

    splits: tuple[LlogSplit, ...]

    @property
    def count(self) -> int:
        return sum(split.count for split in self.splits)


#: A micro-batch's splits smaller than this are read together, up to this many records a Spark
#: task (:func:`pack`).
PACK_RECORDS = 10_000


def pack(splits: list[LlogSplit], limit: int = PACK_RECORDS) -> list[LlogSplit | LlogSplits]:
    """``splits`` with the small ones (fewer than ``limit`` records) grouped, in order, into
    tasks of at most ``limit`` records. A task has a fixed cost (scheduling, a Python worker's
    round trip, a wave on a busy executor) that a few records do not repay: a micro-batch of a
    few records over many partitions is then one task, not one per partition."""
    out: list[LlogSplit | LlogSplits] = []
    group: list[LlogSplit] = []

    def close() -> None:
        if group:
            out.append(group[0] if len(group) == 1 else LlogSplits(tuple(group)))
            group.clear()
    for split in splits:
        if split.count >= limit:
            close()
            out.append(split)
            continue
        if sum(s.count for s in group) + split.count > limit:
            close()
        group.append(split)
    close()
    return out


class PartitionOffsets(NamedTuple):
    """What a partition's ``meta/control`` says about its readable offsets now: ``log_start_offset
    ..high_watermark`` (docs/protocol.md section 10.3)."""

    log_start_offset: int
    high_watermark: int
    #: The topic incarnation the partition belongs to (docs/protocol.md section 12).
    topic_id: str | None = None

    @property
    def earliest(self) -> int:
        """The position of ``earliest``: the log start offset."""
        return self.log_start_offset

    @property
    def latest(self) -> int:
        """The position of ``latest``: the next offset to be written."""
        return self.high_watermark + 1


Found = Mapping[TopicPartition, PartitionOffsets]


def partition_offsets(coordination: Coordination, root: str, partitions: Iterable[TopicPartition]
                      ) -> dict[TopicPartition, PartitionOffsets]:
    """The log start offset and high watermark of each initialized partition of ``partitions``
    (one without a ``meta/control`` is left out): one multi-key read of every ``meta/control``."""
    partitions = list(partitions)
    ids = {r.topic: r.topic_id for r in topic_records(coordination, root, {tp.topic for tp in partitions})}
    keys = [PartitionKeys(root, tp, ids[tp.topic]) for tp in partitions if tp.topic in ids]
    return {k.tp: _offsets(k, c) for k, c in initialized(coordination, keys).items()}


def _offsets(keys: PartitionKeys, found: Versioned) -> PartitionOffsets:
    control = ControlRecord.from_json(found.value, found.key)
    return PartitionOffsets(control.log_start_offset, control.high_watermark, keys.topic_id)


def subscription_offsets(coordination: Coordination, root: str, subscription: Subscription
                         ) -> dict[TopicPartition, PartitionOffsets]:
    """The initialized partitions the subscription covers now, with their offsets: the topic
    records (one range scan for a pattern), then one multi-key read of their ``meta/control``
    records, or (``assign``) :func:`partition_offsets`."""
    if subscription.assigned:
        return partition_offsets(coordination, root, subscription.assigned)
    topics = ([t for t in list_topics(coordination, root) if subscription.matches(t)]
              if subscription.pattern is not None else subscription.topics)
    keys = [k for record in topic_records(coordination, root, topics) for k in record_keys(root, record)]
    return {k.tp: _offsets(k, c) for k, c in sorted(initialized(coordination, keys).items(), key=lambda kc: kc[0].tp)}


def current_topic_ids(coordination: Coordination, root: str, topics: Iterable[str]) -> dict[str, str | None]:
    """Each topic's incarnation now (None: no record), from the topic records: for offsets that
    name none (checkpointed by 1.2), and for the batch reader, which plans as it finds."""
    topics = set(topics)
    found = {r.topic: r.topic_id for r in topic_records(coordination, root, topics)} if topics else {}
    return {t: found.get(t) for t in topics}


def check_subscription(subscription: Subscription, found: Found) -> None:
    """Named topics and assigned partitions must exist when a read starts (a pattern may match
    nothing yet)."""
    if subscription.assigned:
        missing = [str(tp) for tp in subscription.assigned if tp not in found]
        if missing:
            raise InvalidSourceOption(f"assign: unknown partition(s) {', '.join(missing)} (no meta/control in Oxia)")
    for topic in subscription.topics:
        if not any(tp.topic == topic for tp in found):
            raise InvalidSourceOption(f"topics: unknown topic {topic!r} (it has no initialized partition)")


def resolve_positions(name: str, spec: OffsetSpec, found: Found, fail_on_data_loss: bool) -> Positions:
    """Positions for ``startingOffsets`` / ``endingOffsets`` against the partitions found:
    ``earliest`` (-2) is each partition's log start offset, ``latest`` (-1) its high watermark
    + 1. An offset past the end, or below the log start (removed by retention), is data loss:
    it fails, or (``failOnDataLoss=false``) is moved to the end or the log start."""
    if spec == "earliest":
        return {tp: o.earliest for tp, o in found.items()}
    if spec == "latest":
        return {tp: o.latest for tp, o in found.items()}
    unknown = [str(tp) for tp in spec if tp not in found]
    if unknown:
        raise InvalidSourceOption(f"{name} names unknown partition(s) {', '.join(unknown)}")
    missing = [str(tp) for tp in found if tp not in spec]
    if missing:
        raise InvalidSourceOption(f"{name} gives offsets for some partitions but not for {', '.join(missing)}; "
                                  f"give every partition of the subscription an offset (-2 earliest, -1 latest)")
    out = {}
    for tp, offset in spec.items():
        earliest, latest = found[tp].earliest, found[tp].latest
        if offset == EARLIEST:
            offset = earliest
        elif offset == LATEST or offset > latest:
            if offset != LATEST:
                data_loss(fail_on_data_loss, f"{name}: offset {offset} of {tp} is past its end (the next offset "
                                             f"to be written is {latest})", "starting from its end instead")
            offset = latest
        elif offset < earliest:
            data_loss(fail_on_data_loss, f"{name}: {removed_by_retention(tp, offset, earliest)}",
                      f"starting from offset {earliest} instead")
            offset = earliest
        out[tp] = offset
    return out


class DataLossError(LlogError):
    """Offsets the query must read can no longer be read (``failOnDataLoss=true``)."""


def removed_by_retention(partition: TopicPartition | str, first: int, log_start_offset: int,
                         last: int | None = None) -> str:
    """The problem of offsets from ``first`` (to ``last``, at most) below a partition's log start
    offset."""
    last = log_start_offset - 1 if last is None else min(last, log_start_offset - 1)
    return (f"offsets {first}..{last} of {partition} were removed by retention (its log start offset is "
            f"{log_start_offset})")


def data_loss(fail: bool, problem: str, instead: str) -> None:
    """Offsets that cannot be read: fail the query, or (``failOnDataLoss=false``) warn."""
    if fail:
        raise DataLossError(f"{problem}. Records may have been lost; set failOnDataLoss=false to skip them "
                            "and go on")
    print(f"llog source: WARNING: {problem}; {instead} (failOnDataLoss=false)", file=sys.stderr, flush=True)


def advance(start: Positions, found: Found, fail_on_data_loss: bool,
            target: Positions | None = None, start_ids: Mapping[str, str] | None = None
            ) -> tuple[Positions, Positions]:
    """Reconcile the last batch's end with the partitions found now: ``(start, latest)``.

    New partitions start at their log start offset (earliest). A partition that vanished, whose
    topic was created again since (``start_ids``, the incarnations the last batch's end names,
    differ from the one found: it is read from the new one's log start), whose end moved back
    (the same, for an end that names no incarnation: a checkpoint of 1.2), or whose position is
    below its log start (retention removed offsets the query had not read: it goes on from the
    log start) is data loss. ``target`` (``availableNow``) caps ``latest`` and excludes
    partitions that appeared after it was taken.
    """
    start = dict(start)
    for tp in [tp for tp in start if tp not in found]:
        data_loss(fail_on_data_loss, f"partition {tp} no longer exists", "dropping it from the query")
        del start[tp]
    for tp in [tp for tp in start if recreated(tp.topic, start_ids, found[tp].topic_id)]:
        data_loss(fail_on_data_loss, recreated_problem(tp, start[tp], start_ids[tp.topic], found[tp].topic_id),
                  f"reading the new topic from offset {found[tp].earliest}")
        start[tp] = found[tp].earliest
    latest = {}
    for tp, offsets in found.items():
        if target is not None and tp not in target:
            continue
        position = start.setdefault(tp, offsets.earliest)
        if position > offsets.latest:
            data_loss(fail_on_data_loss,
                      f"{tp} was at offset {position} but its high watermark is now {offsets.high_watermark}",
                      f"reading it again from offset {offsets.earliest}")
            start[tp] = offsets.earliest
        elif position < offsets.earliest:
            data_loss(fail_on_data_loss, removed_by_retention(tp, position, offsets.earliest),
                      f"going on from offset {offsets.earliest}")
            start[tp] = offsets.earliest
        latest[tp] = offsets.latest if target is None else min(offsets.latest, target[tp])
        latest[tp] = max(latest[tp], start[tp])
    return start, latest


def recreated(topic: str, ids: Mapping[str, str] | None, now: str | None) -> bool:
    """Whether ``topic``'s incarnation in ``ids`` (a batch's offsets) is known and not ``now``."""
    then = (ids or {}).get(topic)
    return then is not None and now is not None and then != now


def recreated_problem(tp: TopicPartition, position: int, then: str, now: str) -> str:
    """The problem of a position of incarnation ``then`` of a topic whose incarnation is ``now``."""
    return (f"topic {tp.topic!r} was deleted and created again (incarnation {then}, now {now}) since {tp} was "
            f"read up to offset {position - 1}")


def rate_limit(start: Positions, latest: Positions, max_rows: int) -> Positions:
    """At most ``max_rows`` records, shared by the partitions in proportion to their backlog
    (largest remainder rounding, so the shares add up exactly)."""
    backlog = {tp: latest[tp] - start.get(tp, latest[tp]) for tp in latest}
    total = sum(backlog.values())
    if total <= max_rows:
        return dict(latest)
    shares = {tp: max_rows * b / total for tp, b in backlog.items()}
    take = {tp: math.floor(s) for tp, s in shares.items()}
    left = max_rows - sum(take.values())
    for tp in sorted(shares, key=lambda tp: (take[tp] - shares[tp], tp))[:left]:
        take[tp] += 1
    return {tp: start.get(tp, latest[tp]) + take[tp] for tp in latest}


def plan_splits(coordination: Coordination, root: str, start: Positions, end: Positions,
                min_partitions: int | None, max_records_per_partition: int, *,
                topic_ids: Mapping[str, str | None]) -> list[LlogSplit]:
    """Spark tasks for reading ``start..end`` (positions): one per partition, and several for a
    partition holding more than a task's share (``maxRecordsPerPartition``, lowered until there
    are ``minPartitions`` tasks), cut at index entry ends so a WAL slice is fetched by one
    task. Only an entry larger than a share is cut inside.

    ``topic_ids``: each topic's incarnation, the one ``end`` was taken from (docs/protocol.md
    section 12.6), never read again here: a topic created again since is then read by no task
    (the split names the old incarnation, and ``read_split`` fails it by the data-loss rule).
    None: the topic has no record (the read says it is gone)."""
    ranges = [(tp, start.get(tp, 1), end[tp] - 1) for tp in sorted(end) if end[tp] > start.get(tp, 1)]
    unnamed = sorted({tp.topic for tp, _, _ in ranges} - set(topic_ids))
    if unnamed:
        raise ValueError(f"plan_splits needs the incarnation of every topic it plans; none given for {unnamed}")
    total = sum(last - first + 1 for _, first, last in ranges)
    share = max_records_per_partition
    if min_partitions and len(ranges) < min_partitions and total:
        share = min(share, max(1, math.ceil(total / min_partitions)))
    splits = []
    for tp, first, last in ranges:
        topic_id = topic_ids[tp.topic]
        if last - first + 1 <= share or topic_id is None:
            splits.append(LlogSplit(tp.topic, tp.partition, first, last, topic_id))
            continue
        keys = PartitionKeys(root, tp, topic_id)
        ends = [keys.index_end_offset(v.key)
                for v in coordination.range_scan(keys.index(first), keys.index(last), keys.partition_key)]
        splits += [LlogSplit(tp.topic, tp.partition, lo, hi, topic_id)
                   for lo, hi in cut(first, last, ends + [last], share)]
    return splits


def cut(first: int, last: int, boundaries: list[int], share: int) -> list[tuple[int, int]]:
    """``first..last`` as ranges of at most ``share`` offsets ending at ``boundaries`` (ascending,
    the last one ``last``), greedily; a boundary gap wider than a share is cut inside."""
    ranges, position, candidate = [], first, None
    for boundary in boundaries:
        if boundary - position + 1 <= share:
            candidate = boundary
            continue
        if candidate is not None:
            ranges.append((position, candidate))
            position, candidate = candidate + 1, None
        while boundary - position + 1 > share:
            ranges.append((position, position + share - 1))
            position += share
        candidate = boundary
    if position <= last:
        ranges.append((position, last))
    return ranges


#: The field of a topic in a Spark offset that names its incarnation (docs/protocol.md section 12.6).
TOPIC_ID_FIELD = "topic_id"


def to_spark(positions: Mapping[TopicPartition, int], topic_ids: Mapping[str, str | None] | None = None
             ) -> dict[str, dict[str, int | str]]:
    """Positions as a Spark offset: ``{"topic": {"partition": next_offset, ..., "topic_id": id}}``,
    sorted, so equal positions give equal JSON. ``topic_id`` (from ``topic_ids``) is the
    incarnation the positions belong to (docs/protocol.md section 12.6); a partition is a
    decimal number, so the field is never taken for one."""
    out: dict[str, dict[str, int | str]] = {}
    for tp in sorted(positions):
        out.setdefault(tp.topic, {})[str(tp.partition)] = positions[tp]
    for topic, parts in out.items():
        if (topic_ids or {}).get(topic) is not None:
            parts[TOPIC_ID_FIELD] = topic_ids[topic]
    return out


def from_spark(offset: Mapping[str, Mapping[str, int | str]]) -> Positions:
    """The positions of a Spark offset (:func:`to_spark`; also one written by 1.2, without ids)."""
    return {TopicPartition(topic, int(p)): int(n) for topic, parts in offset.items() for p, n in parts.items()
            if p != TOPIC_ID_FIELD}


def topic_ids_of(offset: Mapping[str, Mapping[str, int | str]]) -> dict[str, str]:
    """The incarnation of each topic a Spark offset names one for (:func:`to_spark`; an offset
    checkpointed by 1.2 names none)."""
    return {topic: str(parts[TOPIC_ID_FIELD]) for topic, parts in offset.items() if TOPIC_ID_FIELD in parts}
