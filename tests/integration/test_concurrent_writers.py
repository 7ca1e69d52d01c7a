"""Several writers appending to the same partitions at once (docs/protocol.md section 8)."""

from __future__ import annotations

from llog.coordination import Coordination
from llog.reader import LogReader
from llog.writer import LogWriter
from tests.helpers import writer_process
from tests.helpers.invariants import check_acked_readable, check_partition

WRITERS, BATCHES, RECORDS, PARTITIONS = 4, 15, 20, [0, 1, 2]


def test_concurrent_writers_keep_every_record_exactly_once_in_order(config, tmp_path):
    go, names = tmp_path / "go", [f"w{i}" for i in range(WRITERS)]
    procs = [writer_process.start(config, name, "orders", PARTITIONS, BATCHES, RECORDS, go=go) for name in names]
    writer_process.release_together(go, names, procs)
    outputs = [p.communicate(timeout=300) for p in procs]
    for proc, (_, err) in zip(procs, outputs):
        assert proc.returncode == 0, err
    # The writers raced for the same controls: some reserving CASes lost on the version.
    conflicts = [writer_process.stats(out).get("cas_conflict", 0) for out, _ in outputs]
    assert sum(conflicts) > 0, f"the writers never raced (CAS conflicts per writer: {conflicts})"
    acked = [rec for out, _ in outputs for rec in writer_process.acked_records(out, RECORDS)]
    assert len(acked) == WRITERS * BATCHES * RECORDS * len(PARTITIONS)

    with Coordination(config) as coordination, LogReader(config, coordination=coordination) as reader:
        for p in PARTITIONS:
            snapshot = check_partition(coordination, config.root_prefix, "orders", p)
            assert snapshot.high_watermark == WRITERS * BATCHES * RECORDS  # nothing but acked appends
            assert snapshot.pending is None
            records = reader.read_range("orders", p, 1)
            values = [r.value for r in records]
            assert len(set(values)) == len(values), "a record was written twice"
            # Each writer's records appear in the order it wrote them.
            for w in range(WRITERS):
                mine = [v for v in values if v.startswith(f"w{w}:".encode())]
                assert mine == [writer_process.record_value(f"w{w}", b, p, i)
                                for b in range(BATCHES) for i in range(RECORDS)]
        check_acked_readable(reader, acked)


def test_a_writer_reserves_on_the_control_its_clear_wrote_and_reads_again_when_another_writer_moved_it(config):
    """After an append, a writer remembers the control its clear wrote and sends its next
    reserving CAS on it without reading first. Another writer's append in between moves the
    control: the CAS loses on the version, the writer reads it and reserves after the other's
    records, and no retry attempt is spent on it."""
    with LogWriter(config, auto_initialize=True) as a, LogWriter(config) as b:
        a.append("remembered", 0, [b"1"])
        before = a.coordination.stats.copy()
        assert a.append("remembered", 0, [b"2"]).start_offset == 2
        second = a.coordination.stats - before
        assert second["cas_conflict"] == 0 and second["read_rpc"] == 1  # the tripwire's cursor read only
        assert b.append("remembered", 0, [b"3"]).start_offset == 3
        before = a.coordination.stats.copy()
        assert a.append("remembered", 0, [b"4"]).start_offset == 4
        third = a.coordination.stats - before
        assert third["cas_conflict"] == 1 and third["read_rpc"] == 2  # the control after losing, the cursor
    with LogReader(config) as reader:
        assert [r.value for r in reader.read_range("remembered", 0, 1)] == [b"1", b"2", b"3", b"4"]
