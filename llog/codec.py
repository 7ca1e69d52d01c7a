"""Record bodies and the LLS1 shared WAL blob (docs/protocol.md section 3, docs/protocol.md section 11).

A bytes-batch-v1 body is an Arrow ``binary`` array laid out flat: its offsets buffer, then its
values buffer, behind a 12-byte header (magic, count, CRC-32 of the rest). Encoding reuses the
array's buffers and decoding builds an array over the body's bytes, so neither copies records.

A records-v2 body is one Arrow IPC record batch message (key, value, headers, timestamp; Arrow's
own body compression) behind a 16-byte header. Decoding reads the message over the fetched
bytes (zero-copy when uncompressed).

Records travel between writer, codec and reader as either a ``binary`` array of values (what
bytes-batch-v1 holds) or a record batch of :data:`V2_SCHEMA`.
"""

from __future__ import annotations

import functools
import json
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from llog.errors import CorruptBatch, EmptyAppend, InvalidPayload
from llog.records import BYTES_BATCH_V1, RECORDS_V2

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
V2_MAGIC = b"LLR2"
V2_HEADER = struct.Struct("<4sIIBBH")  # magic, count, CRC-32 of bytes [12:], compression, columns, zero
V2_HEADER_SIZE = V2_HEADER.size
#: records-v2's compression byte, by Kafka's ``compression.type`` name; ordered weakest first.
COMPRESSION_CODES = {"none": 0, "lz4": 1, "zstd": 2}
_COMPRESSION_NAMES = {code: name for name, code in COMPRESSION_CODES.items()}
_ARROW_CODECS = {"none": None, "lz4": "lz4", "zstd": "zstd"}
#: One header: a UTF-8 key (never null) and a value (null allowed).
HEADERS_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
#: The columns of a records-v2 body, in order (docs/protocol.md section 11.3).
V2_SCHEMA = pa.schema([
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("headers", HEADERS_TYPE),
    pa.field("timestamp", pa.int64()),
])
#: records-v2's byte 13: bit ``i`` set when column ``i`` of :data:`V2_SCHEMA` is in the message.
_VALUE_BIT = 1 << 1
_ALL_COLUMNS = (1 << len(V2_SCHEMA)) - 1
#: What a batch of records is between writer, codec and reader: values only, or every field.
Records = pa.BinaryArray | pa.RecordBatch
_MAX_U32 = 0xFFFFFFFF
_BYTES_LIKE = (bytes, bytearray, memoryview)


# --- record values ------------------------------------------------------------------------------


