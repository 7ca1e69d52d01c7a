"""Compaction (docs/protocol.md section 6) and WAL garbage collection (section 9) on real Oxia and
S3 (versitygw): same bytes after compaction, continuous readability, a compactor killed at every step
and resumed by another, racing compactors, and GC deleting exactly the old unreferenced blobs."""

from __future__ import annotations

import threading
import time

import pytest

from llog.clock import ShiftedClock
from llog.compactor import FAILPOINTS, Compactor
from llog.coordination import Coordination
from llog.errors import InconsistentReadState, StaleBlob
from llog.gc import all_partitions, collect_garbage, gc_pass, referenced_blobs
from llog.keys import shared_wal_object, shared_wal_prefix
from llog.objects import ObjectStore
from llog.reader import LogReader
from llog.records import COMPACTED, CompactionRecord
from llog.writer import AppendGroup, LogWriter, SinkBatch
from tests.helpers import compactor_process
from tests.helpers.clocks import past_the_lag
from tests.helpers.invariants import check_monotonic, check_partition

PARTITIONS = [0, 1]


def _fill(writer, topic: str, appends: int = 10, records: int = 50) -> dict[int, list[bytes]]:
    """``appends`` shared appends of ``records`` records to each partition."""
    values = {p: [] for p in PARTITIONS}
    for a in range(appends):
        groups = [AppendGroup(topic, p, [f"{p}/{a}/{i}".encode() * (1 + i % 3) for i in range(records)])
                  for p in PARTITIONS]
        writer.append_shared(groups)
        for g in groups:
            values[g.partition] += g.records
    return values


def _log(reader, topic: str, partition: int) -> list[bytes]:
    return [r.value for r in reader.read_range(topic, partition, 1)]


def _snapshots(config, topic):
    with Coordination(config) as coordination:
        return {p: check_partition(coordination, config.root_prefix, topic, p) for p in PARTITIONS}


def test_compaction_keeps_every_record_with_the_same_bytes(config, writer, reader):
    values = _fill(writer, "t")
    before = _snapshots(config, "t")
    with Compactor(config, clock=past_the_lag(), max_offsets=120) as compactor:
        done = [compactor.compact_partition("t", p) for p in PARTITIONS]
    assert [d.records for d in done] == [500, 500]
    assert all(d.compactions == 5 and d.source_gets == d.source_entries == 10 for d in done)  # 2 entries per run
    after = _snapshots(config, "t")
    for p in PARTITIONS:
        check_monotonic(before[p], after[p])
        assert after[p].cursor == 501
        assert [e.entry.type for e in after[p].entries] == [COMPACTED] * 5
        assert _log(reader, "t", p) == values[p]
        assert reader.read_offset("t", p, 333).value == values[p][332]  # two small range GETs
    with Compactor(config, clock=past_the_lag()) as compactor:  # nothing left
        assert compactor.compact_partition("t", 0).compactions == 0
    writer.append("t", 0, [b"after"])  # appends go on after compacted entries
    assert _log(reader, "t", 0) == values[0] + [b"after"]


