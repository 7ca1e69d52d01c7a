"""Kafka record batches (magic 2) to llog records and back: the ``records`` field of one
partition in a Produce request, and in a Fetch response.

A Kafka record becomes a records-v2 record (docs/protocol.md section 11.1): its key, value
(null: a tombstone), headers (none: null) and timestamp (CreateTime: as the client sent it;
LogAppendTime or Kafka's -1: null, the entry's ``created_at_ms``). A fetched batch is one
RecordBatch v2 at llog's offsets (Kafka offset N is llog offset N).

aiokafka's Cython codec (``aiokafka.record._crecords``) reads and builds the records and
``aiokafka.codec`` (cramjam, gzip) does the compression; this module checks what Kafka's broker
checks before it trusts a batch, and turns records into Arrow columns and back.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import cramjam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from aiokafka.codec import lz4_encode, snappy_encode, zstd_encode
from aiokafka.errors import UnsupportedCodecError
from aiokafka.record._crecords.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from isal import igzip

from llog.codec import HEADERS_TYPE, V2_SCHEMA, Records, as_v2, nulls, record_count
from llog.errors import LlogError

try:  # the crc32c package (a dependency of kio): hardware CRC-32C, about 12x aiokafka's here
    from crc32c import crc32c
except ImportError:  # pragma: no cover
    from aiokafka.record._crecords.cutil import crc32c_cython as crc32c

# Kafka's error codes (org.apache.kafka.common.protocol.Errors) that a batch can earn.
CORRUPT_MESSAGE = 2
MESSAGE_TOO_LARGE = 10
INVALID_TIMESTAMP = 32
UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
UNSUPPORTED_COMPRESSION_TYPE = 76
INVALID_RECORD = 87

#: A RecordBatch's header, through its record count (Kafka's DefaultRecordBatch): base offset,
#: batch length (of the bytes after it), partition leader epoch, magic, CRC-32C (of the bytes
#: from the attributes on), attributes, last offset delta, first timestamp, max timestamp,
#: producer id, producer epoch, base sequence, record count.
BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
BATCH_HEADER_SIZE = BATCH_HEADER.size  # 61
_LENGTH_END = 12  # base offset and batch length: the bytes the batch length does not count
_LEADER_EPOCH = struct.Struct(">i")
_CRC_AT = 17
_ATTRIBUTES_AT = 21
_MAX_TIMESTAMP_AT = 35
#: Attribute bits: the codec (0..2), LogAppendTime (3), transactional (4), control (5).
_CODEC_MASK = 0x07
LOG_APPEND_TIME = 0x08
_TRANSACTIONAL = 0x10
_CONTROL = 0x20
#: Kafka's ``compression.type`` names by attribute code.
CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
_CODE_OF = {name: code for code, name in CODECS.items()}
NO_TIMESTAMP = -1  # Kafka's "no timestamp" (RecordBatch.NO_TIMESTAMP)
_UNBOUNDED = (1 << 31) - 1  # the builder's batch size: ours is whatever the records take
#: What a fetched batch's records are compressed with, by codec: fast settings, as a fetch
#: compresses on every read (gzip: ISA-L level 1, about 25x zlib's level 6 here at 1.7x the size;
#: lz4: level 1, as Kafka's level 9 costs 45x for 1.4x; zstd: Kafka's default level 3).
_COMPRESSORS = {
    1: lambda data: igzip.compress(data, 1),
    2: snappy_encode,  # xerial framing, what Kafka's Java clients read
    3: lambda data: lz4_encode(bytes(data), 1),  # cramjam's lz4 Compressor takes bytes only
    4: zstd_encode,
}


class KafkaBatchError(LlogError, ValueError):
    """A record batch Kafka's broker would refuse, with the error code it would answer."""

    code = CORRUPT_MESSAGE

    def __init__(self, message: str, code: int | None = None):
        if code is not None:
            self.code = code
        self.message = message
        super().__init__(message)


class CorruptMessage(KafkaBatchError):
    """CORRUPT_MESSAGE (2): the bytes are not a well-formed batch (CRC, lengths, counts, offsets)."""

    code = CORRUPT_MESSAGE


class InvalidRecord(KafkaBatchError):
    """INVALID_RECORD (87): a well-formed batch llog refuses (several batches, none, a bad header key)."""

    code = INVALID_RECORD


