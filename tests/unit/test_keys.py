"""Oxia keys and object names (docs/protocol.md sections 1-3 and 12), checked against literal strings."""

from __future__ import annotations

import re
import uuid

import pytest

from llog.coordination import oxia_key_order
from llog.errors import InvalidPartition, InvalidTopicName
from llog.keys import (
    PartitionKeys,
    TopicPartition,
    incarnation_root,
    parse_s3_uri,
    partition_keys,
    s3_uri,
    shared_wal_object,
    shared_wal_prefix,
    validate_partition,
    validate_topic,
    validate_topic_id,
)

UUID_RE = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
#: The topic id of the topic record the keys below belong to (section 12: a segment of ``P``).
TID = "0b5e1c7a-9d2f-4e63-a1b8-7c4d2e9f6a30"
OTHER_TID = "3f2a8b1c-5e7d-4c90-b6a2-1d8e4f7c9b05"


@pytest.fixture
def keys() -> PartitionKeys:
    return partition_keys("llog", "orders", 3, TID)


# --- topic and partition validation ------------------------------------------------------------


@pytest.mark.parametrize(
    "topic",
    ["a", "x" * 249, "orders", "orders.v2", "my-topic", "my_topic", "A.b-C_9", "...", ".hidden", "..a", "0", "-"],
)
def test_valid_topics(topic):
    assert validate_topic(topic) == topic
    assert TopicPartition(topic, 0).topic == topic


@pytest.mark.parametrize(
    "topic,reason",
    [
        ("", "must not be empty"),
        ("x" * 250, "is 250 characters long, the limit is 249"),
        (".", "reserved"),
        ("..", "reserved"),
        ("my topic", "contains ' '"),
        ("a/b", "contains '/'"),
        ("../etc", "contains '/'"),
        ("a:b", "contains ':'"),
        ("caf\u00e9", "contains '\u00e9'"),
        ("\u0661\u0662", "contains"),  # Arabic-Indic digits are not [0-9]
        ("orders\n", "contains '\\n'"),
        ("a*b?", "contains '*?'"),
        (None, "must be a str, not NoneType"),
        (42, "must be a str, not int"),
        (b"orders", "must be a str, not bytes"),
    ],
)
def test_invalid_topics(topic, reason):
    with pytest.raises(InvalidTopicName, match=re.escape(reason)) as info:
        validate_topic(topic)
    assert info.value.topic == topic
    assert str(info.value).startswith(f"invalid topic name {topic!r}")
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("partition", [0, 1, 2**31])
def test_valid_partitions(partition):
    assert validate_partition(partition) == partition


@pytest.mark.parametrize("partition", [-1, True, False, 1.0, "0", None])
def test_invalid_partitions(partition):
    with pytest.raises(InvalidPartition, match=re.escape(f"invalid partition {partition!r}: must be an int >= 0")):
        validate_partition(partition)


def test_topic_partition_validates_and_prints():
    assert str(TopicPartition("orders", 3)) == "orders[3]"
    with pytest.raises(InvalidTopicName):
        TopicPartition("a/b", 0)
    with pytest.raises(InvalidPartition):
        TopicPartition("orders", -1)
    with pytest.raises(InvalidTopicName):
        partition_keys("llog", "", 0, TID)


@pytest.mark.parametrize("topic_id", [TID, str(uuid.UUID(int=2**128 - 1)), "a", "A-1", "x" * 64])
def test_valid_topic_ids(topic_id):
    assert validate_topic_id(topic_id) == topic_id
    assert partition_keys("llog", "orders", 0, topic_id).topic_id == topic_id


@pytest.mark.parametrize("topic_id", ["", "x" * 65, "a/b", "../x", "a b", "a:b", "a_b", "a.b", "caf\u00e9", "a\n",
                                      None, 42, b"abc", uuid.UUID(TID)])