def test_a_concurrent_reader_never_sees_an_error_or_a_gap(config, writer, hooks):
    """A reader reads the whole partition over and over while it is compacted. The compactor
    waits in each state a reader can meet mid-compaction (the index overwritten, the WAL entries
    deleted) until a read has started and ended there, so every compaction is read through, not
    only the log before and after it."""
    values = _fill(writer, "live", appends=30, records=20)
    stop, errors = threading.Event(), []
    reads: list[tuple[float, float]] = []  # (started, ended), time.monotonic()
    read_done = threading.Condition()

    def read_continuously():
        try:
            with LogReader(config) as reader:
                while not stop.is_set():
                    started = time.monotonic()
                    assert _log(reader, "live", 0) == values[0]
                    with read_done:
                        reads.append((started, time.monotonic()))
                        read_done.notify_all()
        except Exception as e:  # noqa: BLE001 - any failure is the finding
            errors.append(e)
        finally:
            with read_done:
                read_done.notify_all()

    def wait_for_a_whole_read():  # the compactor pauses here: the reader reads this state
        since = time.monotonic()
        with read_done:
            read_done.wait_for(lambda: errors or not thread.is_alive() or (reads and reads[-1][0] > since), 10)

    # Each compaction's record exists from after its create to after the cursor move (then it is deleted).
    created, finishing = [], []
    hooks["compactor.after_record_create"] = lambda: created.append(time.monotonic())
    hooks["compactor.after_index_overwrite"] = wait_for_a_whole_read
    hooks["compactor.after_delete_range"] = wait_for_a_whole_read
    hooks["compactor.after_cursor_move"] = lambda: finishing.append(time.monotonic())
    thread = threading.Thread(target=read_continuously)
    thread.start()
    try:
        with Compactor(config, clock=past_the_lag(), max_offsets=40) as compactor:
            assert compactor.compact_partition("live", 0).compactions == 15
    finally:
        stop.set()
        thread.join(60)
    assert not errors, errors[0]
    in_flight = list(zip(created, finishing, strict=True))
    assert len(in_flight) == 15
    # Every compaction had at least two whole reads while its meta/compaction record existed.
    during = [[r for r in reads if start < r[0] and r[1] < end] for start, end in in_flight]
    assert all(len(d) >= 2 for d in during), [len(d) for d in during]


def test_a_read_loses_no_race_with_compaction_and_gc_between_resolving_and_fetching(config, reader, hooks):
    """Each time the read is about to fetch, the next entry it resolved is compacted and its
    blob collected (what a chaos run's reader met). Only the slices of the missing blob are
    resolved again; fetching everything again would meet the next collected blob, and so on.
    Entry ``e`` is written ``e * 1000`` s later by its writer's clock, so a compactor whose clock
    is ``G + k * 1000 + 500`` s ahead takes entries ``0..k`` only (the compaction lag)."""
    entries = [[f"{e}/{i}".encode() for i in range(5)] for e in range(3)]
    for e, records in enumerate(entries):
        with LogWriter(config, auto_initialize=True, clock=ShiftedClock(e * 1000)) as writer:
            writer.append("race", 0, records)  # each entry its own blob
    compacted = []

    def compact_and_collect(k: int):
        def hook():
            del hooks["reader.before_fetch"]  # the compactor fetches too
            with Compactor(config, clock=ShiftedClock(config.gc_grace_ms / 1000 + k * 1000 + 500)) as compactor:
                compacted.append(compactor.compact_partition("race", 0).records)
            report = gc_pass(reader.coordination, reader.objects, config.root_prefix, config.gc_grace_ms,
                             clock=past_the_lag())
            assert report.deleted == 1  # entry k's blob
            if k < 1:
                hooks["reader.before_fetch"] = compact_and_collect(k + 1)
        return hook

    hooks["reader.before_fetch"] = compact_and_collect(0)
    assert _log(reader, "race", 0) == [r for records in entries for r in records]
    assert compacted == [5, 5] and "reader.before_fetch" not in hooks


@pytest.mark.parametrize("failpoint", FAILPOINTS)
def test_a_compactor_killed_at_every_step_is_resumed_by_another(config, writer, reader, failpoint):
    values = _fill(writer, "c")
    before = _snapshots(config, "c")
    killed = compactor_process.run(config, "c", [0], max_offsets=200, failpoint=failpoint)
    assert killed.returncode == -9, killed.stderr
    keys = writer.keys("c", 0)
    with Coordination(config) as coordination:
        record = coordination.get(keys.compaction, keys.partition_key)
        # A record is in flight unless the blob PUT was the last thing done.
        assert (record is None) == (failpoint == "compactor.after_blob_put")
        if record is not None:
            state = CompactionRecord.from_json(record.value).state
            assert state == {"compactor.after_record_create": "WRITING_COMPACTED_INDEX",
                             "compactor.after_index_overwrite": "DELETING_OLD",
                             "compactor.after_delete_range": "UPDATING_CURSOR",
                             "compactor.after_cursor_move": "UPDATING_CURSOR"}[failpoint]
    assert _log(reader, "c", 0) == values[0]  # readable in the state the crash left

    # The killed compactor's claim goes with its session; then another resumes and finishes.
    deadline = time.monotonic() + 30
    with Compactor(config, clock=past_the_lag(), max_offsets=200) as compactor:
        while True:
            done = compactor.compact_partition("c", 0)
            if not done.skipped_claimed:
                break
            assert time.monotonic() < deadline, "the killed compactor's claim never expired"
            time.sleep(0.5)
    assert done.recoveries == (0 if failpoint == "compactor.after_blob_put" else 1)
    after = _snapshots(config, "c")
    check_monotonic(before[0], after[0])
    assert after[0].cursor == 501 and all(e.entry.type == COMPACTED for e in after[0].entries)
    assert _log(reader, "c", 0) == values[0]
    assert _log(reader, "c", 1) == values[1]  # untouched


