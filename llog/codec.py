"""The bytes-batch-v1 body and the LLS1 shared WAL blob (PROTOCOL.md section 3).

A bytes-batch-v1 body is an Arrow ``binary`` array laid out flat: its offsets buffer, then its
values buffer, behind a 12-byte header (magic, count, CRC-32 of the rest). Encoding reuses the
array's buffers and decoding builds an array over the body's bytes, so neither copies records.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from llog.errors import CorruptBatch, EmptyAppend, InvalidPayload

try:  # ISA-L's CRC-32 is zlib's checksum, about 13x faster than zlib here (SIMD carry-less multiply).
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal is a dependency; a platform without its wheel still works
    from zlib import crc32

BATCH_MAGIC = b"LLB1"
BATCH_HEADER = struct.Struct("<4sII")  # magic, record count, CRC-32 of bytes [12:]
BATCH_HEADER_SIZE = BATCH_HEADER.size
SHARED_MAGIC = b"LLS1"
SHARED_PREFIX = struct.Struct(">4sI")  # magic, header length (big-endian)
SHARED_VERSION = 1
_MAX_U32 = 0xFFFFFFFF
_BYTES_LIKE = (bytes, bytearray, memoryview)


# --- record values ------------------------------------------------------------------------------


def to_binary_array(values: object, what: str = "records") -> pa.BinaryArray:
    """Turn record values into one non-null Arrow ``binary`` array.

    Accepts a sequence of bytes-like objects, or an Arrow binary/large_binary array or chunked
    array. Anything else (``str``, ``None``, numbers) raises :class:`InvalidPayload` naming the
    first offending record; an empty input raises :class:`EmptyAppend`.
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    if isinstance(values, pa.Array):
        if not (pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type)):
            raise InvalidPayload(f"{what} must be an Arrow binary array, got type {values.type}")
        array = values if pa.types.is_binary(values.type) else values.cast(pa.binary())
    else:
        if isinstance(values, (str, *_BYTES_LIKE)) or not isinstance(values, Sequence):
            raise InvalidPayload(f"{what} must be a sequence of bytes values, got {type(values).__name__}")
        kinds = {type(v) for v in values}
        if not kinds <= {bytes, bytearray, memoryview}:
            bad = next((i for i, v in enumerate(values) if not isinstance(v, _BYTES_LIKE)), None)
            if bad is not None:
                raise InvalidPayload(
                    f"{what}[{bad}] is {type(values[bad]).__name__}, not bytes"
                    + (" (encode text first, e.g. value.encode('utf-8'))" if isinstance(values[bad], str) else "")
                )
        array = pa.array(values if kinds == {bytes} else [bytes(v) for v in values], type=pa.binary())
    if len(array) == 0:
        raise EmptyAppend(f"{what} must hold at least one record")
    if array.null_count:
        first = array.is_null().to_numpy(zero_copy_only=False).argmax()
        raise InvalidPayload(f"{what}[{first}] is null; llog records are non-null bytes")
    return array


# --- bytes-batch-v1 -----------------------------------------------------------------------------


@dataclass(frozen=True)
class EncodedBatch:
    """One bytes-batch-v1 body as the pieces to write back to back (no copy made yet)."""

    pieces: tuple[object, ...]
    length: int
    count: int

    def to_bytes(self) -> bytes:
        return b"".join(self.pieces)


def encode_batch(values: pa.BinaryArray) -> EncodedBatch:
    """Encode a non-null binary array as a bytes-batch-v1 body (section 3)."""
    n = len(values)
    _, offsets_buf, data_buf = values.buffers()
    offsets = np.frombuffer(offsets_buf, dtype="<i4", count=n + 1, offset=values.offset * 4)
    first, last = int(offsets[0]), int(offsets[-1])
    if first:
        offsets = offsets - first
    if last - first > _MAX_U32:
        raise InvalidPayload(f"batch of {n} records holds {last - first} bytes, over the 4 GiB body limit")
    offsets_bytes = memoryview(offsets.astype("<u4", copy=False)).cast("B")
    data = memoryview(data_buf)[first:last] if data_buf is not None else memoryview(b"")
    crc = crc32(data, crc32(offsets_bytes))
    header = BATCH_HEADER.pack(BATCH_MAGIC, n, crc)
    return EncodedBatch((header, offsets_bytes, data), BATCH_HEADER_SIZE + len(offsets_bytes) + len(data), n)


