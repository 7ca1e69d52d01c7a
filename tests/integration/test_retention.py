"""Retention (docs/protocol.md sections 10.3 and 10.4) on real Oxia and the S3 server: by time and by size
(WAL entries and compacted objects), never an entry younger than the grace period ``G``, readers
racing a pass (before it, midway, after GC), GC collecting exactly what nothing references any
more, consumer groups below the log start, and the invariants from the log start.

Entries are made old with clocks, not sleeps: a compactor whose clock is an hour ahead
(``ShiftedClock(3600)``) sees entries written now as older than ``G`` (600 s by default) and
than a small ``retention.ms``; a writer whose clock is an hour ahead writes entries that the same
compactor sees as younger than ``G``."""

from __future__ import annotations

import pytest

from llog.clock import ShiftedClock
from llog.compactor import Compactor
from llog.consumer_groups import commit_offsets, committed_offsets, describe_group, reset_offsets
from llog.control import read_control, update_control
from llog.errors import InconsistentReadState, InvalidOffset, OffsetOutOfRange
from llog.gc import check_grace, gc_pass
from llog.keys import TopicPartition, s3_uri, shared_wal_prefix
from llog.reader import Fetched, FetchRequest
from llog.records import COMPACTED, WAL, CompactionCursor
from llog.topics import alter_topic, create_topic
from llog.writer import AppendGroup, LogWriter
from tests.helpers.invariants import check_partition
from tests.helpers.retention import (
    compacted_objects, current_keys, entry_sizes, first_kept_by_size, index_entries,
)

#: How far ahead the compactor's (and GC's) clock runs: entries written now are older than G.
AHEAD_S = 3600


def _compactor(writer, config, ahead_s: float = AHEAD_S, **kwargs) -> Compactor:
    return Compactor(config, writer.coordination, writer.objects, clock=ShiftedClock(ahead_s), **kwargs)


def _retain(writer, config, topic: str, partition: int = 0, ahead_s: float = AHEAD_S):
    with _compactor(writer, config, ahead_s) as compactor:
        return compactor.retain_partition(topic, partition)


def _cursor(writer, config, topic: str, partition: int = 0) -> int:
    keys = current_keys(writer.coordination, config.root_prefix, topic, partition)
    return CompactionCursor.from_json(writer.coordination.get(keys.compaction_cursor, keys.partition_key).value).offset


def _young_writer(config) -> LogWriter:
    """A writer whose entries the compactor (an hour ahead too) sees as just written."""
    return LogWriter(config, clock=ShiftedClock(AHEAD_S))


def _old_and_young(writer, config, topic: str, old: int = 3, young: int = 2, per_append: int = 3
                   ) -> tuple[list[bytes], list[bytes]]:
    """``old`` appends written now, then ``young`` appends written an hour ahead, each of
    ``per_append`` records and its own blob: the old and the young values, in offset order."""
    old_values, young_values = [], []
    for i in range(old):
        records = [f"old-{i}-{j}".encode() * (j + 1) for j in range(per_append)]
        writer.append(topic, 0, records)
        old_values += records
    with _young_writer(config) as later:
        for i in range(young):
            records = [f"young-{i}-{j}".encode() for j in range(per_append)]
            later.append(topic, 0, records)
            young_values += records
    return old_values, young_values


def _values(reader, topic: str, start: int, partition: int = 0) -> list[bytes]:
    return [r.value for r in reader.read_range(topic, partition, start)]


def _below_start(error: OffsetOutOfRange, log_start: int) -> None:
    assert error.below_start and error.log_start_offset == log_start, error


# --- by time -------------------------------------------------------------------------------------------


