"""bytes-batch-v1 bodies and LLS1 shared WAL blobs (docs/protocol.md section 3), without servers."""

from __future__ import annotations

import json
import re
import struct
import zlib

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llog.codec import (
    BATCH_HEADER_SIZE,
    EncodedBatch,
    decode_batch,
    encode_batch,
    offsets_prefix_length,
    pack_shared,
    record_span,
    to_binary_array,
    unpack_shared,
)
from llog.errors import CorruptBatch, EmptyAppend, InvalidPayload

records_strategy = st.lists(st.binary(max_size=64), min_size=1, max_size=200)


# --- helpers -----------------------------------------------------------------------------------


def body_of(values) -> bytes:
    return encode_batch(to_binary_array(values)).to_bytes()


def roundtrip(values) -> list[bytes]:
    body = body_of(values)
    return decode_batch(body, expected_count=len(values)).to_pylist()


def data_start(count: int) -> int:
    return BATCH_HEADER_SIZE + 4 * (count + 1)


def with_fixed_crc(body: bytes | bytearray) -> bytes:
    """Recompute the CRC so that a deliberately damaged offsets table is what a decoder trips on."""
    body = bytearray(body)
    struct.pack_into("<I", body, 8, zlib.crc32(bytes(body[12:])))
    return bytes(body)


def with_offsets(values: list[bytes], offsets: list[int]) -> bytes:
    """A body of ``values`` whose offsets table is replaced by ``offsets`` (CRC fixed up)."""
    body = bytearray(body_of(values))
    struct.pack_into(f"<{len(offsets)}I", body, BATCH_HEADER_SIZE, *offsets)
    return with_fixed_crc(body)


def address(obj) -> int:
    return pa.py_buffer(obj).address


def lls1_blob(header: bytes, tail: bytes = b"", magic: bytes = b"LLS1", header_length: int | None = None) -> bytes:
    length = len(header) if header_length is None else header_length
    return magic + struct.pack(">I", length) + header + tail


def lls1_header(**partition) -> bytes:
    slice_ = {"topic": "t", "partition": 0, "msg_count": 1, "encoding": "bytes-batch-v1",
              "body_offset": 0, "body_length": 0, **partition}
    return json.dumps({"version": 1, "created_at_ms": 7, "partitions": [slice_]}).encode()


# --- bytes-batch-v1 round trips ----------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [
        [b""],
        [b"", b"", b""],
        [b"x"],
        [b"hello"],
        [b"a", b"", b"bc", b"", b"\x00\xff" * 10],
        [bytes([i % 256]) * (i % 7) for i in range(1000)],
        [b"\x00" * 100_000],
    ],
    ids=["one-empty", "all-empty", "one-byte", "single", "mixed-empties", "many", "large"],
)
def test_roundtrip(values):
    assert roundtrip(values) == values


def test_bytearray_and_memoryview_values_roundtrip():
    values = [bytearray(b"ab"), memoryview(b"cde"), b"f"]
    assert roundtrip(values) == [b"ab", b"cde", b"f"]


def test_encoded_batch_metadata_matches_bytes():
    encoded = encode_batch(to_binary_array([b"ab", b"cde"]))
    assert isinstance(encoded, EncodedBatch)
    assert encoded.count == 2
    assert encoded.length == len(encoded.to_bytes()) == 12 + 3 * 4 + 5


@pytest.mark.parametrize("start,length", [(0, 1), (3, 4), (5, 5), (9, 1), (1, 8)])
def test_sliced_array_is_rebased(start, length):
    values = [f"record-{i}".encode() * (i + 1) for i in range(10)]
    sliced = pa.array(values, pa.binary()).slice(start, length)
    body = encode_batch(sliced).to_bytes()
    offsets = struct.unpack_from(f"<{length + 1}I", body, BATCH_HEADER_SIZE)
    assert offsets[0] == 0
    assert decode_batch(body, expected_count=length).to_pylist() == values[start:start + length]
    # The data section holds exactly the slice's bytes, nothing before or after it.
    assert body[data_start(length):] == b"".join(values[start:start + length])


def test_sliced_array_encoding_does_not_copy_record_bytes():
    array = pa.array([b"aaaa", b"bb", b"cccccc"], pa.binary())
    sliced = array.slice(1, 2)
    data_piece = encode_batch(sliced).pieces[-1]
    assert address(data_piece) == array.buffers()[2].address + 4