class MessageTooLarge(KafkaBatchError):
    """MESSAGE_TOO_LARGE (10): a record over ``LLOG_MAX_RECORD_BYTES``."""

    code = MESSAGE_TOO_LARGE


class InvalidTimestamp(KafkaBatchError):
    """INVALID_TIMESTAMP (32): a record timestamp below -1 (Kafka's "none")."""

    code = INVALID_TIMESTAMP


class UnsupportedForMessageFormat(KafkaBatchError):
    """UNSUPPORTED_FOR_MESSAGE_FORMAT (43): a control or transactional batch (no transactions here)."""

    code = UNSUPPORTED_FOR_MESSAGE_FORMAT


class UnsupportedCompressionType(KafkaBatchError):
    """UNSUPPORTED_COMPRESSION_TYPE (76): a codec Kafka does not define."""

    code = UNSUPPORTED_COMPRESSION_TYPE


@dataclass(frozen=True)
class ProducedBatch:
    """One partition's records of a Produce request, checked and turned into llog records.

    ``records`` is always a batch of :data:`llog.codec.V2_SCHEMA` (Kafka producers send
    timestamps); pass its columns to :class:`llog.writer.AppendGroup` (``records=value``,
    ``keys``, ``headers``, ``timestamps``): the writer drops all-null columns itself.
    """

    records: pa.RecordBatch
    count: int
    producer_id: int  # -1: not idempotent
    producer_epoch: int
    base_sequence: int  # -1: not idempotent
    max_timestamp: int  # of the records' timestamps; -1 when none has one
    compression: str  # the client's codec: none, gzip, snappy, lz4 or zstd


def decode_produced(data: bytes | memoryview | None, max_record_bytes: int,
                    max_batch_bytes: int = 8 * 1024 * 1024) -> ProducedBatch:
    """Check and decode one partition's ``records`` bytes of a Produce request (v3+): exactly one
    RecordBatch of magic 2, neither control nor transactional, each record at most
    ``max_record_bytes`` (key, value, header keys and values), a compressed batch's records at
    most ``max_batch_bytes`` once decompressed (a small batch may decompress to gigabytes: it
    is refused before it is held). Raises a :class:`KafkaBatchError` naming the problem, with
    the error code Kafka's broker would answer."""
    if data is None or len(data) == 0:
        raise InvalidRecord("the records field is null or empty: a Produce request carries one record batch a partition")
    view = memoryview(data).cast("B")
    if len(view) < BATCH_HEADER_SIZE:
        raise CorruptMessage(f"{len(view)} bytes is too short for a record batch header ({BATCH_HEADER_SIZE} bytes)")
    (base_offset, length, _, magic, crc, attributes, last_delta, _, _, producer_id, producer_epoch,
     base_sequence, count) = BATCH_HEADER.unpack_from(view, 0)
    if magic != 2:
        raise CorruptMessage(f"record batch magic is {magic}; Produce v3 and later carry magic 2 only")
    if length < BATCH_HEADER_SIZE - _LENGTH_END:
        raise CorruptMessage(f"batch length {length} is shorter than the batch header's "
                             f"{BATCH_HEADER_SIZE - _LENGTH_END} bytes")
    end = _LENGTH_END + length
    if end > len(view):
        raise CorruptMessage(f"batch length {length} needs {end} bytes, the records field holds {len(view)}: truncated")
    if end < len(view):
        rest = view[end:]
        if len(rest) >= BATCH_HEADER_SIZE and rest[16] == 2:
            raise InvalidRecord(f"the records field holds more than one record batch (the first ends at byte {end} "
                                f"of {len(view)}); a Produce request carries one batch a partition")
        raise CorruptMessage(f"batch length {length} ends the batch at byte {end}, the records field holds "
                             f"{len(view)} bytes")
    actual = crc32c(view[_ATTRIBUTES_AT:end])
    if actual != crc:
        raise CorruptMessage(f"record batch CRC-32C mismatch (stored {crc:#010x}, computed {actual:#010x})")
    if attributes & _CONTROL:
        raise UnsupportedForMessageFormat("a control batch (transaction marker) cannot be produced to llog")
    if attributes & _TRANSACTIONAL:
        raise UnsupportedForMessageFormat("a transactional batch: this listener does not serve transactions")
    codec = attributes & _CODEC_MASK
    if codec not in CODECS:
        raise UnsupportedCompressionType(f"unknown compression codec {codec} in the batch attributes "
                                         f"(Kafka defines 0..4: {', '.join(CODECS.values())})")
    # A batch whose CRC holds but whose counts disagree was built wrong, not damaged on the way:
    # INVALID_RECORD, which clients do not retry (CORRUPT_MESSAGE they do), as Kafka's broker.
    if count <= 0:
        if count == 0:
            raise InvalidRecord("the record batch holds no records")
        raise InvalidRecord(f"record count {count} is negative")
    if last_delta + 1 != count:
        raise InvalidRecord(f"record count {count} disagrees with the last offset delta {last_delta} "
                             f"(which says {last_delta + 1} records)")
    batch_bytes = bytes(view[:end]) if not codec else _decompressed(view, end, codec, max_batch_bytes)
    records = _read_records(batch_bytes, count)
    offsets = [r.offset for r in records]
    if offsets != list(range(base_offset, base_offset + count)):
        first = next(i for i, o in enumerate(offsets) if o != base_offset + i)
        raise InvalidRecord(f"record {first} has offset delta {offsets[first] - base_offset}, expected {first} "
                             f"(deltas run 0..{count - 1})")
    batch = _columns(records, count, append_time=bool(attributes & LOG_APPEND_TIME))
    _check_sizes(batch, max_record_bytes)
    top = pc.max(batch.column(3)).as_py()
    return ProducedBatch(batch, count, producer_id, producer_epoch, base_sequence,
                         NO_TIMESTAMP if top is None else top, CODECS[codec])


