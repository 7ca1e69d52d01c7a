"""Bad input gets a specific error and leaves nothing behind in Oxia or S3; corrupt or missing
stored data is detected, never returned."""

from __future__ import annotations

import re

import pytest

from llog.errors import (
    CorruptBatch, EmptyAppend, InconsistentReadState, InvalidOffset, InvalidPartition, InvalidPayload,
    InvalidTopicName, OffsetOutOfRange, PartitionNotInitialized, StorageError, TopicNotFound,
)
from llog.keys import parse_s3_uri, shared_wal_prefix
from llog.topics import read_topic
from llog.writer import AppendGroup, LogWriter
from tests.helpers.retention import record_only


def nothing_written(writer: LogWriter, config) -> bool:
    no_blobs = not list(writer.objects.list(shared_wal_prefix(config.root_prefix)))
    return no_blobs and writer.coordination.writes() == 0 and writer.objects.stats["put"] == 0


@pytest.mark.parametrize("groups, error, message", [
    ([], EmptyAppend, "at least one group"),
    ([AppendGroup("t", 0, [])], EmptyAppend, "at least one record"),
    ([AppendGroup("bad topic", 0, [b"x"])], InvalidTopicName, "contains ' '"),
    ([AppendGroup("a/b", 0, [b"x"])], InvalidTopicName, "contains '/'"),
    ([AppendGroup("..", 0, [b"x"])], InvalidTopicName, "reserved"),
    ([AppendGroup("x" * 250, 0, [b"x"])], InvalidTopicName, "limit is 249"),
    ([AppendGroup("t", -1, [b"x"])], InvalidPartition, "int >= 0"),
    ([AppendGroup("t", 0, [b"ok", "text"])], InvalidPayload, r"records\[1\] is str"),
    ([AppendGroup("t", 0, [b"ok", 7])], InvalidPayload, r"records\[1\] is int"),
    ([AppendGroup("t", 0, [b"a", b"b"], keys=[b"k", 3])], InvalidPayload, r"keys\[1\] is int, not bytes or str"),
    ([AppendGroup("t", 0, [b"a", b"b"], keys=[b"k"])], InvalidPayload, "keys holds 1 entries for 2 records"),
    ([AppendGroup("t", 0, [b"a", b"b"], headers=[None, [(b"\xff", b"v")]])], InvalidPayload,
     r"headers\[1\] has a header key that is not UTF-8"),
    ([AppendGroup("t", 0, [b"a", b"b"], headers=[None, [(None, b"v")]])], InvalidPayload,
     r"headers\[1\] has a header key of type NoneType, not str"),
    ([AppendGroup("t", 0, [b"a"], headers=[[("k", b"v", b"extra")]])], InvalidPayload, r"headers\[0\] holds"),
    ([AppendGroup("t", 0, [b"a", b"b"], timestamps=[1, "now"])], InvalidPayload, r"timestamps\[1\] is 'now'"),
    ([AppendGroup("t", 0, [b"a", b"b"], timestamps=[1, -2])], InvalidPayload, r"timestamps\[1\] is -2 ms"),
    ([AppendGroup("t", 0, [b"a", b"x" * ((1 << 20) + 1)])], InvalidPayload, r"record 1 is 1048577 bytes"),
    ([AppendGroup("t", 0, [b"a", b"x" * 1000], keys=[None, b"k" * ((1 << 20) - 999)])], InvalidPayload,
     r"record 1 is 1048577 bytes \(key, value and headers\), over the 1048576-byte limit"),
    ([AppendGroup("t", 0, [b"ok"]), AppendGroup("t", 1, [1])], InvalidPayload, r"groups\[1\]"),
    ([AppendGroup("t", 0, b"not a list")], InvalidPayload, "sequence of bytes"),
])
def test_bad_appends_fail_before_anything_is_written(config, writer, groups, error, message):
    with pytest.raises(error, match=message):
        writer.append_shared(groups)
    assert nothing_written(writer, config)


def test_append_to_a_topic_without_a_record_without_auto_initialize(config):
    with LogWriter(config) as writer:
        with pytest.raises(TopicNotFound, match="'t' does not exist"):
            writer.append("t", 3, [b"x"])
        with pytest.raises(TopicNotFound):
            writer.initialize_partition("t", 3)
        with pytest.raises(TopicNotFound):
            writer.keys("t", 3)
        assert read_topic(writer.coordination, config.root_prefix, "t") is None  # not created
        assert not list(writer.objects.list(shared_wal_prefix(config.root_prefix)))  # refused before the blob


