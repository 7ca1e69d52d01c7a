"""records-v2 (docs/protocol.md section 11) on real Oxia and the S3 server: keys, headers, event times and
tombstones written by the writer and read back by every read path; which encoding and which
compression each append and each compaction uses; compaction of runs that mix both encodings."""

from __future__ import annotations

import json
from uuid import uuid4

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llog.codec import body_compression, decode_body
from llog.compactor import Compactor
from llog.errors import CorruptBatch, InvalidPayload
from llog.keys import shared_wal_prefix
from llog.objects import parse_s3_uri
from llog.reader import RECORD_SCHEMA, FetchRequest, ReadRequest, Record
from llog.records import BYTES_BATCH_V1, COMPACTED, RECORDS_V2, WAL
from llog.writer import AppendGroup, LogWriter
from tests.helpers.clocks import past_the_lag
from tests.helpers.invariants import check_monotonic, check_partition

VALUES = [b"v1", None, b"", b"v4", None]
KEYS = [b"k1", "k2", None, b"", "k5"]
HEADERS = [[("a", b"1"), ("a", None), ("b", b"")], [], None, [("\u00e9t\u00e9", b"\x00\xff")], None]
TIMESTAMPS = [1_700_000_000_000, None, 0, 2 ** 53, 5]


# --- helpers -----------------------------------------------------------------------------------


def expected_fields(values, keys=None, headers=None, timestamps=None) -> list[tuple]:
    """``(key, value, headers, timestamp)`` per record as reads return them (:class:`Record`)."""
    n = len(values)
    keys = keys if keys is not None else [None] * n
    headers = headers if headers is not None else [None] * n
    timestamps = timestamps if timestamps is not None else [None] * n
    return [(k.encode() if isinstance(k, str) else k, v,
             None if h is None else [(hk.decode() if isinstance(hk, bytes) else hk, hv) for hk, hv in h], t)
            for v, k, h, t in zip(values, keys, headers, timestamps)]


def fields(records: list[Record]) -> list[tuple]:
    return [(r.key, r.value, r.headers, r.timestamp) for r in records]


def batch_fields(batches: list[pa.RecordBatch]) -> list[tuple]:
    """``(offset, key, value, headers, timestamp)`` rows of reader batches (headers as pairs)."""
    table = pa.Table.from_batches(batches, schema=RECORD_SCHEMA)
    return [(row["offset"], row["key"], row["value"],
             None if row["headers"] is None else [(h["key"], h["value"]) for h in row["headers"]], row["timestamp"])
            for row in table.to_pylist()]


def entries(writer, config, topic: str, partition: int):
    return check_partition(writer.coordination, config.root_prefix, topic, partition).entries


def stored_body(objects, entry) -> bytes:
    """An index entry's body as stored: its slice of a shared WAL blob, or a whole compacted object."""
    if entry.byte_offset is None:
        return objects.get(entry.data_key)
    return objects.get(entry.data_key, entry.byte_offset, entry.byte_length)


def read_every_way(reader, topic: str, partition: int, expected: list[tuple]) -> list[Record]:
    """Read the partition's records through every read path, assert each gives ``expected``
    (``(key, value, headers, timestamp)`` of offsets 1..), and return them as :class:`Record`."""
    n = len(expected)
    numbered = [(offset, *row) for offset, row in enumerate(expected, 1)]
    records = reader.read_range(topic, partition, 1)
    assert [r.offset for r in records] == list(range(1, n + 1))
    assert fields(records) == expected

    [result] = reader.read_batches([ReadRequest(topic, partition, 1)])
    assert result.high_watermark == n and result.table().schema == RECORD_SCHEMA
    assert batch_fields(result.batches) == numbered
    assert result.table().column("created_at_ms").to_pylist() == [r.created_at_ms for r in records]

    [fetched] = reader.fetch([FetchRequest(topic, partition, 1, 1 << 20)])
    assert batch_fields(fetched.batches) == numbered
    for start in sorted({min(2, n), n}):  # from inside an entry, with a budget that takes one record or a few
        [part] = reader.fetch([FetchRequest(topic, partition, start, 1)])
        got = batch_fields(part.batches)
        assert got and got == numbered[start - 1:start - 1 + len(got)]

    streamed = list(reader.stream_batches(ReadRequest(topic, partition, 1), chunk_bytes=1, lookahead=1))
    assert batch_fields(streamed) == numbered

    assert list(reader.iter_from(topic, partition, 1, window=2)) == records

    for offset in range(1, n + 1):
        one = reader.read_offset(topic, partition, offset)
        assert one == records[offset - 1], offset
    return records


