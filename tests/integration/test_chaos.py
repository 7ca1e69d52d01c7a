"""A short chaos run (``python -m chaos``, see :mod:`chaos`): writers, compactors (with retention
passes), GC, readers, a topic deleted and re-created, a topic created on first use and grown by
writers, consumer groups committing, two brokers behind HAProxy with their
producers and consumer, paused, killed and restarted, lost Oxia replies, Oxia (several shards)
and the S3 server restarted, on a private stack; every acknowledged record of a live incarnation
at or above its log start reads back exactly once, none is read in another incarnation, and the
invariants hold. And the run's end-of-run check on its own: it sees an offset acknowledged twice
and a record read in an incarnation other than its acknowledgement's, counts what retention and
a delete removed as gone (not lost), and judges a partition only after finishing what a killed
compactor left."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.run import check_at_rest, finish_interrupted, judge_acks, read_acks, read_reads
from llog.compactor import Compactor
from llog.records import DELETING_OLD, CompactionRecord
from tests.helpers.clocks import past_the_lag

REPO = Path(__file__).resolve().parents[2]
T = "chaos"


def test_a_short_chaos_run_loses_and_duplicates_nothing():
    run = subprocess.run([sys.executable, "-m", "chaos", "--seconds", "40", "--seed", "11"], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    # What went wrong comes first in the controller's lines (then the actors' log tails).
    said = "\n".join(line for line in run.stderr.splitlines() if line.startswith("chaos:") and not any(
        word in line for word in ("pausing", "killing", "restarting", "starting it again", "killed and restarted")))
    assert run.stdout.strip(), run.stderr[-6000:]
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert run.returncode == 0, f"{summary}\n{said[-6000:]}"
    assert (summary["lost"], summary["duplicated"], summary["double_acked"], summary["invariant_violations"]) \
        == (0, 0, 0, 0), summary
    assert summary["appends_acked"] > 50 and summary["pauses"] > 5, summary
    assert summary["compactions_completed"] > 0 and summary["gc_deleted_blobs"] > 0, summary
    assert summary["killed_mid_operation"]["writer"] > 0 and summary["killed_mid_operation"]["compactor"] > 0, summary
    assert summary["server_restarts"] == 2 and summary["final_gc"] == "ok" and summary["not_exercised"] == [], summary
    assert summary["mixed_incarnations"] == 0 and summary["oxia_shards"] > 1, summary
    assert 4 < summary["grown_partitions"] <= 8, summary  # created on first use by writers, grown past --partitions
    assert summary["brokers"] == 2 and all(summary["balancer_requests"].values()), summary  # both behind HAProxy
    for counter in ("topic_recreations", "retention_passes", "group_commits", "group_commits_via_broker",
                    "records_acked_via_broker", "records_acked_idempotent", "records_acked_plain",
                    "broker_kills", "lost_responses", "gone_by_retention"):
        assert summary[counter] > 0, (counter, summary)


def _ack(name: str, seq: int, topic_id: str, start: int, count: int, topic: str = T, partition: int = 0) -> str:
    return json.dumps({"name": name, "seq": seq, "topic": topic, "topic_id": topic_id, "partition": partition,
                       "start": start, "count": count}) + "\n"


def test_an_offset_acknowledged_to_two_appends_is_reported(tmp_path):
    acks = tmp_path / "acks"
    acks.mkdir()
    (acks / "w0.1.jsonl").write_text(_ack("w0.1", 0, "A", 1, 3))
    (acks / "w1.1.jsonl").write_text(_ack("w1.1", 4, "A", 3, 2))
    acked = read_acks(acks)
    log = {(T, "A", 0): {1: b"w0.1:0:chaos:0:0", 2: b"w0.1:0:chaos:0:1", 3: b"w1.1:4:chaos:0:0",
                         4: b"w1.1:4:chaos:0:1"}}
    judged = judge_acks(acked, log, {(T, "A", 0): 1})
    assert (judged["double_acked"], judged["lost"], judged["duplicated"], judged["mixed_incarnations"]) \
        == (1, 1, 0, 0), judged
    assert "1 offset(s) acknowledged more than once, first 3 to ['w0.1:0:chaos:0:2', 'w1.1:4:chaos:0:0']" \
        in judged["problems"][0]


def test_a_record_read_in_another_incarnation_than_its_ack_is_mixed_and_what_retention_and_delete_removed_is_gone(
        tmp_path):
    acks, reads = tmp_path / "acks", tmp_path / "reads"
    acks.mkdir()
    reads.mkdir()
    # Incarnation A (deleted since): 2 records; B (live, log start 3 after retention): 4 records.
    (acks / "w0.1.jsonl").write_text(_ack("w0.1", 0, "A", 1, 2) + _ack("w0.1", 1, "B", 1, 4))
    live = {(T, "B", 0): {3: b"w0.1:1:chaos:0:2", 4: b"w0.1:1:chaos:0:3"}}
    judged = judge_acks(read_acks(acks), live, {(T, "B", 0): 3}, read_reads(reads))
    assert (judged["lost"], judged["mixed_incarnations"], judged["gone_by_retention"],
            judged["gone_with_deleted_topic"]) == (0, 0, 2, 2), judged
    # A reader that read a record of A in B (during the run), and one not acknowledged read in both.
    (reads / "r0.1.jsonl").write_text(json.dumps({"topic": T, "topic_id": "B", "partition": 0, "start": 1,
                                                  "values": ["w0.1:0:chaos:0:1"]}) + "\n"
                                      + json.dumps({"topic": T, "topic_id": "A", "partition": 0, "start": 5,
                                                    "values": ["w1.1:9:chaos:0:0"]}) + "\n"
                                      + json.dumps({"topic": T, "topic_id": "B", "partition": 0, "start": 5,
                                                    "values": ["w1.1:9:chaos:0:0"]}) + "\n")
    judged = judge_acks(read_acks(acks), live, {(T, "B", 0): 3}, read_reads(reads))
    assert judged["mixed_incarnations"] == 2, judged
    assert "w0.1:0:chaos:0:1 read in incarnation(s) ['B'], acknowledged in ['A']" in judged["problems"]
    # A record at or above the log start missing is lost, not gone.
    del live[(T, "B", 0)][3]
    assert judge_acks(read_acks(acks), live, {(T, "B", 0): 3})["lost"] == 1


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