def test_a_partition_whose_create_stopped_after_the_record_is_initialized_by_its_first_write(config, reader):
    record = record_only(reader.coordination, config.root_prefix, "t", 4)
    with LogWriter(config) as writer:
        keys = writer.keys("t", 3)
        assert keys.topic_id == record.topic_id
        assert writer.coordination.get(keys.control, "t:3") is None
        with pytest.raises(PartitionNotInitialized, match=r"t\[3\] is not initialized"):
            reader.read_range("t", 3, 1)  # a topic that exists, a partition that is not initialized
        assert writer.initialize_partition("t", 3) is True
        assert writer.initialize_partition("t", 3) is False  # idempotent
        assert writer.append("t", 3, [b"x"]).start_offset == 1
        assert writer.append("t", 2, [b"y"]).start_offset == 1  # initialized by the append
    assert [r.value for r in reader.read_range("t", 3, 1)] == [b"x"]
    assert [r.value for r in reader.read_range("t", 2, 1)] == [b"y"]


def test_bad_reads(writer, reader):
    writer.append("t", 0, [b"a", b"b", b"c"])
    with pytest.raises(PartitionNotInitialized):
        reader.read_offset("t", 99, 1)  # past the topic's partitions: never initialized
    with pytest.raises(OffsetOutOfRange, match=r"offset 4 of t\[0\] is out of range: readable offsets are 1..3"):
        reader.read_offset("t", 0, 4)
    with pytest.raises(OffsetOutOfRange):
        reader.read_range("t", 0, 2, 9)
    with pytest.raises(InvalidOffset, match="offsets start at 1"):
        reader.read_offset("t", 0, 0)
    with pytest.raises(InvalidOffset, match="before start"):
        reader.read_range("t", 0, 3, 2)
    with pytest.raises(InvalidTopicName):
        reader.read_range("no/slash", 0, 1)
    assert list(reader.iter_from("t", 0, 4)) == []  # nothing past the high watermark: an empty tail


def test_corrupt_blob_is_detected(config, writer, reader):
    result = writer.append_shared([AppendGroup("t", 0, [b"a" * 100] * 10), AppendGroup("t", 1, [b"b"])])[0]
    bucket, key = parse_s3_uri(result.wal_uri)
    blob = bytearray(writer.objects.get(result.wal_uri))
    blob[-5] ^= 0xFF  # a data byte of partition 1's body
    writer.objects._s3.put_object(Bucket=bucket, Key=key, Body=bytes(blob))
    assert reader.read_offset("t", 0, 3).value == b"a" * 100  # partition 0's slice is intact
    with pytest.raises(CorruptBatch, match="CRC mismatch"):
        reader.read_range("t", 1, 1)

    # Cut inside partition 0's slice: the range GET comes back short.
    writer.objects._s3.put_object(Bucket=bucket, Key=key, Body=bytes(blob[:1000]))
    uri = re.escape(result.wal_uri)
    with pytest.raises(StorageError, match=rf"^range get of {uri} returned \d+ bytes, expected \d+ "
                                           r"\(the object is 1000 bytes\)$") as raised:
        reader.read_range("t", 0, 1)
    assert raised.type is StorageError  # not a subclass: ObjectNotFound would say the blob is gone
    # Cut before partition 0's slice begins: S3 answers 416.
    writer.objects._s3.put_object(Bucket=bucket, Key=key, Body=bytes(blob[:40]))
    with pytest.raises(StorageError, match=rf"^range bytes=\d+-\d+ lies outside object {uri}$") as raised:
        reader.read_range("t", 0, 1)
    assert raised.type is StorageError


def test_missing_index_entry_is_a_gap_not_a_skip(config, writer, reader):
    for i in range(3):
        writer.append("t", 0, [f"{i}".encode()] * 5)
    keys = writer.keys("t", 0)
    writer.coordination.delete(keys.index(10), keys.partition_key)
    assert [r.value for r in reader.read_range("t", 0, 1, 5)] == [b"0"] * 5
    with pytest.raises(InconsistentReadState, match="no index entry covers offset 6"):
        reader.read_range("t", 0, 1, 15)
    with pytest.raises(InconsistentReadState):
        reader.read_offset("t", 0, 7)