# --- writing and reading --------------------------------------------------------------------------


def test_keys_headers_timestamps_and_tombstones_read_back_every_way(config, writer, reader):
    result = writer.append("kv", 0, VALUES, KEYS, HEADERS, TIMESTAMPS)
    assert (result.start_offset, result.end_offset) == (1, 5)
    writer.append("kv", 0, [b"plain-1", b"plain-2"])
    expected = expected_fields(VALUES, KEYS, HEADERS, TIMESTAMPS) + expected_fields([b"plain-1", b"plain-2"])
    records = read_every_way(reader, "kv", 0, expected)

    located = entries(writer, config, "kv", 0)
    assert [e.entry.encoding for e in located] == [RECORDS_V2, BYTES_BATCH_V1]
    assert [e.entry.type for e in located] == [WAL, WAL]
    assert [r.created_at_ms for r in records] == [located[0].entry.created_at_ms] * 5 + [
        located[1].entry.created_at_ms] * 2
    body = stored_body(writer.objects, located[0].entry)
    assert body[:4] == b"LLR2" and body_compression(body) == "none"
    assert stored_body(writer.objects, located[1].entry)[:4] == b"LLB1"


def test_read_batches_returns_key_and_headers_columns_of_both_encodings(writer, reader):
    writer.append("cols", 0, [b"x", b"y"], keys=[b"a", None], headers=[[("h", b"1")], None], timestamps=[10, None])
    writer.append("cols", 0, [b"z"])
    table = reader.read_batches([ReadRequest("cols", 0, 1)])[0].table()
    assert table.column("key").to_pylist() == [b"a", None, None]
    assert table.column("headers").to_pylist() == [[{"key": "h", "value": b"1"}], None, None]
    assert table.column("timestamp").to_pylist() == [10, None, None]
    assert table.column("value").to_pylist() == [b"x", b"y", b"z"]
    fetched = reader.fetch([FetchRequest("cols", 0, 1, 1 << 20)])[0]
    fetched_table = pa.Table.from_batches(fetched.batches, schema=RECORD_SCHEMA)
    assert fetched_table.column("key").to_pylist() == table.column("key").to_pylist()
    assert fetched_table.column("headers").to_pylist() == table.column("headers").to_pylist()


def test_a_shared_append_mixes_encodings_per_partition(config, writer, reader):
    results = writer.append_shared([
        AppendGroup("mixed", 0, [b"plain"]),
        AppendGroup("mixed", 1, [b"one", b"two"]),
        AppendGroup("mixed", 0, [b"keyed"], keys=["k"]),
        AppendGroup("mixed", 2, [None]),
    ])
    assert [(r.partition, r.start_offset, r.end_offset) for r in results] == [(0, 1, 1), (1, 1, 2), (0, 2, 2), (2, 1, 1)]
    assert len({r.wal_uri for r in results}) == 1
    assert [e.entry.encoding for e in entries(writer, config, "mixed", 0)] == [RECORDS_V2]  # one body per partition
    assert [e.entry.encoding for e in entries(writer, config, "mixed", 1)] == [BYTES_BATCH_V1]
    assert [e.entry.encoding for e in entries(writer, config, "mixed", 2)] == [RECORDS_V2]
    read_every_way(reader, "mixed", 0, [(None, b"plain", None, None), (b"k", b"keyed", None, None)])
    read_every_way(reader, "mixed", 1, expected_fields([b"one", b"two"]))
    read_every_way(reader, "mixed", 2, [(None, None, None, None)])


def test_all_null_keys_headers_and_timestamps_stay_bytes_batch_v1(config, writer, reader):
    writer.append("nulls", 0, [b"a", b"b"], keys=[None, None], headers=[None, None], timestamps=[None, None])
    assert [e.entry.encoding for e in entries(writer, config, "nulls", 0)] == [BYTES_BATCH_V1]
    read_every_way(reader, "nulls", 0, expected_fields([b"a", b"b"]))