_XERIAL = b"\x82SNAPPY\x00"
_XERIAL_HEADER = 16


def _decompressed(view: memoryview, end: int, codec: int, limit: int) -> bytes:
    """The batch (``view[:end]``, CRC checked) with its records decompressed and its codec
    cleared, for aiokafka's reader; its records at most ``limit`` bytes decompressed, checked
    while decompressing (into a buffer that size at most) or, for snappy, by the lengths its
    blocks declare before any is decompressed."""
    payload = view[BATCH_HEADER_SIZE:end]
    try:
        if codec == 2:
            records = _snappy(payload, limit)
        else:
            module = {1: cramjam.gzip, 3: cramjam.lz4, 4: cramjam.zstd}[codec]
            records = _bounded(module, payload, limit)
    except KafkaBatchError:
        raise
    except Exception as e:  # noqa: BLE001 - cramjam's DecompressionError and struct errors alike
        raise CorruptMessage(f"the batch's {CODECS[codec]} records cannot be decompressed "
                             f"({type(e).__name__}: {e})") from None
    out = bytearray(view[:BATCH_HEADER_SIZE])
    struct.pack_into(">h", out, _ATTRIBUTES_AT, struct.unpack_from(">h", out, _ATTRIBUTES_AT)[0] & ~_CODEC_MASK)
    out += records
    struct.pack_into(">i", out, 8, len(out) - _LENGTH_END)
    return bytes(out)


def _too_large(limit: int) -> MessageTooLarge:
    return MessageTooLarge(f"the batch's records decompress to more than {limit} bytes "
                           "(LLOG_BROKER_MAX_REQUEST_BYTES); send smaller batches")


def _bounded(module, payload: memoryview, limit: int) -> bytes:
    """``payload`` decompressed into a buffer of at most ``limit`` bytes: first one sized for a
    usual ratio, then, when that is too small, one of ``limit`` (cramjam refuses to write past a
    buffer's end)."""
    for size in dict.fromkeys((min(limit, max(64 * 1024, 16 * len(payload))), limit)):
        buffer = bytearray(size)
        try:
            written = module.decompress_into(payload, buffer)
        except cramjam.DecompressionError as e:
            if "whole buffer" not in str(e) and "too small" not in str(e):
                raise
            continue
        return bytes(memoryview(buffer)[:written])
    raise _too_large(limit)