def test_large_binary_input():
    values = [b"a", b"", b"xyz"]
    array = to_binary_array(pa.array(values, pa.large_binary()))
    assert array.type == pa.binary()
    assert roundtrip(array) == values


@pytest.mark.parametrize(
    "chunks",
    [[[b"a", b"b"], [b"", b"cd"]], [[b"only"]], [[b"x"], [], [b"y", b"z"]]],
    ids=["two", "one", "with-empty-chunk"],
)
@pytest.mark.parametrize("type_", [pa.binary(), pa.large_binary()])
def test_chunked_input(chunks, type_):
    chunked = pa.chunked_array(chunks, type=type_)
    expected = [v for chunk in chunks for v in chunk]
    array = to_binary_array(chunked)
    assert array.type == pa.binary()
    assert roundtrip(array) == expected


@given(records_strategy)
@settings(max_examples=200, deadline=None)
def test_roundtrip_property(values):
    body = body_of(values)
    assert len(body) == data_start(len(values)) + sum(map(len, values))
    assert decode_batch(body, expected_count=len(values)).to_pylist() == values


@given(records_strategy, st.data())
@settings(max_examples=100, deadline=None)
def test_sliced_roundtrip_property(values, data):
    start = data.draw(st.integers(0, len(values) - 1))
    length = data.draw(st.integers(1, len(values) - start))
    sliced = pa.array(values, pa.binary()).slice(start, length)
    assert decode_batch(encode_batch(sliced).to_bytes()).to_pylist() == values[start:start + length]


# --- exact layout --------------------------------------------------------------------------------


def test_byte_layout_by_hand():
    body = body_of([b"ab", b"", b"cde"])
    rest = (
        (0).to_bytes(4, "little") + (2).to_bytes(4, "little")
        + (2).to_bytes(4, "little") + (5).to_bytes(4, "little")
        + b"abcde"
    )
    expected = b"LLB1" + (3).to_bytes(4, "little") + zlib.crc32(rest).to_bytes(4, "little") + rest
    assert body == expected


def test_byte_layout_of_one_empty_record():
    rest = b"\x00" * 8  # offsets [0, 0], no data
    assert body_of([b""]) == b"LLB1\x01\x00\x00\x00" + struct.pack("<I", zlib.crc32(rest)) + rest


# --- zero copy ----------------------------------------------------------------------------------


def test_decode_points_into_body():
    body = body_of([b"hello", b"world", b"!"])
    _, offsets_buf, data_buf = decode_batch(body).buffers()
    base = address(body)
    assert offsets_buf.address == base + BATCH_HEADER_SIZE
    assert data_buf.address == base + data_start(3)


def test_decode_of_a_view_into_a_larger_blob_points_into_the_blob():
    body = body_of([b"abc", b"de"])
    blob = b"\x01\x02\x03" + body + b"trailer"
    view = memoryview(blob)[3:3 + len(body)]
    array = decode_batch(view)
    assert array.to_pylist() == [b"abc", b"de"]  # unaligned start still decodes correctly
    assert array.buffers()[2].address == address(blob) + 3 + data_start(2)


# --- corruption ---------------------------------------------------------------------------------

SMALL = [b"ab", b"", b"cde", b"f"]


def test_wrong_magic():
    body = b"XXXX" + body_of(SMALL)[4:]
    with pytest.raises(CorruptBatch, match="wrong magic"):
        decode_batch(body)


def test_count_disagrees_with_index():
    with pytest.raises(CorruptBatch, match=r"holds 4 records, the index says 5"):
        decode_batch(body_of(SMALL), expected_count=5)


@pytest.mark.parametrize("position", ["first-offset", "last-offset", "first-data", "last-data"])
def test_crc_mismatch(position):
    body = bytearray(body_of(SMALL))
    index = {"first-offset": 12, "last-offset": data_start(len(SMALL)) - 1,
             "first-data": data_start(len(SMALL)), "last-data": len(body) - 1}[position]
    body[index] ^= 0x01
    with pytest.raises(CorruptBatch, match="CRC mismatch"):
        decode_batch(bytes(body))


def test_every_truncation_is_rejected():
    body = body_of(SMALL)
    for length in range(len(body)):
        with pytest.raises(CorruptBatch) as info:
            decode_batch(body[:length], expected_count=len(SMALL))
        message = str(info.value)
        if length < BATCH_HEADER_SIZE:
            assert "too short" in message
        elif length < data_start(len(SMALL)):
            assert "cannot hold the offsets" in message
        else:
            assert "CRC mismatch" in message