def test_a_record_over_the_size_limit_is_refused_before_any_io(config):
    limited = config.replace(max_record_bytes=10)
    with LogWriter(limited, auto_initialize=True) as small:
        with pytest.raises(InvalidPayload, match="record 1 is 11 bytes .key, value and headers., over the 10-byte"):
            small.append("big", 0, [b"ok", b"123456"], keys=[None, b"123"], headers=[None, [("h", b"2")]])
        assert list(small.objects.list(shared_wal_prefix(config.root_prefix))) == []
        small.append("big", 0, [b"12345"], keys=[b"123"], headers=[[("h", b"")]])  # 9 bytes: fine


def test_a_damaged_records_v2_body_is_an_error_naming_the_entry(config, writer, reader):
    result = writer.append("bad", 0, VALUES, KEYS, HEADERS, TIMESTAMPS)
    [located] = entries(writer, config, "bad", 0)
    blob = bytearray(writer.objects.get(result.wal_uri))
    blob[located.entry.byte_offset + located.entry.byte_length - 1] ^= 0x01
    _, key = parse_s3_uri(result.wal_uri)
    writer.objects.put(key, bytes(blob))  # the same object, one bit of the body flipped
    with pytest.raises(CorruptBatch, match=f"{result.wal_uri} .offsets 1..5.: CRC mismatch"):
        reader.read_range("bad", 0, 1)
    with pytest.raises(CorruptBatch, match="CRC mismatch"):
        reader.read_offset("bad", 0, 3)
    [outcome] = reader.fetch([FetchRequest("bad", 0, 1, 1 << 20)])
    assert isinstance(outcome, CorruptBatch)


# --- compression ---------------------------------------------------------------------------------


def test_a_zstd_writer_writes_value_only_records_as_records_v2(config, writer, reader):
    values = [json.dumps({"seq": i, "ts": "2026-11-25 12:00:00.123"}).encode() for i in range(300)]
    with LogWriter(config, auto_initialize=True, compression="zstd") as zstd_writer:
        zstd_writer.append("zs", 0, values)
    writer.append("zs", 0, [b"after"])  # the fixture's writer: the topic's compression (none)
    located = entries(writer, config, "zs", 0)
    assert [e.entry.encoding for e in located] == [RECORDS_V2, BYTES_BATCH_V1]
    body = stored_body(writer.objects, located[0].entry)
    assert body_compression(body) == "zstd"
    assert len(body) < 0.4 * sum(len(v) for v in values)
    assert decode_body(RECORDS_V2, body, 300).column("value").to_pylist() == values
    read_every_way(reader, "zs", 0, expected_fields(values + [b"after"]))


def test_a_topics_compression_type_makes_its_appends_records_v2(config, reader):
    configured = config.replace(topic_config='{"z": {"compression.type": "lz4"}}')
    assert configured.compression("z") == "lz4" and configured.compression("y") == "none"
    with LogWriter(configured, auto_initialize=True) as lz4_writer:
        lz4_writer.append_shared([AppendGroup("z", 0, [b"z1", b"z2"]), AppendGroup("y", 0, [b"y1"])])
        lz4_writer.append("z", 0, [b"z3"], keys=[b"k"])
        z_entries = entries(lz4_writer, configured, "z", 0)
        y_entries = entries(lz4_writer, configured, "y", 0)
        assert [e.entry.encoding for e in z_entries] == [RECORDS_V2, RECORDS_V2]
        assert [body_compression(stored_body(lz4_writer.objects, e.entry)) for e in z_entries] == ["lz4", "lz4"]
        assert [e.entry.encoding for e in y_entries] == [BYTES_BATCH_V1]
    with LogWriter(configured, auto_initialize=True, compression="none") as plain_writer:  # the writer's override wins
        plain_writer.append("z", 0, [b"z4"])
        assert entries(plain_writer, configured, "z", 0)[-1].entry.encoding == BYTES_BATCH_V1
    # a reader needs no topic config to read either
    read_every_way(reader, "z", 0, expected_fields([b"z1", b"z2"]) + [(b"k", b"z3", None, None), (None, b"z4", None, None)])
    read_every_way(reader, "y", 0, expected_fields([b"y1"]))


# --- compaction ----------------------------------------------------------------------------------