def test_retention_by_time_moves_the_log_start_past_the_old_entries(config, writer, reader):
    c, root = writer.coordination, config.root_prefix
    create_topic(c, root, "t", 1, {"retention.ms": 1000})
    old, young = _old_and_young(writer, config, "t")
    keys = current_keys(c, root, "t", 0)
    before = index_entries(c, keys)
    assert [e.start_offset for e in before] == [1, 4, 7, 10, 13]
    assert _cursor(writer, config, "t") == 1

    done = _retain(writer, config, "t")
    assert done.log_start_offset == 10
    assert (done.retention_records, done.retention_entries) == (9, 3)
    assert done.retention_bytes == sum(e.entry.byte_length for e in before[:3])
    assert done.compactions == 0  # a retention pass alone
    assert reader.offsets("t", 0) == (10, 15)
    assert [e.start_offset for e in index_entries(c, keys)] == [10, 13]  # the old keys are deleted
    assert _cursor(writer, config, "t") == 10  # the compaction cursor moved to the start
    check_partition(c, root, "t", 0)

    with pytest.raises(OffsetOutOfRange, match=r"offset 5 of t\[0\] is out of range: offsets 1\.\.9 were removed "
                                               r"by retention; readable offsets are 10\.\.15") as e:
        reader.read_range("t", 0, 5)
    _below_start(e.value, 10)
    with pytest.raises(OffsetOutOfRange) as e:
        reader.read_range("t", 0, 1, 12)  # a range that ends above the start fails too: 1..9 are gone
    _below_start(e.value, 10)
    with pytest.raises(OffsetOutOfRange) as e:
        reader.read_offset("t", 0, 9)
    _below_start(e.value, 10)
    with pytest.raises(OffsetOutOfRange) as e:
        list(reader.iter_from("t", 0, 1))
    _below_start(e.value, 10)
    outcome, = reader.fetch([FetchRequest("t", 0, 3, 1 << 20)])
    assert isinstance(outcome, OffsetOutOfRange)
    _below_start(outcome, 10)

    assert _values(reader, "t", 10) == young
    assert reader.read_offset("t", 0, 10).value == young[0]
    assert [r.value for r in reader.iter_from("t", 0, 10, window=2)] == young
    fetched, = reader.fetch([FetchRequest("t", 0, 10, 1 << 20)])
    assert [v.as_py() for b in fetched.batches for v in b.column(1)] == young

    again = _retain(writer, config, "t")  # the young entries stay: nothing more to drop
    assert (again.log_start_offset, again.retention_records) == (10, 0)
    assert writer.append("t", 0, [b"next"]).start_offset == 16
    assert _values(reader, "t", 10) == young + [b"next"]


def test_retention_ms_is_measured_from_each_entry_and_kept_entries_stay(config, writer, reader):
    """``retention.ms`` of 30 minutes: entries an hour old go, entries 20 minutes old (older than
    G, younger than retention.ms) and 5 minutes old (younger than G) stay."""
    c, root = writer.coordination, config.root_prefix
    create_topic(c, root, "t", 1, {"retention.ms": 30 * 60 * 1000})
    writer.append("t", 0, [b"an-hour"] * 2)
    for ahead_s, value in ((40 * 60, b"20-minutes"), (55 * 60, b"5-minutes")):
        with LogWriter(config, clock=ShiftedClock(ahead_s)) as later:
            later.append("t", 0, [value] * 2)
    done = _retain(writer, config, "t")
    assert (done.log_start_offset, done.retention_entries) == (3, 1)
    assert _values(reader, "t", 3) == [b"20-minutes"] * 2 + [b"5-minutes"] * 2
    check_partition(c, root, "t", 0)


