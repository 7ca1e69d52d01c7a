"""Finding the partitions of a topic from their ``meta/control`` records.

A skip scan: one cross-shard ceiling get lands on the next partition that has any key, one get
checks its ``meta/control``, and the scan jumps past that partition. Costs two Oxia reads per
partition, however long its index is.
"""

from __future__ import annotations

from llog.coordination import Coordination
from llog.keys import (
    PartitionKeys, TopicPartition, parse_partition_segment, partition_scan_key, partitions_root, validate_topic,
)


def topic_partitions(coordination: Coordination, root: str, topic: str) -> list[int]:
    """Initialized partitions of ``topic``, ascending."""
    validate_topic(topic)
    within = partitions_root(root, topic)
    found, segment = [], ""
    while True:
        hit = coordination.ceiling(partition_scan_key(root, topic, segment), None, within)
        segment = parse_partition_segment(root, topic, hit.key) if hit else None
        if segment is None:
            return sorted(found)
        if segment.isdigit():
            keys = PartitionKeys(root, TopicPartition(topic, int(segment)))
            if coordination.get(keys.control, keys.partition_key) is not None:
                found.append(int(segment))
        segment += "\x00"  # the smallest segment after this one
