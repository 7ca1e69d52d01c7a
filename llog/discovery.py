"""Finding topics and the partitions of a topic from their ``meta/control`` records.

Skip scans: one cross-shard ceiling get lands on the next partition (or topic) that has any key,
and the scan jumps past it; then one multi-key read of the ``meta/control`` of every partition
found (one RPC per shard) keeps those initialized. Costs one Oxia read per partition, however
long its index is, and one more.
"""

from __future__ import annotations

from llog.coordination import Coordination, Versioned
from llog.errors import InvalidTopicName
from llog.keys import (
    PartitionKeys, TopicPartition, parse_partition_segment, parse_topic_segment, partition_scan_key, partitions_root,
    topic_scan_key, validate_topic,
)


def topic_partitions(coordination: Coordination, root: str, topic: str) -> list[int]:
    """Initialized partitions of ``topic``, ascending."""
    return sorted(partition_controls(coordination, root, topic))


def partition_controls(coordination: Coordination, root: str, topic: str) -> dict[int, Versioned]:
    """The ``meta/control`` record of each initialized partition of ``topic``."""
    validate_topic(topic)
    within = partitions_root(root, topic)
    candidates, segment = [], ""
    while True:
        hit = coordination.ceiling(partition_scan_key(root, topic, segment), None, within)
        segment = parse_partition_segment(root, topic, hit.key) if hit else None
        if segment is None:
            break
        if segment.isdigit():
            candidates.append(int(segment))
        segment += "\x00"  # the smallest segment after this one
    keys = [PartitionKeys(root, TopicPartition(topic, p)) for p in candidates]
    controls = coordination.get_many([(k.control, k.partition_key) for k in keys]) if keys else []
    return {p: control for p, control in zip(candidates, controls) if control is not None}


def list_topics(coordination: Coordination, root: str) -> list[str]:
    """Topics with at least one initialized partition, ascending."""
    found, segment = [], ""
    while True:
        hit = coordination.ceiling(topic_scan_key(root, segment), None, f"{root}/")
        if hit is None:
            return found
        # The key's first segment names a topic if that topic has partitions. The key itself
        # may be another kind (a topic record ``R/topics/x`` sorts before ``R/topics/partitions/..``
        # of a topic named "topics"), so the topic's partitions are looked up, not assumed.
        topic = parse_topic_segment(root, hit.key) or hit.key[len(root) + 1:].partition("/")[0]
        try:
            if topic_partitions(coordination, root, topic):
                found.append(topic)
        except InvalidTopicName:
            pass  # not written by llog
        segment = topic + "\x00"