def _check_offsets(offsets: np.ndarray, data_length: int, where: str) -> None:
    if offsets[0] != 0:
        raise CorruptBatch(f"{where}: first record offset is {offsets[0]}, must be 0")
    if len(offsets) > 1 and bool(np.any(offsets[1:] < offsets[:-1])):
        raise CorruptBatch(f"{where}: record offsets decrease")
    if int(offsets[-1]) != data_length:
        raise CorruptBatch(f"{where}: records end at byte {offsets[-1]} of a {data_length}-byte data section")


def read_batch_header(body: bytes | memoryview, expected_count: int | None, where: str) -> int:
    """Check magic and count of a body's first 12 bytes; return the record count."""
    if len(body) < BATCH_HEADER_SIZE:
        raise CorruptBatch(f"{where}: {len(body)} bytes is too short for a bytes-batch-v1 header")
    magic, count, _ = BATCH_HEADER.unpack_from(body, 0)
    if magic != BATCH_MAGIC:
        raise CorruptBatch(f"{where}: wrong magic {bytes(magic)!r}, expected {BATCH_MAGIC!r}")
    if expected_count is not None and count != expected_count:
        raise CorruptBatch(f"{where}: body holds {count} records, the index says {expected_count}")
    return count


def decode_batch(body: bytes | memoryview, expected_count: int | None = None, where: str = "batch") -> pa.BinaryArray:
    """Decode a whole bytes-batch-v1 body into a binary array over the body's own bytes.

    Checks magic, count (against ``expected_count`` when given), CRC and offsets.
    """
    view = memoryview(body).cast("B")
    count = read_batch_header(view, expected_count, where)
    data_start = BATCH_HEADER_SIZE + 4 * (count + 1)
    if len(view) < data_start:
        raise CorruptBatch(f"{where}: {len(view)} bytes cannot hold the offsets of {count} records")
    crc = BATCH_HEADER.unpack_from(view, 0)[2]
    actual = crc32(view[BATCH_HEADER_SIZE:])
    if actual != crc:
        raise CorruptBatch(f"{where}: CRC mismatch (stored {crc:#010x}, computed {actual:#010x})")
    offsets = np.frombuffer(view, dtype="<u4", count=count + 1, offset=BATCH_HEADER_SIZE)
    _check_offsets(offsets, len(view) - data_start, where)
    buffer = pa.py_buffer(view)
    return pa.Array.from_buffers(
        pa.binary(), count,
        [None, buffer.slice(BATCH_HEADER_SIZE, 4 * (count + 1)), buffer.slice(data_start)],
    )


def offsets_prefix_length(index: int) -> int:
    """Bytes from a body's start through the offsets of record ``index`` and its successor: what
    a partial read of one record fetches first."""
    return BATCH_HEADER_SIZE + 4 * (index + 2)


def record_span(prefix: bytes | memoryview, index: int, count: int, body_length: int, where: str) -> tuple[int, int]:
    """Where record ``index`` lies in a body, from the body's first
    :func:`offsets_prefix_length` bytes: ``(start, end)`` byte positions in the body.

    A partial read cannot check the CRC; it checks magic, count and bounds instead.
    """
    view = memoryview(prefix).cast("B")
    read_batch_header(view, count, where)
    if not 0 <= index < count:
        raise CorruptBatch(f"{where}: record {index} requested from a batch of {count}")
    if len(view) < offsets_prefix_length(index):
        raise CorruptBatch(f"{where}: body ends inside its offsets table")
    start, end = struct.unpack_from("<II", view, BATCH_HEADER_SIZE + 4 * index)
    data_start = BATCH_HEADER_SIZE + 4 * (count + 1)
    if start > end or data_start + end > body_length:
        raise CorruptBatch(f"{where}: record {index} spans {start}..{end}, past the {body_length}-byte body")
    return data_start + start, data_start + end