def _append_mixed_run(config, writer, topic: str, partition: int) -> list[tuple]:
    """Appends alternating value-only (bytes-batch-v1), full records (records-v2) and zstd and
    lz4 records-v2; the expected ``(key, value, headers, timestamp)`` of every offset."""
    expected = []
    with LogWriter(config, writer.coordination, writer.objects, auto_initialize=True, compression="zstd") as zstd, \
            LogWriter(config, writer.coordination, writer.objects, auto_initialize=True, compression="lz4") as lz4:
        writer.append(topic, partition, [b"v1-a", b"v1-b"])
        expected += expected_fields([b"v1-a", b"v1-b"])
        writer.append(topic, partition, VALUES, KEYS, HEADERS, TIMESTAMPS)
        expected += expected_fields(VALUES, KEYS, HEADERS, TIMESTAMPS)
        zstd.append(topic, partition, [b"z" * 100, None], keys=["zk", None], timestamps=[None, 77])
        expected += expected_fields([b"z" * 100, None], ["zk", None], None, [None, 77])
        writer.append(topic, partition, [b"v1-c"])
        expected += expected_fields([b"v1-c"])
        lz4.append(topic, partition, [b"l" * 50], headers=[[("lz", b"4")]])
        expected += expected_fields([b"l" * 50], None, [[("lz", b"4")]])
        writer.append(topic, partition, [None])
        expected += expected_fields([None])
    return expected


def test_compacting_a_mixed_run_keeps_every_field_and_the_strongest_compression(config, writer, reader):
    expected = _append_mixed_run(config, writer, "mix", 0)
    before_snapshot = check_partition(writer.coordination, config.root_prefix, "mix", 0)
    assert [e.entry.encoding for e in before_snapshot.entries] == [
        BYTES_BATCH_V1, RECORDS_V2, RECORDS_V2, BYTES_BATCH_V1, RECORDS_V2, RECORDS_V2]
    before = read_every_way(reader, "mix", 0, expected)

    with Compactor(config, clock=past_the_lag()) as compactor:
        done = compactor.compact_partition("mix", 0)
    assert done.compactions == 1 and done.records == len(expected) and done.source_entries == 6

    after_snapshot = check_partition(writer.coordination, config.root_prefix, "mix", 0)
    check_monotonic(before_snapshot, after_snapshot)
    [compacted] = after_snapshot.entries
    assert compacted.entry.type == COMPACTED and compacted.entry.encoding == RECORDS_V2
    assert (compacted.start_offset, compacted.end_offset) == (1, len(expected))
    body = stored_body(writer.objects, compacted.entry)
    assert body[:4] == b"LLR2" and body_compression(body) == "zstd"
    decoded = decode_body(RECORDS_V2, body, len(expected))
    assert [(k, v, None if h is None else [(x["key"], x["value"]) for x in h], t)
            for k, v, h, t in zip(*(decoded.column(i).to_pylist() for i in range(4)))] == expected

    after = read_every_way(reader, "mix", 0, expected)
    assert [(r.offset, r.key, r.value, r.headers, r.timestamp) for r in after] == [
        (r.offset, r.key, r.value, r.headers, r.timestamp) for r in before]
    newest = max(e.entry.created_at_ms for e in before_snapshot.entries)
    assert {r.created_at_ms for r in after} == {newest} == {compacted.entry.created_at_ms}

    writer.append("mix", 0, [b"later"], keys=[b"later-key"])  # appends go on after the compacted entry
    read_every_way(reader, "mix", 0, expected + [(b"later-key", b"later", None, None)])


def test_a_run_of_value_only_appends_still_compacts_to_bytes_batch_v1(config, writer, reader):
    values = []
    for a in range(4):
        batch = [f"{a}/{i}".encode() * (1 + i % 3) for i in range(10)]
        writer.append("plain", 0, batch)
        values += batch
    with Compactor(config, clock=past_the_lag()) as compactor:
        assert compactor.compact_partition("plain", 0).records == 40
    [compacted] = entries(writer, config, "plain", 0)
    assert compacted.entry.type == COMPACTED and compacted.entry.encoding == BYTES_BATCH_V1
    body = stored_body(writer.objects, compacted.entry)
    assert body[:4] == b"LLB1"
    assert decode_body(BYTES_BATCH_V1, body, 40).to_pylist() == values
    read_every_way(reader, "plain", 0, expected_fields(values))  # read_offset: the partial read path