def to_binary_array(values: object, what: str = "records", nulls: bool = False) -> pa.BinaryArray:
    """Turn record values into one Arrow ``binary`` array, non-null unless ``nulls``.

    Accepts a sequence of bytes-like objects (and ``None`` with ``nulls``), or an Arrow
    binary/large_binary array or chunked array. Anything else (``str``, numbers) raises
    :class:`InvalidPayload` naming the first offending record; an empty input raises
    :class:`EmptyAppend`.
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
        allowed = {bytes, bytearray, memoryview, type(None)} if nulls else {bytes, bytearray, memoryview}
        if not kinds <= allowed:
            bad = next((i for i, v in enumerate(values) if not (isinstance(v, _BYTES_LIKE) or (nulls and v is None))),
                       None)
            if bad is not None:
                raise InvalidPayload(
                    f"{what}[{bad}] is {type(values[bad]).__name__}, not bytes"
                    + (" (encode text first, e.g. value.encode('utf-8'))" if isinstance(values[bad], str) else "")
                )
        plain = kinds <= {bytes, type(None)}
        array = pa.array(values if plain else [None if v is None else bytes(v) for v in values], type=pa.binary())
    if len(array) == 0:
        raise EmptyAppend(f"{what} must hold at least one record")
    if array.null_count and not nulls:
        first = array.is_null().to_numpy(zero_copy_only=False).argmax()
        raise InvalidPayload(f"{what}[{first}] is null; llog records are non-null bytes")
    return array


# --- records: what writers take -------------------------------------------------------------


def to_records(values: object, keys: object = None, headers: object = None, timestamps: object = None,
               what: str = "records", max_record_bytes: int | None = None) -> Records:
    """Check one group's records and put them in the form the codec takes: a ``binary`` array of
    values when every record is a non-null value alone (bytes-batch-v1 holds it), else a batch of
    :data:`V2_SCHEMA` (docs/protocol.md section 11).

    ``values``: bytes (``None``: a tombstone). ``keys``: bytes or ``str`` (UTF-8), ``None`` for
    no key. ``headers``: per record ``None`` or a list of ``(key, value)`` pairs (key ``str`` or
    UTF-8 bytes, value bytes or ``None``), or an Arrow array of :data:`HEADERS_TYPE`.
    ``timestamps``: event times, ints in ms since the epoch (``None``: none), or an Arrow
    integer or timestamp array. Each a sequence or an Arrow array, as long as ``values``; a
    column that is all null counts as absent. Bad input raises :class:`InvalidPayload` naming
    the record, a record over ``max_record_bytes`` (key, value and headers) too; all before any
    I/O.
    """
    value_array = to_binary_array(values, f"{what}.records", nulls=True)
    n = len(value_array)
    key_array = _optional_column(keys, n, f"{what}.keys", _keys_array)
    header_array = _optional_column(headers, n, f"{what}.headers", _headers_array)
    time_array = _optional_column(timestamps, n, f"{what}.timestamps", _timestamps_array)
    if max_record_bytes is not None and _data_bytes_at_most(value_array, key_array, header_array) > max_record_bytes:
        sizes = _binary_lengths(value_array)
        if key_array is not None:
            sizes += _binary_lengths(key_array)
        if header_array is not None:
            sizes += _header_bytes(header_array)
        if len(sizes) and int(sizes.max()) > max_record_bytes:
            big = int(sizes.argmax())
            raise InvalidPayload(f"{what}: record {big} is {int(sizes[big])} bytes (key, value and headers), over the "
                                 f"{max_record_bytes}-byte limit (LLOG_MAX_RECORD_BYTES)")
    if key_array is None and header_array is None and time_array is None and not value_array.null_count:
        return value_array
    return pa.RecordBatch.from_arrays([
        key_array if key_array is not None else nulls(pa.binary(), n),
        value_array,
        header_array if header_array is not None else nulls(HEADERS_TYPE, n),
        time_array if time_array is not None else nulls(pa.int64(), n),
    ], schema=V2_SCHEMA)


def _optional_column(column: object, n: int, what: str, convert) -> pa.Array | None:
    """``convert(column)`` checked to be ``n`` long; None for no column or an all-null one."""
    if column is None:
        return None
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if not isinstance(column, pa.Array) and (isinstance(column, (str, *_BYTES_LIKE)) or not isinstance(column, Sequence)):
        raise InvalidPayload(f"{what} must be a sequence or an Arrow array, got {type(column).__name__}")
    if len(column) != n:
        raise InvalidPayload(f"{what} holds {len(column)} entries for {n} records")
    array = convert(column, what)
    return None if array.null_count == n else array


def _first_bad(items: Sequence, ok) -> int:
    return next((i for i, v in enumerate(items) if not ok(v)), 0)


def _keys_array(keys: object, what: str) -> pa.BinaryArray:
    if isinstance(keys, pa.Array):
        if pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type) or pa.types.is_large_binary(keys.type):
            return keys.cast(pa.binary())
        if not pa.types.is_binary(keys.type):
            raise InvalidPayload(f"{what} must be an Arrow binary or string array, got type {keys.type}")
        return keys
    try:
        return pa.array([k.encode() if isinstance(k, str) else k for k in keys], type=pa.binary())
    except (pa.ArrowException, TypeError):
        bad = _first_bad(keys, lambda k: k is None or isinstance(k, (str, *_BYTES_LIKE)))
        raise InvalidPayload(f"{what}[{bad}] is {type(keys[bad]).__name__}, not bytes or str") from None


def _headers_array(headers: object, what: str) -> pa.ListArray:
    if isinstance(headers, pa.Array):
        try:
            array = headers.cast(HEADERS_TYPE)
        except (pa.ArrowException, TypeError, ValueError):
            raise InvalidPayload(f"{what} must be an Arrow array of {HEADERS_TYPE}, got type {headers.type}") from None
    else:
        try:
            if isinstance(headers, (str, *_BYTES_LIKE)) or any(
                    isinstance(h, (str, *_BYTES_LIKE, dict)) for h in headers if h is not None):
                raise TypeError("a record's headers must be a list of pairs")
            array = pa.array([None if h is None else [_header(pair) for pair in h] for h in headers], type=HEADERS_TYPE)
        except (pa.ArrowException, TypeError, ValueError):
            raise InvalidPayload(_bad_headers(headers, what)) from None
    items = array.flatten()
    if items.null_count or items.field(0).null_count:
        offsets = _list_offsets(array)
        bad = int(np.searchsorted(offsets - offsets[0], int(np.argmax(
            items.is_null().to_numpy(zero_copy_only=False) | items.field(0).is_null().to_numpy(zero_copy_only=False))),
            side="right")) - 1
        raise InvalidPayload(f"{what}[{bad}] has a null header or a header with a null key")
    try:
        array.validate(full=True)
    except pa.ArrowInvalid:
        raise InvalidPayload(_bad_headers(array.to_pylist(), what)) from None
    return array


def _unpacked(pair: object) -> object:
    """A ``{"key", "value"}`` dict (what Arrow's ``to_pylist`` gives back) as a pair; anything
    else as it is."""
    return (pair.get("key"), pair.get("value")) if isinstance(pair, dict) and set(pair) <= {"key", "value"} else pair


def _header(pair: object) -> tuple[object, object]:
    """One header as a ``(key, value)`` tuple, from a pair or a dict (:func:`_unpacked`); key
    ``str`` or bytes, value bytes or None."""
    pair = _unpacked(pair)
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise TypeError("not a pair")
    key, value = pair
    if not isinstance(key, (str, *_BYTES_LIKE)) or not (value is None or isinstance(value, _BYTES_LIKE)):
        raise TypeError("not a str key and bytes value")
    return key, value


def _bad_headers(headers: Sequence, what: str) -> str:
    """The message naming the first malformed record of a headers column (the error path only)."""
    for i, h in enumerate(headers):
        if h is None:
            continue
        if isinstance(h, (str, *_BYTES_LIKE, dict)) or not isinstance(h, Sequence):
            return f"{what}[{i}] must be a list of (key, value) pairs, got {type(h).__name__}"
        for pair in map(_unpacked, h):
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                return f"{what}[{i}] holds {pair!r}, not a (key, value) pair"
            key, value = pair
            if isinstance(key, _BYTES_LIKE):
                try:
                    bytes(key).decode("utf-8")
                except UnicodeDecodeError:
                    return f"{what}[{i}] has a header key that is not UTF-8: {bytes(key)!r}"
            elif not isinstance(key, str):
                return f"{what}[{i}] has a header key of type {type(key).__name__}, not str"
            if value is not None and not isinstance(value, _BYTES_LIKE):
                return f"{what}[{i}] has a header value of type {type(value).__name__}, not bytes"
    return f"{what} cannot be read as lists of (str key, bytes value) pairs"


def _timestamps_array(timestamps: object, what: str) -> pa.Int64Array:
    if isinstance(timestamps, pa.Array):
        if pa.types.is_timestamp(timestamps.type) and timestamps.type.unit == "s":
            array, per_ms = pc.multiply_checked(timestamps.cast(pa.int64()), 1000), 1
        elif pa.types.is_timestamp(timestamps.type):
            array, per_ms = timestamps.cast(pa.int64()), _TICKS_PER_MS[timestamps.type.unit]
        elif pa.types.is_integer(timestamps.type):
            array, per_ms = timestamps.cast(pa.int64()), 1
        else:
            raise InvalidPayload(f"{what} must be an Arrow integer (ms) or timestamp array, got type {timestamps.type}")
    else:
        try:
            array, per_ms = pa.array(timestamps, type=pa.int64()), 1
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            bad = _first_bad(timestamps, lambda t: t is None or (isinstance(t, int) and not isinstance(t, bool)))
            raise InvalidPayload(f"{what}[{bad}] is {timestamps[bad]!r}, not an int of ms since the epoch") from None
    lowest = pc.min(array).as_py()
    if lowest is not None and lowest < 0:
        bad = int(np.argmax(array.fill_null(0).to_numpy() < 0))
        raise InvalidPayload(f"{what}[{bad}] is {lowest / per_ms:g} ms, before the epoch")
    return array if per_ms == 1 else pc.divide(array, per_ms)  # integer division: floors, as none is negative


#: Ticks of each Arrow timestamp unit (but seconds) per millisecond.
_TICKS_PER_MS = {"ms": 1, "us": 1_000, "ns": 1_000_000}


def _list_offsets(array: pa.ListArray) -> np.ndarray:
    return np.frombuffer(array.buffers()[1], dtype=np.int32, count=len(array) + 1, offset=4 * array.offset)


def binary_bytes(array: pa.Array) -> int:
    """Bytes of the slots of a binary or string array (or a slice of one), from its offsets."""
    if not len(array):
        return 0
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int32, count=len(array) + 1, offset=4 * array.offset)
    return int(offsets[-1] - offsets[0])


def _binary_lengths(array: pa.Array) -> np.ndarray:
    """Bytes of each slot of a binary or string array (0 for a null)."""
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int32, count=len(array) + 1, offset=4 * array.offset)
    return np.diff(offsets).astype(np.int64)


def _data_bytes_at_most(values: pa.BinaryArray, keys: pa.BinaryArray | None, headers: pa.ListArray | None) -> int:
    """A cheap upper bound of the bytes of any one record: the sizes of the data buffers of the
    values, keys, header keys and header values together (whole buffers, also of slices).
    Records are measured one by one only past it."""
    arrays = [values] + ([keys] if keys is not None else [])
    if headers is not None:
        arrays += [headers.values.field(0), headers.values.field(1)]
    return sum(0 if (data := a.buffers()[2]) is None else data.size for a in arrays)


def _header_bytes(headers: pa.ListArray) -> np.ndarray:
    """Bytes of each record's header keys and values."""
    items = headers.values  # every item the offsets can reach, not only this slice's
    per_item = _binary_lengths(items.field(0)) + _binary_lengths(items.field(1))
    cumulative = np.concatenate([[0], np.cumsum(per_item)])
    offsets = _list_offsets(headers)
    return cumulative[offsets[1:]] - cumulative[offsets[:-1]]


_NULL_ARRAYS: dict[pa.DataType, pa.Array] = {}


def nulls(kind: pa.DataType, n: int) -> pa.Array:
    """``n`` nulls of type ``kind``: a slice of one array kept per type (records without keys,
    headers or event times are read and built often, and allocating the nulls each time would
    cost more than the rest)."""
    cached = _NULL_ARRAYS.get(kind)
    if cached is None or len(cached) < n:
        cached = _NULL_ARRAYS[kind] = pa.nulls(max(n, 1 << 16), kind)
    return cached.slice(0, n)


def as_v2(records: Records) -> pa.RecordBatch:
    """``records`` as a batch of :data:`V2_SCHEMA` (values alone get null keys, headers and times)."""
    if isinstance(records, pa.RecordBatch):
        return records
    n = len(records)
    return pa.RecordBatch.from_arrays(
        [nulls(pa.binary(), n), records, nulls(HEADERS_TYPE, n), nulls(pa.int64(), n)], schema=V2_SCHEMA)


def concat_records(parts: Sequence[Records]) -> Records:
    """One batch of records from several, in order: a values array if every part is one."""
    if len(parts) == 1:
        return parts[0]
    if all(isinstance(p, pa.Array) for p in parts):
        return pa.concat_arrays(parts)
    return pa.Table.from_batches([as_v2(p) for p in parts], schema=V2_SCHEMA).combine_chunks().to_batches()[0]


def record_count(records: Records) -> int:
    return records.num_rows if isinstance(records, pa.RecordBatch) else len(records)


# --- bytes-batch-v1 -----------------------------------------------------------------------------


@dataclass(frozen=True)
class EncodedBatch:
    """One body as the pieces to write back to back (no copy made yet)."""

    pieces: tuple[object, ...]
    length: int
    count: int
    encoding: str = BYTES_BATCH_V1

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


# --- records-v2 ---------------------------------------------------------------------------------


def encode_body(records: Records, compression: str = "none") -> EncodedBatch:
    """The body for ``records``: bytes-batch-v1 for values alone without compression,
    records-v2 otherwise (docs/protocol.md section 11.2)."""
    if isinstance(records, pa.Array) and compression == "none":
        return encode_batch(records)
    return encode_records_v2(as_v2(records), compression)


@functools.lru_cache(maxsize=None)
def _schema(columns: int) -> pa.Schema:
    """The schema of a message holding the columns whose bits are set in ``columns``."""
    return pa.schema([f for i, f in enumerate(V2_SCHEMA) if columns >> i & 1])


@functools.lru_cache(maxsize=None)
def _options(compression: str, columns: int) -> tuple[ipc.IpcWriteOptions, int]:
    """IPC write options for ``compression``, and the bytes an IPC stream of those columns
    spends before its first record batch message (the schema message)."""
    if compression not in COMPRESSION_CODES:
        raise InvalidPayload(f"unknown compression {compression!r}; use one of {', '.join(COMPRESSION_CODES)}")
    options = ipc.IpcWriteOptions(compression=_ARROW_CODECS[compression])
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, _schema(columns), options=options):
        pass
    return options, sink.getvalue().size - 8  # an empty stream: the schema, then the 8-byte end marker