def test_trailing_garbage_is_rejected():
    with pytest.raises(CorruptBatch, match="CRC mismatch"):
        decode_batch(body_of(SMALL) + b"\x00")


@pytest.mark.parametrize(
    "offsets,problem",
    [
        ([0, 2, 2, 5, 100], "records end at byte 100"),  # runs past the data section
        ([0, 2, 2, 5, 0xFFFFFFFF], "records end at byte"),
        ([0, 2, 2, 5, 5], "records end at byte 5 of a 6-byte"),  # stops short of the data
        ([0, 3, 2, 5, 6], "decrease"),
        ([0, 6, 2, 5, 6], "decrease"),
        ([1, 2, 2, 5, 6], "first record offset is 1"),
    ],
)
def test_bad_offsets(offsets, problem):
    body = with_offsets(SMALL, offsets)
    with pytest.raises(CorruptBatch, match=re.escape(problem)):
        decode_batch(body)


def test_count_larger_than_the_body():
    body = bytearray(body_of(SMALL))
    struct.pack_into("<I", body, 4, 0xFFFFFFFF)
    with pytest.raises(CorruptBatch, match="cannot hold the offsets"):
        decode_batch(bytes(body))


def test_error_names_the_source():
    with pytest.raises(CorruptBatch, match=r"^s3://b/k: wrong magic"):
        decode_batch(b"\x00" * 20, where="s3://b/k")


# --- partial reads --------------------------------------------------------------------------------


def spans_of(values: list[bytes]) -> list[tuple[int, int]]:
    spans, position = [], data_start(len(values))
    for value in values:
        spans.append((position, position + len(value)))
        position += len(value)
    return spans


@given(records_strategy, st.data())
@settings(max_examples=100, deadline=None)
def test_record_span_locates_each_record(values, data):
    body = body_of(values)
    index = data.draw(st.integers(0, len(values) - 1))
    prefix = body[:offsets_prefix_length(index)]
    start, end = record_span(prefix, index, len(values), len(body), "test")
    assert (start, end) == spans_of(values)[index]
    assert body[start:end] == values[index]


def test_offsets_prefix_length():
    assert offsets_prefix_length(0) == 12 + 8
    assert offsets_prefix_length(9) == 12 + 4 * 11


@pytest.mark.parametrize("index", [-1, len(SMALL), len(SMALL) + 10])
def test_record_span_bad_index(index):
    body = body_of(SMALL)
    with pytest.raises(CorruptBatch, match=f"record {index} requested from a batch of {len(SMALL)}"):
        record_span(body, index, len(SMALL), len(body), "test")


def test_record_span_body_too_small():
    body = body_of(SMALL)
    with pytest.raises(CorruptBatch, match="past the"):
        record_span(body, 2, len(SMALL), len(body) - 2, "test")


def test_record_span_prefix_too_short():
    body = body_of(SMALL)
    with pytest.raises(CorruptBatch, match="inside its offsets table"):
        record_span(body[:offsets_prefix_length(2) - 1], 2, len(SMALL), len(body), "test")


def test_record_span_checks_magic_and_count():
    body = body_of(SMALL)
    with pytest.raises(CorruptBatch, match="the index says 5"):
        record_span(body, 0, 5, len(body), "test")
    with pytest.raises(CorruptBatch, match="wrong magic"):
        record_span(b"XXXX" + body[4:], 0, len(SMALL), len(body), "test")


def test_record_span_rejects_decreasing_offsets():
    body = with_offsets(SMALL, [0, 3, 2, 5, 6])
    with pytest.raises(CorruptBatch, match="record 1 spans 3..2"):
        record_span(body, 1, len(SMALL), len(body), "test")


# --- LLS1 shared blobs ----------------------------------------------------------------------------


def pack(groups: list[tuple[str, int, list[bytes]]], created_at_ms: int = 1234):
    bodies = [(topic, partition, encode_batch(to_binary_array(values))) for topic, partition, values in groups]
    pieces, length, slices = pack_shared(bodies, created_at_ms)
    return b"".join(pieces), length, slices