# --- LLS1 shared WAL blob -----------------------------------------------------------------------


@dataclass(frozen=True)
class SharedSlice:
    """One partition's body inside a shared WAL blob; ``body_offset`` counts from the blob's
    first byte, so it is the index entry's ``byte_offset``."""

    topic: str
    partition: int
    msg_count: int
    body_offset: int
    body_length: int
    encoding: str = "bytes-batch-v1"


def _shared_header(slices: Iterable[SharedSlice], created_at_ms: int) -> bytes:
    return json.dumps({
        "version": SHARED_VERSION,
        "created_at_ms": created_at_ms,
        "partitions": [
            {"topic": s.topic, "partition": s.partition, "msg_count": s.msg_count, "encoding": s.encoding,
             "body_offset": s.body_offset, "body_length": s.body_length}
            for s in slices
        ],
    }, separators=(",", ":")).encode()


def pack_shared(
    bodies: Sequence[tuple[str, int, EncodedBatch]], created_at_ms: int
) -> tuple[list[object], int, list[SharedSlice]]:
    """Lay out an LLS1 blob holding ``(topic, partition, body)`` in order.

    Returns the pieces to write back to back, the blob's length, and each body's slice. Body
    offsets are absolute, so they depend on the header's length, which depends on them: the
    layout is recomputed until the header length stops changing (two or three rounds).
    """
    if not bodies:
        raise EmptyAppend("a shared WAL blob needs at least one partition body")
    header_length = 0
    while True:
        position = SHARED_PREFIX.size + header_length
        slices = []
        for topic, partition, body in bodies:
            slices.append(SharedSlice(topic, partition, body.count, position, body.length))
            position += body.length
        header = _shared_header(slices, created_at_ms)
        if len(header) == header_length:
            break
        header_length = len(header)
    pieces: list[object] = [SHARED_PREFIX.pack(SHARED_MAGIC, len(header)), header]
    for _, _, body in bodies:
        pieces.extend(body.pieces)
    return pieces, position, slices


def unpack_shared(blob: bytes | memoryview, where: str = "shared WAL blob") -> tuple[int, list[SharedSlice]]:
    """Parse an LLS1 blob's header: ``(created_at_ms, slices)``, each slice checked to lie
    inside the blob after the header."""
    view = memoryview(blob).cast("B")
    if len(view) < SHARED_PREFIX.size:
        raise CorruptBatch(f"{where}: {len(view)} bytes is too short for an LLS1 blob")
    magic, header_length = SHARED_PREFIX.unpack_from(view, 0)
    if magic != SHARED_MAGIC:
        raise CorruptBatch(f"{where}: wrong magic {bytes(magic)!r}, expected {SHARED_MAGIC!r}")
    bodies_start = SHARED_PREFIX.size + header_length
    if bodies_start > len(view):
        raise CorruptBatch(f"{where}: header length {header_length} runs past the {len(view)}-byte blob")
    try:
        header = json.loads(bytes(view[SHARED_PREFIX.size:bodies_start]))
        if not isinstance(header, dict):
            raise TypeError(f"the header is a JSON {type(header).__name__}, not an object")
        if header.get("version") != SHARED_VERSION:
            raise CorruptBatch(f"{where}: unsupported LLS1 version {header.get('version')!r}")
        slices = [
            SharedSlice(p["topic"], p["partition"], p["msg_count"], p["body_offset"], p["body_length"], p["encoding"])
            for p in header["partitions"]
        ]
        created_at_ms = int(header["created_at_ms"])
        for s in slices:
            for name in ("partition", "msg_count", "body_offset", "body_length"):
                value = getattr(s, name)
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise TypeError(f"{name} of {s.topic}[{s.partition}] is {value!r}, not an int >= 0")
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptBatch(f"{where}: malformed LLS1 header: {e}") from None
    for s in slices:
        if s.body_offset < bodies_start or s.body_offset + s.body_length > len(view):
            raise CorruptBatch(f"{where}: body of {s.topic}[{s.partition}] at {s.body_offset}+{s.body_length} "
                               f"lies outside the blob's bodies ({bodies_start}..{len(view)})")
    return created_at_ms, slices
