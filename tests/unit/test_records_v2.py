"""records-v2 bodies (docs/protocol.md section 11): keys, headers, event times and compression, without
servers. Round trips through the codec for every compression, zero-copy decoding, the decoder's
rejection of every kind of damage the spec lists, and how writers' input is normalized."""

from __future__ import annotations

import json
import struct
import zlib

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llog.codec import (
    COMPRESSION_CODES,
    HEADERS_TYPE,
    V2_HEADER,
    V2_HEADER_SIZE,
    V2_MAGIC,
    V2_SCHEMA,
    as_v2,
    body_compression,
    concat_records,
    decode_body,
    decode_records_v2,
    encode_body,
    encode_records_v2,
    to_records,
)
from llog.errors import CorruptBatch, InvalidPayload
from llog.records import BYTES_BATCH_V1, RECORDS_V2

COMPRESSIONS = ["none", "lz4", "zstd"]


# --- helpers -----------------------------------------------------------------------------------


def with_fixed_crc(body: bytes | bytearray) -> bytes:
    """Recompute the CRC (bytes 8..11, over bytes 12..) so a deliberate change is what a
    decoder trips on, not the checksum."""
    body = bytearray(body)
    struct.pack_into("<I", body, 8, zlib.crc32(bytes(body[12:])))
    return bytes(body)


def sample_records() -> pa.RecordBatch:
    return to_records(
        [b"first value", None, b"third"],
        keys=["k1", None, b"k3"],
        headers=[[("h", b"v"), ("h", None)], [], None],
        timestamps=[1_700_000_000_000, None, 3],
    )


def sample_body(compression: str = "none") -> bytes:
    encoded = encode_body(sample_records(), compression)
    assert encoded.encoding == RECORDS_V2
    return encoded.to_bytes()


def expected_rows(values, keys, headers, timestamps) -> list[dict]:
    """What decoding ``to_records(values, keys, headers, timestamps)`` gives, as ``to_pylist``
    of a :data:`V2_SCHEMA` batch."""
    n = len(values)
    keys = keys if keys is not None else [None] * n
    headers = headers if headers is not None else [None] * n
    timestamps = timestamps if timestamps is not None else [None] * n
    return [
        {"key": k.encode() if isinstance(k, str) else k,
         "value": v,
         "headers": None if h is None else [{"key": hk, "value": hv} for hk, hv in h],
         "timestamp": t}
        for v, k, h, t in zip(values, keys, headers, timestamps)
    ]


def schema_message() -> bytes:
    """The IPC schema message Arrow writes at the start of a stream of :data:`V2_SCHEMA`."""
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, V2_SCHEMA):
        pass
    return sink.getvalue().to_pybytes()[:-8]  # without the end-of-stream marker


def record_batch_message(batch: pa.RecordBatch) -> bytes:
    """The IPC record batch message of ``batch``, whatever its schema."""
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, batch.schema) as stream:
        stream.write_batch(batch)
    empty = pa.BufferOutputStream()
    with ipc.new_stream(empty, batch.schema):
        pass
    return sink.getvalue().to_pybytes()[empty.getvalue().size - 8:-8]


# --- round trips -------------------------------------------------------------------------------


@st.composite
def record_groups(draw):
    n = draw(st.integers(min_value=1, max_value=30))
    values = draw(st.lists(st.one_of(st.none(), st.binary(max_size=40)), min_size=n, max_size=n))
    keys = draw(st.one_of(st.none(),
                          st.lists(st.one_of(st.none(), st.binary(max_size=16)), min_size=n, max_size=n)))
    header = st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=16)))
    headers = draw(st.one_of(st.none(), st.lists(st.one_of(st.none(), st.lists(header, max_size=4)),
                                                 min_size=n, max_size=n)))
    timestamps = draw(st.one_of(st.none(), st.lists(st.one_of(st.none(), st.integers(0, 2 ** 53)),
                                                    min_size=n, max_size=n)))
    return values, keys, headers, timestamps


