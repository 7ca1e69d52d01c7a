"""A short chaos run (``python -m chaos``, see :mod:`chaos`): writers, compactors, GC and readers
paused, killed and restarted, Oxia and the S3 server restarted, on a private stack; every
acknowledged record reads back exactly once and the invariants hold. And the run's end-of-run
check on its own: it sees an offset acknowledged twice, and judges a partition only after
finishing what a killed compactor left."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.run import check_at_rest, finish_interrupted, judge_acks, read_acks
from llog.compactor import Compactor
from llog.records import DELETING_OLD, CompactionRecord
from tests.helpers.clocks import past_the_lag

REPO = Path(__file__).resolve().parents[2]
T = "chaos"


def test_a_short_chaos_run_loses_and_duplicates_nothing():
    run = subprocess.run([sys.executable, "-m", "chaos", "--seconds", "40", "--seed", "11"], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-6000:]
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert (summary["lost"], summary["duplicated"], summary["double_acked"], summary["invariant_violations"]) \
        == (0, 0, 0, 0), summary
    assert summary["appends_acked"] > 50 and summary["pauses"] > 5, summary
    assert summary["compactions_completed"] > 0 and summary["gc_deleted_blobs"] > 0, summary
    assert summary["killed_mid_operation"]["writer"] > 0 and summary["killed_mid_operation"]["compactor"] > 0, summary
    assert summary["server_restarts"] == 2 and summary["final_gc"] == "ok" and summary["not_exercised"] == [], summary


def test_an_offset_acknowledged_to_two_appends_is_reported(tmp_path):
    acks = tmp_path / "acks"
    acks.mkdir()
    (acks / "w0.1.jsonl").write_text(json.dumps({"name": "w0.1", "seq": 0, "partition": 0, "start": 1, "count": 3}) + "\n")
    (acks / "w1.1.jsonl").write_text(json.dumps({"name": "w1.1", "seq": 4, "partition": 0, "start": 3, "count": 2}) + "\n")
    acked = read_acks(acks, 1)
    log = {0: {1: b"w0.1:0:0:0", 2: b"w0.1:0:0:1", 3: b"w1.1:4:0:0", 4: b"w1.1:4:0:1"}}
    judged = judge_acks(acked, log)
    assert (judged["double_acked"], judged["lost"], judged["duplicated"]) == (1, 1, 0), judged
    assert "1 offset(s) acknowledged more than once, first 3 to ['w0.1:0:0:2', 'w1.1:4:0:0']" in judged["problems"][1]


def test_the_end_of_run_check_finishes_a_compaction_killed_between_its_index_overwrite_and_delete_range(
        config, writer, reader, hooks):
    records = [f"{i}/{j}".encode() for i in range(3) for j in range(5)]
    for i in range(0, 15, 5):
        writer.append(T, 0, records[i:i + 5])

    def die():
        raise SystemExit("killed after overwriting index/{end}, before deleting the keys below it")

    hooks["compactor.after_index_overwrite"] = die
    with Compactor(config, clock=past_the_lag()) as compactor, pytest.raises(SystemExit):
        compactor.compact_partition(T, 0)
    hooks.clear()
    # docs/protocol.md section 6 step 4 done, step 5 not: the COMPACTED entry at index/15 overlaps the
    # WAL entries below it, and the record in DELETING_OLD says so. Legal until it is resumed.
    keys = writer.keys(T, 0)
    found = writer.coordination.get(keys.compaction, keys.partition_key)
    record = CompactionRecord.from_json(found.value, found.key)
    assert (record.state, record.start_offset, record.end_offset) == (DELETING_OLD, 1, 15)
    assert check_at_rest(writer.coordination, config.root_prefix, T, [0]) == [
        f"{T}[0] invariants: AssertionError: {T}[0]: entry 1..15 overlaps offset 10 "
        f"(meta/compaction {DELETING_OLD} 1..15)"]

    # A killed compactor's claim stays until its session expires: the check waits for it, bounded.
    claim = writer.coordination.claim(keys.compactor_claim, b"a killed compactor's", keys.partition_key)
    with pytest.raises(TimeoutError, match="meta/compactor-claim still held after 0.5 s"):
        finish_interrupted(config, T, [0], timeout_s=0.5)
    writer.coordination.release(keys.compactor_claim, keys.partition_key, claim)
    assert finish_interrupted(config, T, [0], timeout_s=10) == 1
    assert check_at_rest(writer.coordination, config.root_prefix, T, [0]) == []
    assert [r.value for r in reader.read_range(T, 0, 1)] == records
