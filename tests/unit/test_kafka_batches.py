"""Kafka record batches to llog records and back (broker_lite.kafka.batches), without servers.

The other side of every round trip is kafka-python's own ``kafka.record`` (a pure-Python
implementation, independent of aiokafka's Cython codec the module uses): batches it builds
decode to the records put in, and batches the module builds read back through it, for every
codec. Then each refusal with its Kafka error code, and a fuzz: every input decodes or raises
KafkaBatchError, never anything else."""

from __future__ import annotations

import functools
import struct
import types

import cramjam
import kafka.codec
import kafka.record.default_records as kafka_records
import pyarrow as pa
import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch as KafkaPythonBatch
from kafka.record.default_records import DefaultRecordBatchBuilder as KafkaPythonBuilder

from broker_lite.kafka.batches import (
    CORRUPT_MESSAGE,
    INVALID_RECORD,
    INVALID_TIMESTAMP,
    LOG_APPEND_TIME,
    MESSAGE_TOO_LARGE,
    UNSUPPORTED_COMPRESSION_TYPE,
    UNSUPPORTED_FOR_MESSAGE_FORMAT,
    KafkaBatchError,
    decode_produced,
    encode_fetched,
)
from llog.codec import V2_SCHEMA, to_records

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
LIMIT = 1 << 20
T0 = 1_700_000_000_000


@pytest.fixture(autouse=True)
def kafka_python_codecs(monkeypatch):
    """kafka-python compresses snappy with python-snappy and lz4 with lz4, neither installed
    here: plug in cramjam's raw snappy (kafka-python keeps its own xerial framing) and cramjam's
    lz4 frames (independent blocks, as Kafka requires). gzip (the standard library) and zstd
    (zstandard) are kafka-python's own."""
    monkeypatch.setattr(kafka.codec, "snappy", types.SimpleNamespace(
        compress=lambda data: bytes(cramjam.snappy.compress_raw(bytes(data))),
        decompress=lambda data: bytes(cramjam.snappy.decompress_raw(bytes(data)))))

    def lz4_encode(data):
        compressor = cramjam.lz4.Compressor(content_checksum=False, block_linked=False)
        compressor.compress(bytes(data))
        return bytes(compressor.finish())

    monkeypatch.setattr(kafka_records, "lz4_encode", lz4_encode)
    monkeypatch.setattr(kafka_records, "lz4_decode", lambda data: bytes(cramjam.lz4.decompress(bytes(data))))
    monkeypatch.setattr(kafka.codec, "lz4", types.SimpleNamespace())


# --- helpers -----------------------------------------------------------------------------------


def kafka_batch(records, codec="none", producer=(-1, -1, -1), transactional=False, offsets=None) -> bytes:
    """A Produce request's batch built by kafka-python: ``records`` as (timestamp, key, value,
    headers) tuples."""
    builder = KafkaPythonBuilder(2, CODECS[codec], int(transactional), *producer, batch_size=1 << 30)
    for i, (timestamp, key, value, headers) in enumerate(records):
        builder.append(offsets[i] if offsets else i, timestamp, key, value, headers)
    return bytes(builder.build())


def with_fixed_crc(batch: bytes | bytearray) -> bytes:
    """Recompute the CRC-32C (bytes 17..20, over bytes 21..) so a deliberate change is what the
    decoder trips on, not the checksum."""
    batch = bytearray(batch)
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    return bytes(batch)


def patched(batch: bytes, fmt: str, at: int, value: int) -> bytes:
    batch = bytearray(batch)
    struct.pack_into(fmt, batch, at, value)
    return with_fixed_crc(batch)


def compressible(i: int) -> bytes:
    return (b"value %06d " % i) * 8


SAMPLE = [
    (T0, b"k0", compressible(0), [("trace", b"t0"), ("trace", b"t1"), ("empty", None)]),
    (T0 + 5, None, compressible(1), []),
    (T0 - 3, b"k2", None, [("only", b"")]),  # a tombstone, an earlier time than the first
    (T0 + 9, b"", b"", []),
]


def expected_rows(records):
    return [{"key": key, "value": value, "headers": [{"key": k, "value": v} for k, v in headers] or None,
             "timestamp": timestamp} for timestamp, key, value, headers in records]


def read_with_kafka_python(data: bytes) -> tuple[KafkaPythonBatch, list]:
    batch = KafkaPythonBatch(data)
    assert batch.validate_crc()
    return batch, list(batch)


