"""Consumer groups (PROTOCOL.md section 9): per partition, the next offset a group will read,
committed in Oxia at ``P/consumers/{group}``, so lag is visible outside the consuming job.

``llog groups describe GROUP`` prints, per partition the group has committed: the committed
offset, the high watermark and the lag (records written but not yet consumed).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from llog.coordination import Coordination
from llog.discovery import list_topics, topic_partitions
from llog.errors import CorruptRecord
from llog.keys import PartitionKeys, TopicPartition, validate_group
from llog.records import ConsumerOffset, ControlRecord, now_ms


def commit_offsets(coordination: Coordination, root: str, group: str,
                   offsets: Mapping[TopicPartition, int]) -> None:
    """Commit ``group``'s next offset to read for each partition (one write RPC per shard)."""
    validate_group(group)
    stamp = now_ms()
    coordination.put_many([
        (PartitionKeys(root, tp).consumer_group(group), ConsumerOffset(offset, stamp).to_json(),
         PartitionKeys(root, tp).partition_key, None)
        for tp, offset in offsets.items()
    ])


def committed_offsets(coordination: Coordination, root: str, group: str,
                      partitions: Iterable[TopicPartition]) -> dict[TopicPartition, ConsumerOffset]:
    """The committed offsets of ``group`` on ``partitions`` (partitions without one are left out)."""
    validate_group(group)
    partitions = list(partitions)
    keys = [PartitionKeys(root, tp) for tp in partitions]
    found = coordination.get_many([(k.consumer_group(group), k.partition_key) for k in keys])
    return {tp: ConsumerOffset.from_json(v.value, v.key) for tp, v in zip(partitions, found) if v is not None}


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    committed_offset: int
    committed_at_ms: int
    high_watermark: int

    @property
    def lag(self) -> int:
        """Records at or after the committed offset (offsets are 1-based; the committed offset
        is the next to read)."""
        return max(0, self.high_watermark - self.committed_offset + 1)


def describe_group(coordination: Coordination, root: str, group: str,
                   topics: Iterable[str] | None = None) -> list[PartitionLag]:
    """Lag of ``group`` on every partition it has committed (of ``topics``, default all)."""
    validate_group(group)
    partitions = [TopicPartition(t, p) for t in (list(topics) if topics is not None else list_topics(coordination, root))
                  for p in topic_partitions(coordination, root, t)]
    committed = committed_offsets(coordination, root, group, partitions)
    keys = [PartitionKeys(root, tp) for tp in committed]
    controls = coordination.get_many([(k.control, k.partition_key) for k in keys])
    rows = []
    for (tp, offset), k, control in zip(committed.items(), keys, controls):
        if control is None:
            raise CorruptRecord(f"{k.consumer_group(group)} exists but {k.control} does not")
        hw = ControlRecord.from_json(control.value, k.control).high_watermark
        rows.append(PartitionLag(tp.topic, tp.partition, offset.offset, offset.committed_at_ms, hw))
    return rows


def format_group(group: str, rows: list[PartitionLag]) -> str:
    if not rows:
        return f"group {group!r} has no committed offsets"
    header = ("TOPIC", "PARTITION", "COMMITTED_OFFSET", "HIGH_WATERMARK", "LAG")
    table = [header] + [(r.topic, str(r.partition), str(r.committed_offset), str(r.high_watermark), str(r.lag))
                        for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = [f"group {group}: {len(rows)} partition(s), total lag {sum(r.lag for r in rows)}"]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    return "\n".join(lines)
