"""Finding topics and the partitions of a topic from their ``meta/control`` records.

Skip scans: one cross-shard ceiling get lands on the next partition (or topic) that has any key,
one get checks its ``meta/control``, and the scan jumps past it. Costs two Oxia reads per
partition, however long its index is.
"""

from __future__ import annotations

from llog.coordination import Coordination
from llog.errors import InvalidTopicName
from llog.keys import (
    PartitionKeys, TopicPartition, parse_partition_segment, parse_topic_segment, partition_scan_key, partitions_root,
    topic_scan_key, validate_topic,
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
