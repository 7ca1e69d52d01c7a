"""llog.metrics: the clients' latency counts, their Prometheus families, and one-shot jobs' textfiles."""

from __future__ import annotations

import collections
import types

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from llog.errors import CoordinationError, StorageError, VersionConflict
from llog.metrics import ClientCollector, OpTimings, metrics_file, write_run_metrics


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def client(stats: dict, timings: OpTimings):
    # Stands in for a Coordination or an ObjectStore: its ``stats`` and ``timings`` only.
    return types.SimpleNamespace(stats=collections.Counter(stats), timings=timings)


def test_buckets_are_prometheus_le_bounds():
    t = OpTimings(buckets=(0.001, 0.01))
    for seconds in (0.0005, 0.001, 0.002, 0.5):  # 0.001 is <= its own bound
        t.observe("get", seconds)
    counts, failures = t.snapshot()
    assert counts["get"][:3] == [2, 1, 1] and counts["get"][3] == pytest.approx(0.5035)
    assert failures == {}


def test_lost_cas_is_not_a_failure():
    t = OpTimings()
    t.observe("put", 0.01, VersionConflict("k", 3))
    t.observe("put", 0.01, CoordinationError("gone"))
    assert t.snapshot()[1] == {("put", "CoordinationError"): 1}


def test_client_families_sum_the_clients():
    a, b, s3 = OpTimings(), OpTimings(), OpTimings()
    a.observe("get", 0.002)
    b.observe("get", 0.2)
    b.observe("put", 0.003, CoordinationError("x"))
    s3.observe("put", 0.05, StorageError("503"))
    s3.observe("range_get", 0.004)
    registry = CollectorRegistry()
    registry.register(ClientCollector([client({"get": 1}, a), client({"get": 1, "put": 1}, b)],
                                      [client({"put": 1, "put_bytes": 10, "range_get": 1}, s3)]))
    got = samples(generate_latest(registry).decode())
    oxia = "leaderless_log_oxia_operation_duration_seconds"
    assert got[(oxia + "_count", (("operation", "get"),))] == 2
    assert got[(oxia + "_bucket", (("le", "0.0025"), ("operation", "get")))] == 1
    assert got[(oxia + "_bucket", (("le", "+Inf"), ("operation", "get")))] == 2
    assert got[(oxia + "_sum", (("operation", "get"),))] == pytest.approx(0.202)
    assert got[("leaderless_log_oxia_operation_failures_total",
                (("error_type", "CoordinationError"), ("operation", "put")))] == 1
    assert got[("leaderless_log_s3_operation_duration_seconds_count", (("operation", "range_get"),))] == 1
    assert got[("leaderless_log_s3_put_failures_total", ())] == 1
    assert got[("leaderless_log_s3_operations_total", (("operation", "put"),))] == 1


def test_metrics_file_names():
    assert metrics_file(None, None, "gc") is None
    assert str(metrics_file(None, "/m", "gc")) == "/m/gc.prom"
    assert str(metrics_file("/x/y.prom", "/m", "gc")) == "/x/y.prom"
    with pytest.raises(ValueError, match=r"must end in \.prom"):
        metrics_file("/x/y.txt", None, "gc")


def test_a_failed_run_keeps_the_last_success(tmp_path):
    path = tmp_path / "gc.prom"
    figures = {"deleted_objects": ("Blobs deleted", 3)}
    write_run_metrics(path, "gc", success=True, duration_s=1.5, figures=figures, now=1000.0)
    write_run_metrics(path, "gc", success=False, duration_s=0.5, figures={}, error_type="StorageError", now=2000.0)
    got = samples(path.read_text())
    assert got[("leaderless_log_gc_last_success_timestamp_seconds", ())] == 1000.0
    assert got[("leaderless_log_gc_last_run_timestamp_seconds", ())] == 2000.0
    assert got[("leaderless_log_gc_last_run_success", ())] == 0.0
    assert got[("leaderless_log_gc_runs_total", (("outcome", "success"),))] == 1
    assert got[("leaderless_log_gc_runs_total", (("outcome", "failure"),))] == 1
    assert got[("leaderless_log_gc_last_run_failure_info", (("error_type", "StorageError"),))] == 1
    write_run_metrics(path, "gc", success=True, duration_s=1.0, figures=figures, now=3000.0)
    got = samples(path.read_text())
    assert got[("leaderless_log_gc_last_success_timestamp_seconds", ())] == 3000.0
    assert got[("leaderless_log_gc_runs_total", (("outcome", "success"),))] == 2
    assert got[("leaderless_log_gc_last_run_deleted_objects", ())] == 3
    assert list(tmp_path.iterdir()) == [path]  # the temporary file was renamed over it