def _snappy(payload: memoryview, limit: int) -> bytes:
    """Raw snappy, or xerial's framing of it (Kafka's Java clients): every block's declared length
    summed and checked before any block is decompressed."""
    if bytes(payload[:len(_XERIAL)]) != _XERIAL:
        if cramjam.snappy.decompress_raw_len(payload) > limit:
            raise _too_large(limit)
        return bytes(cramjam.snappy.decompress_raw(payload))
    blocks, at, total = [], _XERIAL_HEADER, 0
    while at < len(payload):
        (size,) = struct.unpack_from(">i", payload, at)
        if size < 0 or at + 4 + size > len(payload):
            raise CorruptMessage(f"a snappy block of {size} bytes at byte {at} runs past the batch")
        block = payload[at + 4:at + 4 + size]
        total += cramjam.snappy.decompress_raw_len(block)
        if total > limit:
            raise _too_large(limit)
        blocks.append(block)
        at += 4 + size
    return b"".join(bytes(cramjam.snappy.decompress_raw(b)) for b in blocks)


def _read_records(batch_bytes: bytes, count: int) -> list:
    """aiokafka's records of a CRC-checked batch. Its reader, and gzip and cramjam under it,
    raise a zoo of exception types on malformed bytes (CorruptRecordException, struct.error,
    EOFError, OSError, cramjam's DecompressionError, ...): any of them means the same thing here."""
    try:
        return list(DefaultRecordBatch(batch_bytes))
    except UnicodeDecodeError:
        index = _first_unreadable(batch_bytes)
        raise InvalidRecord(f"record {index} has a header key that is not UTF-8") from None
    except UnsupportedCodecError as e:  # pragma: no cover - every codec 0..4 is installed (cramjam)
        raise UnsupportedCompressionType(f"cannot decompress the batch: {e}") from None
    except Exception as e:  # noqa: BLE001 - see the docstring
        raise CorruptMessage(f"malformed records in the batch ({type(e).__name__}: {e})") from None


def _first_unreadable(batch_bytes: bytes) -> int:
    """The index of the record aiokafka's reader fails on (the error path only)."""
    index = 0
    try:
        for _ in DefaultRecordBatch(batch_bytes):
            index += 1
    except Exception:  # noqa: BLE001 - the failing record is what we are looking for
        pass
    return index


def _columns(records: list, count: int, append_time: bool) -> pa.RecordBatch:
    """The records as a batch of :data:`V2_SCHEMA`: one ``pa.array`` call a column, and the
    constant null column when no record has headers (the common case)."""
    values = pa.array([r.value for r in records], pa.binary())
    keys = [r.key for r in records]
    keys = pa.array(keys, pa.binary()) if any(k is not None for k in keys) else nulls(pa.binary(), count)
    headers = [r.headers for r in records]
    # Kafka cannot tell empty headers from none: zero headers read as null (no headers).
    headers = (pa.array([h or None for h in headers], HEADERS_TYPE) if any(headers)
               else nulls(HEADERS_TYPE, count))
    if append_time:
        timestamps = nulls(pa.int64(), count)
    else:
        times = [r.timestamp for r in records]
        lowest = min(times)
        if lowest < NO_TIMESTAMP:
            index = times.index(lowest)
            raise InvalidTimestamp(f"record {index} has timestamp {lowest}; Kafka timestamps are ms since the "
                                   f"epoch, or -1 for none")
        timestamps = pa.array(times, pa.int64())
        if lowest == NO_TIMESTAMP:
            timestamps = pc.if_else(pc.equal(timestamps, NO_TIMESTAMP), None, timestamps)
    return pa.RecordBatch.from_arrays([keys, values, headers, timestamps], schema=V2_SCHEMA)


def _lengths(array: pa.Array) -> np.ndarray:
    """Bytes of each slot of a binary or string array (0 for a null)."""
    return pc.binary_length(array).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)


def _check_sizes(batch: pa.RecordBatch, max_record_bytes: int) -> None:
    """Refuse a record whose key, value, header keys and header values (docs/protocol.md 11.1)
    pass ``max_record_bytes``, naming the first such record. All the bytes together bound each
    record's, so records are measured one by one only past that."""
    keys, values, headers, _ = batch.columns
    items = headers.flatten()
    parts = [keys, values, items.field(0), items.field(1)]
    if sum(0 if (data := a.buffers()[2]) is None else data.size for a in parts) <= max_record_bytes:
        return
    sizes = _lengths(keys) + _lengths(values)
    if len(items):
        per_item = np.concatenate([[0], np.cumsum(_lengths(items.field(0)) + _lengths(items.field(1)))])
        offsets = headers.offsets.to_numpy()
        sizes += per_item[offsets[1:] - offsets[0]] - per_item[offsets[:-1] - offsets[0]]
    big = int(np.argmax(sizes > max_record_bytes))
    if sizes[big] > max_record_bytes:
        raise MessageTooLarge(f"record {big} is {int(sizes[big])} bytes (key, value and headers), over the "
                              f"{max_record_bytes}-byte limit (LLOG_MAX_RECORD_BYTES)")