def test_invalid_topic_ids(topic_id):
    # A topic id is one key segment: anything that could add or hide a segment is refused before
    # it reaches a key.
    with pytest.raises(ValueError, match=re.escape(f"topic id {topic_id!r} must be 1..64 letters, digits or '-'")):
        validate_topic_id(topic_id)
    with pytest.raises(ValueError, match="topic id"):
        PartitionKeys("llog", TopicPartition("orders", 0), topic_id)


def test_partition_keys_need_a_topic_id():
    with pytest.raises(TypeError):
        PartitionKeys("llog", TopicPartition("orders", 0))  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        partition_keys("llog", "orders", 0)  # type: ignore[call-arg]


# --- per-partition keys --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "attribute,expected",
    [
        ("base", "llog/orders/0b5e1c7a-9d2f-4e63-a1b8-7c4d2e9f6a30/partitions/3"),
        ("partition_key", "orders:3"),
        ("control", "llog/orders/0b5e1c7a-9d2f-4e63-a1b8-7c4d2e9f6a30/partitions/3/meta/control"),
        ("compaction_cursor", "llog/orders/0b5e1c7a-9d2f-4e63-a1b8-7c4d2e9f6a30/partitions/3/meta/compaction-cursor"),
        ("compaction", "llog/orders/0b5e1c7a-9d2f-4e63-a1b8-7c4d2e9f6a30/partitions/3/meta/compaction"),
        ("compactor_claim", "llog/orders/0b5e1c7a-9d2f-4e63-a1b8-7c4d2e9f6a30/partitions/3/meta/compactor-claim"),
        ("index_prefix", "llog/orders/0b5e1c7a-9d2f-4e63-a1b8-7c4d2e9f6a30/partitions/3/index/"),
        ("index_end", "llog/orders/0b5e1c7a-9d2f-4e63-a1b8-7c4d2e9f6a30/partitions/3/index/~"),
    ],
)
def test_partition_keys(keys, attribute, expected):
    assert getattr(keys, attribute) == expected


@pytest.mark.parametrize(
    "end_offset,expected",
    [
        (1, "llog/orders/0b5e1c7a-9d2f-4e63-a1b8-7c4d2e9f6a30/partitions/3/index/00000000000000000001"),
        (42, "llog/orders/0b5e1c7a-9d2f-4e63-a1b8-7c4d2e9f6a30/partitions/3/index/00000000000000000042"),
        (10**19, "llog/orders/0b5e1c7a-9d2f-4e63-a1b8-7c4d2e9f6a30/partitions/3/index/10000000000000000000"),
        (2**63 - 1, "llog/orders/0b5e1c7a-9d2f-4e63-a1b8-7c4d2e9f6a30/partitions/3/index/09223372036854775807"),
    ],
)
def test_index_key(keys, end_offset, expected):
    assert keys.index(end_offset) == expected
    assert keys.index_end_offset(expected) == end_offset


def test_index_keys_sort_like_offsets_and_below_index_end(keys):
    offsets = [1, 9, 10, 99, 100, 12345, 10**18]
    index_keys = [keys.index(o) for o in offsets]
    assert sorted(index_keys) == index_keys
    assert all(keys.index_prefix <= k < keys.index_end for k in index_keys)


def test_other_root_topic_and_partition():
    k = partition_keys("prod/llog", "payments.eu", 12, TID)
    assert k.control == "prod/llog/payments.eu/0b5e1c7a-9d2f-4e63-a1b8-7c4d2e9f6a30/partitions/12/meta/control"
    assert k.index(7) == "prod/llog/payments.eu/0b5e1c7a-9d2f-4e63-a1b8-7c4d2e9f6a30/partitions/12/index/00000000000000000007"
    assert k.partition_key == "payments.eu:12"


def test_consumer_group_key(keys):
    assert keys.consumer_group("billing") == "llog/orders/0b5e1c7a-9d2f-4e63-a1b8-7c4d2e9f6a30/partitions/3/consumers/billing"


