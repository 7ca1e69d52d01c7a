"""The broker's tail cache: hits inside and across runs, gaps, byte budgets, eviction, and
incarnations of a topic (docs/protocol.md section 12), in memory and in the shared directory."""

from broker_lite.tail_cache import RECORD_OVERHEAD, TailCache, TailCacheDir
from llog.keys import TopicPartition

TP = TopicPartition("t", 0)
#: Two incarnations of topic ``t`` (topic ids as a topic record has them).
OLD, NEW = "0b5e3c1e-0000-4000-8000-000000000001", "0b5e3c1e-0000-4000-8000-000000000002"
#: The ``created_at_ms`` of the entries the runs landed in.
CREATED = 1_790_000_000_000


def values(n: int, first: int = 1, size: int = 10) -> list[bytes]:
    return [str(first + i).encode().ljust(size, b".") for i in range(n)]


def test_a_hit_reads_through_adjacent_runs_and_stops_at_a_gap():
    cache = TailCache(10**6)
    cache.add(TP, OLD, 1, values(5), CREATED)
    cache.add(TP, OLD, 11, values(5, 11), CREATED)  # 6..10 came from another writer
    cache.add(TP, OLD, 6 + 10, values(3, 16), CREATED)
    hit = cache.get(TP, OLD, 3, 10**6)
    assert (hit.first, hit.values, hit.tail) == (3, values(3, 3), 18)
    hit = cache.get(TP, OLD, 12, 10**6)
    assert hit.values == values(4, 12) + values(3, 16)
    assert cache.get(TP, OLD, 7, 10**6) is None and cache.get(TP, OLD, 19, 10**6) is None
    assert cache.get(TopicPartition("t", 1), OLD, 1, 10**6) is None
    assert (cache.hits, cache.misses) == (2, 3)


def test_runs_added_out_of_order_are_found():
    cache = TailCache(10**6)
    cache.add(TP, OLD, 4, values(3, 4), CREATED)
    cache.add(TP, OLD, 1, values(3), CREATED)
    assert cache.get(TP, OLD, 1, 10**6).values == values(6)


def test_a_hit_returns_what_fits_the_budget_and_at_least_one_record():
    cache = TailCache(10**6)
    cache.add(TP, OLD, 1, values(5), CREATED)
    cache.add(TP, OLD, 6, values(5, 6), CREATED)
    assert cache.get(TP, OLD, 2, 35).values == values(3, 2)
    assert cache.get(TP, OLD, 4, 45).values == values(4, 4)  # across the run boundary
    assert cache.get(TP, OLD, 2, 3).values == values(1, 2)


def test_the_oldest_runs_are_evicted_past_the_limit():
    per_run = 5 * (10 + RECORD_OVERHEAD)
    cache = TailCache(3 * per_run)
    for k in range(5):
        cache.add(TP, OLD, 1 + 5 * k, values(5, 1 + 5 * k), CREATED)
    assert cache.bytes == 3 * per_run and cache.evictions == 2
    assert cache.get(TP, OLD, 10, 10**6) is None
    assert cache.get(TP, OLD, 11, 10**6).values == values(15, 11)


def test_a_zero_limit_turns_the_cache_off():
    cache = TailCache(0)
    cache.add(TP, OLD, 1, values(5), CREATED)
    assert not cache.enabled and cache.get(TP, OLD, 1, 100) is None and cache.tail(TP) is None


def test_runs_from_arrow_arrays_read_like_runs_from_lists():
    import pyarrow as pa

    cache = TailCache(10**6)
    array = pa.array([v.decode() for v in values(8)], type=pa.string()).view(pa.binary()).slice(2, 5)
    cache.add(TP, OLD, 3, array, CREATED)
    cache.add(TP, OLD, 8, values(2, 8), CREATED)
    assert cache.get(TP, OLD, 4, 10**6).values == values(6, 4)