def encode_fetched(records: Records, base_offset: int, append_time_ms: int, compression: str = "none") -> bytes:
    """One RecordBatch v2 (magic 2) holding ``records`` (a values array or a batch of
    :data:`V2_SCHEMA`, as llog's reader returns them) at offsets ``base_offset``.., producer id
    -1, partition leader epoch 0, compressed with ``compression`` (a Kafka codec name) when that
    makes it smaller.

    Timestamps: with no record timestamped the batch is LogAppendTime, its max timestamp
    ``append_time_ms`` (the entry's ``created_at_ms``), which Kafka clients read as every
    record's time; otherwise CreateTime, a record without a timestamp taking ``append_time_ms``.
    Null and empty headers both encode as zero headers.
    """
    code = _CODE_OF.get(compression)
    if code is None:
        raise UnsupportedCompressionType(f"unknown compression {compression!r}; use one of {', '.join(_CODE_OF)}")
    count = record_count(records)
    if count == 0:
        raise ValueError("a fetched record batch needs at least one record")
    builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, _UNBOUNDED)
    append = builder.append
    if isinstance(records, pa.Array):
        keys = headers = times = None
        values = records
    else:
        keys, values, headers, times = as_v2(records).columns
        keys = None if keys.null_count == count else keys
        headers = None if headers.null_count == count else headers
        times = None if times.null_count == count else times
    if keys is None and headers is None and times is None:  # values alone: the common case, one call a record
        for i, value in enumerate(values.to_pylist()):
            append(i, append_time_ms, None, value, [])
    else:
        key_list = keys.to_pylist() if keys is not None else [None] * count
        header_list = _header_pairs(headers) if headers is not None else [[]] * count
        time_list = (times.fill_null(append_time_ms).to_pylist() if times is not None else [append_time_ms] * count)
        for i, (key, value, hs, t) in enumerate(zip(key_list, values.to_pylist(), header_list, time_list)):
            append(i, t, key, value, hs)
    batch = builder.build()
    if struct.unpack_from(">i", batch, 23)[0] != count - 1:  # the builder drops what passes its 2 GiB size
        raise ValueError(f"{count} records do not fit in one Kafka record batch (2 GiB)")
    attributes = 0
    if code:  # compressed here, not by the builder: it has no level to set, and its gzip (level 9) is slow
        compressed = _COMPRESSORS[code](memoryview(batch)[BATCH_HEADER_SIZE:])
        if len(compressed) < len(batch) - BATCH_HEADER_SIZE:  # Kafka's rule too: compress only what shrinks
            del batch[BATCH_HEADER_SIZE:]
            batch += compressed
            struct.pack_into(">i", batch, 8, len(batch) - _LENGTH_END)
            attributes |= code
    if times is None:  # LogAppendTime: every record's time is the batch's max timestamp
        attributes |= LOG_APPEND_TIME
        struct.pack_into(">q", batch, _MAX_TIMESTAMP_AT, append_time_ms)
    struct.pack_into(">q", batch, 0, base_offset)
    _LEADER_EPOCH.pack_into(batch, _LENGTH_END, 0)
    if attributes:  # the CRC covers the attributes and everything after them
        struct.pack_into(">h", batch, _ATTRIBUTES_AT, attributes)
        struct.pack_into(">I", batch, _CRC_AT, crc32c(memoryview(batch)[_ATTRIBUTES_AT:]))
    return bytes(batch)


def _header_pairs(headers: pa.ListArray) -> list[list[tuple[str, bytes | None]]]:
    """Each record's headers as the builder takes them, ``[]`` for null: the items' keys and
    values listed once and sliced by the list offsets (a third of ``to_pylist``'s cost, which
    makes a dict an item)."""
    items = headers.values  # the whole child; the offsets of a slice point into it
    pairs = list(zip(items.field(0).to_pylist(), items.field(1).to_pylist()))
    offsets = headers.offsets.to_pylist()
    valid = headers.is_valid().to_pylist()
    return [pairs[offsets[i]:offsets[i + 1]] if valid[i] else [] for i in range(len(headers))]