def _absent(column) -> bool:
    return column is None or all(x is None for x in column)


@settings(max_examples=150, deadline=None)
@given(group=record_groups(), compression=st.sampled_from(COMPRESSIONS))
def test_every_field_survives_encoding_and_decoding(group, compression):
    values, keys, headers, timestamps = group
    records = to_records(values, keys, headers, timestamps)
    value_only = all(v is not None for v in values) and _absent(keys) and _absent(headers) and _absent(timestamps)
    assert isinstance(records, pa.Array) == value_only
    encoded = encode_body(records, compression)
    expected_encoding = BYTES_BATCH_V1 if value_only and compression == "none" else RECORDS_V2
    assert encoded.encoding == expected_encoding
    body = encoded.to_bytes()
    assert len(body) == encoded.length and encoded.count == len(values)
    if expected_encoding == RECORDS_V2:
        assert body[:4] == V2_MAGIC and body_compression(body) == compression

    decoded = decode_body(encoded.encoding, body, len(values))
    if expected_encoding == BYTES_BATCH_V1:
        assert isinstance(decoded, pa.BinaryArray) and decoded.to_pylist() == values
    else:
        assert isinstance(decoded, pa.RecordBatch) and decoded.schema.equals(V2_SCHEMA)
        decoded.validate(full=True)
    batch = as_v2(decoded)
    want = expected_rows(values, keys, headers, timestamps)
    for name in ("key", "value", "headers", "timestamp"):
        assert batch.column(name).to_pylist() == [row[name] for row in want], name


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_sliced_arrow_input_round_trips(compression):
    n = 20
    values = pa.array([None if i % 5 == 0 else f"v{i}".encode() * i for i in range(n)], pa.binary())
    keys = pa.array([f"key-{i}" if i % 3 else None for i in range(n)], pa.string())
    headers = pa.array([None if i % 4 == 0 else [{"key": f"h{j}", "value": None if j % 2 else bytes([j]) * i}
                                                  for j in range(i % 3)] for i in range(n)], HEADERS_TYPE)
    stamps = pa.array([i * 1000 if i % 2 else None for i in range(n)], pa.int64())
    lo, count = 3, 12
    records = to_records(values.slice(lo, count), keys.slice(lo, count), headers.slice(lo, count),
                         stamps.slice(lo, count), max_record_bytes=1 << 20)
    body = encode_body(records, compression).to_bytes()
    got = decode_body(RECORDS_V2, body, count)
    assert got.column("value").to_pylist() == values.slice(lo, count).to_pylist()
    assert got.column("key").to_pylist() == [None if k is None else k.encode() for k in keys.slice(lo, count).to_pylist()]
    assert got.column("headers").to_pylist() == headers.slice(lo, count).to_pylist()
    assert got.column("timestamp").to_pylist() == stamps.slice(lo, count).to_pylist()


def test_concatenated_value_only_and_full_records_round_trip():
    plain = to_records([b"a", b"b"])
    full = sample_records()
    assert isinstance(concat_records([plain, plain]), pa.Array)
    both = concat_records([plain, full, plain])
    assert isinstance(both, pa.RecordBatch) and both.num_rows == 7
    got = decode_body(RECORDS_V2, encode_body(both, "zstd").to_bytes(), 7)
    assert got.column("value").to_pylist() == [b"a", b"b", b"first value", None, b"third", b"a", b"b"]
    assert got.column("key").to_pylist() == [None, None, b"k1", None, b"k3", None, None]
    assert got.column("timestamp").to_pylist() == [None, None, 1_700_000_000_000, None, 3, None, None]
    assert got.column("headers").to_pylist()[2:5] == [[{"key": "h", "value": b"v"}, {"key": "h", "value": None}],
                                                      [], None]


# --- zero copy ----------------------------------------------------------------------------------


