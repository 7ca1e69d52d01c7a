"""Write and read through real Oxia and the S3 server: shared blobs, random reads, scans, Arrow
batches, one GET per blob."""

from __future__ import annotations

import random

import pyarrow as pa

from llog.codec import decode_batch, unpack_shared
from llog.keys import shared_wal_prefix
from llog.reader import RECORD_SCHEMA, ReadRequest
from llog.writer import AppendGroup
from tests.helpers.invariants import check_partition


def values(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() * (1 + i % 3) for i in range(n)]


def test_one_blob_holds_every_partition_of_a_shared_append(config, writer, reader):
    groups = [AppendGroup("orders", p, values(f"p{p}", 5 + p)) for p in range(3)]
    results = writer.append_shared(groups)

    assert [(r.partition, r.start_offset, r.end_offset) for r in results] == [(0, 1, 5), (1, 1, 6), (2, 1, 7)]
    assert len({r.wal_uri for r in results}) == 1
    blobs = list(writer.objects.list(shared_wal_prefix(config.root_prefix)))
    assert [f"s3://{config.s3_bucket}/{b.key}" for b in blobs] == [results[0].wal_uri]

    blob = writer.objects.get(results[0].wal_uri)
    _, slices = unpack_shared(blob)
    assert [(s.topic, s.partition, s.msg_count) for s in slices] == [("orders", 0, 5), ("orders", 1, 6), ("orders", 2, 7)]
    for s, group in zip(slices, groups):
        body = memoryview(blob)[s.body_offset:s.body_offset + s.body_length]
        assert decode_batch(body, s.msg_count).to_pylist() == group.records

    for p, group in enumerate(groups):
        assert [r.value for r in reader.read_range("orders", p, 1)] == group.records
        snapshot = check_partition(writer.coordination, config.root_prefix, "orders", p)
        assert snapshot.high_watermark == len(group.records) and snapshot.pending is None


def test_groups_of_one_partition_get_consecutive_offsets_in_one_entry(writer, reader):
    results = writer.append_shared([AppendGroup("t", 0, [b"a", b"b"]), AppendGroup("t", 1, [b"x"]),
                                    AppendGroup("t", 0, [b"c"])])
    assert [(r.partition, r.start_offset, r.end_offset) for r in results] == [(0, 1, 2), (1, 1, 1), (0, 3, 3)]
    assert results[0].index_key == results[2].index_key
    assert [r.value for r in reader.read_range("t", 0, 1)] == [b"a", b"b", b"c"]


def test_random_reads_and_scans_across_many_entries(config, writer, reader):
    expected = []
    for batch in range(12):
        records = values(f"b{batch}", random.randint(1, 40))
        writer.append("events", 0, records)
        expected += records
    rng = random.Random(7)
    for offset in rng.sample(range(1, len(expected) + 1), 40):
        assert reader.read_offset("events", 0, offset).value == expected[offset - 1]
    for _ in range(20):
        a = rng.randint(1, len(expected))
        b = rng.randint(a, len(expected))
        got = reader.read_range("events", 0, a, b)
        assert [r.offset for r in got] == list(range(a, b + 1))
        assert [r.value for r in got] == expected[a - 1:b]
    streamed = list(reader.iter_from("events", 0, 3, window=17))
    assert [r.value for r in streamed] == expected[2:]
    assert reader.high_watermark("events", 0) == len(expected)
    check_partition(writer.coordination, config.root_prefix, "events", 0)


def test_arrow_read_fetches_each_blob_once_for_all_partitions(writer, reader):
    for batch in range(3):
        writer.append_shared([AppendGroup("shared", p, values(f"{batch}.{p}", 100)) for p in range(4)])
    before = reader.objects.stats.copy()
    results = reader.read_batches([ReadRequest("shared", p, 1) for p in range(4)])
    fetched = reader.objects.stats - before
    assert fetched["range_get"] + fetched["get"] == 3  # three blobs, not twelve slices

    for p, result in enumerate(results):
        table = result.table()
        assert table.schema == RECORD_SCHEMA
        assert table.column("offset").to_pylist() == list(range(1, 301))
        assert table.column("value").to_pylist() == [v for b in range(3) for v in values(f"{b}.{p}", 100)]
        assert result.high_watermark == 300


def test_arrow_input_is_written_without_conversion(writer, reader):
    array = pa.array([b"x" * i for i in range(50)], type=pa.binary()).slice(10, 30)
    result = writer.append("arrow", 0, array)
    assert (result.start_offset, result.end_offset) == (1, 30)
    assert [r.value for r in reader.read_range("arrow", 0, 1)] == array.to_pylist()