def refusal(data, code: int, max_record_bytes: int = LIMIT) -> str:
    with pytest.raises(KafkaBatchError) as caught:
        decode_produced(data, max_record_bytes)
    assert caught.value.code == code, f"{caught.value} has code {caught.value.code}, expected {code}"
    return str(caught.value)


# --- Produce: kafka-python's batches -> llog records ----------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_batches_decode_to_their_records(codec):
    data = kafka_batch(SAMPLE, codec, producer=(4711, 3, 42))
    assert KafkaPythonBatch(data).compression_type == CODECS[codec]  # compression shrank it, so it was used
    produced = decode_produced(data, LIMIT)
    assert produced.records.schema.equals(V2_SCHEMA)
    assert produced.records.to_pylist() == expected_rows(SAMPLE)
    assert (produced.count, produced.producer_id, produced.producer_epoch, produced.base_sequence) == (4, 4711, 3, 42)
    assert produced.max_timestamp == T0 + 9
    assert produced.compression == codec


def test_a_batch_without_producer_is_not_idempotent_and_values_alone_stay_null_elsewhere():
    data = kafka_batch([(T0 + i, None, b"v%d" % i, []) for i in range(3)])
    produced = decode_produced(data, LIMIT)
    assert (produced.producer_id, produced.producer_epoch, produced.base_sequence) == (-1, -1, -1)
    assert produced.records.column("key").null_count == 3
    assert produced.records.column("headers").null_count == 3  # zero headers: null, Kafka has no "empty"
    assert produced.records.column("timestamp").to_pylist() == [T0, T0 + 1, T0 + 2]


def test_kafka_no_timestamp_reads_as_no_event_time():
    produced = decode_produced(kafka_batch([(-1, None, b"a", []), (T0, None, b"b", [])]), LIMIT)
    assert produced.records.column("timestamp").to_pylist() == [None, T0]
    assert produced.max_timestamp == T0


def test_a_log_append_time_batch_reads_as_no_event_time():
    data = patched(kafka_batch([(T0, None, b"a", [])]), ">h", 21, LOG_APPEND_TIME)
    produced = decode_produced(data, LIMIT)
    assert produced.records.column("timestamp").to_pylist() == [None]
    assert produced.max_timestamp == -1


def test_produced_records_go_through_the_writers_checks():
    """What the listener hands the writer (llog.writer.AppendGroup's columns) passes to_records."""
    batch = decode_produced(kafka_batch(SAMPLE), LIMIT).records
    again = to_records(batch.column("value"), batch.column("key"), batch.column("headers"), batch.column("timestamp"))
    assert again.to_pylist() == batch.to_pylist()


# --- Fetch: llog records -> batches kafka-python reads ----------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_fetched_batches_read_back_in_kafka_python(codec):
    records = to_records(
        [compressible(0), None, compressible(2), b""],
        keys=[b"k0", None, "k2", b""],
        headers=[[("h", b"1"), ("h", None)], [], None, [("x", b"")]],
        timestamps=[T0, None, T0 + 7, T0 - 2],
    )
    data = encode_fetched(records, base_offset=101, append_time_ms=T0 + 1000, compression=codec)
    batch, read = read_with_kafka_python(data)
    assert batch.compression_type == CODECS[codec]
    assert (batch.base_offset, batch.leader_epoch, batch.producer_id, batch.last_offset_delta) == (101, 0, -1, 3)
    assert not batch.is_transactional and not batch.is_control_batch
    assert batch.timestamp_type == 0  # CreateTime: some records carry an event time
    assert [r.offset for r in read] == [101, 102, 103, 104]
    assert [r.key for r in read] == [b"k0", None, b"k2", b""]
    assert [r.value for r in read] == [compressible(0), None, compressible(2), b""]
    assert [r.headers for r in read] == [[("h", b"1"), ("h", None)], [], [], [("x", b"")]]
    assert [r.timestamp for r in read] == [T0, T0 + 1000, T0 + 7, T0 - 2]  # no event time: the append time
    assert batch.max_timestamp == T0 + 1000


@pytest.mark.parametrize("codec", CODECS)
def test_values_alone_fetch_as_log_append_time(codec):
    values = pa.array([compressible(i) for i in range(50)], pa.binary())
    data = encode_fetched(values, base_offset=1, append_time_ms=T0, compression=codec)
    batch, read = read_with_kafka_python(data)
    assert batch.attributes & LOG_APPEND_TIME and batch.timestamp_type == 1
    assert batch.compression_type == CODECS[codec]
    assert batch.max_timestamp == T0
    assert [r.timestamp for r in read] == [T0] * 50
    assert [r.offset for r in read] == list(range(1, 51))
    assert [r.value for r in read] == values.to_pylist()
    assert all(r.key is None and r.headers == [] for r in read)