@pytest.mark.parametrize("misalign", [0, 3])
def test_an_uncompressed_body_decodes_without_copying(misalign):
    body = b"\x00" * misalign + sample_body("none")  # a body need not be aligned in a shared blob
    buffer = pa.py_buffer(body)
    batch = decode_records_v2(memoryview(buffer)[misalign:], 3)
    lo, hi = buffer.address, buffer.address + buffer.size
    _, offsets, data = batch.column("value").buffers()
    assert lo <= data.address and data.address + data.size <= hi
    assert lo <= offsets.address and offsets.address + offsets.size <= hi
    key_data = batch.column("key").buffers()[2]
    assert lo <= key_data.address < hi
    assert batch.column("value").to_pylist() == [b"first value", None, b"third"]


def test_decode_body_of_a_buffer_is_zero_copy_too():
    buffer = pa.py_buffer(sample_body("none"))
    batch = decode_body(RECORDS_V2, buffer, 3)
    data = batch.column("value").buffers()[2]
    assert buffer.address <= data.address < buffer.address + buffer.size


# --- corruption ----------------------------------------------------------------------------------


def test_wrong_magic_is_rejected():
    body = sample_body()
    with pytest.raises(CorruptBatch, match=r"my body: wrong magic b'LLB1'"):
        decode_body(RECORDS_V2, b"LLB1" + body[4:], 3, "my body")


def test_a_count_that_disagrees_with_the_index_is_rejected():
    with pytest.raises(CorruptBatch, match="body holds 3 records, the index says 4"):
        decode_body(RECORDS_V2, sample_body(), 4)


def test_a_header_count_that_disagrees_with_the_batch_is_rejected():
    body = bytearray(sample_body())
    struct.pack_into("<I", body, 4, 5)  # not covered by the CRC
    with pytest.raises(CorruptBatch, match="the record batch holds 3 records, the header says 5"):
        decode_body(RECORDS_V2, bytes(body), None)


@pytest.mark.parametrize("compression", COMPRESSIONS)
@pytest.mark.parametrize("position", [12, 20, -1, -9])
def test_a_flipped_byte_fails_the_crc(compression, position):
    body = bytearray(sample_body(compression))
    body[position] ^= 0x10
    with pytest.raises(CorruptBatch, match="CRC mismatch"):
        decode_body(RECORDS_V2, bytes(body), 3)


@pytest.mark.parametrize("byte, value", [(13, 0b10000), (13, 0b1101), (14, 1), (15, 1)],
                         ids=["unknown column", "no value column", "byte 14", "byte 15"])
def test_bad_column_bytes_are_rejected(byte, value):
    body = bytearray(sample_body())
    body[byte] = value
    with pytest.raises(CorruptBatch, match="bad column bytes"):
        decode_body(RECORDS_V2, with_fixed_crc(body), 3)


def test_columns_null_in_every_record_are_left_out_and_read_as_nulls():
    keyed = to_records([b"a", b"b"], keys=[b"k", None])
    body = encode_body(keyed).to_bytes()
    everything = encode_body(to_records([b"a", b"b"], keys=[b"k", None], headers=[[], None],
                                        timestamps=[None, 1])).to_bytes()
    assert body[13] == 0b0011 and everything[13] == 0b1111 and len(body) < len(everything) - 16
    assert decode_body(RECORDS_V2, body, 2).to_pylist() == [
        {"key": b"k", "value": b"a", "headers": None, "timestamp": None},
        {"key": None, "value": b"b", "headers": None, "timestamp": None}]
    tombstones = encode_body(to_records([None, None])).to_bytes()
    assert tombstones[13] == 0b0010 and decode_body(RECORDS_V2, tombstones, 2).column("value").null_count == 2
    mask_says_more = bytearray(body)
    mask_says_more[13] = 0b1011  # a timestamp column the message does not hold
    with pytest.raises(CorruptBatch, match="malformed records-v2 message"):
        decode_body(RECORDS_V2, with_fixed_crc(mask_says_more), 2)


