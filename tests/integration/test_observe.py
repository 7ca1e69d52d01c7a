"""``llog observe`` for real: a broker process, Prometheus and node_exporter (Debian's binaries) on
free ports scraping every second, traffic through the broker (produce, consume, a group commit),
a compaction job run and an ``llog gc`` run writing their textfiles; then every query of the
Grafana dashboard (``conf/grafana/llog-dashboard.json``) is asked of that Prometheus.

A query must return data. The one exception are queries of counters that only have samples once
something failed (``*_operation_failures_total``): for those, every metric the query names must
be known to Prometheus from the scrapes (its HELP and TYPE, ``/api/v1/metadata``), which a
misspelt name never is."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from uuid import uuid4

import httpx
import pytest

from llog_tools import observe
from tests.helpers.broker_process import REPO, free_port, run_broker

DASHBOARD = REPO / "conf" / "grafana" / "llog-dashboard.json"
#: Grafana's rate window variable, as the queries are sent here.
RATE_INTERVAL = "1m"
#: Families without samples until something fails.
FAILURE_FAMILIES = ("leaderless_log_oxia_operation_failures_total", "leaderless_log_s3_operation_failures_total")

pytestmark = pytest.mark.skipif(not (os.access(observe.PROMETHEUS, os.X_OK) and os.access(observe.NODE_EXPORTER, os.X_OK)),
                                reason="Debian's prometheus and prometheus-node-exporter are not installed "
                                       "(make debian-packages)")


def dashboard_queries(path: Path = DASHBOARD) -> list[tuple[str, str]]:
    """(panel title, expr) of every target of every panel."""
    dashboard = json.loads(path.read_text())
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel.get("targets", [])]


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads (function names and label names left out)."""
    names = set(re.findall(r"\b((?:leaderless_log|node)_[a-zA-Z0-9_]+|up)\b(?!\s*\()", expr))
    return {re.sub(r"_(bucket|count|sum)$", "", n) if "_seconds_" in n else n for n in names}


def query(prometheus: str, expr: str) -> list:
    response = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=10)
    assert response.status_code == 200, f"{expr}: {response.text}"
    return response.json()["data"]["result"]