def test_entries_younger_than_the_grace_period_are_never_dropped(config, writer, reader):
    c, root = writer.coordination, config.root_prefix
    create_topic(c, root, "t", 1, {"retention.ms": 0})
    values = [f"v{i}".encode() for i in range(6)]
    writer.append("t", 0, values[:3])
    writer.append("t", 0, values[3:])
    assert config.gc_grace_ms > 60_000
    done = _retain(writer, config, "t", ahead_s=60)  # a minute old: older than retention.ms=0, younger than G
    assert (done.log_start_offset, done.retention_records) == (1, 0)
    assert reader.offsets("t", 0) == (1, 6) and _values(reader, "t", 1) == values

    alter_topic(c, root, "t", set_config={"retention.ms": -1})  # -1: forever, however old
    assert _retain(writer, config, "t").retention_records == 0

    alter_topic(c, root, "t", set_config={"retention.ms": 0})
    done = _retain(writer, config, "t")  # an hour old: all go
    assert (done.log_start_offset, done.retention_records, done.retention_entries) == (7, 6, 2)
    assert reader.offsets("t", 0) == (7, 6)
    assert index_entries(c, current_keys(c, root, "t", 0)) == []
    check_partition(c, root, "t", 0)
    with pytest.raises(OffsetOutOfRange, match=r"offsets 1\.\.6 were removed by retention; the partition holds "
                                               r"no records \(the next offset written is 7\)") as e:
        reader.read_range("t", 0, 1)
    _below_start(e.value, 7)
    caught_up, = reader.fetch([FetchRequest("t", 0, 7, 1 << 20)])  # a consumer at the start
    assert isinstance(caught_up, Fetched) and caught_up.count == 0 and caught_up.high_watermark == 6
    assert list(reader.iter_from("t", 0, 7)) == []
    assert writer.append("t", 0, [b"after"]).start_offset == 7
    assert _values(reader, "t", 7) == [b"after"]
    check_partition(c, root, "t", 0)


# --- by size -------------------------------------------------------------------------------------------


def test_retention_by_size_keeps_the_newest_entries_holding_at_least_retention_bytes(config, writer, reader):
    c, root = writer.coordination, config.root_prefix
    create_topic(c, root, "t", 1, {"retention.ms": -1})
    lengths = [100, 300, 50, 400, 200, 150]
    values = [bytes([65 + i]) * n for i, n in enumerate(lengths)]
    for v in values:
        writer.append("t", 0, [v])
    keys = current_keys(c, root, "t", 0)
    sizes = [e.entry.byte_length for e in index_entries(c, keys)]
    assert [s - n for s, n in zip(sizes, lengths)] == [sizes[0] - lengths[0]] * 6  # a body: the record and a header
    limit = sizes[-1] + sizes[-2] + 1  # the last two fall short by a byte: three are kept
    first = first_kept_by_size(sizes, limit)
    assert first == 3
    alter_topic(c, root, "t", set_config={"retention.bytes": limit})

    done = _retain(writer, config, "t")
    assert (done.log_start_offset, done.retention_entries, done.retention_bytes) \
        == (first + 1, first, sum(sizes[:first]))
    assert sum(sizes[first:]) >= limit > sum(sizes[first + 1:])
    assert _values(reader, "t", first + 1) == values[first:]
    assert _retain(writer, config, "t").retention_records == 0  # what is left is needed to hold the limit
    check_partition(c, root, "t", 0)

    alter_topic(c, root, "t", set_config={"retention.bytes": sizes[-1]})  # exactly the last: the rest go
    assert _retain(writer, config, "t").log_start_offset == 6
    assert _values(reader, "t", 6) == values[-1:]
    alter_topic(c, root, "t", set_config={"retention.bytes": 0})  # Kafka's rule: even the last goes
    assert _retain(writer, config, "t").log_start_offset == 7
    assert reader.offsets("t", 0) == (7, 6)
    check_partition(c, root, "t", 0)