def test_racing_compactors_are_kept_apart_by_the_claim(config, writer, reader, hooks):
    """Two connected compactors start together on the same partitions. The first to take a
    partition's claim waits, once, until the other has been refused one, so they do contend;
    the claim must then leave each partition's whole work to one compactor: no run compacted
    twice, by two, or left out."""
    values = _fill(writer, "race", appends=20, records=30)
    results, errors = {}, []
    go = threading.Barrier(2, timeout=60)
    refused = threading.Event()

    def hold_the_first_claim():
        hooks.pop("compactor.after_recover", None)
        refused.wait(10)

    def compact(name):
        try:
            with Compactor(config, clock=past_the_lag(), max_offsets=60) as compactor:
                go.wait()  # both connected: neither is ahead by its start-up
                runs = []
                for p in PARTITIONS * 3:
                    runs.append(compactor.compact_partition("race", p))
                    if runs[-1].skipped_claimed:
                        refused.set()
                results[name] = runs
        except Exception as e:  # noqa: BLE001 - any failure is the finding
            errors.append(e)

    hooks["compactor.after_recover"] = hold_the_first_claim
    threads = [threading.Thread(target=compact, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[0]
    assert sorted(results) == ["a", "b"]
    done = [d for runs in results.values() for d in runs]
    assert any(d.skipped_claimed for d in done)  # they did meet at a claim
    for p in PARTITIONS:
        # The claim holder compacts until nothing is left: 10 runs of 60 offsets, in one call.
        assert [(d.compactions, d.records) for d in done if d.partition == p and d.compactions] == [(10, 600)]
        assert len(list(reader.objects.list(writer.keys("race", p).compacted_prefix))) == 10  # no run PUT twice
        assert _log(reader, "race", p) == values[p]
    after = _snapshots(config, "race")
    for p in PARTITIONS:
        assert after[p].cursor == 601
        assert [(e.start_offset, e.entry.type) for e in after[p].entries] == [(1 + 60 * k, COMPACTED)
                                                                              for k in range(10)]


def test_a_killed_claim_holder_is_waited_out(config, writer, reader):
    values = _fill(writer, "held")
    killed = compactor_process.run(config, "held", [0], max_offsets=100, failpoint="compactor.after_index_overwrite",
                                   session_timeout_ms=4000)
    assert killed.returncode == -9
    with Compactor(config, clock=past_the_lag(), max_offsets=100) as compactor:
        assert compactor.compact_partition("held", 0).skipped_claimed  # its session is still alive
        time.sleep(6)
        done = compactor.compact_partition("held", 0)
    assert not done.skipped_claimed and done.recoveries == 1 and done.records == 400
    assert _log(reader, "held", 0) == values[0]


def test_gc_deletes_exactly_the_old_unreferenced_blobs(config):
    config = config.replace(gc_grace_ms=2000)
    objects = ObjectStore(config)
    with LogWriter(config, auto_initialize=True) as writer, Coordination(config) as coordination:
        values = _fill(writer, "g", appends=4, records=10)
        with Compactor(config, coordination=coordination, objects=objects, max_offsets=20,
                       clock=past_the_lag()) as compactor:
            compactor.compact_partition("g", 0)  # entries 1..20 of partition 0 compacted
        orphan = objects.put(shared_wal_object(config.root_prefix), b"an aborted sink batch's blob")
        staged = writer.upload([AppendGroup("g", 1, [b"staged, never committed"])])
        time.sleep(2.5)  # everything so far is older than the grace period
        young = objects.put(shared_wal_object(config.root_prefix), b"too young")

        # Writers append while GC runs: what they write is young, and referenced.
        stop, appended, failed = threading.Event(), [], []

        def append_while_gc_runs():
            try:
                while not stop.is_set():
                    appended.append(writer.append("g", 1, [b"concurrent"]))
            except Exception as e:  # noqa: BLE001 - asserted below
                failed.append(e)

        def appends_after(count: int) -> None:
            deadline = time.monotonic() + 30
            while len(appended) <= count and not failed and time.monotonic() < deadline:
                time.sleep(0.005)
            assert len(appended) > count, f"the appender made no append in 30 s: {failed}"

        appender = threading.Thread(target=append_while_gc_runs)
        appender.start()
        try:
            appends_after(0)  # appending when the pass begins
            referenced = referenced_blobs(coordination, config.root_prefix,
                                          all_partitions(coordination, config.root_prefix))
            scanned = len(appended)
            appends_after(scanned)  # and between the scan and the listing: blobs no reference it scanned names
            listed = len(appended)
            report = collect_garbage(objects, config.root_prefix, referenced, config.gc_grace_ms)
        finally:
            stop.set()
            appender.join(30)
        assert not failed and not appender.is_alive()

        blobs = {f"s3://{config.s3_bucket}/{o.key}" for o in objects.list(shared_wal_prefix(config.root_prefix))}
        assert orphan in report.deleted_uris and staged[0].wal_uri in report.deleted_uris
        assert young in blobs and orphan not in blobs and staged[0].wal_uri not in blobs
        # The 4 shared blobs still back partition 1's WAL entries: all kept. So are the blobs of the
        # appends that landed after the scan (too young), and of every append made meanwhile.
        assert report.deleted == 2 and not set(report.deleted_uris) & referenced
        after_scan = {r.wal_uri for r in appended[scanned:listed]} - referenced
        assert after_scan and report.too_young >= len(after_scan) + 1 and after_scan <= blobs
        assert {r.wal_uri for r in appended} <= blobs
        with LogReader(config, coordination=coordination) as reader:
            assert _log(reader, "g", 0) == values[0]
            assert _log(reader, "g", 1) == values[1] + [b"concurrent"] * len(appended)
        # The age rule: the deleted staged blob can never be referenced again.
        with pytest.raises(StaleBlob):
            writer.commit_staged(staged, SinkBatch("late", 0))

        # Once partition 1 is compacted too, its old shared blobs are garbage.
        with Compactor(config, clock=past_the_lag(), coordination=coordination, objects=objects) as compactor:
            compactor.compact_partition("g", 1)
        time.sleep(2.5)
        partitions = all_partitions(coordination, config.root_prefix)
        referenced = referenced_blobs(coordination, config.root_prefix, partitions)
        report = collect_garbage(objects, config.root_prefix, referenced, config.gc_grace_ms, partitions=partitions)
        assert all("/data/compacted/" in uri for uri in referenced) and report.deleted >= 4
        assert report.referenced == len(referenced)  # the compacted blobs are listed, and kept
        assert list(objects.list(shared_wal_prefix(config.root_prefix))) == []
        with LogReader(config, coordination=coordination) as reader:
            assert _log(reader, "g", 0) == values[0]
    objects.close()


def test_gc_collects_the_compacted_blob_of_a_compactor_that_died_before_its_record(config, reader):
    config = config.replace(gc_grace_ms=2000)  # every process under the root prefix uses one G
    with LogWriter(config, auto_initialize=True) as writer:
        values = _fill(writer, "orphan")
        keys = writer.keys("orphan", 0)
    killed = compactor_process.run(config, "orphan", [0], max_offsets=200, failpoint="compactor.after_blob_put")
    assert killed.returncode == -9, killed.stderr
    objects = ObjectStore(config)
    try:
        [orphan] = [o.key for o in objects.list(keys.compacted_prefix)]
        deadline = time.monotonic() + 30
        # once the killed one's claim expires:
        with Compactor(config, clock=past_the_lag(), max_offsets=200) as compactor:
            while compactor.compact_partition("orphan", 0).skipped_claimed:
                assert time.monotonic() < deadline, "the killed compactor's claim never expired"
                time.sleep(0.5)
        time.sleep(2.5)  # every blob is older than the grace period now
        with Coordination(config) as coordination:
            report = gc_pass(coordination, objects, config.root_prefix, config.gc_grace_ms)
        left = {o.key for o in objects.list(keys.compacted_prefix)}
        assert f"s3://{config.s3_bucket}/{orphan}" in report.deleted_uris and orphan not in left
        assert len(left) == 3  # the 3 compactions that landed (200 + 200 + 100 offsets)
        assert _log(reader, "orphan", 0) == values[0] and _log(reader, "orphan", 1) == values[1]
    finally:
        objects.close()


def test_a_gap_in_an_index_stops_gc_before_anything_is_deleted(config):
    config = config.replace(gc_grace_ms=2000)  # every process under the root prefix uses one G
    with LogWriter(config, auto_initialize=True) as writer:
        _fill(writer, "gap", appends=3, records=10)
        keys = writer.keys("gap", 1)
    objects = ObjectStore(config)
    try:
        garbage = objects.put(shared_wal_object(config.root_prefix), b"old and unreferenced")
        with Coordination(config) as coordination:
            coordination.delete(keys.index(20), keys.partition_key)  # offsets 11..20 lose their entry
            time.sleep(2.5)
            with pytest.raises(InconsistentReadState, match=r"gap\[1\]: no index entry covers offsets 11..20"):
                gc_pass(coordination, objects, config.root_prefix, config.gc_grace_ms)
        assert objects.get(garbage) == b"old and unreferenced"
    finally:
        objects.close()


def test_a_compactor_does_not_reference_a_blob_older_than_half_the_grace_period(config, writer, reader, hooks):
    values = _fill(writer, "slow", appends=2, records=10)
    keys = writer.keys("slow", 0)
    clock = past_the_lag()
    # its PUT takes longer than G/2:
    hooks["compactor.after_blob_put"] = lambda: clock.advance(config.gc_grace_ms / 1000 / 2 + 1)
    with Compactor(config, clock=clock, max_offsets=200) as compactor:
        with pytest.raises(StaleBlob, match="left for GC"):
            compactor.compact_partition("slow", 0)
    with Coordination(config) as coordination:
        assert coordination.get(keys.compaction, keys.partition_key) is None
        assert check_partition(coordination, config.root_prefix, "slow", 0).cursor == 1
    assert _log(reader, "slow", 0) == values[0]


def test_a_reader_whose_blobs_were_compacted_and_collected_resolves_again(config, writer, reader):
    values = _fill(writer, "gone", appends=12, records=40)
    from llog.reader import ReadRequest

    stream = reader.stream_batches(ReadRequest("gone", 0, 1, 480), chunk_bytes=1, lookahead=1)  # a chunk per entry
    first = next(stream)
    with Compactor(config, clock=past_the_lag()) as compactor:
        assert compactor.compact_partition("gone", 0).records == 480
    objects = ObjectStore(config)
    try:  # every WAL blob collected at once (as GC would once they are old enough)
        objects.delete_many([f"s3://{config.s3_bucket}/{o.key}" for o in objects.list(shared_wal_prefix(config.root_prefix))])
    finally:
        objects.close()
    rest = [v for batch in stream for v in batch.column(1).to_pylist()]
    assert first.column(1).to_pylist() + rest == values[0]
    assert _log(reader, "gone", 0) == values[0]


def test_max_bytes_bounds_a_run_but_takes_at_least_one_entry(config, writer, reader):
    values = _fill(writer, "bytes", appends=4, records=10)
    with Compactor(config, clock=past_the_lag(), max_bytes=1) as compactor:
        done = compactor.compact_partition("bytes", 0)
    assert done.compactions == 4 and done.records == 40
    assert _log(reader, "bytes", 0) == values[0]