def test_the_directory_cache_finds_runs_written_after_it_listed_and_misses_deleted_ones(tmp_path):
    writer = TailCacheDir(tmp_path, "root", 10**6)
    reader = TailCacheDir(tmp_path, "root", 10**6)
    writer.add(TP, OLD, 1, values(5), CREATED)
    assert reader.get(TP, OLD, 2, 10**6).values == values(4, 2)
    writer.add(TP, OLD, 6, values(5, 6), CREATED)  # maybe within the same mtime tick as the first
    hit = reader.get(TP, OLD, 7, 10**6)
    assert hit.values == values(4, 7) and hit.tail == 10
    assert reader.get(TP, OLD, 3, 10**6).values == values(8, 3)  # across the two runs
    small = TailCacheDir(tmp_path, "root", 1)  # keeps nothing: a run over its limit is not written
    small.add(TP, OLD, 11, values(5, 11), CREATED)
    assert reader.get(TP, OLD, 11, 10**6) is None
    for run in (tmp_path / "root" / "t" / OLD / "0").glob("*.llb"):
        run.unlink()
    assert reader.get(TP, OLD, 2, 10**6) is None and reader.get(TP, OLD, 12, 10**6) is None


def test_a_lookup_never_answers_with_runs_of_another_incarnation():
    """A topic deleted and created again starts at offset 1 again under a new topic id: the old
    incarnation's runs are no answer for the new one, whether or not the broker itself added a
    run of the new one (another writer may have written it)."""
    cache = TailCache(10**6)
    cache.add(TP, OLD, 1, values(20), CREATED)
    assert cache.get(TP, NEW, 1, 10**6) is None and cache.get(TP, NEW, 20, 10**6) is None
    assert cache.incarnation(TP) == OLD and cache.get(TP, OLD, 1, 10**6).values == values(20)


def test_a_run_of_a_new_incarnation_replaces_the_old_runs():
    cache = TailCache(10**6)
    cache.add(TP, OLD, 1, values(5), CREATED)
    cache.add(TP, OLD, 6, values(5, 6), CREATED)
    new = [b"new-%d" % i for i in range(3)]
    cache.add(TP, NEW, 1, new, CREATED)
    hit = cache.get(TP, NEW, 1, 10**6)
    assert (hit.values, hit.tail) == (new, 3) and cache.incarnation(TP) == NEW
    assert cache.get(TP, NEW, 6, 10**6) is None and cache.get(TP, OLD, 1, 10**6) is None
    assert cache.bytes == sum(map(len, new)) + RECORD_OVERHEAD * 3
    cache.add(TP, NEW, 4, values(7, 4), CREATED)  # not overlapping the old runs' offsets 4..10 any more
    assert cache.get(TP, NEW, 1, 10**6).values == new + values(7, 4)
    for i in range(200):  # evicting past the forgotten runs' age entries works
        cache.add(TopicPartition("u", 0), OLD, 1 + 10 * i, values(10, 1 + 10 * i, 500), CREATED)
    assert cache.bytes <= cache.max_bytes


def test_forget_drops_a_partition_s_incarnation():
    cache = TailCache(10**6)
    cache.add(TP, OLD, 1, values(5), CREATED)
    cache.forget(TP)
    assert cache.get(TP, OLD, 1, 10**6) is None and cache.incarnation(TP) is None and cache.bytes == 0


def test_the_directory_cache_keeps_incarnations_apart(tmp_path):
    """Runs live in a directory per incarnation: a reader of the new one never sees the old one's
    runs, and a writer's first run of the new one removes the old one's directory."""
    old_writer = TailCacheDir(tmp_path, "llog", 10**6)
    new_writer = TailCacheDir(tmp_path, "llog", 10**6)
    reader = TailCacheDir(tmp_path, "llog", 10**6)
    old_writer.add(TP, OLD, 1, values(20), CREATED)
    assert reader.get(TP, NEW, 1, 10**6) is None
    assert reader.get(TP, OLD, 1, 10**6).values == values(20)
    new_writer.add(TP, NEW, 1, [b"again"], CREATED)
    hit = reader.get(TP, NEW, 1, 10**6)
    assert (hit.values, hit.tail) == ([b"again"], 1)
    assert reader.get(TP, OLD, 1, 10**6) is None
    assert sorted(p.name for p in (tmp_path / "llog" / "t").iterdir()) == [NEW]


def _v2(first: int, n: int):
    """``n`` records-v2 records numbered from ``first``: keys, headers and event times on some,
    a tombstone every fourth."""
    import pyarrow as pa

    from llog.codec import to_records

    numbers = range(first, first + n)
    return to_records([None if i % 4 == 0 else b"v%d" % i for i in numbers],
                      keys=[b"k%d" % i if i % 2 else None for i in numbers],
                      headers=[[("h", b"%d" % i)] if i % 3 == 0 else None for i in numbers],
                      timestamps=pa.array([1_700_000_000_000 + i if i % 5 else None for i in numbers], pa.int64()))