@pytest.mark.parametrize("code", [3, 9, 255])
def test_an_unknown_compression_code_is_rejected(code):
    body = bytearray(sample_body())
    body[12] = code
    with pytest.raises(CorruptBatch, match=f"bad compression byte {code:#04x}"):
        decode_body(RECORDS_V2, with_fixed_crc(body), 3)


def test_a_compression_byte_that_misnames_the_codec_never_gives_wrong_data():
    """Section 3 has byte 12 name the message's codec but lists no check that it does: Arrow
    decompresses by the batch's own ``compression`` field, so the records still come out right."""
    right = decode_body(RECORDS_V2, sample_body("zstd"), 3).to_pylist()
    for code in (COMPRESSION_CODES["none"], COMPRESSION_CODES["lz4"]):
        body = bytearray(sample_body("zstd"))
        body[12] = code
        assert decode_body(RECORDS_V2, with_fixed_crc(body), 3).to_pylist() == right


def test_a_truncated_body_is_rejected():
    body = sample_body()
    with pytest.raises(CorruptBatch, match="CRC mismatch"):
        decode_body(RECORDS_V2, body[:-8], 3)
    for cut in (8, 100, len(body) - V2_HEADER_SIZE - 1):  # with the CRC recomputed: the message itself
        with pytest.raises(CorruptBatch, match="malformed records-v2 message"):
            decode_body(RECORDS_V2, with_fixed_crc(body[:len(body) - cut]), 3)
    with pytest.raises(CorruptBatch, match="10 bytes is too short for a records-v2 header"):
        decode_body(RECORDS_V2, body[:10], 3)
    with pytest.raises(CorruptBatch, match="malformed records-v2 message"):
        decode_body(RECORDS_V2, with_fixed_crc(body[:V2_HEADER_SIZE + 4]), 3)  # a continuation marker only


@pytest.mark.parametrize("message", [b"", b"\xff\xff\xff\xff\x00\x00\x00\x00", b"\x00\x00\x00\x00"],
                         ids=["nothing", "end-of-stream", "old-end-of-stream"])
def test_a_header_without_a_message_is_rejected(message):
    body = sample_body()[:V2_HEADER_SIZE] + message
    with pytest.raises(CorruptBatch, match="malformed records-v2 message"):
        decode_body(RECORDS_V2, with_fixed_crc(body), 3)


@pytest.mark.parametrize("extra", [b"\x00", b"\x01\x02\x03", b"\x00" * 8, b"\xff\xff\xff\xff\x00\x00\x00\x00"])
def test_trailing_bytes_after_the_message_are_rejected(extra):
    body = sample_body()
    size = len(body) - V2_HEADER_SIZE
    with pytest.raises(CorruptBatch, match=f"the IPC message takes {size} of the body's {size + len(extra)} bytes"):
        decode_body(RECORDS_V2, with_fixed_crc(body + extra), 3)


def test_a_schema_message_instead_of_a_record_batch_is_rejected():
    body = sample_body()[:V2_HEADER_SIZE] + schema_message()
    with pytest.raises(CorruptBatch, match="the IPC message is a schema, not a record batch"):
        decode_body(RECORDS_V2, with_fixed_crc(body), 3)


def test_columns_of_another_layout_are_rejected():
    int32_times = pa.schema([*list(V2_SCHEMA)[:3], pa.field("timestamp", pa.int32())])
    batch = pa.RecordBatch.from_arrays([pa.array([b"k"] * 3), pa.array([b"v"] * 3), pa.nulls(3, HEADERS_TYPE),
                                        pa.array([1, 2, 3], pa.int32())], schema=int32_times)
    body = V2_HEADER.pack(V2_MAGIC, 3, 0, 0, 0b1111, 0) + record_batch_message(batch)
    with pytest.raises(CorruptBatch, match="malformed records-v2 message"):
        decode_body(RECORDS_V2, with_fixed_crc(body), 3)

    two_columns = pa.RecordBatch.from_arrays([pa.array([b"k"] * 3), pa.array([b"v"] * 3)], names=["key", "value"])
    body = V2_HEADER.pack(V2_MAGIC, 3, 0, 0, 0b1111, 0) + record_batch_message(two_columns)
    with pytest.raises(CorruptBatch, match="malformed records-v2 message"):
        decode_body(RECORDS_V2, with_fixed_crc(body), 3)