def test_retention_by_size_counts_compacted_objects_by_their_size(config, writer, reader):
    c, root = writer.coordination, config.root_prefix
    create_topic(c, root, "t", 1, {"retention.ms": -1})
    values = []
    for i in range(6):
        records = [f"{i}-{j}".encode() * (10 * (i + 1)) for j in range(10)]
        writer.append("t", 0, records)
        values += records
    with _young_writer(config) as later:
        later.append("t", 0, [b"young"] * 10)  # stays a WAL entry: younger than the compaction lag
    values += [b"young"] * 10
    with _compactor(writer, config, max_offsets=20) as compactor:
        assert compactor.compact_partition("t", 0).compactions == 3  # two entries per object
    keys = current_keys(c, root, "t", 0)
    entries = index_entries(c, keys)
    assert [e.entry.type for e in entries] == [COMPACTED] * 3 + [WAL]
    assert all(e.entry.byte_length is None for e in entries[:3])
    sizes = entry_sizes(writer.objects, keys, entries)
    objects_before = compacted_objects(writer.objects, keys)
    assert sizes[:3] == [objects_before[e.entry.data_key] for e in entries[:3]]

    limit = sizes[2] + sizes[3] + 1  # the last compacted object and the WAL entry fall short
    first = first_kept_by_size(sizes, limit)
    assert first == 1
    alter_topic(c, root, "t", set_config={"retention.bytes": limit})
    done = _retain(writer, config, "t")
    assert (done.log_start_offset, done.retention_entries, done.retention_bytes) == (21, 1, sizes[0])
    assert reader.offsets("t", 0) == (21, 70)
    assert _values(reader, "t", 21) == values[20:]
    assert [e.start_offset for e in index_entries(c, keys)] == [21, 41, 61]
    # The object stays until GC: retention only drops references.
    assert compacted_objects(writer.objects, keys) == objects_before
    check_partition(c, root, "t", 0)


# --- readers alongside a pass ------------------------------------------------------------------------


def _pass_at_fetch(hooks, writer, config, topic: str, collect: bool, ran: list):
    """A hook for ``reader.before_fetch`` (one shot): a retention pass, and with ``collect`` a GC
    pass that deletes the blobs the pass left unreferenced."""

    def hook():
        del hooks["reader.before_fetch"]
        ran.append(_retain(writer, config, topic).log_start_offset)
        if collect:
            report = gc_pass(writer.coordination, writer.objects, config.root_prefix, config.gc_grace_ms,
                             clock=ShiftedClock(AHEAD_S))
            assert report.deleted == 3  # the old entries' blobs
    return hook


@pytest.mark.parametrize("collect", [False, True], ids=["retention", "retention-and-gc"])
def test_a_read_midway_returns_the_right_records_or_fails_below_the_start(config, writer, reader, hooks, collect):
    """The read resolved its entries; then a pass drops the first three (and GC deletes their
    blobs). Blobs still there: the records it resolved are read, the right ones. Gone: it
    resolves again and fails naming the new start. Never other offsets' records."""
    create_topic(writer.coordination, config.root_prefix, "t", 1, {"retention.ms": 1000})
    old, young = _old_and_young(writer, config, "t")
    ran = []
    hooks["reader.before_fetch"] = _pass_at_fetch(hooks, writer, config, "t", collect, ran)
    if collect:
        with pytest.raises(OffsetOutOfRange) as e:
            reader.read_range("t", 0, 1)
        _below_start(e.value, 10)
    else:
        records = reader.read_range("t", 0, 1)
        assert [(r.offset, r.value) for r in records] == list(enumerate(old + young, start=1))
    assert ran == [10]
    assert _values(reader, "t", 10) == young


@pytest.mark.parametrize("collect", [False, True], ids=["retention", "retention-and-gc"])
def test_iter_from_midway_yields_the_right_records_then_fails_below_the_start(config, writer, reader, hooks, collect):
    create_topic(writer.coordination, config.root_prefix, "t", 1, {"retention.ms": 1000})
    old, young = _old_and_young(writer, config, "t")
    ran, got = [], []
    hooks["reader.before_fetch"] = _pass_at_fetch(hooks, writer, config, "t", collect, ran)
    with pytest.raises(OffsetOutOfRange) as e:
        for record in reader.iter_from("t", 0, 1, window=3):
            got.append((record.offset, record.value))
    _below_start(e.value, 10)
    # The first window was resolved before the pass: read whole while its blob was there.
    assert got == ([] if collect else list(enumerate(old[:3], start=1)))
    assert ran == [10]