def test_a_hit_is_what_the_log_s_reader_returns_offsets_times_keys_headers_and_tombstones():
    """Runs of values and runs of records-v2 (a Kafka producer's) side by side: a hit's batches
    have the reader's schema, each record's offset, and its entry's ``created_at_ms``."""
    from llog.reader import RECORD_SCHEMA

    cache = TailCache(10**6)
    cache.add(TP, OLD, 1, values(4), CREATED)
    cache.add(TP, OLD, 5, _v2(5, 8), CREATED + 1)
    cache.add(TP, OLD, 13, values(2, 13), CREATED + 2)
    hit = cache.get(TP, OLD, 3, 10**6)
    assert [b.schema for b in hit.batches] == [RECORD_SCHEMA] * 3 and hit.count == 12 and hit.tail == 14
    rows = [row for b in hit.batches for row in b.to_pylist()]
    assert [r["offset"] for r in rows] == list(range(3, 15))
    assert [r["created_at_ms"] for r in rows] == [CREATED] * 2 + [CREATED + 1] * 8 + [CREATED + 2] * 2
    assert [r["value"] for r in rows[:2]] == values(2, 3) and rows[-1]["value"] == values(1, 14)[0]
    v2 = _v2(5, 8).to_pylist()
    assert [{k: r[k] for k in ("key", "value", "headers", "timestamp")} for r in rows[2:10]] == v2
    assert rows[5]["value"] is None and rows[2]["key"] == b"k5" and rows[3]["headers"] == [{"key": "h", "value": b"6"}]
    assert all(r["key"] is None and r["headers"] is None and r["timestamp"] is None for r in rows[:2] + rows[10:])


def test_a_records_v2_run_spends_the_budget_by_value_bytes_and_costs_its_encoded_size():
    cache = TailCache(10**6)
    records = _v2(1, 8)  # values v1..v7 (2 bytes each), v8 is 2 bytes, offsets 4 and 8 tombstones
    cache.add(TP, OLD, 1, records, CREATED)
    assert cache.bytes > 8 * RECORD_OVERHEAD  # the keys, headers and times count too
    hit = cache.get(TP, OLD, 2, 5)  # v2, v3 fit (4 bytes); the tombstone at 4 is 0 bytes; v5 does not fit
    assert [r["offset"] for b in hit.batches for r in b.to_pylist()] == [2, 3, 4]
    assert cache.get(TP, OLD, 4, 0).count == 1  # the first record always


def test_the_directory_cache_returns_the_entry_s_created_at(tmp_path):
    writer = TailCacheDir(tmp_path, "root", 10**6)
    reader = TailCacheDir(tmp_path, "root", 10**6)
    writer.add(TP, OLD, 1, values(3), CREATED)
    writer.add(TP, OLD, 4, values(3, 4), CREATED + 5)
    hit = reader.get(TP, OLD, 2, 10**6)
    assert [(r["offset"], r["created_at_ms"]) for b in hit.batches for r in b.to_pylist()] == [
        (2, CREATED), (3, CREATED), (4, CREATED + 5), (5, CREATED + 5), (6, CREATED + 5)]
    (tmp_path / "root" / "t" / OLD / "0" / "00000000000000000007-00000000000000000009.llb").write_bytes(b"old form")
    assert reader.get(TP, OLD, 7, 10**6) is None  # a name of another form is not a run


def test_a_records_v2_run_costs_its_own_bytes_not_the_arrays_it_was_sliced_from():
    """A Kafka producer's record: timestamps set, keys and headers null (llog.codec.nulls: slices
    of one long shared array), or a slice of a larger decoded batch with headers. Each run costs
    about its own bytes (a run of one record once cost the cache half a MiB: the whole shared
    null headers array went into its message)."""
    import pyarrow as pa

    from llog.codec import HEADERS_TYPE, to_records

    cache = TailCache(10**9)
    cache.add(TP, OLD, 1, to_records([b"v" * 100], timestamps=pa.array([1], pa.int64())), CREATED)
    assert cache.bytes < 2_000
    decoded = to_records([b"v" * 100] * 1000, headers=pa.array([[("h", b"x")]] * 1000, HEADERS_TYPE))
    cache.add(TP, OLD, 2, decoded.slice(500, 1), CREATED)
    assert cache.bytes < 4_000
    assert [r["headers"] for b in cache.get(TP, OLD, 2, 10**6).batches for r in b.to_pylist()] == [
        [{"key": "h", "value": b"x"}]]
