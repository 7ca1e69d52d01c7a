"""``llog topics describe`` (llog_tools/describe.py, on the partitions llog/describe.py reads) on
real Oxia and the S3 server: each partition's log start and end offsets, records, its share of
shared WAL blobs and its compacted objects' sizes, after compaction, retention and interrupted
appends; per topic its record, effective config, total bytes and the monthly storage cost at S3
Standard list prices (conf/s3_prices.json)."""

from __future__ import annotations

import json

import pytest

from llog.clock import ShiftedClock
from llog.compactor import Compactor
from llog.control import read_control
from llog.describe import describe_topic
from llog.errors import TopicNotFound
from llog.keys import shared_wal_prefix
from llog.objects import ObjectStore
from llog.records import ACTIVE, WAL
from llog.topics import TopicSettings, create_topic, read_topic
from llog_tools.describe import (
    PARTITION_COLUMNS, describe_topics, format_descriptions, format_topic_descriptions, format_topic_descriptions_json,
)
from llog_tools.pricing import PRICES_FILE_ENV, load_prices
from tests.helpers.retention import compacted_objects, current_keys, index_entries

GIB = 2**30


class Aborted(Exception):
    """Raised by a failpoint hook: the writer stops there, as if its process died."""


def _abort():
    raise Aborted()


def _append(writer, topic: str, partition: int, count: int, size: int = 100):
    return writer.append(topic, partition, [bytes([65 + i % 26]) * size for i in range(count)])


def _wal_blob_sizes(objects: ObjectStore, root: str) -> dict[str, int]:
    return {info.key: info.size for info in objects.list(shared_wal_prefix(root))}


@pytest.fixture
def objects(config):
    store = ObjectStore(config)
    yield store
    store.close()


@pytest.fixture
def log(config, writer, hooks):
    """Three topics, each in a state worth describing:

    - ``kept`` (2 partitions, created explicitly): partition 0 compacted (3 appends, 6 records)
      then appended to (2 appends, 2 records); partition 1 appended to twice, not compacted;
    - ``short`` (``retention.ms`` 1000): 2 appends (4 records) dropped by retention, then 3
      appends (3 records);
    - ``pend`` (2 partitions): partition 0's last append
      stopped after reserving (pending, no index entry), partition 1's after writing the index
      entry (pending and its entry both there).
    """
    c, root = writer.coordination, config.root_prefix
    create_topic(c, root, "kept", 2, {"retention.ms": -1})
    for _ in range(3):
        _append(writer, "kept", 0, 2)
    with Compactor(config, clock=ShiftedClock(3600)) as compactor:
        compacted = compactor.compact_partition("kept", 0)
    assert (compacted.compactions, compacted.records) == (1, 6)
    for _ in range(2):
        _append(writer, "kept", 0, 1, size=300)
    _append(writer, "kept", 1, 4)
    _append(writer, "kept", 1, 1)

    create_topic(c, root, "short", 1, {"retention.ms": 1000})
    for _ in range(2):
        _append(writer, "short", 0, 2)
    with Compactor(config, clock=ShiftedClock(3600)) as compactor:
        retained = compactor.retain_partition("short", 0)
    assert (retained.log_start_offset, retained.retention_records, retained.retention_entries) == (5, 4, 2)
    for _ in range(3):
        _append(writer, "short", 0, 1)

    create_topic(c, root, "pend", 2)
    _append(writer, "pend", 0, 2)
    hooks["writer.after_reserve"] = _abort
    with pytest.raises(Aborted):
        _append(writer, "pend", 0, 3, size=50)
    del hooks["writer.after_reserve"]
    hooks["writer.after_index_put"] = _abort
    with pytest.raises(Aborted):
        _append(writer, "pend", 1, 2, size=70)
    del hooks["writer.after_index_put"]
    return compacted