@pytest.mark.parametrize("collect", [False, True], ids=["retention", "retention-and-gc"])
def test_a_fetch_midway_returns_the_right_records_or_the_partitions_offset_out_of_range(
        config, writer, reader, hooks, collect):
    create_topic(writer.coordination, config.root_prefix, "t", 1, {"retention.ms": 1000})
    old, young = _old_and_young(writer, config, "t")
    create_topic(writer.coordination, config.root_prefix, "other", 1)
    writer.append("other", 0, [b"o1", b"o2"])
    ran = []
    hooks["reader.before_fetch"] = _pass_at_fetch(hooks, writer, config, "t", collect, ran)
    outcome, other = reader.fetch([FetchRequest("t", 0, 2, 1 << 20), FetchRequest("other", 0, 1, 1 << 20)])
    assert ran == [10]
    if collect:
        assert isinstance(outcome, OffsetOutOfRange)
        _below_start(outcome, 10)
    else:
        assert isinstance(outcome, Fetched)
        assert [(o.as_py(), v.as_py()) for b in outcome.batches for o, v in zip(b.column(0), b.column(1))] \
            == list(enumerate(old + young, start=1))[1:1 + outcome.count]
        assert outcome.count >= 1
    assert [v.as_py() for b in other.batches for v in b.column(1)] == [b"o1", b"o2"]  # the other partition is fine


def test_read_offset_midway_through_retention_and_gc_fails_below_the_start(config, writer, reader, hooks):
    create_topic(writer.coordination, config.root_prefix, "t", 1, {"retention.ms": 1000})
    _old_and_young(writer, config, "t")
    ran = []
    hooks["reader.before_fetch"] = _pass_at_fetch(hooks, writer, config, "t", True, ran)
    with pytest.raises(OffsetOutOfRange) as e:
        reader.read_offset("t", 0, 2)
    assert ran == [10]
    _below_start(e.value, 10)


def test_a_read_that_read_control_before_the_pass_and_scans_after_fails_below_the_start(config, writer, reader):
    """No failpoint sits between a read's ``meta/control`` read and its index scan
    (``LogReader._resolve_many`` then ``_resolve``), so the interleaving is reproduced by
    resolving with the control state read before the pass: the entries below the new start are
    gone, a gap at the low end, and the read fails naming the start (not InconsistentReadState).
    A real gap above the start is still InconsistentReadState."""
    c, root = writer.coordination, config.root_prefix
    create_topic(c, root, "t", 1, {"retention.ms": 1000})
    old, young = _old_and_young(writer, config, "t")
    keys = current_keys(c, root, "t", 0)
    before = read_control(c, keys)
    assert before.record.log_start_offset == 1
    _retain(writer, config, "t")
    with pytest.raises(OffsetOutOfRange) as e:
        reader._resolve(keys, before, 1, 15)
    _below_start(e.value, 10)
    assert [s.lo for s in reader._resolve(keys, before, 10, 15)] == [10, 13]

    c.delete(keys.index(12), keys.partition_key)  # damage: entry 10..12 gone, above the start
    with pytest.raises(InconsistentReadState, match="no index entry covers offset 10"):
        reader.read_range("t", 0, 10)


# --- garbage collection after retention -----------------------------------------------------------------


def _shared_blobs(writer, config) -> set[str]:
    bucket = writer.objects.config.s3_bucket
    return {s3_uri(bucket, info.key) for info in writer.objects.list(shared_wal_prefix(config.root_prefix))}