def check_blob(blob: bytes, length: int, slices, groups) -> None:
    """Every property a reader relies on: prefix, header, absolute offsets, decodable bodies."""
    assert len(blob) == length
    assert blob[:4] == b"LLS1"
    header_length = int.from_bytes(blob[4:8], "big")
    header = json.loads(blob[8:8 + header_length])
    assert header["version"] == 1
    assert [p["body_offset"] for p in header["partitions"]] == [s.body_offset for s in slices]
    position = 8 + header_length
    for s, (topic, partition, values) in zip(slices, groups, strict=True):
        assert (s.topic, s.partition, s.msg_count, s.encoding) == (topic, partition, len(values), "bytes-batch-v1")
        assert s.body_offset == position  # bodies are back to back right after the header
        body = blob[s.body_offset:s.body_offset + s.body_length]
        assert decode_batch(body, expected_count=s.msg_count).to_pylist() == values
        position += s.body_length
    assert position == len(blob)


GROUPS = [("orders", 0, [b"a", b"bc"]), ("orders", 3, [b""]), ("payments.eu", 12, [b"x" * 300, b"y"])]


def test_pack_unpack_roundtrip():
    blob, length, slices = pack(GROUPS, created_at_ms=1_700_000_000_123)
    check_blob(blob, length, slices, GROUPS)
    assert unpack_shared(blob) == (1_700_000_000_123, slices)


def test_blob_prefix_is_big_endian():
    blob, _, _ = pack(GROUPS)
    header_length = struct.unpack(">I", blob[4:8])[0]
    assert blob[4:8] == header_length.to_bytes(4, "big")
    assert header_length != struct.unpack("<I", blob[4:8])[0]  # little-endian would read differently
    assert json.loads(blob[8:8 + header_length])["created_at_ms"] == 1234


def test_pack_nothing_is_empty_append():
    with pytest.raises(EmptyAppend):
        pack_shared([], 0)


def test_header_length_crosses_digit_boundaries():
    """Sweep the first body's size so the second body's offset crosses 999 -> 1000 and
    9999 -> 10000: every layout must be self-consistent, and the sweep must see the header grow."""
    second_offsets, header_lengths = set(), set()
    for size in [*range(550, 650), *range(9550, 9650)]:
        groups = [("t", 0, [b"a" * size]), ("t", 1, [b"b"]), ("u", 2, [b"c", b"d"])]
        blob, length, slices = pack(groups)
        check_blob(blob, length, slices, groups)
        second_offsets.add(slices[1].body_offset)
        header_lengths.add(int.from_bytes(blob[4:8], "big"))
    for boundary in (1000, 10000):
        assert min(second_offsets) < boundary <= max(second_offsets)
        assert any(o < boundary for o in second_offsets if o > boundary - 10)  # seen just below ...
        assert any(o >= boundary for o in second_offsets if o < boundary + 10)  # ... and just above
    assert len(header_lengths) >= 3


@given(
    st.lists(st.lists(st.integers(0, 2500), min_size=1, max_size=4), min_size=1, max_size=6),
    st.integers(0, 2**53),
)
@settings(max_examples=150, deadline=None)
def test_pack_property(record_sizes, created_at_ms):
    groups = [(f"topic-{i}", i * 7, [bytes([i]) * n for n in sizes]) for i, sizes in enumerate(record_sizes)]
    blob, length, slices = pack(groups, created_at_ms)
    check_blob(blob, length, slices, groups)
    assert unpack_shared(blob) == (created_at_ms, slices)


def test_unpack_accepts_a_memoryview():
    blob, _, slices = pack(GROUPS)
    assert unpack_shared(memoryview(blob))[1] == slices


@pytest.mark.parametrize(
    "blob,problem",
    [
        (b"LLS", "too short"),
        (lls1_blob(b"{}", magic=b"LLS2"), "wrong magic"),
        (lls1_blob(b"{}", magic=b"LLB1"), "wrong magic"),
        (lls1_blob(b"{}", header_length=3), "runs past"),
        (lls1_blob(b"{}", header_length=0xFFFFFFFF), "runs past"),
        (lls1_blob(b"{not json"), "malformed LLS1 header"),
        (lls1_blob(b"\xff\xfe"), "malformed LLS1 header"),
        (lls1_blob(b""), "malformed LLS1 header"),
        (lls1_blob(b'{"version": 1, "created_at_ms": 1}'), "malformed LLS1 header"),
        (lls1_blob(b'{"version": 1, "partitions": []}'), "malformed LLS1 header"),
        (lls1_blob(b'{"version": 1, "created_at_ms": 1, "partitions": [{"topic": "t"}]}'), "malformed LLS1 header"),
        (lls1_blob(b'{"version": 1, "created_at_ms": 1, "partitions": [1]}'), "malformed LLS1 header"),
        (lls1_blob(b'{"version": 2, "created_at_ms": 1, "partitions": []}'), "unsupported LLS1 version 2"),
    ],
    ids=["short", "magic", "batch-magic", "header-past-end", "header-huge", "bad-json", "bad-utf8", "empty-header",
         "no-partitions", "no-created", "partition-missing-fields", "partition-not-object", "version"],
)
def test_corrupt_blob(blob, problem):
    with pytest.raises(CorruptBatch, match=re.escape(problem)):
        unpack_shared(blob)


