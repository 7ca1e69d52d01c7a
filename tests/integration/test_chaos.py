"""A short chaos run (``python -m chaos``, see :mod:`chaos`): writers, compactors (with retention
passes), GC, readers, a topic deleted and re-created, a topic created on first use and grown by
writers, consumer groups committing, two brokers behind HAProxy with their
producers and consumer, paused, killed and restarted, lost Oxia replies, Oxia (several shards)
and the S3 server restarted, on a private stack; every acknowledged record of a live incarnation
at or above its log start reads back exactly once, none is read in another incarnation, and the
invariants hold. And the run's end-of-run check on its own: it sees an offset acknowledged twice
and a record read in an incarnation other than its acknowledgement's, counts as gone (not lost)
only what retention may have taken (older than ``retention.ms``) and what a delete the admin made
took, judges a partition only after finishing what a killed compactor left, reads a cut last
acknowledgement line, sees a Kafka member start past the group's commits, counts a compactor's
``InconsistentReadState`` as a violation, and fails a run that checked too little or did too
little (a compactor killed only between passes, one incarnation, actors exiting on their own)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.run import (
    AckedRecord, _mid_operation, check_at_rest, finish_interrupted, judge_acks, judge_kafka_group, not_exercised,
    out_of_bounds, read_ack_lines, read_acks, read_reads, retention_safe_from,
)
from llog.compactor import Compactor
from llog.errors import InconsistentReadState
from llog.records import DELETING_OLD, CompactionRecord
from llog.topics import TopicSettings
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
    # At least half of what was acknowledged read back and checked; exits only around server restarts.
    assert summary["out_of_bounds"] == [] and summary["verified_fraction"] >= 0.5, summary
    assert summary["incarnations_acked"] >= 2 and summary["compactions_resumed"] > 0, summary
    assert summary["mixed_incarnations"] == 0 and summary["oxia_shards"] > 1, summary
    assert 4 < summary["grown_partitions"] <= 8, summary  # created on first use by writers, grown past --partitions
    assert summary["brokers"] == 2 and all(summary["balancer_requests"].values()), summary  # both behind HAProxy
    # The Kafka consumer group: nothing wrong consumed, no acknowledged commit lost, and it went on
    # after its coordinator was killed.
    assert (summary["kafka_wrong_records"], summary["kafka_out_of_order"], summary["kafka_skipped"],
            summary["kafka_lost_commits"], summary["kafka_started_past_commit"]) == (0, 0, 0, 0, 0), summary
    for counter in ("topic_recreations", "retention_passes", "group_commits", "group_commits_via_broker",
                    "records_acked_via_broker", "records_acked_idempotent", "records_acked_plain",
                    "broker_kills", "lost_responses", "gone_by_retention", "kafka_consumed", "kafka_commits_acked",
                    "kafka_coordinator_kills", "kafka_assignments_after_coordinator_kill",
                    "kafka_consumed_after_coordinator_kill"):
        assert summary[counter] > 0, (counter, summary)


def _ack(name: str, seq: int, topic_id: str, start: int, count: int, topic: str = T, partition: int = 0,
         sent_at: float = 100.0) -> str:
    return json.dumps({"name": name, "seq": seq, "topic": topic, "topic_id": topic_id, "partition": partition,
                       "start": start, "count": count, "sent_at": sent_at, "acked_at": sent_at + 0.5}) + "\n"


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
    judged = judge_acks(read_acks(acks), live, {(T, "B", 0): 3}, read_reads(reads), deleted={(T, "A", 0)})
    assert (judged["lost"], judged["mixed_incarnations"], judged["gone_by_retention"],
            judged["gone_with_deleted_topic"], judged["verified"]) == (0, 0, 2, 2, 2), judged
    # A reader that read a record of A in B (during the run), and one not acknowledged read in both.
    (reads / "r0.1.jsonl").write_text(json.dumps({"topic": T, "topic_id": "B", "partition": 0, "start": 1,
                                                  "values": ["w0.1:0:chaos:0:1"]}) + "\n"
                                      + json.dumps({"topic": T, "topic_id": "A", "partition": 0, "start": 5,
                                                    "values": ["w1.1:9:chaos:0:0"]}) + "\n"
                                      + json.dumps({"topic": T, "topic_id": "B", "partition": 0, "start": 5,
                                                    "values": ["w1.1:9:chaos:0:0"]}) + "\n")
    judged = judge_acks(read_acks(acks), live, {(T, "B", 0): 3}, read_reads(reads), deleted={(T, "A", 0)})
    assert judged["mixed_incarnations"] == 2, judged
    assert "w0.1:0:chaos:0:1 read in incarnation(s) ['B'], acknowledged in ['A']" in judged["problems"]
    # A record at or above the log start missing is lost, not gone.
    del live[(T, "B", 0)][3]
    assert judge_acks(read_acks(acks), live, {(T, "B", 0): 3}, deleted={(T, "A", 0)})["lost"] == 1


def test_acknowledgements_of_an_incarnation_no_one_deleted_or_of_a_partition_not_read_back_are_lost(tmp_path):
    acks = tmp_path / "acks"
    acks.mkdir()
    # A: deleted by the admin (its partition 0 a tombstone); C: never deleted, yet not read back;
    # B: live, but its partition 5 (past its count, or unreadable) not read back.
    (acks / "w0.1.jsonl").write_text(_ack("w0.1", 0, "A", 1, 2) + _ack("w0.1", 1, "C", 1, 3)
                                     + _ack("w0.1", 2, "B", 1, 4, partition=5) + _ack("w0.1", 3, "B", 1, 1))
    live = {(T, "B", 0): {1: b"w0.1:3:chaos:0:0"}}
    judged = judge_acks(read_acks(acks), live, {(T, "B", 0): 1}, deleted={(T, "A", 0)})
    assert (judged["lost"], judged["gone_with_deleted_topic"], judged["verified"]) == (7, 2, 1), judged
    assert f"{T}[0] of C: 3 acknowledged record(s) not read back: the partition is not in a live incarnation and " \
           "its incarnation was not deleted" in judged["problems"]
    assert any(p.startswith(f"{T}[5] of B: 4 acknowledged record(s) not read back") for p in judged["problems"])
    # Nothing is excused as deleted that the run did not delete.
    assert judge_acks(read_acks(acks), live, {(T, "B", 0): 1})["lost"] == 9


def test_retention_excuses_only_acknowledgements_sent_before_it_could_take_them(tmp_path):
    acks = tmp_path / "acks"
    acks.mkdir()
    # retention.ms 30 s, G 12 s, the actors stopped at 1000: retention cannot have taken an entry
    # created at or after 971 (1000 - 30 + 1 s margin); an append sent then is created no earlier.
    safe = retention_safe_from(1000.0, TopicSettings(30_000, -1, "delete", "none"), 12_000)
    assert safe == 971.0
    assert retention_safe_from(1000.0, TopicSettings(5_000, -1, "delete", "none"), 12_000) == 989.0  # floor G
    assert retention_safe_from(1000.0, TopicSettings(-1, -1, "delete", "none"), 12_000) == float("-inf")
    (acks / "w0.1.jsonl").write_text(_ack("w0.1", 0, "B", 1, 3, sent_at=900.0)
                                     + _ack("w0.1", 1, "B", 4, 2, sent_at=980.0)
                                     + _ack("w0.1", 2, "B", 6, 2, sent_at=990.0))
    key = (T, "B", 0)
    log = {key: {6: b"w0.1:2:chaos:0:0", 7: b"w0.1:2:chaos:0:1"}}
    # The log start 6: 1..3 old enough to be gone; 4..5 sent at 980, too young for retention: lost.
    judged = judge_acks(read_acks(acks), log, {key: 6}, kept_from={key: safe})
    assert (judged["lost"], judged["gone_by_retention"], judged["verified"]) == (2, 3, 2), judged
    assert f"{T}[0] of B: 2 acknowledged record(s) below the log start 6 though sent after 971.000, too young for " \
           "retention to take, first at offsets [4, 5]" in judged["problems"]
    # The log start at 4: nothing lost, 4 of 7 verified.
    log[key].update({4: b"w0.1:1:chaos:0:0", 5: b"w0.1:1:chaos:0:1"})
    judged = judge_acks(read_acks(acks), log, {key: 4}, kept_from={key: safe})
    assert (judged["lost"], judged["gone_by_retention"], judged["verified"]) == (0, 3, 4), judged


def test_a_cut_last_acknowledgement_line_is_counted_not_a_crash_and_a_damaged_one_is_reported(tmp_path):
    acks = tmp_path / "acks"
    acks.mkdir()
    (acks / "w0.1.jsonl").write_text(_ack("w0.1", 0, "A", 1, 2) + _ack("w0.1", 1, "A", 3, 1)[:40])
    (acks / "w1.1.jsonl").write_text(_ack("w1.1", 0, "A", 4, 1))
    acked = read_acks(acks)
    assert sorted(acked[(T, "A", 0)]) == [1, 2, 4]
    assert acked[(T, "A", 0)][1] == [AckedRecord(b"w0.1:0:chaos:0:0", 100.0)]
    lines = read_ack_lines(acks)
    assert (len(lines.lines), len(lines.cut), lines.damaged) == (2, 1, []), lines
    assert read_ack_lines(acks, ["w1"]).lines[0]["name"] == "w1.1"
    # A line that does not parse before a file's last one: no kill explains it.
    (acks / "w2.1.jsonl").write_text("{not json\n" + _ack("w2.1", 0, "A", 5, 1))
    assert read_ack_lines(acks).damaged == ["w2.1.jsonl line 1: '{not json'"]


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
    # Not at rest, so not judged by the invariants at rest (whose "No overlap" it breaks, legally).
    assert check_at_rest(writer.coordination, config.root_prefix, T, [0]) == [
        f"{T}[0]: not at rest, work left unfinished: meta/compaction {DELETING_OLD} 1..15"]

    # A killed compactor's claim stays until its session expires: the check waits for it, bounded.
    claim = writer.coordination.claim(keys.compactor_claim, b"a killed compactor's", keys.partition_key)
    with pytest.raises(TimeoutError, match="meta/compactor-claim still held after 0.5 s"):
        finish_interrupted(config, T, [0], timeout_s=0.5)
    writer.coordination.release(keys.compactor_claim, keys.partition_key, claim)
    assert finish_interrupted(config, T, [0], timeout_s=10) == (1, 1)  # one recovery: the compaction record
    assert check_at_rest(writer.coordination, config.root_prefix, T, [0]) == []
    assert [r.value for r in reader.read_range(T, 0, 1)] == records


def _assign(member: str, n: int, at: float, partitions: list[int]) -> dict:
    return {"event": "assign", "member": member, "n": n, "at": at, "partitions": partitions}


def _consumed(member: str, n: int, offsets: list[int], values: list[str], partition: int = 0, at: float = 0.0) -> dict:
    return {"event": "consumed", "member": member, "n": n, "at": at, "partition": partition, "offsets": offsets,
            "values": values}


def _commit(member: str, n: int, sent: float, offset: int, error: str | None = None, partition: int = 0) -> list[dict]:
    return [{"event": "commit", "member": member, "n": n, "sent": sent, "offsets": {str(partition): offset}},
            {"event": "committed", "member": member, "n": n, "answered": sent + 0.1,
             "offsets": {str(partition): offset}, "errors": {str(partition): error}}]


def test_the_kafka_group_check_sees_a_record_not_the_logs_out_of_order_or_skipped():
    key = (T, "A", 0)
    log = {key: {o: f"w0.1:0:chaos:0:{o}".encode() for o in range(3, 9)}}
    acked = {key: {1: [AckedRecord(b"w0.1:0:chaos:0:1", 1.0)]}}
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
    # No commit: each assignment begins at the log start (3). The second began at 5, past 3 and 4.
    assert judged["kafka_started_past_commit"] == 1, judged
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


def test_the_kafka_group_check_sees_a_member_begin_past_the_groups_commits_and_counts_what_it_consumed_after_a_kill():
    key = (T, "A", 0)
    log = {key: {o: f"p:{o}:chaos:0:0".encode() for o in range(10, 40)}}
    values = lambda offsets: [f"p:{o}:chaos:0:0" for o in offsets]  # noqa: E731
    kc1_first = _consumed("kc1.1", 1, [15, 16], values([15, 16]), at=14.0)
    events = [_assign("kc0.1", 1, 10.0, [0]), _consumed("kc0.1", 1, [10, 11], values([10, 11]), at=10.5),
              *_commit("kc0.1", 1, 11.0, 12),
              # kc1 takes the partition over at 13: the group's offset is 12 at most, yet it begins at 15.
              _assign("kc1.1", 1, 13.0, [0]), kc1_first,
              # kc0's commit of 20, sent after kc1's assignment began, cannot have set where kc1 began.
              *_commit("kc0.1", 1, 13.5, 20, error="ILLEGAL_GENERATION")]
    judge = lambda log_starts, acked, retention_s: judge_kafka_group(  # noqa: E731
        events, T, "A", log, log_starts, acked, {0: 17}, [12.0], retention_s)
    judged = judge({key: 10}, {}, None)
    assert (judged["kafka_started_past_commit"], judged["kafka_consumed_after_coordinator_kill"]) == (1, 2), judged
    assert judged["problems"] == ["Kafka member kc1.1 began assignment 1 of chaos[0] at offset 15, past 12 (the "
                                  "highest commit sent before it), though offset 14 was still in the log then (it "
                                  "is now)"]
    # Retention took 12..14 (the log start 15 at the end), with offset 14 sent long enough before
    # the assignment: the member began at the log start, as it should.
    acked = {key: {14: [AckedRecord(b"p:14:chaos:0:0", 1.0)]}}
    assert judge({key: 15}, acked, 5.0)["kafka_started_past_commit"] == 0
    # Offset 14 acknowledged as sent at 12.5, 0.5 s before the assignment: retention, which takes
    # nothing younger than 5 s, cannot have taken it by then.
    acked = {key: {14: [AckedRecord(b"p:14:chaos:0:0", 12.5)]}}
    assert judge({key: 15}, acked, 5.0)["kafka_started_past_commit"] == 1
    # The member looks up where to start after the assignment begins, before its first record: on
    # a loaded machine seconds later (a chaos run beside the suite: 1795 of 1796). Its first
    # record at 19.0, retention may have taken 14 (sent 6.5 s before) meanwhile.
    kc1_first["at"] = 19.0
    assert judge({key: 15}, acked, 5.0)["kafka_started_past_commit"] == 0
    kc1_first["at"] = 14.0
    # A commit of 15 sent before the assignment and answered with an error may have landed (an
    # earlier attempt of it, sent again after a timeout): the group's offset may have been 15.
    events.insert(3, _commit("kc0.1", 1, 12.5, 15, error="ILLEGAL_GENERATION")[0])
    events.insert(4, _commit("kc0.1", 1, 12.5, 15, error="ILLEGAL_GENERATION")[1])
    assert judge({key: 10}, {}, None)["kafka_started_past_commit"] == 0


def test_a_compactors_inconsistent_read_state_is_a_violation(config, writer, tmp_path, hooks):
    from chaos.actors import _Lines, compaction_pass

    writer.append(T, 0, [b"a", b"b"])

    def damaged():
        raise InconsistentReadState(f"{T}[0]: no index entry covers offsets 1..2 (planted)")

    hooks["compactor.after_recover"] = damaged
    activity, violations = _Lines(tmp_path / "activity.jsonl"), _Lines(tmp_path / "violations.jsonl")
    with Compactor(config, clock=past_the_lag()) as compactor:
        compaction_pass(compactor, activity, violations, "c0.1", T, 0, retention=False)
    (seen,) = map(json.loads, (tmp_path / "violations.jsonl").read_text().splitlines())
    assert seen == {"actor": "c0.1", "topic": T, "partition": 0, "error": "InconsistentReadState",
                    "detail": f"{T}[0]: no index entry covers offsets 1..2 (planted)"}


def test_a_compactor_is_killed_mid_operation_only_between_compaction_steps(tmp_path):
    activity = tmp_path / "c0.1.jsonl"
    activity.write_text(json.dumps({"begin": "compact", "topic": T, "partition": 0}) + "\n")
    # A pass begun, nothing compacted yet: no compaction record to recover.
    assert _mid_operation(activity, "compactor") is False
    assert _mid_operation(activity, "writer") is True
    for step, between in (("compactor.after_record_create", True), ("compactor.after_index_overwrite", True),
                          ("compactor.after_delete_range", True), ("compactor.after_cursor_move", False)):
        activity.write_text(json.dumps({"begin": "compact"}) + "\n" + json.dumps({"step": step}) + "\n"
                            + '{"end": "comp')  # cut by the SIGKILL
        assert _mid_operation(activity, "compactor") is between, step


def _result(**changes) -> dict:
    """A run's result (:func:`chaos.run._verify`) that did everything, with ``changes``."""
    result = {what: 1 for what in (
        "records_acked", "compactions_completed", "gc_deleted_blobs", "topic_recreations", "retention_passes",
        "group_commits", "lost_responses", "records_acked_idempotent", "records_acked_plain", "records_acked_via_kafka",
        "group_commits_via_broker", "kafka_consumed", "kafka_commits_acked", "kafka_coordinator_kills",
        "kafka_assignments_after_coordinator_kill", "kafka_consumed_after_coordinator_kill", "compactions_resumed")}
    result.update(grown_partitions=5, incarnations_acked=2, killed_mid_operation={"writer": 1, "compactor": 1},
                  kills={"broker": 1}, verified=60, verified_fraction=0.6, exits=0, exits_outside_outages=0,
                  exit_list=[], server_restarts=2)
    return {**result, **changes}


def test_a_run_that_did_too_little_or_checked_too_little_fails():
    assert not_exercised(_result(), 4) == [] and out_of_bounds(_result(), 20) == []
    assert not_exercised(_result(killed_mid_operation={"writer": 1, "compactor": 0}, compactions_resumed=0,
                                 incarnations_acked=1, kafka_consumed_after_coordinator_kill=0), 4) == [
        "kafka_consumed_after_coordinator_kill is 0", "compactions_resumed is 0",
        "records acknowledged in 1 incarnation(s) of chaos-re, fewer than 2",
        "no compactor killed between compaction steps"]
    assert out_of_bounds(_result(records_acked=100, verified=40, verified_fraction=0.4), 20) == [
        "verified_fraction 0.4: 40 of 100 acknowledged records read back and checked, fewer than 50%"]
    assert out_of_bounds(_result(exits=1, exits_outside_outages=1, exit_list=["w0.2 (1): Traceback"]), 20) == [
        "1 actor exit(s) with no server restart in the 35 s before: ['w0.2 (1): Traceback']"]
    assert out_of_bounds(_result(exits=41), 20) == [
        "41 actor exits, more than one per actor (20) per server restart (2)"]
