"""Every Oxia key and S3 object name llog uses (docs/protocol.md sections 2, 3 and 12).

No other module formats a key or an object name. Topic names and partitions are validated here,
before they can reach a key.
"""

from __future__ import annotations

import functools
import re
import uuid
from dataclasses import dataclass

from llog.errors import InvalidGroupId, InvalidPartition, InvalidTopicName

_TOPIC_CHARS = re.compile(r"[A-Za-z0-9._-]+")
#: A topic id is one key segment: a UUID as the topic record has it (letters, digits, '-').
_TOPIC_ID = re.compile(r"[A-Za-z0-9-]{1,64}")
MAX_TOPIC_LENGTH = 249
OFFSET_WIDTH = 20


def _name_problem(name: object) -> str | None:
    if not isinstance(name, str):
        return f"must be a str, not {type(name).__name__}"
    return _str_name_problem(name)


@functools.lru_cache(maxsize=4096)
def _str_name_problem(name: str) -> str | None:
    """Cached: a broker checks the same few names on every request."""
    if not name:
        return "must not be empty"
    if len(name) > MAX_TOPIC_LENGTH:
        return f"is {len(name)} characters long, the limit is {MAX_TOPIC_LENGTH}"
    if name in (".", ".."):
        return "'.' and '..' are reserved"
    if not _TOPIC_CHARS.fullmatch(name):
        bad = sorted({c for c in name if not _TOPIC_CHARS.fullmatch(c)})
        return f"contains {''.join(bad)!r}; allowed are letters, digits, '.', '_' and '-'"
    return None


def validate_topic(topic: object) -> str:
    """Kafka's rule: 1..249 characters of ``[A-Za-z0-9._-]``, not ``.`` or ``..`` (section 1)."""
    problem = _name_problem(topic)
    if problem:
        raise InvalidTopicName(topic, problem)
    return topic


def validate_group(group: object) -> str:
    """Consumer group ids follow the topic rule: each is one segment of an Oxia key."""
    problem = _name_problem(group)
    if problem:
        raise InvalidGroupId(group, problem)
    return group


def validate_partition(partition: object) -> int:
    # bool is an int subclass; True is not a partition.
    if not isinstance(partition, int) or isinstance(partition, bool) or partition < 0:
        raise InvalidPartition(partition)
    return partition


@dataclass(frozen=True, order=True)
class TopicPartition:
    """One log: ``(topic, partition)``, validated on construction."""

    topic: str
    partition: int

    def __post_init__(self) -> None:
        validate_topic(self.topic)
        validate_partition(self.partition)

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]"


def validate_topic_id(topic_id: object) -> str:
    if not isinstance(topic_id, str) or not _TOPIC_ID.fullmatch(topic_id):
        raise ValueError(f"topic id {topic_id!r} must be 1..64 letters, digits or '-' (a topic record's UUID)")
    return topic_id


@dataclass(frozen=True)
class PartitionKeys:
    """The Oxia keys of one partition of one incarnation of a topic under root prefix ``R``
    (sections 2 and 12): ``P = R/{topic}/{topic_id}/partitions/{partition}``.

    ``topic_id`` is the topic record's: a topic deleted and created again gets a new one, so
    nothing written late on behalf of the deleted incarnation can land among the new one's keys.
    ``partition_key`` routes every one of them to the same Oxia shard.
    """

    root: str
    tp: TopicPartition
    topic_id: str

    def __post_init__(self) -> None:
        validate_topic_id(self.topic_id)

    @property
    def base(self) -> str:
        return f"{incarnation_root(self.root, self.tp.topic, self.topic_id)}{self.tp.partition}"

    @property
    def partition_key(self) -> str:
        return f"{self.tp.topic}:{self.tp.partition}"

    @property
    def control(self) -> str:
        return f"{self.base}/meta/control"

    @property
    def compaction_cursor(self) -> str:
        return f"{self.base}/meta/compaction-cursor"

    @property
    def compaction(self) -> str:
        return f"{self.base}/meta/compaction"

    @property
    def compactor_claim(self) -> str:
        return f"{self.base}/meta/compactor-claim"

    @property
    def index_prefix(self) -> str:
        return f"{self.base}/index/"

    def index(self, end_offset: int) -> str:
        return f"{self.index_prefix}{end_offset:0{OFFSET_WIDTH}d}"

    @property
    def index_end(self) -> str:
        """Exclusive upper bound of every index key ('~' sorts after every digit)."""
        return f"{self.index_prefix}~"

    def index_end_offset(self, key: str) -> int:
        """The end offset an index key names; rejects keys outside this partition's index."""
        if not key.startswith(self.index_prefix):
            raise ValueError(f"{key!r} is not an index key of {self.tp}")
        suffix = key[len(self.index_prefix):]
        if len(suffix) != OFFSET_WIDTH or not (suffix.isascii() and suffix.isdigit()):
            raise ValueError(f"{key!r} does not end in a {OFFSET_WIDTH}-digit offset")
        return int(suffix)

    @property
    def all_but_control(self) -> tuple[tuple[str, str], tuple[str, str]]:
        """Two ranges holding every key of depth ``P/x/y`` (each kind of per-partition key) but
        ``meta/control``: ``[P//, P/meta/control)`` and ``[P/meta/control\\x00, P/~/)``. Oxia
        compares keys segment by segment, so keys of another depth fall outside both (section
        12, delete)."""
        return (f"{self.base}//", self.control), (f"{self.control}\x00", f"{self.base}/~/")

    def consumer_group(self, group: str) -> str:
        return f"{self.base}/consumers/{group}"

    @property
    def compacted_prefix(self) -> str:
        return f"{self.base}/data/compacted/"

    def compacted_object(self, blob_id: str | None = None) -> str:
        return f"{self.compacted_prefix}{blob_id or uuid.uuid4()}"


