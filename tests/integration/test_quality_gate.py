"""The llog -> Delta job's data-quality gate (jobs/quality_gate.py, a great-expectations suite
translated to Spark SQL) on real Spark, Delta, Oxia and the S3 server: rows that pass reach the table,
rows that fail reach the quarantine with the expectations they failed, each exactly once, also
when the driver is killed between the two appends and the job restarted."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from chispa import assert_df_equality

from jobs.llog_to_delta import Job, run
from jobs.local_spark import local_spark
from jobs.quality_gate import ExpectationsFailed
from llog.topics import create_topic
from tests.helpers import driver_process

REPO = Path(__file__).resolve().parents[2]
SUITE = REPO / "conf" / "expectations" / "events.json"
PARTITIONS, RECORDS = 3, 200          # 600 records, 2 batches of at most 300
MAX_PER_TRIGGER = 300
ROWS = "topic string, partition int, offset long, value binary"
QUARANTINED = "topic string, partition int, offset long, value binary, failed_expectations array<string>"

#: Bad values and the expectations of the demo's suite each fails (in the suite's order, sorted).
BAD = {
    b"not json": ["seq_is_an_integer", "ts_is_a_timestamp", "value_is_json"],
    b'{"seq": "seven", "ts": "2026-01-01 00:00:00"}': ["seq_is_an_integer"],
    b'{"seq": 7}': ["ts_is_a_timestamp"],
    b'{"seq": 7, "ts": "2999-01-01 00:00:00"}': ["ts_not_in_the_future"],
}


@pytest.fixture(scope="module")
def spark():
    session = local_spark("quality-gate-tests", delta=True)
    yield session
    session.stop()


def _fill(writer, topic: str) -> tuple[list[tuple], list[tuple]]:
    """RECORDS records per partition, every 10th bad (cycling through BAD); the rows that should
    pass and the rows that should be quarantined (with their failed expectations)."""
    create_topic(writer.coordination, writer.config.root_prefix, topic, PARTITIONS)
    bad = list(BAD)
    good_rows, bad_rows = [], []
    for p in range(PARTITIONS):
        values = [bad[(i // 10) % len(bad)] if i % 10 == 9 else
                  json.dumps({"seq": i, "ts": "2026-01-01 00:00:00.250"}).encode() for i in range(RECORDS)]
        start = writer.append(topic, p, values).start_offset
        for i, v in enumerate(values):
            if v in BAD:
                bad_rows.append((topic, p, start + i, v, BAD[v]))
            else:
                good_rows.append((topic, p, start + i, v))
    return good_rows, bad_rows


def _assert_tables(spark, table: Path, quarantine: Path, good: list[tuple], bad: list[tuple]) -> None:
    """The table holds exactly the good rows, the quarantine exactly the bad ones, each once."""
    assert_df_equality(spark.read.format("delta").load(str(table)).select("topic", "partition", "offset", "value"),
                       spark.createDataFrame(good, ROWS), ignore_row_order=True, ignore_nullable=True)
    assert_df_equality(spark.read.format("delta").load(str(quarantine))
                       .select("topic", "partition", "offset", "value", "failed_expectations"),
                       spark.createDataFrame(bad, QUARANTINED), ignore_row_order=True, ignore_nullable=True)


def test_gate_splits_each_batch_into_table_and_quarantine_and_records_results(spark, config, writer, tmp_path):
    good, bad = _fill(writer, "gated")
    table, quarantine = tmp_path / "table", tmp_path / "quarantine"
    job = Job(table=str(table), checkpoint=str(tmp_path / "ck"), topics=("gated",), max_offsets_per_trigger=300,
              expectations=str(SUITE), quarantine=str(quarantine))
    progress = run(spark, job, config)
    assert [p["numInputRows"] for p in progress] == [300, 300]
    _assert_tables(spark, table, quarantine, good, bad)
    assert {r.batch_id for r in spark.read.format("delta").load(str(quarantine)).select("batch_id").collect()} == {0, 1}
    # One result row per batch and expectation: what GX counted, in the results table.
    results = spark.read.format("delta").load(job.results_table)
    counted = {}
    for r in results.collect():
        assert r.suite == "events" and r.element_count == 300 and r.batch_timestamp is not None
        counted.setdefault(r.expectation, []).append((r.batch_id, r.success, r.unexpected_count))
    expected = {name: sum(name in names for *_, names in bad) for name in
                ("value_is_json", "seq_is_an_integer", "ts_is_a_timestamp", "ts_not_in_the_future")}
    assert {name: sum(n for *_, n in rows) for name, rows in counted.items()} == expected
    assert all(len(rows) == 2 and not any(ok for _, ok, _ in rows) for rows in counted.values())


def test_on_failure_fail_stops_the_query_naming_the_expectation_and_writes_nothing(spark, config, writer, tmp_path):
    _fill(writer, "strict")
    table = tmp_path / "table"
    job = Job(table=str(table), checkpoint=str(tmp_path / "ck"), topics=("strict",), max_offsets_per_trigger=300,
              expectations=str(SUITE), on_failure="fail")
    with pytest.raises(Exception, match="ts_not_in_the_future") as failed:
        run(spark, job, config)
    assert "ExpectationsFailed" in str(failed.value) and "nothing of the batch was written" in str(failed.value)
    assert not (table / "_delta_log").exists()
    assert issubclass(ExpectationsFailed, RuntimeError)


def test_driver_killed_between_the_appends_twice_then_restarted_lands_every_row_once(spark, config, writer, tmp_path):
    """Killed in batch 1 after the table's append, then, restarted, in batch 1's replay after the
    quarantine's append (the table's skipped as written), the job lands every row once when it
    is run again: in the table or in the quarantine, and each batch's results once."""
    good, bad = _fill(writer, "crash")
    table, quarantine, checkpoint = tmp_path / "table", tmp_path / "quarantine", tmp_path / "ck"
    argv = ["jobs.llog_to_delta", "--topics", "crash", "--table", str(table), "--checkpoint", str(checkpoint),
            "--max-offsets-per-trigger", str(MAX_PER_TRIGGER), "--expectations", str(SUITE),
            "--quarantine", str(quarantine)]
    for failpoint in ("llog_to_delta.after_append.1", "llog_to_delta.after_quarantine.1"):
        crashed = driver_process.run(config, argv, failpoint, timeout=600)
        assert crashed.returncode == -signal.SIGKILL, f"not killed at {failpoint}: {crashed.stderr[-3000:]}"
    finished = driver_process.run(config, argv, timeout=600)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert f"{len(good):,} row(s) in {table}, {len(bad):,} quarantined in {quarantine}" in finished.stdout
    _assert_tables(spark, table, quarantine, good, bad)
    # Each batch's results once, though batch 1 ran three times.
    results = spark.read.format("delta").load(f"{quarantine}_results")
    assert sorted((r.batch_id, r.expectation) for r in results.collect()) == sorted(
        (b, e) for b in (0, 1) for e in ("value_is_json", "seq_is_an_integer", "ts_is_a_timestamp",
                                        "ts_not_in_the_future"))
