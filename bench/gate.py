"""``python -m bench gate``: what the data-quality gate costs the llog -> Delta job.

The same JSON events (``{"seq": n, "ts": ...}``, one in ``BENCH_GATE_BAD_EVERY`` bad) go through
``jobs.llog_to_delta`` (``availableNow``, ``BENCH_GATE_PER_BATCH`` records per micro-batch) into a
fresh Delta table twice per round, in turn: without a gate, and with the demo's suite
(``conf/expectations/events.json``) and a quarantine. Prints the seconds per micro-batch
(``triggerExecution``) of both, the gate's overhead per batch, and records/s. After each run the
rows are counted where they landed: the table holds every event (no gate), or the table every
good one and the quarantine every bad one (the gate); any other count fails the bench.
Sizes: ``BENCH_GATE_RECORDS`` (default 150000), ``BENCH_GATE_PER_BATCH`` (50000),
``BENCH_GATE_ROUNDS`` (2).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import uuid
from pathlib import Path

from bench.report import emit, env_int, progress
from jobs.llog_to_delta import Job, run as run_job
from jobs.local_spark import local_spark
from llog.config import Config
from llog.topics import create_topic
from llog.writer import LogWriter
from llog_tools import progress as llog_progress

SUITE = Path(__file__).resolve().parents[1] / "conf" / "expectations" / "events.json"
TOPIC, PARTITIONS, PER_APPEND = "gate", 3, 5_000


def _fill(config: Config, records: int, bad_every: int) -> int:
    """``records`` events over PARTITIONS partitions; how many are bad."""
    bad = 0
    with LogWriter(config) as writer:
        create_topic(writer.coordination, config.root_prefix, TOPIC, PARTITIONS)
        per_partition = records // PARTITIONS
        for p in range(PARTITIONS):
            for start in range(0, per_partition, PER_APPEND):
                values = []
                for i in range(start, min(start + PER_APPEND, per_partition)):
                    if i % bad_every == bad_every - 1:
                        values.append(b"not json")
                        bad += 1
                    else:
                        values.append(json.dumps({"seq": i, "ts": "2026-01-01 00:00:00"}).encode())
                writer.append(TOPIC, p, values)
    return bad


def run(config: Config) -> dict:
    records = env_int("BENCH_GATE_RECORDS", 150_000, minimum=PARTITIONS) // PARTITIONS * PARTITIONS
    per_batch = env_int("BENCH_GATE_PER_BATCH", 50_000)
    rounds = env_int("BENCH_GATE_ROUNDS", 2)
    bad_every = env_int("BENCH_GATE_BAD_EVERY", 1_000)
    config = config.replace(root_prefix=f"bench-{uuid.uuid4().hex[:8]}")
    progress(f"gate: filling {PARTITIONS} partitions with {records} JSON events (1 in {bad_every} bad)")
    bad = _fill(config, records, bad_every)
    batch_s: dict[str, list[float]] = {"plain": [], "gated": []}
    run_s: dict[str, list[float]] = {"plain": [], "gated": []}
    with tempfile.TemporaryDirectory(prefix="llog-bench-gate-") as tmp:
        spark = local_spark("llog-bench-gate", delta=True)
        try:
            with llog_progress.task("gate: llog -> Delta runs", total=2 * (rounds + 1), unit="runs") as advance:
                for round_ in range(rounds + 1):  # round 0 warms up both paths, untimed
                    for case in ("plain", "gated"):
                        work = Path(tmp) / f"{case}-{round_}"
                        gate = {"expectations": str(SUITE), "quarantine": str(work / "quarantine")} \
                            if case == "gated" else {}
                        job = Job(table=str(work / "table"), checkpoint=str(work / "ck"), topics=(TOPIC,),
                                  max_offsets_per_trigger=per_batch, **gate)
                        batches = run_job(spark, job, config)
                        if sum(b["numInputRows"] for b in batches) != records:
                            raise RuntimeError(f"gate bench: {case} run read {batches} records, not {records}")
                        _check_landed(spark, case, work, records, bad)
                        if round_:
                            batch_s[case] += [b["durationMs"]["triggerExecution"] / 1000 for b in batches]
                            run_s[case].append(sum(b["durationMs"]["triggerExecution"] for b in batches) / 1000)
                        advance()
        finally:
            spark.stop()
    plain, gated = (statistics.median(batch_s[c]) for c in ("plain", "gated"))
    summary = {
        "bench": "gate", "records": records, "bad_records": bad, "records_per_batch": per_batch,
        "batches_per_run": len(batch_s["plain"]) // rounds, "rounds": rounds,
        "plain_batch_s_median": round(plain, 3), "gated_batch_s_median": round(gated, 3),
        "gate_overhead_per_batch_s": round(gated - plain, 3),
        "plain_records_per_s": round(records / statistics.median(run_s["plain"])),
        "gated_records_per_s": round(records / statistics.median(run_s["gated"])),
    }
    emit(summary)
    return summary


def _check_landed(spark, case: str, work: Path, records: int, bad: int) -> None:
    """The rows of one run in its table and quarantine: every event in the table without a gate;
    with one, the good events in the table and the bad ones in the quarantine."""
    table, quarantined = _delta_rows(spark, work / "table"), _delta_rows(spark, work / "quarantine")
    expected = (records, 0) if case == "plain" else (records - bad, bad)
    if (table, quarantined) != expected:
        raise RuntimeError(f"gate bench: the {case} run sent {records:,} records ({bad:,} bad) and left "
                           f"{table:,} rows in its table and {quarantined:,} in its quarantine, expected "
                           f"{expected[0]:,} and {expected[1]:,}")


def _delta_rows(spark, path: Path) -> int:
    """Rows of the Delta table at ``path``; 0 when no batch created it."""
    return spark.read.format("delta").load(str(path)).count() if (path / "_delta_log").is_dir() else 0