def test_slice_outside_blob():
    blob, _, slices = pack(GROUPS)
    header_length = int.from_bytes(blob[4:8], "big")
    bodies = blob[8 + header_length:]
    for body_offset, body_length in [(len(blob) - 2, 3), (8 + header_length - 1, 1), (0, 1), (len(blob), 1)]:
        header = lls1_header(body_offset=body_offset, body_length=body_length)
        # Keep the header length unchanged so only the slice is wrong (pad JSON with spaces).
        assert len(header) <= header_length
        forged = lls1_blob(header.ljust(header_length), bodies)
        with pytest.raises(CorruptBatch, match="lies outside the blob"):
            unpack_shared(forged)


@pytest.mark.parametrize("header", [b"[]", b"1", b"null", b'"s"'])
def test_non_object_header_is_corrupt(header):
    with pytest.raises(CorruptBatch):
        unpack_shared(lls1_blob(header))


@pytest.mark.parametrize("field,value", [("body_offset", "40"), ("body_offset", None), ("body_length", "1")])
def test_non_int_slice_fields_are_corrupt(field, value):
    with pytest.raises(CorruptBatch):
        unpack_shared(lls1_blob(lls1_header(**{"body_offset": 500, "body_length": 1, field: value}), b"x" * 1000))


def test_negative_body_length_is_corrupt():
    header = lls1_header(body_offset=500, body_length=-10)
    with pytest.raises(CorruptBatch):
        unpack_shared(lls1_blob(header, b"x" * 1000))


# --- to_binary_array ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values,error,message",
    [
        (["text"], InvalidPayload, r"records\[0\] is str, not bytes \(encode text first"),
        ([b"a", b"b", None], InvalidPayload, r"records\[2\] is NoneType, not bytes"),
        ([b"a", 7], InvalidPayload, r"records\[1\] is int, not bytes"),
        ([b"a", b"b", 1.5, "x"], InvalidPayload, r"records\[2\] is float"),
        (b"abc", InvalidPayload, r"must be a sequence of bytes values, got bytes"),
        (bytearray(b"abc"), InvalidPayload, r"got bytearray"),
        ("abc", InvalidPayload, r"got str"),
        (None, InvalidPayload, r"got NoneType"),
        (iter([b"a"]), InvalidPayload, r"must be a sequence"),
        ([], EmptyAppend, r"at least one record"),
        ((), EmptyAppend, r"at least one record"),
        (pa.array([], pa.binary()), EmptyAppend, r"at least one record"),
        (pa.chunked_array([], pa.binary()), EmptyAppend, r"at least one record"),
        (pa.array([b"a", None, b"c"], pa.binary()), InvalidPayload, r"records\[1\] is null"),
        (pa.array([b"a", b"b", None], pa.large_binary()), InvalidPayload, r"records\[2\] is null"),
        (pa.chunked_array([[b"a"], [None]], pa.binary()), InvalidPayload, r"records\[1\] is null"),
        (pa.array(["a"], pa.string()), InvalidPayload, r"Arrow binary array, got type string"),
        (pa.array([1], pa.int64()), InvalidPayload, r"got type int64"),
    ],
)
def test_to_binary_array_rejects(values, error, message):
    with pytest.raises(error, match=message):
        to_binary_array(values)


def test_to_binary_array_names_what():
    with pytest.raises(InvalidPayload, match=r"^values\[0\] is str"):
        to_binary_array(["x"], what="values")


def test_errors_are_also_builtin_kinds():
    with pytest.raises(TypeError):
        to_binary_array([None])
    with pytest.raises(ValueError):
        to_binary_array([])


def test_to_binary_array_passes_a_binary_array_through():
    array = pa.array([b"a", b"b"], pa.binary())
    assert to_binary_array(array) is array


def test_bytes_subclass_values():
    assert to_binary_array([np.bytes_(b"ab"), b"c"]).to_pylist() == [b"ab", b"c"]
