"""The pinned record's JSON (docs/protocol.md section 9.1): ``finished_at_ms`` is written only
on a finished pin, in both forms, and read back; a record without it reads as not finished."""

from __future__ import annotations

import json

from llog.sink_batches import PinnedBatch
from llog.writer import StagedSlice

SLICE = StagedSlice("t", 0, 2, 0, 10, "s3://b/R/wal-shared/x", 1_000, "records-v2")


def test_an_inline_pin_round_trips_with_and_without_finished_at_ms():
    pinned = PinnedBatch("q", 4, (SLICE,), 900, {"t": (2, 10)})
    raw = pinned.inline_json()
    assert "finished_at_ms" not in json.loads(raw)
    assert PinnedBatch.from_json(raw, "k") == pinned
    finished = PinnedBatch("q", 4, (SLICE,), 900, {"t": (2, 10)}, finished_at_ms=1_234)
    assert json.loads(finished.inline_json())["finished_at_ms"] == 1_234
    assert PinnedBatch.from_json(finished.inline_json(), "k") == finished


def test_a_pin_whose_cut_is_in_an_object_keeps_the_object_and_the_mark():
    header = PinnedBatch("q", 4, (), 900, None, "s3://b/R/sink-cuts/u", 800, 1_234)
    read = PinnedBatch.from_json(header.header_json(), "k")
    assert (read.cut_uri, read.cut_created_at_ms, read.finished_at_ms) == ("s3://b/R/sink-cuts/u", 800, 1_234)
