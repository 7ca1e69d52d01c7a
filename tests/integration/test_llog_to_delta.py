"""jobs.llog_to_delta from real Spark (local mode, with Delta) over real Oxia and the S3 server: the
Delta table holds every record exactly once, also when the driver is killed in the middle of a
run and the job is restarted from its checkpoint."""

from __future__ import annotations

import glob
import json
import math
import signal
import subprocess
from pathlib import Path

import pytest
from chispa import assert_df_equality

from jobs.llog_to_delta import FAILPOINTS, Job, main, parse_trigger, run
from jobs.local_spark import local_spark
from llog.consumer_groups import describe_group
from llog.coordination import Coordination
from llog.topics import create_topic
from tests.helpers import driver_process

PARTITIONS, APPENDS, RECORDS = 3, 5, 100        # 500 records per partition, 1,500 in all
MAX_PER_TRIGGER = 400                           # 4 batches: 3 of 400, 1 of 300
BATCHES = math.ceil(PARTITIONS * APPENDS * RECORDS / MAX_PER_TRIGGER)
KILL_AT = 2                                     # the batch whose failpoint kills the driver
COLUMNS = "topic string, partition int, offset long, value binary"


@pytest.fixture(scope="module")
def spark():
    session = local_spark("llog-to-delta-tests", delta=True)
    yield session
    session.stop()


def _fill(writer, topic: str, appends: int = APPENDS) -> list[tuple[str, int, int, bytes]]:
    """``appends`` appends of RECORDS records to each of PARTITIONS partitions (binary values,
    not UTF-8); every record as ``(topic, partition, offset, value)``."""
    rows = []
    create_topic(writer.coordination, writer.config.root_prefix, topic, PARTITIONS, if_not_exists=True)
    for a in range(appends):
        for p in range(PARTITIONS):
            values = [f"{topic}/{p}/{a}/{i}".encode() + b"\x00\xff" for i in range(RECORDS)]
            result = writer.append(topic, p, values)
            rows += [(topic, p, result.start_offset + i, v) for i, v in enumerate(values)]
    return rows


def _assert_table_holds(spark, table: Path, rows: list[tuple]) -> None:
    """The Delta table holds exactly ``rows``: each (topic, partition, offset, value) once."""
    df = spark.read.format("delta").load(str(table))
    assert_df_equality(df.select("topic", "partition", "offset", "value"), spark.createDataFrame(rows, COLUMNS),
                       ignore_row_order=True, ignore_nullable=True)
    assert df.where("timestamp is null or timestampType != 1").count() == 0


def _txns(table: Path) -> list[tuple[str, int]]:
    """The ``(txnAppId, txnVersion)`` of every commit in the table's log, in commit order: one per
    micro-batch that was appended."""
    txns = []
    for path in sorted(glob.glob(str(table / "_delta_log" / "*.json"))):
        with open(path) as f:
            txns += [(a["txn"]["appId"], a["txn"]["version"]) for a in map(json.loads, f) if "txn" in a]
    return txns


def _run_job(config, topic: str, table: Path, checkpoint: Path, failpoint: str | None = None
             ) -> subprocess.CompletedProcess:
    """``python -m jobs.llog_to_delta``, killed at ``failpoint`` with its JVM and Python workers."""
    return driver_process.run(config, ["jobs.llog_to_delta", "--topics", topic, "--table", str(table), "--checkpoint",
                                       str(checkpoint), "--max-offsets-per-trigger", str(MAX_PER_TRIGGER)],
                              failpoint, timeout=600)


def test_driver_killed_before_then_after_an_append_then_restarted_writes_every_record_exactly_once(
        spark, config, writer, tmp_path):
    """Killed in batch KILL_AT before its Delta append, then, restarted, in that batch's replay
    after the append (Spark had not recorded it), the job writes every record once when it is
    run again: the replayed batch is skipped by Delta as already written, and each batch is in
    the table's log once, under the one app id of this checkpoint."""
    rows = _fill(writer, "crash")
    table, checkpoint = tmp_path / "table", tmp_path / "ck"
    # Every failpoint of the job without a gate is one of the kills below.
    assert {f for f in FAILPOINTS if "quarantine" not in f} == {"llog_to_delta.before_append",
                                                                "llog_to_delta.after_append"}

    for failpoint, appended in (("llog_to_delta.before_append", KILL_AT), ("llog_to_delta.after_append", KILL_AT + 1)):
        crashed = _run_job(config, "crash", table, checkpoint, failpoint=f"{failpoint}.{KILL_AT}")
        assert crashed.returncode == -signal.SIGKILL, f"not killed at {failpoint}: {crashed.stderr[-3000:]}"
        txns = _txns(table)
        assert [version for _, version in txns] == list(range(appended)), failpoint

    finished = _run_job(config, "crash", table, checkpoint)
    assert finished.returncode == 0, finished.stderr[-3000:]
    app_id = txns[0][0]
    assert _txns(table) == [(app_id, version) for version in range(BATCHES)]
    _assert_table_holds(spark, table, rows)


