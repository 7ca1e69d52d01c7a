"""The load test (``python -m loadtest``) in miniature on the real stack: every scenario for a
second or two at a low load, through vegeta and real broker processes. Checks the run directory
and the summary, and that the counts reconcile (vegeta's results, the log's high watermarks, the
brokers' ``/metrics``); the broker's performance targets are the load test's business, not this."""

from __future__ import annotations

import json
from uuid import uuid4

from loadtest.run import make_run_dir, run
from loadtest.scenarios import SCENARIOS

TINY = {
    "produce-max": {"duration_s": 2, "warmup_s": 0.5, "workers": 4, "partitions": 4},
    "produce-rate": {"duration_s": 2, "warmup_s": 0.5, "rate": 50, "partitions": 4},
    "consume-hit": {"duration_s": 1.5, "workers": 4, "records_per_request": 100, "preload_records": 1000,
                    "partitions": 4},
    "consume-miss": {"duration_s": 1.5, "workers": 4, "records_per_request": 100, "preload_records": 1000,
                     "partitions": 4},
    "long-poll": {"probes": 10},
    "overload": {"duration_s": 2, "rate": 300, "partitions": 4, "buffer_bytes": 64 * 1024},
}


def test_a_tiny_run_writes_its_directory_and_reconciles(stack, tmp_path):
    config = stack.replace(root_prefix=f"t{uuid4().hex[:12]}")
    scenarios = [SCENARIOS[name].replace(**changes) for name, changes in TINY.items()]
    run_dir = make_run_dir(tmp_path, "smoke")
    summary = run(config, scenarios, run_dir)

    assert json.loads((run_dir / "summary.json").read_text()) == summary
    assert [s["name"] for s in json.loads((run_dir / "scenario.json").read_text())["scenarios"]] == list(TINY)
    assert (run_dir / "broker-0.log").is_file() and (run_dir / "broker-overload.log").is_file()
    samples = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert samples and {"t", "phase", "broker", "metrics"} <= samples[0].keys()
    for key in ("produce_records_per_s", "produce_ack_p99_ms", "consume_records_per_s", "consume_miss_records_per_s",
                "long_poll_e2e_p99_ms", "s3_puts_per_s", "s3_cost_usd_per_million_records",
                "overload_non_503_errors"):
        assert key in summary
    assert summary["unexpected_non_200"] == {} and summary["reconciled"] and summary["unreconciled"] == {}
    phases = summary["phases"]

    for name in ("produce-max", "produce-rate", "overload"):
        phase = phases[name]
        for file in ("results.bin", "report.json", "hist.txt", "hdrplot.txt", "phase.json"):
            assert (run_dir / name / file).is_file(), (name, file)
        assert (run_dir / "targets" / f"{name}.json").is_file()
        assert sum(phase["status_counts"].values()) == phase["requests"] > 0
        assert phase["records"] == phase["ok_requests"] * phase["records_per_request"] == phase["log_records"]
        assert phase["p50_ms"] <= phase["p99_ms"] <= phase["p999_ms"]
        assert 1 <= phase["s3_puts_from_acks"] <= phase["ok_requests"]
        assert phase["s3_puts_from_metrics"] >= phase["s3_puts_from_acks"]  # every acked blob was a PUT
    vegeta_report = json.loads((run_dir / "produce-rate" / "report.json").read_text())
    assert vegeta_report["requests"] == phases["produce-rate"]["requests"]
    overload = phases["overload"]
    assert overload["overload_non_503_errors"] == overload["requests"] - overload["ok_requests"] \
        - overload["retry_after_503"]

    for name in ("consume-hit", "consume-miss"):
        phase = phases[name]
        assert phase["records"] == phase["ok_requests"] * 100 > 0  # each response a full preloaded range
        assert phase["bodies_without_record_count"] == 0
        assert phase["records_from_metrics"] == phase["records"]
    poll = phases["long-poll"]
    assert poll["probes"] == 10 == poll["delivered"] + poll["not_delivered"]
    assert len((run_dir / "long-poll" / "probes.jsonl").read_text().splitlines()) > 10  # with the warm-up