def encode_records_v2(batch: pa.RecordBatch, compression: str = "none") -> EncodedBatch:
    """Encode a batch of :data:`V2_SCHEMA` as a records-v2 body (docs/protocol.md section 11.3):
    the value column and every other column that is not null in every record; Arrow writes a
    stream of them, and the body keeps the stream's record batch message only."""
    n = batch.num_rows
    if not batch.schema.equals(V2_SCHEMA):
        batch = batch.cast(V2_SCHEMA)
    columns = _VALUE_BIT | sum(1 << i for i in (0, 2, 3) if batch.column(i).null_count < n)
    options, schema_length = _options(compression, columns)
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, _schema(columns), options=options) as stream:
        stream.write_batch(pa.RecordBatch.from_arrays([batch.column(i) for i in range(len(V2_SCHEMA)) if columns >> i & 1],
                                                      schema=_schema(columns)))
    written = sink.getvalue()
    message = memoryview(written.slice(schema_length, written.size - schema_length - 8))
    code = COMPRESSION_CODES[compression]
    tail = struct.pack("<BBH", code, columns, 0)
    header = V2_HEADER.pack(V2_MAGIC, n, crc32(message, crc32(tail)), code, columns, 0)
    return EncodedBatch((header, message), V2_HEADER_SIZE + len(message), n, RECORDS_V2)


