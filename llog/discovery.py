"""Finding topics and their partitions: from the topic records (docs/protocol.md section 12).

Every partition belongs to one incarnation of a topic, named by its record's ``topic_id``, and
the partitions of an incarnation are ``0..partitions-1`` of its record. So one range scan of the
topic records' shard lists the topics, and one multi-key read of the ``meta/control`` of every
partition a record names (one RPC per shard) tells which are initialized.
"""

from __future__ import annotations

from collections.abc import Iterable

from llog.coordination import Coordination, Versioned
from llog.keys import TOPICS_PARTITION_KEY, PartitionKeys, TopicPartition, topic_key, topic_keys_range, validate_topic
from llog.records import ControlRecord, TopicRecord


def topic_records(coordination: Coordination, root: str, topics: Iterable[str] | None = None) -> list[TopicRecord]:
    """The records of ``topics`` that have one (every topic when None; one range scan), by name.
    Topics being deleted are included: their partitions still exist until the delete ends."""
    if topics is None:
        start, end = topic_keys_range(root)
        found = coordination.range_scan(start, end, TOPICS_PARTITION_KEY)
    else:
        names = sorted({validate_topic(t) for t in topics})
        found = [v for v in coordination.get_many([(topic_key(root, t), TOPICS_PARTITION_KEY) for t in names]) if v]
    return sorted((TopicRecord.from_json(v.value, v.key) for v in found), key=lambda r: r.topic)


def record_keys(root: str, record: TopicRecord) -> list[PartitionKeys]:
    """The keys of every partition the record names."""
    return [PartitionKeys(root, TopicPartition(record.topic, p), record.topic_id) for p in range(record.partitions)]


def initialized(coordination: Coordination, keys: list[PartitionKeys]) -> dict[PartitionKeys, Versioned]:
    """The ``meta/control`` of each partition of ``keys`` that is initialized and not a
    tombstone (one read per shard)."""
    controls = coordination.get_many([(k.control, k.partition_key) for k in keys]) if keys else []
    return {k: c for k, c in zip(keys, controls)
            if c is not None and not ControlRecord.from_json(c.value, c.key).deleted}


def partition_controls(coordination: Coordination, root: str, topic: str) -> tuple[TopicRecord | None,
                                                                                      dict[int, Versioned]]:
    """The topic's record (None: no such topic) and the ``meta/control`` of each initialized
    partition of it, by partition."""
    records = topic_records(coordination, root, [topic])
    if not records:
        return None, {}
    found = initialized(coordination, record_keys(root, records[0]))
    return records[0], {k.tp.partition: c for k, c in found.items()}


def topic_partitions(coordination: Coordination, root: str, topic: str) -> list[int]:
    """Initialized partitions of ``topic``'s current incarnation, ascending."""
    return sorted(partition_controls(coordination, root, topic)[1])


def partitions_of(coordination: Coordination, root: str, topics: Iterable[str] | None = None) -> list[PartitionKeys]:
    """The keys of every initialized partition of ``topics`` (every topic when None), by topic
    and partition."""
    keys = [k for record in topic_records(coordination, root, topics) for k in record_keys(root, record)]
    return sorted(initialized(coordination, keys), key=lambda k: k.tp)


def list_topics(coordination: Coordination, root: str) -> list[str]:
    """Topics that have a record, ascending."""
    return [r.topic for r in topic_records(coordination, root)]
