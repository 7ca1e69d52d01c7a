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

from chaos.run import check_at_rest, finish_interrupted, judge_acks, judge_kafka_group, read_acks, read_reads
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
    # The Kafka consumer group: nothing wrong consumed, no acknowledged commit lost, and it went on
    # after its coordinator was killed.
    assert (summary["kafka_wrong_records"], summary["kafka_out_of_order"], summary["kafka_skipped"],
            summary["kafka_lost_commits"]) == (0, 0, 0, 0), summary
    for counter in ("topic_recreations", "retention_passes", "group_commits", "group_commits_via_broker",
                    "records_acked_via_broker", "records_acked_idempotent", "records_acked_plain",
                    "broker_kills", "lost_responses", "gone_by_retention", "kafka_consumed", "kafka_commits_acked",
                    "kafka_coordinator_kills", "kafka_assignments_after_coordinator_kill"):
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


def _assign(member: str, n: int, at: float, partitions: list[int]) -> dict:
    return {"event": "assign", "member": member, "n": n, "at": at, "partitions": partitions}


def _consumed(member: str, n: int, offsets: list[int], values: list[str], partition: int = 0) -> dict:
    return {"event": "consumed", "member": member, "n": n, "partition": partition, "offsets": offsets,
            "values": values}


def _commit(member: str, n: int, sent: float, offset: int, error: str | None = None, partition: int = 0) -> list[dict]:
    return [{"event": "commit", "member": member, "n": n, "sent": sent, "offsets": {str(partition): offset}},
            {"event": "committed", "member": member, "n": n, "answered": sent + 0.1,
             "offsets": {str(partition): offset}, "errors": {str(partition): error}}]


def test_the_kafka_group_check_sees_a_record_not_the_logs_out_of_order_or_skipped():
    key = (T, "A", 0)
    log = {key: {o: f"w0.1:0:chaos:0:{o}".encode() for o in range(3, 9)}}
    acked = {key: {1: [b"w0.1:0:chaos:0:1"]}}
    events = [_assign("kc0.1", 1, 10.0, [0]),
              # 1 acknowledged, 2 below the log start and not acknowledged: both as they should be.
              _consumed("kc0.1", 1, [1, 2, 3, 4], ["w0.1:0:chaos:0:1", "p:5:chaos:0:0", "w0.1:0:chaos:0:3",
                                                   "w0.1:0:chaos:0:3"]),
              _consumed("kc0.1", 1, [4, 7], ["w0.1:0:chaos:0:4", "w0.1:0:chaos:0:7"]),
              _consumed("kc0.1", 1, [6], ["w0.1:0:chaos:0:6"]),
              # A new assignment starts over: reading 5 again is no disorder.
              _assign("kc0.1", 2, 20.0, [0]), _consumed("kc0.1", 2, [5], ["w0.1:0:chaos:0:5"])]
    judged = judge_kafka_group(events, T, "A", log, {key: 3}, acked, {}, [])
    assert (judged["kafka_consumed"], judged["kafka_wrong_records"], judged["kafka_out_of_order"],
            judged["kafka_skipped"], judged["kafka_assignments"]) == (8, 1, 2, 2, 2), judged
    assert judged["problems"][0] == ("Kafka member kc0.1 consumed 'w0.1:0:chaos:0:3' at chaos[0] offset 4; the log "
                                     "has b'w0.1:0:chaos:0:4'")
    assert "Kafka member kc0.1 skipped chaos[0] offsets 5..6 (log start 3)" in judged["problems"]
    # Below the log start, a value of another partition is wrong too.
    judged = judge_kafka_group([_consumed("kc0.1", 1, [2], ["p:5:chaos:1:0"])], T, "A", log, {key: 3}, acked, {}, [])
    assert judged["kafka_wrong_records"] == 1, judged


def test_the_kafka_group_check_tells_an_acknowledged_commit_lost_from_one_a_newer_generation_moved_back():
    a, b = "kc0.1", "kc1.1"
    events = [_assign(a, 1, 10.0, [0]), *_commit(a, 1, 11.0, 50), *_commit(a, 1, 12.0, 60),
              *_commit(a, 1, 12.5, 70, error="ILLEGAL_GENERATION"), _assign(b, 1, 13.0, [0]),
              *_commit(b, 1, 14.0, 55)]
    judge = lambda committed: judge_kafka_group(events, T, "A", {}, {}, {}, committed, [12.8])  # noqa: E731
    ok = judge({0: 60})
    assert (ok["kafka_lost_commits"], ok["kafka_commits_acked"], ok["kafka_commits_refused"]) == (0, 3, 1), ok
    # b was assigned the partition after 60 was sent: its 55 is a newer generation's, Kafka allows it.
    moved = judge({0: 55})
    assert (moved["kafka_lost_commits"], moved["kafka_commits_moved_back"]) == (0, 1), moved
    assert moved["kafka_assignments_after_coordinator_kill"] == 1, moved
    # Nothing written, or a's own older 50 landing last: 60 was lost.
    for committed in ({}, {0: 50}):
        lost = judge(committed)
        assert lost["kafka_lost_commits"] == 1, (committed, lost)
        assert "below 60 acknowledged" in lost["problems"][0]
    # A member assigned before 60 was sent is no newer generation: its 55 landing last loses 60.
    early = [_assign(b, 1, 10.5, [0]) if e["event"] == "assign" and e["member"] == b else e for e in events]
    assert judge_kafka_group(early, T, "A", {}, {}, {}, {0: 55}, [])["kafka_lost_commits"] == 1
