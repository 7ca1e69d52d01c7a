"""Several writer processes appending to the same partitions at once (PROTOCOL.md section 8)."""

from __future__ import annotations

from llog.coordination import Coordination
from llog.reader import LogReader
from tests.helpers import writer_process
from tests.helpers.invariants import check_acked_readable, check_partition

WRITERS, BATCHES, RECORDS, PARTITIONS = 4, 15, 20, [0, 1, 2]


def test_concurrent_writers_keep_every_record_exactly_once_in_order(config):
    procs = [writer_process.start(config, f"w{i}", "orders", PARTITIONS, BATCHES, RECORDS) for i in range(WRITERS)]
    outputs = [p.communicate(timeout=300) for p in procs]
    for proc, (_, err) in zip(procs, outputs):
        assert proc.returncode == 0, err
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