@pytest.mark.parametrize(
    "key,problem",
    [
        ("llog/orders/0b5e1c7a-9d2f-4e63-a1b8-7c4d2e9f6a30/partitions/30/index/00000000000000000042", "is not an index key of orders[3]"),
        ("llog/orders/0b5e1c7a-9d2f-4e63-a1b8-7c4d2e9f6a30/partitions/4/index/00000000000000000042", "is not an index key"),
        ("llog/orders.x/0b5e1c7a-9d2f-4e63-a1b8-7c4d2e9f6a30/partitions/3/index/00000000000000000042", "is not an index key"),
        ("other/orders/0b5e1c7a-9d2f-4e63-a1b8-7c4d2e9f6a30/partitions/3/index/00000000000000000042", "is not an index key"),
        # The same partition of another incarnation of the topic (section 12).
        ("llog/orders/3f2a8b1c-5e7d-4c90-b6a2-1d8e4f7c9b05/partitions/3/index/00000000000000000042", "is not an index key"),
        ("llog/orders/partitions/3/index/00000000000000000042", "is not an index key"),  # v1.1 layout
        ("llog/orders/0b5e1c7a-9d2f-4e63-a1b8-7c4d2e9f6a30/partitions/3/meta/control", "is not an index key"),
        ("llog/orders/0b5e1c7a-9d2f-4e63-a1b8-7c4d2e9f6a30/partitions/3/index/", "does not end in a 20-digit offset"),
        ("llog/orders/0b5e1c7a-9d2f-4e63-a1b8-7c4d2e9f6a30/partitions/3/index/42", "does not end in a 20-digit offset"),
        ("llog/orders/0b5e1c7a-9d2f-4e63-a1b8-7c4d2e9f6a30/partitions/3/index/000000000000000000042", "does not end in a 20-digit offset"),
        ("llog/orders/0b5e1c7a-9d2f-4e63-a1b8-7c4d2e9f6a30/partitions/3/index/0000000000000000004x", "does not end in a 20-digit offset"),
        ("llog/orders/0b5e1c7a-9d2f-4e63-a1b8-7c4d2e9f6a30/partitions/3/index/-0000000000000000042", "does not end in a 20-digit offset"),
        ("llog/orders/0b5e1c7a-9d2f-4e63-a1b8-7c4d2e9f6a30/partitions/3/index/~", "does not end in a 20-digit offset"),
    ],
)
def test_index_end_offset_rejects_foreign_keys(keys, key, problem):
    with pytest.raises(ValueError, match=re.escape(problem)):
        keys.index_end_offset(key)


def test_index_end_offset_rejects_non_ascii_digits(keys):
    with pytest.raises(ValueError):
        keys.index_end_offset(keys.index_prefix + "\uff10" * 19 + "\uff15")  # fullwidth "0...05"


# --- object names --------------------------------------------------------------------------------


def test_shared_wal_object():
    assert shared_wal_object("llog", "abc") == "llog/wal-shared/abc"
    assert shared_wal_prefix("llog") == "llog/wal-shared/"
    assert re.fullmatch(f"llog/wal-shared/{UUID_RE}", shared_wal_object("llog"))
    assert shared_wal_object("llog") != shared_wal_object("llog")


def test_compacted_object(keys):
    blob_id = str(uuid.UUID(int=1))
    assert keys.compacted_object(blob_id) == f"llog/orders/0b5e1c7a-9d2f-4e63-a1b8-7c4d2e9f6a30/partitions/3/data/compacted/{blob_id}"
    assert re.fullmatch(f"llog/orders/0b5e1c7a-9d2f-4e63-a1b8-7c4d2e9f6a30/partitions/3/data/compacted/{UUID_RE}", keys.compacted_object())
    assert keys.compacted_object() != keys.compacted_object()


