"""``python -m bench broker``: the HTTP broker (``python -m broker_lite``) driven by vegeta.

The scenarios of ``python -m loadtest`` (:mod:`loadtest.scenarios`), measured for longer
(:data:`loadtest.scenarios.BENCH`): produce throughput (64 clients, 100 records of 100 bytes a
request), produce-ack latency at 1,000 requests/s of 10 records, a lone client, consume from the
tail cache and on a miss (Oxia + S3), long-poll end to end (produce ack -> record returned to a
waiting consumer), and overload (only 503 with Retry-After). One line per phase, then the
summary; the run directory (vegeta's results and histograms, the brokers' ``/metrics`` every
second, their logs) is under ``loadtest/results/``. ``LLOG_BENCH_BROKER_SECONDS`` sets every
vegeta phase's duration (a quick run).

No throughput is reported from counts that do not reconcile (a produce phase whose acked
records are not what the log gained, a consume phase whose records are not what the brokers
counted, or one that could not be checked): the bench prints ``"status": "failed"`` with those
phases' counts instead, and raises.
"""

from __future__ import annotations

import uuid

from bench.report import emit, env_int, progress
from llog.config import Config
from llog_tools import progress as llog_progress
from loadtest.run import make_run_dir
from loadtest.run import run as run_scenarios
from loadtest.scenarios import BENCH

#: The summary's fields, in order (see :func:`loadtest.run.summarize`).
FIELDS = (
    "produce_records_per_s", "produce_requests_per_s", "produce_p99_ms", "produce_ack_p50_ms", "produce_ack_p99_ms",
    "produce_ack_p999_ms", "produce_lone_p99_ms", "consume_records_per_s", "consume_miss_records_per_s",
    "long_poll_e2e_p50_ms", "long_poll_e2e_p99_ms", "s3_puts_per_s", "s3_puts_per_s_at_fixed_rate",
    "s3_cost_usd_per_million_records", "consume_miss_s3_cost_usd_per_million_records", "overload_503_retry_after",
    "overload_non_503_errors", "unexpected_non_200", "reconciled",
)
#: A phase's counts that show what did not reconcile (see :func:`loadtest.run.Run._produce`, ``_consume``).
RECONCILING = ("reconciled", "records", "log_records", "records_from_metrics", "transport_errors", "status_counts")


def run(config: Config) -> dict:
    config = config.replace(root_prefix=f"bench-{uuid.uuid4().hex[:8]}")
    seconds = env_int("LLOG_BENCH_BROKER_SECONDS", 0, minimum=0)
    scenarios = [s.replace(duration_s=seconds) if seconds else s for s in BENCH.values()]
    run_dir = make_run_dir(None, "bench")
    progress(f"broker: {', '.join(s.name for s in scenarios)}; run directory {run_dir}")
    with llog_progress.task(f"broker: {len(scenarios)} load test scenarios (vegeta)"):
        summary = run_scenarios(config, scenarios, run_dir)
    unreconciled = {name: {k: phase.get(k) for k in RECONCILING if k in phase}
                    for name, phase in summary["phases"].items() if phase.get("reconciled", True) is not True}
    if unreconciled:
        emit({"bench": "broker", "status": "failed", "unreconciled": unreconciled, "run_dir": summary["run_dir"]})
        raise RuntimeError(f"broker bench: counts did not reconcile in {sorted(unreconciled)}: {unreconciled} "
                           f"(see {summary['run_dir']})")
    for name, phase in summary["phases"].items():
        emit({"bench": "broker", "case": name, **{k: v for k, v in phase.items() if k != "command"}})
    result = {"bench": "broker", **{k: summary[k] for k in FIELDS}, "run_dir": summary["run_dir"]}
    emit(result)
    return result