def test_gc_after_retention_deletes_exactly_the_blobs_no_partition_references(config, writer, reader):
    c, root = writer.coordination, config.root_prefix
    create_topic(c, root, "ret", 1, {"retention.ms": 1000})
    create_topic(c, root, "keep", 1)
    shared = [writer.append_shared([AppendGroup("ret", 0, [f"r{i}".encode()] * 2),
                                    AppendGroup("keep", 0, [f"k{i}".encode()] * 2)])[0].wal_uri for i in range(2)]
    ret_only = writer.append("ret", 0, [b"r2"] * 2).wal_uri
    keep_only = writer.append("keep", 0, [b"k2"] * 2).wal_uri
    with _young_writer(config) as later:
        young = later.append("ret", 0, [b"young"] * 2).wal_uri
    assert _shared_blobs(writer, config) == {*shared, ret_only, keep_only, young}
    keep_values = _values(reader, "keep", 1)

    with _compactor(writer, config, max_offsets=4) as compactor:
        assert compactor.compact_partition("ret", 0).compactions == 2  # 1..4, then 5..6; the young entry stays
    ret_keys = current_keys(c, root, "ret", 0)
    compacted = set(compacted_objects(writer.objects, ret_keys))
    assert len(compacted) == 2
    done = _retain(writer, config, "ret")
    assert (done.log_start_offset, done.retention_entries) == (7, 2)

    with pytest.raises(ValueError, match="below LLOG_GC_GRACE_MS"):
        check_grace(1000, config)
    now = gc_pass(c, writer.objects, root, config.gc_grace_ms)  # every blob is younger than G now
    assert (now.listed, now.referenced, now.too_young, now.deleted) == (7, 4, 3, 0)
    report = gc_pass(c, writer.objects, root, config.gc_grace_ms, clock=ShiftedClock(AHEAD_S))
    assert set(report.deleted_uris) == {ret_only, *compacted}
    assert _shared_blobs(writer, config) == {*shared, keep_only, young}  # "keep" still needs the shared ones
    assert compacted_objects(writer.objects, ret_keys) == {}

    assert _values(reader, "keep", 1) == keep_values == [b"k0", b"k0", b"k1", b"k1", b"k2", b"k2"]
    assert _values(reader, "ret", 7) == [b"young"] * 2
    with pytest.raises(OffsetOutOfRange) as e:
        reader.read_range("ret", 0, 1)
    _below_start(e.value, 7)
    check_partition(c, root, "ret", 0)
    check_partition(c, root, "keep", 0)
    assert gc_pass(c, writer.objects, root, config.gc_grace_ms, clock=ShiftedClock(AHEAD_S)).deleted == 0


def test_a_pass_that_stopped_after_moving_the_start_is_finished_by_the_next_compactor(config, writer, reader):
    """A pass that crashed between its step 3 (the start moved) and step 1 (cursor, keys): GC
    still counts the keys below the start as references, readers refuse the offsets, and any
    compactor's recovery finishes the pass."""
    c, root = writer.coordination, config.root_prefix
    create_topic(c, root, "t", 1, {"retention.ms": -1})
    old, young = _old_and_young(writer, config, "t")
    keys = current_keys(c, root, "t", 0)
    blobs = {e.end_offset: e.entry.data_key for e in index_entries(c, keys)}
    update_control(c, keys, lambda control: control.with_extra(log_start_offset=7), "moving log_start_offset", config)

    assert reader.offsets("t", 0) == (7, 15)
    with pytest.raises(OffsetOutOfRange) as e:
        reader.read_range("t", 0, 4)
    _below_start(e.value, 7)
    assert _values(reader, "t", 7) == old[6:] + young
    report = gc_pass(c, writer.objects, root, config.gc_grace_ms, clock=ShiftedClock(AHEAD_S))
    assert report.deleted == 0  # the keys below the start still reference their blobs

    with _compactor(writer, config) as compactor:  # retention.ms=-1: only the recovery drops anything
        done = compactor.compact_partition("t", 0)
    # Recovery moved the cursor to the start and deleted the keys below it; compaction then
    # went on from the start (7..9 is old enough, the young entries are not).
    assert (done.log_start_offset, done.retention_records, done.records) == (7, 0, 3)
    assert [(e.start_offset, e.entry.type) for e in index_entries(c, keys)] == [(7, COMPACTED), (10, WAL), (13, WAL)]
    assert _cursor(writer, config, "t") == 10
    check_partition(c, root, "t", 0)
    report = gc_pass(c, writer.objects, root, config.gc_grace_ms, clock=ShiftedClock(AHEAD_S))
    assert set(report.deleted_uris) == {blobs[3], blobs[6], blobs[9]}  # 7..9's WAL blob: compacted
    assert _values(reader, "t", 7) == old[6:] + young