@pytest.mark.parametrize(
    "bucket,key",
    [("bucket", "k"), ("llog-data", "llog/wal-shared/1234"), ("b", "a/b/c/"), ("b.example", "key with spaces")],
)
def test_s3_uri_roundtrip(bucket, key):
    uri = s3_uri(bucket, key)
    assert uri == f"s3://{bucket}/{key}"
    assert parse_s3_uri(uri) == (bucket, key)


@pytest.mark.parametrize(
    "uri,problem",
    [
        ("bucket/key", "not an s3:// URI"),
        ("S3://bucket/key", "not an s3:// URI"),
        ("s3:/bucket/key", "not an s3:// URI"),
        ("https://bucket/key", "not an s3:// URI"),
        ("", "not an s3:// URI"),
        ("s3://", "needs a bucket and a key"),
        ("s3://bucket", "needs a bucket and a key"),
        ("s3://bucket/", "needs a bucket and a key"),
        ("s3:///key", "needs a bucket and a key"),
    ],
)
def test_parse_s3_uri_rejects(uri, problem):
    with pytest.raises(ValueError, match=re.escape(problem)):
        parse_s3_uri(uri)


# --- one incarnation's keys (section 12) ------------------------------------------------------------


def test_incarnation_root():
    assert incarnation_root("llog", "orders", TID) == f"llog/orders/{TID}/partitions/"
    assert partition_keys("llog", "orders", 3, TID).base.startswith(incarnation_root("llog", "orders", TID))


def test_incarnations_of_a_topic_share_no_key(keys):
    other = partition_keys("llog", "orders", 3, OTHER_TID)
    assert other.partition_key == keys.partition_key == "orders:3"  # routing only: one shard
    mine = _every_key(keys)
    assert not set(mine) & set(_every_key(other))
    assert not any(k.startswith(other.base + "/") for k in mine)
    assert not keys.compacted_prefix.startswith(other.compacted_prefix)
    assert not other.compacted_prefix.startswith(keys.compacted_prefix)


def _every_key(keys: PartitionKeys) -> list[str]:
    """One key of each kind a partition has in Oxia."""
    return [keys.control, keys.compaction_cursor, keys.compaction, keys.compactor_claim, keys.index(1),
            keys.index(2**63 - 1), keys.consumer_group("g"), keys.consumer_group("~")]


def test_all_but_control(keys):
    assert keys.all_but_control == (
        (f"llog/orders/{TID}/partitions/3//", f"llog/orders/{TID}/partitions/3/meta/control"),
        (f"llog/orders/{TID}/partitions/3/meta/control\x00", f"llog/orders/{TID}/partitions/3/~/"),
    )


def _in(key: str, start: str, end: str) -> bool:
    """Whether ``key`` lies in ``[start, end)`` in Oxia's key order (as a range delete sees it)."""
    return oxia_key_order(start) <= oxia_key_order(key) < oxia_key_order(end)


def test_all_but_control_covers_every_other_key_of_the_partition_and_nothing_else(keys):
    ranges = keys.all_but_control
    assert not any(_in(keys.control, *r) for r in ranges)
    # Deeper keys (none exists in Oxia; compacted objects are S3 names) would go with them too.
    for key in _every_key(keys)[1:] + [keys.index(10**19), keys.control + "-x", keys.base + "/meta/z",
                                       keys.base + "/meta/control/x", keys.compacted_object("x")]:
        assert sum(_in(key, *r) for r in ranges) == 1, key
    outside = [
        keys.base, keys.base + "/", keys.base + "/meta",  # shallower than P/x/y
        *_every_key(partition_keys("llog", "orders", 30, TID)),  # another partition
        *_every_key(partition_keys("llog", "orders", 4, TID)),
        *_every_key(partition_keys("llog", "orders", 3, OTHER_TID)),  # another incarnation
        *_every_key(partition_keys("llog", "orders2", 3, TID)),  # another topic
        "llog/topics/orders", "llog/wal-shared/abc",
    ]
    for key in outside:
        assert not any(_in(key, *r) for r in ranges), key