def wait_for(prometheus: str, exprs: list[str], timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    missing = exprs
    while missing:
        missing = [e for e in exprs if not query(prometheus, e)]
        if missing and time.monotonic() > deadline:
            targets = httpx.get(f"{prometheus}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
            pytest.fail(f"no data within {timeout_s:.0f} s for {missing}; targets: "
                        f"{[(t['scrapeUrl'], t['health'], t['lastError']) for t in targets]}")
        time.sleep(1)


def run(cmd: list[str], env: dict, timeout_s: float) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, f"{cmd}: {done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def prometheus(stack, tmp_path_factory):
    """Prometheus (and node_exporter) scraping a broker after traffic and job runs; its URL."""
    config = stack.replace(root_prefix=f"t{uuid4().hex[:12]}", default_partitions=2, metrics_scan_interval_s=1.0)
    stack_dir = tmp_path_factory.mktemp("observed-stack")
    env = {**os.environ, "PYTHONPATH": str(REPO), "LLOG_SETTINGS_FILE": "/nonexistent", **config.to_options(),
           "SPARK_LOCAL_IP": "127.0.0.1"}
    with run_broker(config) as (url, proc):
        # The stack's state record as `llog stack up --brokers N` writes it (the brokers' list).
        port = int(url.rsplit(":", 1)[1])
        (stack_dir / "stack.json").write_text(json.dumps({"brokers": [{"pid": proc.pid, "port": port, "url": url}]}))
        status = observe.up(stack_dir, prometheus_port=free_port(), exporter_port=free_port(), scrape_interval_s=1.0)
        try:
            assert status["broker_targets"] == [url.removeprefix("http://")]
            textfile = Path(status["textfile_dir"])
            traffic(url)
            run([sys.executable, "-m", "compaction_job", "--metrics-file", str(textfile / "compaction.prom")], env, 600)
            run([sys.executable, "-m", "llog_tools", "gc", "--metrics-file", str(textfile / "gc.prom")], env, 300)
            traffic(url)  # fresh samples for the rates
            prometheus = status["prometheus"]["url"]
            wait_for(prometheus, ["leaderless_log_consumer_group_lag_records",
                                  "leaderless_log_compaction_last_run_success", "leaderless_log_gc_last_run_success",
                                  f"rate(leaderless_log_produce_requests_total[{RATE_INTERVAL}]) > 0"])
            yield prometheus
        finally:
            observe.down(stack_dir, purge=True)


def traffic(url: str) -> None:
    for i in range(5):
        for partition in (0, 1):
            response = httpx.post(f"{url}/produce", json={"topic_partitions": [
                {"topic": "observed", "partition": partition, "records": [f"r{i}-{j}" for j in range(10)]}]}, timeout=30)
            assert response.status_code == 200, response.text
    response = httpx.post(f"{url}/consume", json={"topic_partitions": [
        {"topic": "observed", "partition": p, "fetch_offset": 1} for p in (0, 1)]}, timeout=30)
    assert response.status_code == 200, response.text
    response = httpx.post(f"{url}/groups/observers/commit", json={"offsets": [
        {"topic": "observed", "partition": 0, "offset": 3}]}, timeout=30)
    assert response.status_code == 200, response.text


def test_every_dashboard_query_returns_data(prometheus):
    metadata = httpx.get(f"{prometheus}/api/v1/metadata", timeout=10).json()["data"]
    empty = []
    for title, expr in dashboard_queries():
        sent = expr.replace("$__rate_interval", RATE_INTERVAL)
        if query(prometheus, sent):
            continue
        names = metric_names(sent)
        if any(n in FAILURE_FAMILIES for n in names) and all(n in metadata for n in names):
            continue  # nothing failed: no samples, but every name was scraped
        empty.append(f"{title}: {expr} (names {sorted(names)}; known to Prometheus: "
                     f"{sorted(n for n in names if n in metadata)})")
    assert not empty, "dashboard queries without data:\n" + "\n".join(empty)


def test_the_consumer_lag_and_the_jobs_figures_are_right(prometheus):
    lag = query(prometheus, 'leaderless_log_consumer_group_lag_records{group="observers", topic="observed"}')
    assert [float(s["value"][1]) for s in lag] == [100 - 2]  # 100 records in partition 0, committed 3
    for job in ("compaction", "gc"):
        assert float(query(prometheus, f"leaderless_log_{job}_last_run_success")[0]["value"][1]) == 1
        age = float(query(prometheus, f"time() - leaderless_log_{job}_last_success_timestamp_seconds")[0]["value"][1])
        assert 0 <= age < 600
    seen = float(query(prometheus, "leaderless_log_compaction_last_run_partitions_seen")[0]["value"][1])
    assert seen == 2


def test_metric_names_of_an_expression():
    assert metric_names('histogram_quantile(0.99, sum by (operation, le) (rate('
                        'leaderless_log_s3_operation_duration_seconds_bucket{route="/x"}[1m])))') == {
        "leaderless_log_s3_operation_duration_seconds"}
    assert metric_names("time() - max(leaderless_log_gc_last_success_timestamp_seconds)") == {
        "leaderless_log_gc_last_success_timestamp_seconds"}


def test_a_failed_gc_run_is_recorded_and_keeps_the_last_success(stack, tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    config = stack.replace(root_prefix=f"t{uuid4().hex[:12]}")
    env = {**os.environ, "PYTHONPATH": str(REPO), "LLOG_SETTINGS_FILE": "/nonexistent", **config.to_options(),
           "LLOG_METRICS_TEXTFILE_DIR": str(tmp_path)}
    run([sys.executable, "-m", "llog_tools", "gc"], env, 300)
    broken = {**env, "LLOG_S3_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}", "LLOG_S3_MAX_ATTEMPTS": "1"}
    failed = subprocess.run([sys.executable, "-m", "llog_tools", "gc"], cwd=REPO, env=broken, capture_output=True, text=True,
                            timeout=300)
    assert failed.returncode == 1, failed.stderr
    samples = {(s.name, tuple(s.labels.items())): s.value
               for f in text_string_to_metric_families((tmp_path / "gc.prom").read_text()) for s in f.samples}
    assert samples[("leaderless_log_gc_last_run_success", ())] == 0
    assert samples[("leaderless_log_gc_runs_total", (("outcome", "failure"),))] == 1
    assert samples[("leaderless_log_gc_runs_total", (("outcome", "success"),))] == 1
    assert samples[("leaderless_log_gc_last_success_timestamp_seconds", ())] > 0
    assert any(name == "leaderless_log_gc_last_run_failure_info" for name, _ in samples)