def test_a_header_key_that_is_not_utf8_is_rejected():
    batch = to_records([b"v"], headers=[[("\u00ff", b"x")]])
    body = bytearray(encode_records_v2(batch).to_bytes())
    at = bytes(body).index("\u00ff".encode())
    body[at:at + 2] = b"\xff\xfe"
    with pytest.raises(CorruptBatch, match="malformed records-v2 message.*UTF8"):
        decode_body(RECORDS_V2, with_fixed_crc(body), 1)


def test_an_unknown_encoding_is_rejected():
    with pytest.raises(CorruptBatch, match=r"entry 7: unknown encoding 'records-v3'"):
        decode_body("records-v3", sample_body(), 3, "entry 7")


# --- compression ---------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_body_compression_names_the_codec(compression):
    body = sample_body(compression)
    assert body[12] == COMPRESSION_CODES[compression]
    assert body_compression(body) == compression
    assert body_compression(memoryview(body)) == compression


def test_body_compression_of_an_unknown_code_is_unknown():
    body = bytearray(sample_body())
    body[12] = 9
    assert body_compression(bytes(body)) == "unknown"


def test_zstd_shrinks_json_like_values():
    values = [json.dumps({"seq": i, "ts": "2026-11-25 12:00:00.123"}).encode() for i in range(1000)]
    records = to_records(values)
    plain = encode_body(records, "none")
    packed = encode_body(records, "zstd")
    assert plain.encoding == BYTES_BATCH_V1 and packed.encoding == RECORDS_V2
    assert packed.length < 0.4 * plain.length, (packed.length, plain.length)
    assert decode_body(RECORDS_V2, packed.to_bytes(), 1000).column("value").to_pylist() == values


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_incompressible_values_round_trip_compressed(compression):
    import random

    rng = random.Random(3)
    values = [rng.randbytes(rng.randint(0, 300)) for _ in range(200)]
    body = encode_body(to_records(values), compression).to_bytes()
    assert decode_body(RECORDS_V2, body, 200).column("value").to_pylist() == values


def test_an_unknown_compression_name_is_refused():
    with pytest.raises(InvalidPayload, match="unknown compression 'gzip'"):
        encode_body(to_records([b"a"]), "gzip")


# --- input normalization --------------------------------------------------------------------------


def test_header_keys_given_as_utf8_bytes_are_accepted():
    batch = to_records([b"v", b"w"], headers=[[(b"caf\xc3\xa9", b"1"), ("plain", None)], [(bytearray(b"k"), b"")]])
    assert batch.column("headers").to_pylist() == [
        [{"key": "café", "value": b"1"}, {"key": "plain", "value": None}], [{"key": "k", "value": b""}]]
    got = decode_body(RECORDS_V2, encode_body(batch).to_bytes(), 2)
    assert got.column("headers").to_pylist() == batch.column("headers").to_pylist()


def test_header_keys_given_as_bytes_that_are_not_utf8_are_refused():
    with pytest.raises(InvalidPayload, match=r"headers\[1\] has a header key that is not UTF-8"):
        to_records([b"v", b"w"], headers=[None, [(b"\xff", b"1")]])


def test_str_keys_become_binary_keys():
    batch = to_records([b"a", b"b", b"c"], keys=["k", "ключ", None])
    assert batch.schema.field("key").type == pa.binary()
    assert batch.column("key").to_pylist() == [b"k", "ключ".encode(), None]
    arrow = to_records([b"a", b"b"], keys=pa.array(["x", None], pa.string()))
    assert arrow.column("key").type == pa.binary() and arrow.column("key").to_pylist() == [b"x", None]
    got = decode_body(RECORDS_V2, encode_body(batch).to_bytes(), 3)
    assert got.column("key").to_pylist() == [b"k", "ключ".encode(), None]


