"""Kafka's default partitioner: murmur2 of the key, made positive, modulo the partition count.

Bit-exact with Kafka's ``Utils.murmur2`` and ``Utils.toPositive``, so a keyed record lands on the
partition Kafka would choose and a topic moved from Kafka keeps its key placement. Vectorised over
a pyarrow array of keys: the only Python loop is over 4-byte word rounds, not over records.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["murmur2", "murmur2_bytes", "to_positive", "kafka_partitions"]

_SEED = np.uint32(0x9747B28C)
_M = np.uint32(0x5BD1E995)
_R = np.uint32(24)
_TAIL_MASKS = np.array([0, 0xFF, 0xFFFF, 0xFFFFFF], np.uint32)


def _as_binary(keys: pa.Array) -> pa.Array:
    t = keys.type
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return keys
    if pa.types.is_large_string(t):
        return keys.cast(pa.large_binary())
    if pa.types.is_string(t) or pa.types.is_fixed_size_binary(t) or pa.types.is_binary_view(t) \
            or pa.types.is_string_view(t):
        return keys.cast(pa.binary())
    raise TypeError(f"keys must be a binary or string array, not {t}")


def murmur2(keys: pa.Array) -> np.ndarray:
    """Kafka's signed 32-bit murmur2 hash of every key, as ``np.int32``.

    ``keys`` is a binary, large_binary or string array. Callers pass non-null keys (Kafka does not
    hash a null key); a null raises ValueError.
    """
    if isinstance(keys, pa.ChunkedArray):
        parts = [murmur2(c) for c in keys.chunks]
        return np.concatenate(parts) if parts else np.empty(0, np.int32)
    if keys.null_count:
        raise ValueError(f"keys must not be null ({keys.null_count} of {len(keys)} are)")
    keys = _as_binary(keys)
    n = len(keys)
    if n == 0:
        return np.empty(0, np.int32)
    _, offsets_buf, data_buf = keys.buffers()
    odtype = np.int64 if pa.types.is_large_binary(keys.type) else np.int32
    offsets = np.frombuffer(offsets_buf, odtype)[keys.offset:keys.offset + n + 1].astype(np.int64)
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.empty(0, np.uint8)
    # The little-endian u32 at every byte position (zero past the end): one gather per word.
    padded = np.zeros(len(data) + 4, np.uint8)
    padded[:len(data)] = data
    word_at = np.ndarray(shape=(len(data) + 1,), dtype="<u4", buffer=padded, strides=(1,))
    starts = offsets[:-1]
    lengths = offsets[1:] - starts

    h = _SEED ^ lengths.astype(np.uint32)
    nwords = lengths >> 2
    most = int(nwords.max())
    every = int(nwords.min()) == most  # keys of one length (the usual case): no masks
    idx = np.arange(n)
    for j in range(most):
        if not every:
            idx = idx[nwords[idx] > j]  # keys with a word j; shrinks as short keys run out
        k = word_at[(starts if every else starts[idx]) + 4 * j]
        k *= _M
        k ^= k >> _R
        k *= _M
        if every:
            h *= _M
            h ^= k
        else:
            hj = h[idx]
            hj *= _M
            hj ^= k
            h[idx] = hj

    # Java's switch with fallthrough: the last 1-3 bytes, little-endian, XORed in, then one multiply.
    rem = lengths & 3
    sel = np.nonzero(rem)[0]
    if len(sel):
        h[sel] ^= word_at[starts[sel] + (lengths[sel] & ~3)] & _TAIL_MASKS[rem[sel]]
        h[sel] *= _M

    h ^= h >> np.uint32(13)
    h *= _M
    h ^= h >> np.uint32(15)
    return h.view(np.int32)


def murmur2_bytes(data: bytes) -> int:
    """Kafka's murmur2 of one key."""
    return int(murmur2(pa.array([data], pa.binary()))[0])


def to_positive(h: np.ndarray) -> np.ndarray:
    """Kafka's ``Utils.toPositive``: clears the sign bit (not ``abs``), same dtype."""
    return h & h.dtype.type(0x7FFFFFFF)


def kafka_partitions(keys: pa.Array, num_partitions: int) -> np.ndarray:
    """The partition Kafka's default partitioner picks for every key, as ``np.int32``."""
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be at least 1, not {num_partitions}")
    p = to_positive(murmur2(keys)).astype(np.int64) % int(num_partitions)
    return p.astype(np.int32)