def partition_keys(root: str, topic: str, partition: int, topic_id: str) -> PartitionKeys:
    return PartitionKeys(root, TopicPartition(topic, partition), topic_id)


def incarnation_root(root: str, topic: str, topic_id: str) -> str:
    """``R/{topic}/{topic_id}/partitions/``: every key and compacted object of one incarnation of
    a topic lies below it."""
    return f"{root}/{topic}/{topic_id}/partitions/"


#: The partition key of every topic record: one shard holds them all (docs/protocol.md section 10.1).
TOPICS_PARTITION_KEY = "topics"


def topic_key(root: str, topic: str) -> str:
    """``R/topics/{topic}``, the topic record (docs/protocol.md section 10.1)."""
    return f"{root}/topics/{validate_topic(topic)}"


def topic_keys_range(root: str) -> tuple[str, str]:
    """``[R/topics/, R/topics/~)``: every topic record and no other key."""
    return f"{root}/topics/", f"{root}/topics/~"


#: The partition key of the Kafka listeners' registry and group claims (docs/protocol.md section 9.5).
KAFKA_PARTITION_KEY = "kafka"


def kafka_listener_key(root: str, node_id: int) -> str:
    """``R/kafka/listeners/{node_id}``, a registered Kafka listener (docs/protocol.md section 9.5)."""
    return f"{root}/kafka/listeners/{node_id}"


def kafka_listeners_range(root: str) -> tuple[str, str]:
    """``[R/kafka/listeners/, R/kafka/listeners/~)``: every registered Kafka listener and no other key."""
    return f"{root}/kafka/listeners/", f"{root}/kafka/listeners/~"


def kafka_group_key(root: str, group: str) -> str:
    """``R/kafka/groups/{group}``, the claim naming a Kafka group's coordinator (docs/protocol.md section 9.5)."""
    return f"{root}/kafka/groups/{validate_group(group)}"


def shared_wal_object(root: str, blob_id: str | None = None) -> str:
    """``R/wal-shared/{uuid}`` (section 3)."""
    return f"{root}/wal-shared/{blob_id or uuid.uuid4()}"


def shared_wal_prefix(root: str) -> str:
    return f"{root}/wal-shared/"


def sink_cut_object(root: str, cut_id: str | None = None) -> str:
    """``R/sink-cuts/{uuid}``: a pinned sink batch's cut, when it does not fit in its record
    (section 9.1)."""
    return f"{root}/sink-cuts/{cut_id or uuid.uuid4()}"


def sink_cut_prefix(root: str) -> str:
    """Lists every sink cut, and also the compacted objects of a topic named ``sink-cuts``
    (``R/sink-cuts/{topic_id}/partitions/...``): a cut is a direct child, a UUID without ``/``."""
    return f"{root}/sink-cuts/"


def s3_uri(bucket: str, key: str) -> str:
    return f"s3://{bucket}/{key}"


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` -> ``(bucket, key)``."""
    if not uri.startswith("s3://"):
        raise ValueError(f"not an s3:// URI: {uri!r}")
    bucket, _, key = uri[5:].partition("/")
    if not bucket or not key:
        raise ValueError(f"s3 URI {uri!r} needs a bucket and a key")
    return bucket, key


def kafka_groups_range(root: str) -> tuple[str, str]:
    """``[R/kafka/groups/, R/kafka/groups/~)``: every group coordinator claim and no other key."""
    return f"{root}/kafka/groups/", f"{root}/kafka/groups/~"