def test_a_compressed_topic_compacts_with_its_own_compression(config, writer, reader):
    """Section 4: the topic's compression if it is not none, over the run's strongest."""
    expected = _append_mixed_run(config, writer, "ctopic", 0)  # holds a zstd body
    for i in range(3):
        writer.append("ctopic", 1, [f"p{i}".encode()])  # value-only bodies only
    configured = config.replace(topic_config=json.dumps({"ctopic": {"compression.type": "lz4"}}))
    with Compactor(configured, clock=past_the_lag()) as compactor:
        assert compactor.compact_partition("ctopic", 0).compactions == 1
        assert compactor.compact_partition("ctopic", 1).compactions == 1
    for p in (0, 1):
        [compacted] = entries(writer, config, "ctopic", p)
        assert compacted.entry.type == COMPACTED and compacted.entry.encoding == RECORDS_V2
        assert body_compression(stored_body(writer.objects, compacted.entry)) == "lz4"
    read_every_way(reader, "ctopic", 0, expected)
    read_every_way(reader, "ctopic", 1, expected_fields([b"p0", b"p1", b"p2"]))


# --- random appends through the real stack --------------------------------------------------------


@st.composite
def group_records(draw):
    n = draw(st.integers(min_value=1, max_value=8))
    values = draw(st.lists(st.one_of(st.none(), st.binary(max_size=30)), min_size=n, max_size=n))
    keys = draw(st.one_of(st.none(), st.lists(st.one_of(st.none(), st.binary(max_size=8), st.text(max_size=4)),
                                              min_size=n, max_size=n)))
    header = st.tuples(st.text(max_size=6), st.one_of(st.none(), st.binary(max_size=8)))
    headers = draw(st.one_of(st.none(), st.lists(st.one_of(st.none(), st.lists(header, max_size=3)),
                                                 min_size=n, max_size=n)))
    timestamps = draw(st.one_of(st.none(), st.lists(st.one_of(st.none(), st.integers(0, 2 ** 53)),
                                                    min_size=n, max_size=n)))
    return values, keys, headers, timestamps


appends_strategy = st.lists(
    st.tuples(
        st.sampled_from([None, "none", "lz4", "zstd"]),  # the writer's compression (None: the topic's, none)
        st.lists(st.tuples(st.integers(0, 1), group_records()), min_size=1, max_size=3),
    ),
    min_size=1, max_size=4,
)

_STRENGTH = {"none": 0, "lz4": 1, "zstd": 2}


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(appends=appends_strategy)
def test_random_appends_read_back_the_same_before_and_after_compaction(config, writer, reader, appends):
    topic = f"h{uuid4().hex[:10]}"
    expected: dict[int, list[tuple]] = {}
    compressions: dict[int, list[str]] = {}  # per partition, each body's compression
    writers = {c: LogWriter(config, writer.coordination, writer.objects, auto_initialize=True, compression=c)
               for c in ("none", "lz4", "zstd")}
    writers[None] = writer
    try:
        for compression, groups in appends:
            writers[compression].append_shared([AppendGroup(topic, p, *g) for p, g in groups])
            for p, g in groups:
                expected.setdefault(p, []).extend(expected_fields(*g))
            for p in {p for p, _ in groups}:
                compressions.setdefault(p, []).append(compression or "none")
    finally:
        for c in ("none", "lz4", "zstd"):
            writers[c].close()

    for p, rows in expected.items():
        located = entries(writer, config, topic, p)
        assert len(located) == len(compressions[p])
        for e, compression in zip(located, compressions[p]):
            body = stored_body(writer.objects, e.entry)
            if e.entry.encoding == RECORDS_V2:
                assert body_compression(body) == compression
            else:
                assert compression == "none" and body[:4] == b"LLB1"
        read_every_way(reader, topic, p, rows)

    with Compactor(config, writer.coordination, writer.objects, clock=past_the_lag()) as compactor:
        for p, rows in expected.items():
            before = [e.entry.encoding for e in entries(writer, config, topic, p)]
            assert compactor.compact_partition(topic, p).records == len(rows)
            [compacted] = entries(writer, config, topic, p)
            assert compacted.entry.type == COMPACTED
            if all(encoding == BYTES_BATCH_V1 for encoding in before):
                assert compacted.entry.encoding == BYTES_BATCH_V1
            else:
                strongest = max((c for c, enc in zip(compressions[p], before) if enc == RECORDS_V2),
                                key=_STRENGTH.__getitem__)
                assert compacted.entry.encoding == RECORDS_V2
                assert body_compression(stored_body(writer.objects, compacted.entry)) == strongest
            read_every_way(reader, topic, p, rows)