def test_partitions_show_log_start_end_records_and_bytes(config, writer, objects, log):
    c, root = writer.coordination, config.root_prefix
    kept = {p.partition: p for p in describe_topic(c, root, "kept", objects)}
    k0 = current_keys(c, root, "kept", 0)
    entries = index_entries(c, k0)
    [(compacted_uri, compacted_size)] = compacted_objects(objects, k0).items()
    assert compacted_size == log.bytes  # the object the compaction wrote, as S3 lists it
    assert [e.entry.data_key for e in entries if e.entry.type != WAL] == [compacted_uri]
    wal_lengths = [e.entry.byte_length for e in entries if e.entry.type == WAL]
    assert len(wal_lengths) == 2 and all(n > 300 for n in wal_lengths)  # one 300-byte record each, and framing
    p0 = kept[0]
    assert (p0.log_start_offset, p0.high_watermark, p0.log_end_offset, p0.records) == (1, 8, 9, 8)
    assert (p0.index_entries, p0.wal_entries, p0.compacted_entries, p0.compaction_cursor) == (3, 2, 1, 7)
    assert (p0.wal_bytes, p0.compacted_bytes) == (sum(wal_lengths), compacted_size)
    assert p0.bytes == sum(wal_lengths) + compacted_size
    assert p0.pending is None

    p1 = kept[1]
    entries1 = index_entries(c, current_keys(c, root, "kept", 1))
    assert (p1.log_start_offset, p1.log_end_offset, p1.records, p1.index_entries) == (1, 6, 5, 2)
    assert (p1.compacted_bytes, p1.wal_bytes) == (0, sum(e.entry.byte_length for e in entries1))
    # Each append here went alone into its own shared WAL blob: the partition's share is the
    # blob's body, the blob the body plus its framing.
    blobs = _wal_blob_sizes(objects, root)
    for e in entries1:
        blob = blobs[e.entry.data_key.split("/", 3)[3]]
        assert e.entry.byte_offset + e.entry.byte_length <= blob
    assert p1.bytes == p1.wal_bytes


def test_retention_moves_the_log_start_and_drops_the_bytes(config, writer, objects, log):
    c, root = writer.coordination, config.root_prefix
    [short] = describe_topic(c, root, "short", objects)
    entries = index_entries(c, current_keys(c, root, "short", 0))
    assert [e.start_offset for e in entries] == [5, 6, 7]  # the 2 dropped entries' keys are gone
    assert (short.log_start_offset, short.high_watermark, short.log_end_offset, short.records) == (5, 7, 8, 3)
    assert (short.index_entries, short.wal_bytes, short.compacted_bytes) == (
        3, sum(e.entry.byte_length for e in entries), 0)
    assert short.compaction_cursor == 5
    control = read_control(c, current_keys(c, root, "short", 0)).record
    assert control.log_start_offset == short.log_start_offset


def test_a_pending_append_counts_once(config, writer, objects, log):
    c, root = writer.coordination, config.root_prefix
    rows = {p.partition: p for p in describe_topic(c, root, "pend", objects)}
    # Partition 0: the pending append has no index entry yet; its bytes count, its offsets are
    # reserved (the high watermark covers them, a reader finishes the append).
    p0 = rows[0]
    control0 = read_control(c, current_keys(c, root, "pend", 0)).record
    [entry0] = index_entries(c, current_keys(c, root, "pend", 0))
    assert p0.pending == control0.pending and (p0.pending.start_offset, p0.pending.end_offset) == (3, 5)
    assert (p0.high_watermark, p0.records, p0.index_entries) == (5, 5, 1)
    assert p0.wal_bytes == entry0.entry.byte_length + control0.pending.byte_length
    # Partition 1: the pending append's entry is in the index already: counted once.
    p1 = rows[1]
    [entry1] = index_entries(c, current_keys(c, root, "pend", 1))
    assert p1.pending is not None and entry1.end_offset == p1.pending.end_offset == 2
    assert p1.wal_bytes == entry1.entry.byte_length == p1.pending.byte_length
    assert (p1.records, p1.index_entries) == (2, 1)


def test_topics_show_record_config_bytes_and_cost(config, writer, objects, log):
    c, root = writer.coordination, config.root_prefix
    described = describe_topics(c, objects, root, config=config)
    assert [d.topic for d in described] == ["kept", "pend", "short"]
    by_name = {d.topic: d for d in described}
    prices = load_prices()

    kept = by_name["kept"]
    record = read_topic(c, root, "kept").record
    assert (kept.topic_id, kept.state, kept.partition_count) == (record.topic_id, ACTIVE, 2)
    assert kept.config == TopicSettings.of("kept", record, config).as_kafka()
    assert kept.config["retention.ms"] == -1 and kept.config["retention.bytes"] == config.retention_bytes
    assert [p.partition for p in kept.partitions] == [0, 1] and kept.uninitialized_partitions == []
    assert kept.bytes == sum(p.wal_bytes + p.compacted_bytes for p in kept.partitions)
    assert kept.records == 8 + 5
    region = config.s3_region_name
    rate = prices.regions[prices.prices_for(region).region].storage_tiers[0].usd_per_gb_month
    assert kept.monthly_cost_usd == pytest.approx(kept.bytes / GIB * rate)  # far below 50 TB: the first tier
    assert kept.cost_region == prices.prices_for(region).region
    assert kept.cost_basis.startswith(f"S3 Standard list prices of {kept.cost_region} as of {prices.as_of}")

    assert by_name["short"].config["retention.ms"] == 1000

    # One topic by name; the cost at another region's prices, and at an unknown region's.
    [frankfurt] = describe_topics(c, objects, root, ["kept"], config.replace(s3_region_name="eu-central-1"))
    assert frankfurt.bytes == kept.bytes
    assert frankfurt.monthly_cost_usd == pytest.approx(kept.bytes / GIB * 0.0245)
    [moon] = describe_topics(c, objects, root, ["kept"], config.replace(s3_region_name="moon-south-1"))
    assert (moon.cost_region, moon.monthly_cost_usd) == ("us-east-1", pytest.approx(kept.bytes / GIB * 0.023))
    assert "no prices for region 'moon-south-1'" in moon.cost_basis