def test_compaction_with_retention_starts_at_the_log_start(config, writer, reader):
    c, root = writer.coordination, config.root_prefix
    create_topic(c, root, "t", 1, {"retention.ms": 1000})
    old, young = _old_and_young(writer, config, "t")
    with _compactor(writer, config) as compactor:
        done = compactor.compact_partition("t", 0, retention=True)
    assert (done.log_start_offset, done.retention_records, done.records) == (10, 9, 0)  # the young are too young
    with _compactor(writer, config, ahead_s=2 * AHEAD_S) as compactor:
        done = compactor.compact_partition("t", 0, retention=False)
    assert (done.log_start_offset, done.records, done.compactions) == (10, 6, 1)
    assert [(e.start_offset, e.entry.type) for e in index_entries(c, current_keys(c, root, "t", 0))] == [(10, COMPACTED)]
    assert _cursor(writer, config, "t") == 16
    assert _values(reader, "t", 10) == young
    check_partition(c, root, "t", 0)


# --- consumer groups ---------------------------------------------------------------------------------


@pytest.fixture
def retained(config, writer):
    """Topic ``cg``: offsets 1..9 dropped by retention, 10..15 left; group ``g`` committed at 4."""
    create_topic(writer.coordination, config.root_prefix, "cg", 1, {"retention.ms": 1000})
    _old_and_young(writer, config, "cg")
    commit_offsets(writer.coordination, config.root_prefix, "g", {TopicPartition("cg", 0): 4})
    assert _retain(writer, config, "cg").log_start_offset == 10
    return writer


def test_a_group_committed_below_the_start_counts_lag_from_the_start(config, retained, reader):
    row, = describe_group(retained.coordination, config.root_prefix, "g")
    assert (row.committed_offset, row.log_start_offset, row.high_watermark) == (4, 10, 15)
    assert row.lag == 6  # offsets 10..15; 4..9 are gone and will never be read
    outcome, = reader.fetch([FetchRequest("cg", 0, row.committed_offset, 1 << 20)])
    assert isinstance(outcome, OffsetOutOfRange)  # what a consumer at the committed offset meets
    _below_start(outcome, 10)


def test_reset_to_earliest_moves_a_group_to_the_log_start(config, retained):
    c, root, tp = retained.coordination, config.root_prefix, TopicPartition("cg", 0)
    assert reset_offsets(c, root, "g", "earliest") == {tp: 10}
    assert committed_offsets(c, root, "g", [tp])[tp].offset == 10
    assert reset_offsets(c, root, "g", '{"cg": {"0": -1}}') == {tp: 16}
    assert reset_offsets(c, root, "g", '{"cg": {"0": -2}}') == {tp: 10}
    with pytest.raises(InvalidOffset, match=r"offset 5 is outside 10\.\.16 \(the log start offset"):
        reset_offsets(c, root, "g", '{"cg": {"0": 5}}')
    assert committed_offsets(c, root, "g", [tp])[tp].offset == 10


# --- the invariants ---------------------------------------------------------------------------------


def test_the_invariants_hold_from_the_log_start_after_retention(config, writer):
    c, root = writer.coordination, config.root_prefix
    create_topic(c, root, "t", 1, {"retention.ms": 1000})
    _old_and_young(writer, config, "t")
    before = check_partition(c, root, "t", 0)
    _retain(writer, config, "t")
    after = check_partition(c, root, "t", 0)
    assert before.log_start_offset == 1 and after.log_start_offset == 10  # only forward
    assert after.sequence_counter == before.sequence_counter and after.cursor >= before.cursor



def test_a_compacted_entry_dropped_by_time_counts_its_object_size(config, writer):
    """The pass reports the bytes it dropped; a compacted entry's are its object's size."""
    c, root = writer.coordination, config.root_prefix
    create_topic(c, root, "t", 1, {"retention.ms": 1000})
    for i in range(3):
        writer.append("t", 0, [b"r%d" % i] * 4)
    with _compactor(writer, config) as compactor:
        assert compactor.compact_partition("t", 0).compactions == 1
    keys = current_keys(c, root, "t", 0)
    [size] = compacted_objects(writer.objects, keys).values()
    done = _retain(writer, config, "t")
    assert (done.log_start_offset, done.retention_entries, done.retention_bytes) == (13, 1, size)
