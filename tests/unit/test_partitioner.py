"""Kafka's default partitioner (llog.partitioner) against Kafka's test vectors and a pure-Python
transliteration of Kafka's ``Utils.murmur2``."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llog.partitioner import kafka_partitions, murmur2, murmur2_bytes, to_positive

# Kafka's UtilsTest.testMurmur2, then values of Kafka's implementation quoted by Akka's Murmur2Spec.
VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (bytes([ord("a"), ord("b"), ord("c")]), 479470107),
    (b"1", -1993445489),
    (b"12", 126087238),
    (b"123", -267702483),
    (b"1234", -1614185708),
    (b"12345", -1188365604),
]


def ref_murmur2(data: bytes) -> int:
    """Kafka's Utils.murmur2 line by line, Java int arithmetic emulated with 32-bit masks."""
    mask = 0xFFFFFFFF
    length = len(data)
    seed = 0x9747B28C
    m = 0x5BD1E995
    r = 24
    h = (seed ^ length) & mask
    length4 = length // 4
    for i in range(length4):
        i4 = i * 4
        k = (data[i4] & 0xFF) + ((data[i4 + 1] & 0xFF) << 8) + ((data[i4 + 2] & 0xFF) << 16) \
            + ((data[i4 + 3] & 0xFF) << 24)
        k = (k * m) & mask
        k ^= k >> r  # k >>> r on a masked (unsigned) value
        k = (k * m) & mask
        h = (h * m) & mask
        h ^= k
    rem = length % 4
    if rem == 3:
        h ^= (data[(length & ~3) + 2] & 0xFF) << 16
    if rem >= 2:
        h ^= (data[(length & ~3) + 1] & 0xFF) << 8
    if rem >= 1:
        h ^= data[length & ~3] & 0xFF
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def _ref_partition(data: bytes, n: int) -> int:
    return (ref_murmur2(data) & 0x7FFFFFFF) % n


@pytest.mark.parametrize(("key", "expected"), VECTORS)
def test_reference_matches_kafka_vectors(key: bytes, expected: int) -> None:
    assert ref_murmur2(key) == expected


@pytest.mark.parametrize(("key", "expected"), VECTORS)
def test_murmur2_bytes_matches_kafka_vectors(key: bytes, expected: int) -> None:
    assert murmur2_bytes(key) == expected


def test_murmur2_vectors_in_one_array() -> None:
    got = murmur2(pa.array([k for k, _ in VECTORS], pa.binary()))
    assert got.dtype == np.int32
    assert got.tolist() == [v for _, v in VECTORS]


def _random_keys(count: int, seed: int = 20240611) -> list[bytes]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 65, size=count)
    keys = [rng.integers(0, 256, size=int(n), dtype=np.uint8).tobytes() for n in lengths]
    keys[:65] = [bytes(range(n)) for n in range(65)]  # every length 0..64, empty included
    return keys


@pytest.fixture(scope="module")
def random_keys() -> list[bytes]:
    return _random_keys(10_000)


@pytest.fixture(scope="module")
def random_ref(random_keys: list[bytes]) -> list[int]:
    return [ref_murmur2(k) for k in random_keys]


def test_random_keys_match_reference(random_keys: list[bytes], random_ref: list[int]) -> None:
    assert murmur2(pa.array(random_keys, pa.binary())).tolist() == random_ref
    assert murmur2(pa.array(random_keys, pa.large_binary())).tolist() == random_ref


@pytest.mark.parametrize("n", [1, 3, 12, 1000])
def test_random_keys_partitions(random_keys: list[bytes], random_ref: list[int], n: int) -> None:
    got = kafka_partitions(pa.array(random_keys, pa.binary()), n)
    assert got.dtype == np.int32
    assert got.tolist() == [(h & 0x7FFFFFFF) % n for h in random_ref]


def test_sliced_array(random_keys: list[bytes], random_ref: list[int]) -> None:
    arr = pa.array(random_keys[:200], pa.binary()).slice(5, 100)
    assert arr.offset == 5
    assert murmur2(arr).tolist() == random_ref[5:105]
    large = pa.array(random_keys[:200], pa.large_binary()).slice(5, 100)
    assert murmur2(large).tolist() == random_ref[5:105]


def test_string_arrays() -> None:
    strs = ["21", "foobar", "", "héllo", "12345"]
    expected = [ref_murmur2(s.encode()) for s in strs]
    assert murmur2(pa.array(strs, pa.string())).tolist() == expected
    assert murmur2(pa.array(strs, pa.large_string())).tolist() == expected


def test_empty_inputs() -> None:
    assert murmur2(pa.array([], pa.binary())).tolist() == []
    assert kafka_partitions(pa.array([], pa.binary()), 3).tolist() == []
    assert murmur2(pa.array([b""] * 3, pa.binary())).tolist() == [ref_murmur2(b"")] * 3


def test_nulls_raise() -> None:
    with pytest.raises(ValueError):
        murmur2(pa.array([b"a", None], pa.binary()))
    with pytest.raises(ValueError):
        kafka_partitions(pa.array([None], pa.string()), 3)


@pytest.mark.parametrize("n", [0, -1])
def test_bad_partition_count_raises(n: int) -> None:
    with pytest.raises(ValueError):
        kafka_partitions(pa.array([b"a"], pa.binary()), n)


def test_to_positive_clears_sign_bit() -> None:
    h = np.array([0, 1, -1, -2147483648, 2147483647, -973932308], np.int32)
    got = to_positive(h)
    assert got.dtype == np.int32
    assert got.tolist() == [x & 0x7FFFFFFF for x in h.tolist()]
    assert to_positive(h.astype(np.int64)).tolist() == got.tolist()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=100), max_size=50), st.integers(1, 5000))
def test_hypothesis_matches_reference(keys: list[bytes], n: int) -> None:
    arr = pa.array(keys, pa.binary())
    assert murmur2(arr).tolist() == [ref_murmur2(k) for k in keys]
    assert kafka_partitions(arr, n).tolist() == [_ref_partition(k, n) for k in keys]
