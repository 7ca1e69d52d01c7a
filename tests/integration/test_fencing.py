"""Fencing rejects appends (docs/protocol.md section 7); unfencing resumes them."""

from __future__ import annotations

import pytest

from llog.errors import AppendFailed, LogFenced
from llog.fence import fence, unfence
from llog.reader import LogReader
from llog.writer import AppendGroup, LogWriter
from tests.helpers.invariants import check_partition


def test_fence_rejects_appends_until_unfenced(config):
    with LogWriter(config, auto_initialize=True) as writer, LogReader(config) as reader:
        writer.append("t", 0, [b"a", b"b"])
        keys = writer.keys("t", 0)

        state = fence(writer.coordination, keys)
        assert state.record.fenced and state.record.high_watermark == 2
        with pytest.raises(LogFenced, match=r"t\[0\] is FENCED"):
            writer.append("t", 0, [b"c"])
        assert reader.high_watermark("t", 0) == 2  # the rejected append reserved nothing
        assert [r.value for r in reader.read_range("t", 0, 1)] == [b"a", b"b"]  # reads still work

        # One fenced partition of a shared append fails alone; the others commit.
        with pytest.raises(AppendFailed) as failed:
            writer.append_shared([AppendGroup("t", 0, [b"c"]), AppendGroup("t", 1, [b"d"])])
        assert [(r.partition, r.start_offset) for r in failed.value.results] == [(1, 1)]
        assert isinstance(failed.value.errors[("t", 0)], LogFenced)

        assert not unfence(writer.coordination, keys).record.fenced
        assert writer.append("t", 0, [b"c"]).start_offset == 3
        check_partition(writer.coordination, config.root_prefix, "t", 0)


def test_fence_is_idempotent_and_preserves_unknown_control_fields(config):
    with LogWriter(config, auto_initialize=True) as writer:
        writer.append("t", 0, [b"a"])
        keys = writer.keys("t", 0)
        control = writer.coordination.get(keys.control, keys.partition_key)
        import json
        value = json.loads(control.value)
        value["sinks"] = {"query-1": {"batch_id": 7}}
        writer.coordination.put(keys.control, json.dumps(value).encode(), keys.partition_key, control.version_id)

        first = fence(writer.coordination, keys)
        second = fence(writer.coordination, keys)
        assert first.version == second.version  # no second write
        unfence(writer.coordination, keys)
        writer.append("t", 0, [b"b"])
        after = json.loads(writer.coordination.get(keys.control, keys.partition_key).value)
        assert after["sinks"] == {"query-1": {"batch_id": 7}}
        assert after["sequence_counter"] == 3