def test_records_without_any_timestamp_fetch_as_log_append_time():
    records = to_records([b"a", None], keys=[b"k", b"k"], headers=[[("h", b"v")], None])
    batch, read = read_with_kafka_python(encode_fetched(records, 7, T0))
    assert batch.timestamp_type == 1 and batch.max_timestamp == T0
    assert [(r.offset, r.key, r.value, r.headers, r.timestamp) for r in read] == [
        (7, b"k", b"a", [("h", b"v")], T0), (8, b"k", None, [], T0)]


def test_a_slice_of_records_fetches_its_own_records():
    """The reader hands out slices of decoded bodies: their headers' offsets point into the
    whole body's items."""
    records = to_records([b"a", b"b", b"c", b"d"], headers=[[("h0", b"0")], None, [("h2", b"2"), ("h2b", None)], []],
                         timestamps=[1, 2, 3, 4])
    _, read = read_with_kafka_python(encode_fetched(records.slice(1, 2), 10, T0))
    assert [(r.offset, r.value, r.headers, r.timestamp) for r in read] == [
        (10, b"b", [], 2), (11, b"c", [("h2", b"2"), ("h2b", None)], 3)]


def test_a_compression_that_does_not_shrink_is_not_used():
    values = pa.array([bytes(range(7))], pa.binary())  # too small for any codec to shrink
    batch, read = read_with_kafka_python(encode_fetched(values, 1, T0, "gzip"))
    assert batch.compression_type == 0 and [r.value for r in read] == [bytes(range(7))]


def test_fetch_refuses_an_unknown_codec_and_no_records():
    with pytest.raises(KafkaBatchError) as caught:
        encode_fetched(pa.array([b"a"]), 1, T0, "brotli")
    assert caught.value.code == UNSUPPORTED_COMPRESSION_TYPE
    with pytest.raises(ValueError, match="at least one record"):
        encode_fetched(pa.array([], pa.binary()), 1, T0)


headers_st = st.one_of(st.none(), st.lists(st.tuples(st.text(max_size=5), st.one_of(st.none(), st.binary(max_size=5))),
                                           max_size=3))
record_st = st.tuples(st.one_of(st.none(), st.binary(max_size=20)), st.one_of(st.none(), st.binary(max_size=20)),
                      headers_st, st.one_of(st.none(), st.integers(0, 1 << 50)))


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(record_st, min_size=1, max_size=20), codec=st.sampled_from(list(CODECS)),
       base=st.integers(1, 1 << 40))
def test_fetch_then_produce_gives_the_records_back(rows, codec, base):
    """encode_fetched then decode_produced: every field back, empty headers as null, and no
    event time anywhere stays no event time (LogAppendTime)."""
    keys, values, headers, times = map(list, zip(*rows))
    records = pa.RecordBatch.from_pylist(
        [{"key": k, "value": v, "headers": h, "timestamp": t} for k, v, h, t in rows], schema=V2_SCHEMA)
    produced = decode_produced(encode_fetched(records, base, T0, codec), LIMIT)
    any_time = any(t is not None for t in times)
    assert produced.records.column("key").to_pylist() == keys
    assert produced.records.column("value").to_pylist() == values
    assert produced.records.column("headers").to_pylist() == [
        [{"key": k, "value": v} for k, v in h] if h else None for h in headers]
    assert produced.records.column("timestamp").to_pylist() == (
        [T0 if t is None else t for t in times] if any_time else [None] * len(rows))


# --- refusals, each with Kafka's error code ------------------------------------------------


def test_a_wrong_crc_is_corrupt():
    data = bytearray(kafka_batch(SAMPLE))
    data[-1] ^= 0x01
    assert "CRC-32C mismatch" in refusal(bytes(data), CORRUPT_MESSAGE)


def test_a_magic_other_than_2_is_corrupt():
    data = bytearray(kafka_batch(SAMPLE))
    data[16] = 1
    assert "magic is 1" in refusal(bytes(data), CORRUPT_MESSAGE)