@pytest.mark.parametrize("unit,scale", [("us", 1_000), ("ns", 1_000_000)])
def test_arrow_timestamps_become_milliseconds_floored(unit, scale):
    ms = 1_764_072_000_123
    raw = [ms * scale, ms * scale + scale - 1, (ms + 1) * scale, None, 0, scale - 1]
    stamps = pa.array(raw, pa.timestamp(unit, tz="UTC"))
    batch = to_records([b"v"] * len(raw), timestamps=stamps)
    assert batch.schema.field("timestamp").type == pa.int64()
    assert batch.column("timestamp").to_pylist() == [ms, ms, ms + 1, None, 0, 0]


def test_second_and_millisecond_timestamps_and_naive_ones():
    assert to_records([b"v"], timestamps=pa.array([5], pa.timestamp("s"))).column("timestamp").to_pylist() == [5000]
    assert to_records([b"v"], timestamps=pa.array([7], pa.timestamp("ms", tz="UTC"))).column(
        "timestamp").to_pylist() == [7]


def test_all_null_columns_count_as_absent():
    records = to_records([b"a", b"b"], keys=[None, None], headers=[None, None], timestamps=[None, None])
    assert isinstance(records, pa.Array)
    assert encode_body(records).encoding == BYTES_BATCH_V1


def test_empty_header_lists_are_kept():
    records = to_records([b"a", b"b"], headers=[[], []])
    assert isinstance(records, pa.RecordBatch)
    got = decode_body(RECORDS_V2, encode_body(records).to_bytes(), 2)
    assert got.column("headers").to_pylist() == [[], []]


def test_tombstones_alone_are_records_v2():
    records = to_records([None, b"x"])
    assert isinstance(records, pa.RecordBatch)
    body = encode_body(records)
    assert body.encoding == RECORDS_V2
    assert decode_body(RECORDS_V2, body.to_bytes(), 2).column("value").to_pylist() == [None, b"x"]


def test_a_record_over_the_size_limit_is_refused_counting_key_and_headers():
    with pytest.raises(InvalidPayload, match="record 1 is 12 bytes"):
        to_records([b"a", b"bb"], keys=[b"k", b"kkk"], headers=[None, [("hh", b"hhhhh")]], max_record_bytes=11)
    to_records([b"a", b"bb"], keys=[b"k", b"kkk"], headers=[None, [("hh", b"hhhhh")]], max_record_bytes=12)


# --- headers input that is not (key, value) pairs ------------------------------------------------


def test_a_header_given_as_a_dict_is_stored_right():
    batch = to_records([b"v"], headers=[[{"key": "a", "value": b"b"}]])
    assert batch.column("headers").to_pylist() == [[{"key": "a", "value": b"b"}]]


def test_a_header_that_is_a_two_character_string_is_refused():
    with pytest.raises(InvalidPayload, match=r"headers\[0\]"):
        to_records([b"v"], headers=[["ab"]])


def test_a_str_header_value_is_refused():
    with pytest.raises(InvalidPayload, match="header value of type str, not bytes"):
        to_records([b"v"], headers=[[("k", "text")]])


def test_a_null_header_key_is_refused_naming_the_record():
    headers = pa.array([[{"key": "a", "value": b"1"}], [{"key": "b", "value": None}, {"key": None, "value": b"x"}]],
                       pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))
    with pytest.raises(InvalidPayload, match=r"headers\[1\] has a null header or a header with a null key"):
        to_records([b"v", b"w"], headers=headers)


def test_a_null_header_key_in_a_sliced_array_names_the_right_record():
    headers = pa.array([[{"key": "x", "value": b"1"}], [{"key": "y", "value": b"2"}], [{"key": "a", "value": b"1"}],
                        [{"key": None, "value": b"x"}]],
                       pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))
    with pytest.raises(InvalidPayload, match=r"headers\[1\] has a null header"):
        to_records([b"v", b"w"], headers=headers.slice(2, 2))
