"""Oxia keys and object names (PROTOCOL.md sections 1-3), checked against literal strings."""

from __future__ import annotations

import re
import uuid

import pytest

from llog.errors import InvalidPartition, InvalidTopicName
from llog.keys import (
    PartitionKeys,
    TopicPartition,
    parse_partition_segment,
    parse_s3_uri,
    partition_keys,
    partition_scan_key,
    partitions_root,
    s3_uri,
    shared_wal_object,
    shared_wal_prefix,
    validate_partition,
    validate_topic,
)

UUID_RE = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


@pytest.fixture
def keys() -> PartitionKeys:
    return partition_keys("llog", "orders", 3)


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
        partition_keys("llog", "", 0)


# --- per-partition keys --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "attribute,expected",
    [
        ("base", "llog/orders/partitions/3"),
        ("partition_key", "orders:3"),
        ("control", "llog/orders/partitions/3/meta/control"),
        ("compaction_cursor", "llog/orders/partitions/3/meta/compaction-cursor"),
        ("compaction", "llog/orders/partitions/3/meta/compaction"),
        ("compactor_claim", "llog/orders/partitions/3/meta/compactor-claim"),
        ("index_prefix", "llog/orders/partitions/3/index/"),
        ("index_end", "llog/orders/partitions/3/index/~"),
    ],
)
def test_partition_keys(keys, attribute, expected):
    assert getattr(keys, attribute) == expected


@pytest.mark.parametrize(
    "end_offset,expected",
    [
        (1, "llog/orders/partitions/3/index/00000000000000000001"),
        (42, "llog/orders/partitions/3/index/00000000000000000042"),
        (10**19, "llog/orders/partitions/3/index/10000000000000000000"),
        (2**63 - 1, "llog/orders/partitions/3/index/09223372036854775807"),
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
    k = partition_keys("prod/llog", "payments.eu", 12)
    assert k.control == "prod/llog/payments.eu/partitions/12/meta/control"
    assert k.index(7) == "prod/llog/payments.eu/partitions/12/index/00000000000000000007"
    assert k.partition_key == "payments.eu:12"


def test_consumer_group_key(keys):
    assert keys.consumer_group("billing") == "llog/orders/partitions/3/consumers/billing"


@pytest.mark.parametrize(
    "key,problem",
    [
        ("llog/orders/partitions/30/index/00000000000000000042", "is not an index key of orders[3]"),
        ("llog/orders/partitions/4/index/00000000000000000042", "is not an index key"),
        ("llog/orders.x/partitions/3/index/00000000000000000042", "is not an index key"),
        ("other/orders/partitions/3/index/00000000000000000042", "is not an index key"),
        ("llog/orders/partitions/3/meta/control", "is not an index key"),
        ("llog/orders/partitions/3/index/", "does not end in a 20-digit offset"),
        ("llog/orders/partitions/3/index/42", "does not end in a 20-digit offset"),
        ("llog/orders/partitions/3/index/000000000000000000042", "does not end in a 20-digit offset"),
        ("llog/orders/partitions/3/index/0000000000000000004x", "does not end in a 20-digit offset"),
        ("llog/orders/partitions/3/index/-0000000000000000042", "does not end in a 20-digit offset"),
        ("llog/orders/partitions/3/index/~", "does not end in a 20-digit offset"),
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
    assert keys.compacted_object(blob_id) == f"llog/orders/partitions/3/data/compacted/{blob_id}"
    assert re.fullmatch(f"llog/orders/partitions/3/data/compacted/{UUID_RE}", keys.compacted_object())
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


# --- topic-wide scans ----------------------------------------------------------------------------


def test_partitions_root_and_scan_key():
    assert partitions_root("llog", "orders") == "llog/orders/partitions/"
    assert partition_scan_key("llog", "orders", "3") == "llog/orders/partitions/3//"


@pytest.mark.parametrize(
    "key,segment",
    [
        ("llog/orders/partitions/3/meta/control", "3"),
        ("llog/orders/partitions/17/index/00000000000000000001", "17"),
        ("llog/orders/partitions/3/", "3"),
        ("llog/orders/partitions/3", None),  # no '/' after the segment
        ("llog/orders/partitions/", None),
        ("llog/orders2/partitions/3/meta/control", None),
        ("llog/order/partitions/3/meta/control", None),
        ("other/orders/partitions/3/meta/control", None),
        ("llog/wal-shared/abc", None),
    ],
)
def test_parse_partition_segment(key, segment):
    assert parse_partition_segment("llog", "orders", key) == segment


def test_parse_partition_segment_of_every_key(keys):
    for key in (keys.control, keys.compaction_cursor, keys.index(5), keys.compacted_object("x"), keys.consumer_group("g")):
        assert parse_partition_segment("llog", "orders", key) == "3"