@pytest.mark.parametrize("keep", [0.5, 0.99])
def test_a_truncated_batch_is_corrupt(keep):
    data = kafka_batch(SAMPLE)
    assert "truncated" in refusal(data[:int(len(data) * keep)], CORRUPT_MESSAGE)
    assert "too short" in refusal(data[:40], CORRUPT_MESSAGE)


def test_a_batch_length_that_disagrees_with_the_bytes_is_corrupt():
    data = kafka_batch(SAMPLE)
    length = struct.unpack_from(">i", data, 8)[0]
    assert "ends the batch at byte" in refusal(data + b"\x00\x01\x02", CORRUPT_MESSAGE)
    assert "truncated" in refusal(patched(data, ">i", 8, length + 10), CORRUPT_MESSAGE)
    assert "shorter than the batch header" in refusal(patched(data, ">i", 8, 20), CORRUPT_MESSAGE)
    # Shorter than the bytes, CRC fixed over the shorter batch: the records no longer fit.
    short = bytearray(data[:-2])
    struct.pack_into(">i", short, 8, length - 2)
    assert "malformed records" in refusal(with_fixed_crc(short), CORRUPT_MESSAGE)


def test_offset_deltas_other_than_0_to_n_minus_1_are_corrupt():
    data = kafka_batch([(T0, None, b"a", []), (T0, None, b"b", []), (T0, None, b"c", [])], offsets=[0, 0, 2])
    assert "record 1 has offset delta 0, expected 1" in refusal(data, INVALID_RECORD)


def test_a_record_count_that_disagrees_is_corrupt():
    data = kafka_batch(SAMPLE)
    assert "disagrees with the last offset delta" in refusal(patched(data, ">i", 57, 5), INVALID_RECORD)
    # Count and last offset delta agree with each other but not with the records.
    more = patched(patched(data, ">i", 57, 5), ">i", 23, 4)
    assert "malformed records" in refusal(more, CORRUPT_MESSAGE)
    fewer = patched(patched(data, ">i", 57, 3), ">i", 23, 2)
    assert "malformed records" in refusal(fewer, CORRUPT_MESSAGE)
    assert "negative" in refusal(patched(data, ">i", 57, -1), INVALID_RECORD)


def test_more_than_one_batch_is_an_invalid_record():
    data = kafka_batch(SAMPLE)
    assert "more than one record batch" in refusal(data + data, INVALID_RECORD)


@pytest.mark.parametrize("data", [None, b"", memoryview(b"")])
def test_a_null_or_empty_records_field_is_an_invalid_record(data):
    assert "null or empty" in refusal(data, INVALID_RECORD)


def test_a_batch_without_records_is_an_invalid_record():
    header = kafka_batch(SAMPLE[:1])[:61]  # the header alone: length 49, count 0, last offset delta -1
    data = patched(patched(patched(header, ">i", 8, 49), ">i", 57, 0), ">i", 23, -1)
    assert "no records" in refusal(data, INVALID_RECORD)


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_a_header_key_not_utf8_is_an_invalid_record(codec):
    records = [(T0, None, b"a", [("fine", b"1")]), (T0, None, b"b", [("KEYX", b"2")])]
    raw = kafka_batch(records)
    assert raw.count(b"KEYX") == 1
    raw = with_fixed_crc(raw.replace(b"KEYX", b"\xff\xfe\xfd\xfc"))
    if codec != "none":  # the same records, compressed: the check runs after decompression
        body = kafka.codec.zstd_encode(raw[61:])
        raw = bytearray(raw[:61] + body)
        struct.pack_into(">i", raw, 8, len(raw) - 12)
        struct.pack_into(">h", raw, 21, CODECS[codec])
        raw = with_fixed_crc(raw)
    assert "record 1 has a header key that is not UTF-8" in refusal(raw, INVALID_RECORD)


def test_a_record_over_the_limit_is_too_large_named_with_its_size():
    records = [(T0, None, b"x" * 100, []), (T0, b"k" * 10, b"y" * 100, [("h", b"z" * 39)]), (T0, None, b"", [])]
    data = kafka_batch(records)
    message = refusal(data, MESSAGE_TOO_LARGE, max_record_bytes=149)
    assert "record 1 is 150 bytes" in message and "149-byte limit" in message
    assert decode_produced(data, 150).count == 3  # key, value, header key and value: 10 + 100 + 1 + 39


