"""A writer killed with SIGKILL at each step of the write path (docs/protocol.md section 4); the next
writer or reader recovers, the invariants hold and no acknowledged record is lost."""

from __future__ import annotations

import signal

import pytest

from llog.coordination import Coordination
from llog.fence import fence
from llog.keys import shared_wal_prefix
from llog.objects import ObjectStore
from llog.reader import LogReader
from tests.helpers import writer_process
from tests.helpers.invariants import check_acked_readable, check_monotonic, check_partition
from tests.helpers.retention import current_keys

PARTITIONS = [0, 1]


def run_writer(config, name, failpoint=None, batches=1, records=5, partitions=PARTITIONS):
    proc = writer_process.start(config, name, "t", partitions, batches, records, failpoint)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, writer_process.acked_records(out, records), err


@pytest.mark.parametrize("failpoint, reserved, indexed", [
    ("writer.after_blob_put", False, False),
    ("writer.after_reserve", True, False),
    ("writer.after_index_put", True, True),
])
def test_writer_killed_mid_append_is_recovered(config, failpoint, reserved, indexed):
    code, acked, err = run_writer(config, "before", batches=2)
    assert code == 0, err
    with Coordination(config) as coordination, LogReader(config, coordination=coordination) as reader:
        before = {p: check_partition(coordination, config.root_prefix, "t", p) for p in PARTITIONS}

        # One partition, so the failpoint is reached exactly where the test says.
        code, crashed_acked, _ = run_writer(config, "crashed", failpoint, partitions=[0])
        assert code == -signal.SIGKILL and crashed_acked == []
        blobs = list(ObjectStore(config).list(shared_wal_prefix(config.root_prefix)))
        assert len(blobs) == 3  # the crashed writer's blob was written in every case

        keys = current_keys(coordination, config.root_prefix, "t", 0)
        crashed = check_partition(coordination, config.root_prefix, "t", 0)
        check_monotonic(before[0], crashed)
        assert (crashed.pending is not None) == reserved  # the crash left the append pending
        assert crashed.high_watermark == 10 + (5 if reserved else 0)
        if reserved:
            # Durable once reserved: readers see the pending tail before anyone repairs it.
            tail = reader.read_range("t", 0, 11)
            assert [r.value for r in tail] == [writer_process.record_value("crashed", 0, 0, i) for i in range(5)]
            assert (coordination.get(keys.index(15), keys.partition_key) is not None) == indexed
        check_acked_readable(reader, acked)

        # The next writer finishes the crashed append first, then appends its own.
        code, after_acked, err = run_writer(config, "after")
        assert code == 0, err
        offset = 16 if reserved else 11
        assert [a[2] for a in after_acked if a[1] == 0] == list(range(offset, offset + 5))
        for p in PARTITIONS:
            after = check_partition(coordination, config.root_prefix, "t", p)
            check_monotonic(before[p], after)
            assert after.pending is None
        check_acked_readable(reader, acked + after_acked)


def test_fencing_finishes_a_crashed_append(config):
    code, _, _ = run_writer(config, "crashed", "writer.after_reserve", partitions=[1])
    assert code == -signal.SIGKILL
    with Coordination(config) as coordination:
        keys = current_keys(coordination, config.root_prefix, "t", 1)
        state = fence(coordination, keys)
        assert state.record.pending is None and state.record.high_watermark == 5
        assert coordination.get(keys.index(5), keys.partition_key) is not None
        check_partition(coordination, config.root_prefix, "t", 1)
