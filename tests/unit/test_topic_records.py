"""The topic record and topic settings (docs/protocol.md section 10.1): JSON in and out, checks."""

from __future__ import annotations

import json

import pytest

from llog.config import Config
from llog.errors import CorruptRecord, InvalidTopicConfig, OffsetOutOfRange
from llog.keys import PartitionKeys, TopicPartition, topic_key, topic_keys_range
from llog.records import ControlRecord, TopicRecord
from llog.topics import TopicSettings, parse_config, parse_config_pairs


def test_topic_record_round_trips_and_keeps_unknown_fields():
    raw = json.dumps({"topic": "orders", "topic_id": "id-1", "state": "ACTIVE", "partitions": 3,
                      "config": {"retention.ms": 1000}, "created_at_ms": 5, "updated_at_ms": 6, "owner": "x"})
    record = TopicRecord.from_json(raw)
    assert (record.topic, record.partitions, record.config, record.extra) == ("orders", 3, {"retention.ms": 1000},
                                                                            {"owner": "x"})
    assert json.loads(record.to_json()) == json.loads(raw)


def test_auto_created_is_written_only_when_true_and_absent_reads_as_explicit():
    # docs/protocol.md section 10.1: a record without the field (one written before it existed) is explicit.
    raw = {"topic": "t", "topic_id": "i", "state": "ACTIVE", "partitions": 1, "config": {}, "created_at_ms": 1,
           "updated_at_ms": 1}
    assert TopicRecord.from_json(json.dumps(raw)).auto_created is False
    auto = TopicRecord.from_json(json.dumps({**raw, "auto_created": True}))
    assert auto.auto_created and json.loads(auto.to_json()) == {**raw, "auto_created": True}
    assert json.loads(auto.with_changes(auto_created=False).to_json()) == raw


@pytest.mark.parametrize("change,problem", [
    ({"auto_created": "yes"}, "field 'auto_created' must be bool"),
    ({"partitions": 0}, "partitions must be >= 1"),
    ({"state": "GONE"}, "unknown topic state"),
    ({"partitions": "3"}, "field 'partitions' must be int"),
])
def test_bad_topic_records_are_refused(change, problem):
    good = {"topic": "t", "topic_id": "i", "state": "ACTIVE", "partitions": 1, "config": {}, "created_at_ms": 1}
    with pytest.raises(CorruptRecord, match=problem):
        TopicRecord.from_json(json.dumps({**good, **change}))


def test_control_record_log_start_and_topic_id():
    control = ControlRecord(sequence_counter=11)
    assert control.log_start_offset == 1 and control.topic_id is None
    moved = control.with_extra(log_start_offset=8, topic_id="abc")
    again = ControlRecord.from_json(moved.to_json())
    assert (again.log_start_offset, again.topic_id, again.high_watermark) == (8, "abc", 10)
    with pytest.raises(CorruptRecord, match="log_start_offset"):
        ControlRecord(sequence_counter=3).with_extra(log_start_offset=5).log_start_offset


def test_a_tombstone_control_record_round_trips():
    # docs/protocol.md section 12: a deleted incarnation's meta/control stays, as a tombstone.
    tombstone = ControlRecord(sequence_counter=11).with_changes(log_state="DELETED").with_extra(
        topic_id="abc", deleted_at_ms=5)
    again = ControlRecord.from_json(tombstone.to_json())
    assert (again.deleted, again.fenced, again.topic_id, again.high_watermark) == (True, False, "abc", 10)
    assert again.extra["deleted_at_ms"] == 5
    assert not ControlRecord(sequence_counter=11).deleted
    assert not ControlRecord(sequence_counter=11).with_changes(log_state="FENCED").deleted


def test_config_is_checked_and_typed():
    assert parse_config_pairs(["retention.ms=3600000", "retention.bytes=-1", "cleanup.policy=delete",
                               "compression.type=zstd"]) == {
        "retention.ms": 3600000, "retention.bytes": -1, "cleanup.policy": "delete", "compression.type": "zstd"}
    for bad, problem in (({"retention.ms": "soon"}, "retention.ms='soon' must be an integer >= -1"),
                         ({"retention.bytes": -5}, "must be an integer >= -1"),
                         ({"cleanup.policy": "compact"}, "only 'delete'"),
                         ({"compression.type": "gzip"}, "must be one of none, lz4, zstd"),
                         ({"segment.ms": 1}, "unknown topic setting 'segment.ms'")):
        with pytest.raises(InvalidTopicConfig, match=problem):
            parse_config(bad)
    with pytest.raises(InvalidTopicConfig, match="name=value"):
        parse_config_pairs(["retention.ms"])


def test_settings_fall_back_to_the_defaults():
    config = Config(retention_ms=5000, compression_type="lz4")
    record = TopicRecord("t", "i", 1, {"retention.bytes": 10})
    assert TopicSettings.of("t", record, config).as_kafka() == {
        "cleanup.policy": "delete", "compression.type": "lz4", "retention.bytes": 10, "retention.ms": 5000}
    assert TopicSettings.of("t", None, Config()).retention_ms == 7 * 24 * 3600 * 1000


def test_topic_keys_and_what_a_delete_removes_of_a_partition():
    assert topic_key("llog", "orders") == "llog/topics/orders"
    assert topic_keys_range("llog") == ("llog/topics/", "llog/topics/~")
    assert PartitionKeys("llog", TopicPartition("orders", 2), "id-1").all_but_control == (
        ("llog/orders/id-1/partitions/2//", "llog/orders/id-1/partitions/2/meta/control"),
        ("llog/orders/id-1/partitions/2/meta/control\x00", "llog/orders/id-1/partitions/2/~/"))


def test_out_of_range_names_the_readable_offsets():
    below = OffsetOutOfRange("t", 0, 3, 20, 8)
    assert below.below_start and "offsets 1..7 were removed by retention; readable offsets are 8..20" in str(below)
    emptied = OffsetOutOfRange("t", 0, 3, 20, 21)
    assert "holds no records (the next offset written is 21)" in str(emptied)
    past = OffsetOutOfRange("t", 0, 30, 20, 8)
    assert not past.below_start and "readable offsets are 8..20" in str(past)