def test_available_now_runs_commit_the_group_and_continue_from_the_checkpoint(spark, config, writer, tmp_path):
    rows = _fill(writer, "grouped.a", appends=2) + _fill(writer, "grouped.b", appends=1)
    _fill(writer, "other", appends=1)
    job = Job(table=str(tmp_path / "table"), checkpoint=str(tmp_path / "ck"), topic_pattern=r"grouped\..*",
              max_offsets_per_trigger=400, group_id="to-delta")

    def lag() -> dict[tuple[str, int], tuple[int, int]]:
        with Coordination(config) as coordination:
            return {(r.topic, r.partition): (r.committed_offset, r.lag)
                    for r in describe_group(coordination, config.root_prefix, "to-delta")}

    progress = run(spark, job, config)
    assert [p["numInputRows"] for p in progress] == [400, 400, 100]
    _assert_table_holds(spark, Path(job.table), rows)
    assert lag() == {**{("grouped.a", p): (2 * RECORDS + 1, 0) for p in range(PARTITIONS)},
                     **{("grouped.b", p): (RECORDS + 1, 0) for p in range(PARTITIONS)}}

    # A second run from the same checkpoint reads only what was appended since.
    rows += _fill(writer, "grouped.b", appends=1)
    progress = run(spark, job, config)
    assert sum(p["numInputRows"] for p in progress) == PARTITIONS * RECORDS
    _assert_table_holds(spark, Path(job.table), rows)
    assert lag() == {
        **{("grouped.a", p): (2 * RECORDS + 1, 0) for p in range(PARTITIONS)},
        **{("grouped.b", p): (2 * RECORDS + 1, 0) for p in range(PARTITIONS)}}


def test_keys_headers_and_event_times_reach_the_table_also_one_written_before_llog_had_them(spark, config, writer,
                                                                                          tmp_path):
    table = tmp_path / "table"
    old = spark.createDataFrame([("orders", 0, 1, b"old")], COLUMNS).selectExpr(
        "*", "current_timestamp() AS timestamp", "1 AS timestampType")  # the columns tables had before keys
    old.write.format("delta").save(str(table))
    writer.append("keyed", 0, [b"plain"])
    writer.append("keyed", 0, [b"a", None], keys=[b"k1", "k2"], headers=[[("h", b"x"), ("n", None)], []],
                  timestamps=[1_700_000_000_123, None])
    run(spark, Job(table=str(table), checkpoint=str(tmp_path / "ck"), topics=("keyed",)), config)
    df = spark.read.format("delta").load(str(table))
    rows = {(r.topic, r.offset): r for r in df.collect()}
    assert rows[("orders", 1)].key is None and rows[("orders", 1)].headers is None  # the old row
    plain, first, tombstone = rows[("keyed", 1)], rows[("keyed", 2)], rows[("keyed", 3)]
    assert (plain.key, plain.headers, plain.timestampType) == (None, None, 1)
    assert (bytes(first.key), bytes(first.value), first.timestampType) == (b"k1", b"a", 0)
    assert [(h.key, None if h.value is None else bytes(h.value)) for h in first.headers] == [("h", b"x"), ("n", None)]
    assert int(first.timestamp.timestamp() * 1000) == 1_700_000_000_123
    assert (bytes(tombstone.key), tombstone.value, tombstone.headers, tombstone.timestampType) == (b"k2", None, [], 1)


def test_command_line_checks():
    assert parse_trigger("available-now") == {"availableNow": True}
    assert parse_trigger("processing-time=10 seconds") == {"processingTime": "10 seconds"}
    for bad in ("processing-time=", "once", ""):
        with pytest.raises(ValueError, match="available-now"):
            parse_trigger(bad)
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    for argv in (["--table", "t", "--checkpoint", "c"],                                   # no subscription
                 ["--topics", "a", "--topic-pattern", "b", "--table", "t", "--checkpoint", "c"],
                 ["--topics", "a", "--table", "t", "--checkpoint", "c", "--trigger", "sometimes"],
                 ["--topics", "a", "--table", "t", "--checkpoint", "c", "--max-offsets-per-trigger", "0"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
    with pytest.raises(ValueError, match="exactly one"):
        Job(table="t", checkpoint="c")