def test_control_and_transactional_batches_are_unsupported():
    data = kafka_batch(SAMPLE, producer=(9, 0, 0), transactional=True)
    assert "transactional" in refusal(data, UNSUPPORTED_FOR_MESSAGE_FORMAT)
    control = patched(kafka_batch(SAMPLE), ">h", 21, 0x20)
    assert "control batch" in refusal(control, UNSUPPORTED_FOR_MESSAGE_FORMAT)


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_an_unknown_codec_is_unsupported(codec):
    data = patched(kafka_batch(SAMPLE), ">h", 21, codec)
    assert f"unknown compression codec {codec}" in refusal(data, UNSUPPORTED_COMPRESSION_TYPE)


def test_a_timestamp_below_minus_1_is_invalid():
    data = kafka_batch([(T0, None, b"a", []), (-2, None, b"b", [])])
    assert "record 1 has timestamp -2" in refusal(data, INVALID_TIMESTAMP)


# --- fuzz: decode or KafkaBatchError, nothing else -----------------------------------------------

@functools.cache
def fuzz_batch(codec: str) -> bytes:
    """A valid batch to damage (built inside a test, where kafka-python has its codecs)."""
    return kafka_batch([(T0 + i, b"k%d" % i if i % 2 else None, compressible(i),
                         [("h", b"v"), ("n", None)] if i % 3 else []) for i in range(12)], codec)


def decodes_or_refuses(data: bytes) -> None:
    try:
        decode_produced(data, LIMIT)
    except KafkaBatchError as e:
        assert e.code in {CORRUPT_MESSAGE, INVALID_RECORD, MESSAGE_TOO_LARGE, INVALID_TIMESTAMP,
                          UNSUPPORTED_FOR_MESSAGE_FORMAT, UNSUPPORTED_COMPRESSION_TYPE}
        assert str(e)


@settings(max_examples=400, deadline=None)
@given(data=st.binary(max_size=300))
def test_fuzz_random_bytes(data):
    decodes_or_refuses(data)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(min_size=61, max_size=300))
def test_fuzz_random_bytes_behind_a_plausible_header(data):
    """Random bytes with magic 2, a length that fits and a right CRC: the record parser's turn."""
    data = bytearray(data)
    data[16] = 2
    struct.pack_into(">i", data, 8, len(data) - 12)
    struct.pack_into(">h", data, 21, struct.unpack_from(">h", data, 21)[0] & 0x0F)
    decodes_or_refuses(with_fixed_crc(data))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(codec=st.sampled_from(list(CODECS)), flips=st.lists(st.tuples(st.integers(0), st.integers(0, 255)),
                                                           min_size=1, max_size=4),
       cut=st.one_of(st.none(), st.integers(0)), fix_crc=st.booleans())
def test_fuzz_damaged_batches(codec, flips, cut, fix_crc):
    """A valid batch with bytes changed and maybe cut short; with ``fix_crc`` the CRC is made to
    match, so the damage reaches the header checks, the decompressor and the record parser."""
    data = bytearray(fuzz_batch(codec))
    for at, byte in flips:
        data[at % len(data)] = byte
    if cut is not None:
        data = data[:cut % len(data)]
    if fix_crc and len(data) >= 61:
        data = bytearray(with_fixed_crc(data))
    decodes_or_refuses(bytes(data))


# --- decompression bombs --------------------------------------------------------------------


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_a_batch_that_decompresses_past_the_bound_is_too_large_and_never_held(codec):
    """4 MiB of zeros compress to a few KiB: a bound of 1 MiB refuses the batch (snappy by its
    blocks' declared lengths, the others while decompressing into a buffer that size)."""
    data = kafka_batch([(T0, None, bytes(4 << 20), [])], codec)
    assert len(data) < 1 << 20
    with pytest.raises(KafkaBatchError) as caught:
        decode_produced(data, 8 << 20, max_batch_bytes=1 << 20)
    assert caught.value.code == MESSAGE_TOO_LARGE and "decompress to more than 1048576 bytes" in str(caught.value)


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_a_batch_that_compresses_very_well_within_the_bound_decodes(codec):
    """Past the first buffer's usual ratio (16x) and within the bound: decoded whole."""
    values = [bytes(100_000) for _ in range(5)]
    data = kafka_batch([(T0 + i, None, v, []) for i, v in enumerate(values)], codec)
    assert 16 * len(data) < sum(map(len, values)) < 1 << 20
    batch = decode_produced(data, 8 << 20, max_batch_bytes=1 << 20)
    assert batch.records.column("value").to_pylist() == values