def body_compression(body: bytes | memoryview) -> str:
    """The compression a records-v2 body's header names (its byte 12)."""
    code = memoryview(body).cast("B")[12]
    return _COMPRESSION_NAMES.get(code, "unknown")


def decode_records_v2(body: bytes | memoryview, expected_count: int | None = None, where: str = "batch"
                      ) -> pa.RecordBatch:
    """Decode a whole records-v2 body into a batch of :data:`V2_SCHEMA` over the body's bytes
    (uncompressed buffers are not copied). Checks everything docs/protocol.md section 11.3 lists."""
    view = memoryview(body).cast("B")
    if len(view) < V2_HEADER_SIZE:
        raise CorruptBatch(f"{where}: {len(view)} bytes is too short for a records-v2 header")
    magic, count, crc, code, columns, zero = V2_HEADER.unpack_from(view, 0)
    if magic != V2_MAGIC:
        raise CorruptBatch(f"{where}: wrong magic {bytes(magic)!r}, expected {V2_MAGIC!r}")
    if expected_count is not None and count != expected_count:
        raise CorruptBatch(f"{where}: body holds {count} records, the index says {expected_count}")
    actual = crc32(view[12:])
    if actual != crc:
        raise CorruptBatch(f"{where}: CRC mismatch (stored {crc:#010x}, computed {actual:#010x})")
    if code not in _COMPRESSION_NAMES:
        raise CorruptBatch(f"{where}: bad compression byte {code:#04x}")
    if columns & ~_ALL_COLUMNS or not columns & _VALUE_BIT or zero:
        raise CorruptBatch(f"{where}: bad column bytes {bytes(view[13:16]).hex()} (byte 13 names the columns, with "
                           f"value; bytes 14..15 are zero)")
    buffer = pa.py_buffer(view[V2_HEADER_SIZE:])
    try:
        message = ipc.read_message(buffer)
        if message.type != "record batch":
            raise CorruptBatch(f"{where}: the IPC message is a {message.type}, not a record batch")
        if 8 + message.metadata.size + message.body.size != buffer.size:
            raise CorruptBatch(f"{where}: the IPC message takes {8 + message.metadata.size + message.body.size} of "
                               f"the body's {buffer.size} bytes after the header")
        batch = ipc.read_record_batch(message, _schema(columns))
        batch.validate(full=True)
    except (pa.ArrowException, OSError, ValueError, EOFError) as e:
        raise CorruptBatch(f"{where}: malformed records-v2 message: {e or type(e).__name__}") from None
    if batch.num_rows != count:
        raise CorruptBatch(f"{where}: the record batch holds {batch.num_rows} records, the header says {count}")
    if columns == _ALL_COLUMNS:
        return batch
    present = iter(batch.columns)
    return pa.RecordBatch.from_arrays([next(present) if columns >> i & 1 else nulls(f.type, count)
                                       for i, f in enumerate(V2_SCHEMA)], schema=V2_SCHEMA)


def decode_body(encoding: str, body: bytes | memoryview, expected_count: int | None = None, where: str = "batch"
                ) -> Records:
    """Decode a whole body of either encoding: a values array (bytes-batch-v1) or a batch of
    :data:`V2_SCHEMA` (records-v2)."""
    if encoding == BYTES_BATCH_V1:
        return decode_batch(body, expected_count, where)
    if encoding == RECORDS_V2:
        return decode_records_v2(body, expected_count, where)
    raise CorruptBatch(f"{where}: unknown encoding {encoding!r} (this llog reads {BYTES_BATCH_V1}, {RECORDS_V2})")


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
            slices.append(SharedSlice(topic, partition, body.count, position, body.length, body.encoding))
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