def test_a_topic_without_a_record_is_not_found(config, writer, objects, log):
    with pytest.raises(TopicNotFound, match="'nothing' does not exist"):
        describe_topics(writer.coordination, objects, config.root_prefix, ["kept", "nothing"], config)


def test_a_record_whose_partitions_are_not_initialized_says_so(config, writer, objects):
    c, root = writer.coordination, config.root_prefix
    create_topic(c, root, "half", 3)
    keys = current_keys(c, root, "half", 2)
    c.delete(keys.control, keys.partition_key)  # as if the create had crashed before initializing it
    [half] = describe_topics(c, objects, root, ["half"], config)
    assert [p.partition for p in half.partitions] == [0, 1] and half.uninitialized_partitions == [2]
    assert "not initialized yet: partition(s) 2" in format_topic_descriptions([half])


def test_the_cost_is_unknown_without_a_price_table_or_an_object_store(config, writer, objects, log, tmp_path,
                                                                       monkeypatch):
    c, root = writer.coordination, config.root_prefix
    monkeypatch.setenv(PRICES_FILE_ENV, str(tmp_path / "absent.json"))
    [kept] = describe_topics(c, objects, root, ["kept"], config)
    assert kept.bytes > 0 and kept.monthly_cost_usd is None and kept.cost_region is None
    assert kept.cost_basis.startswith("unknown: S3 price table") and "absent.json" in kept.cost_basis
    assert "est. monthly cost: unknown: S3 price table" in format_topic_descriptions([kept])

    [blind] = describe_topics(c, None, root, ["kept"], config)
    p0 = blind.partitions[0]
    assert (p0.bytes, p0.compacted_bytes, p0.wal_bytes) == (None, None, kept.partitions[0].wal_bytes)
    assert (blind.bytes, blind.monthly_cost_usd) == (None, None)
    assert blind.cost_basis == "unknown: no object store to list the compacted objects' sizes"


def test_text_and_json_output(config, writer, objects, log):
    c, root = writer.coordination, config.root_prefix
    described = describe_topics(c, objects, root, config=config)
    text = format_topic_descriptions(described)
    kept = described[0]
    header = next(line for line in text.splitlines() if line.startswith("topic kept "))
    assert f"id={kept.topic_id}" in header and "partitions=2" in header and "state=ACTIVE" in header
    assert "retention.ms=-1" in header and "cleanup.policy=delete" in header
    assert f"bytes={kept.bytes} (" in header and "est. monthly cost: <$0.01 (S3 Standard list prices of" in header
    assert text.count("  ".join(PARTITION_COLUMNS[:3])) == 3  # one table per topic
    p0 = kept.partitions[0]
    row = next(line for line in text.splitlines() if line.split()[:2] == ["0", "OPEN"])
    assert row.split() == ["0", "OPEN", "1", "9", "8", str(p0.wal_bytes), str(p0.compacted_bytes), "3", "7", "-"]
    total = sum(d.bytes for d in described)
    assert text.splitlines()[-1].startswith(f"3 topic(s), {sum(d.records for d in described)} record(s), bytes={total}")

    as_json = json.loads(format_topic_descriptions_json(described))
    assert [t["topic"] for t in as_json] == ["kept", "pend", "short"]
    first = as_json[0]
    assert (first["topic_id"], first["bytes"], first["records"]) == (kept.topic_id, kept.bytes, 13)
    assert first["monthly_cost_usd"] == pytest.approx(kept.monthly_cost_usd)
    first_partition = first["partitions"][0]
    assert (first_partition["log_end_offset"], first_partition["compacted_bytes"]) == (9, p0.compacted_bytes)
    pend = as_json[1]["partitions"][0]["pending"]
    assert (pend["start_offset"], pend["end_offset"]) == (3, 5)

    # ``llog describe TOPIC`` (one topic's partitions, no record) prints the same table.
    old = format_descriptions("kept", describe_topic(c, root, "kept"))
    assert old.splitlines()[0] == "topic kept: 2 partition(s)"
    assert old.splitlines()[1].split() == list(PARTITION_COLUMNS)
    assert old.splitlines()[2].split()[6] == "-"  # compacted bytes unknown without an object store
