"""The broker's metrics (broker_lite/metrics.py): the JSON snapshot holds the seed's fields, the
Prometheus text parses and carries the request histogram, billing arithmetic, the bucket scan.
Pure code: no servers (an ObjectStore is built against a closed port, so its scans fail)."""

from __future__ import annotations

import asyncio
import collections
import socket
import threading
import types
from datetime import datetime, timezone

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker_lite.batcher import Batcher
from broker_lite.consume import ConsumeStats
from broker_lite.metrics import (GB, PROMETHEUS_CONTENT_TYPE, S3_STANDARD_US_EAST_1, SCAN_DUTY_FACTOR, BrokerMetrics,
                                 BucketUsageScanner, route_label)
from llog.config import Config
from llog.metrics import OpTimings
from llog.objects import ObjectInfo, ObjectStore
from llog.writer import AppendGroup

# The reference broker's lists (its HTTP API).
SEED_BROKER = ["broker_id", "host", "port", "started_at_ms", "roles", "batch_settings"]
SEED_HTTP = [
    "inbound_requests", "accepted_produce_requests", "rejected_produce_requests", "malformed_request_count",
    "response_status_counts", "backpressure_rejected_count", "records_accepted", "request_payload_bytes_accepted",
    "distinct_topics_seen", "distinct_topic_partitions_seen", "consume_requests_total",
    "consume_request_errors_total", "consume_records_returned_total", "consume_bytes_returned_total",
    "consume_partition_results_total", "consume_blob_cache_hits_total", "consume_blob_cache_misses_total",
    "consume_blob_cache_full_object_gets_total", "consume_blob_cache_range_gets_total",
    "consume_long_poll_waiters_current", "consume_long_poll_hits_total", "consume_long_poll_timeouts_total",
    "consume_backpressure_rejections_total"]
SEED_BILLING = [
    "pricing_model", "storage_usd_per_gb_month", "put_usd_per_1000", "get_usd_per_1000",
    "bucket_usage_refresh_interval_seconds", "bucket_usage_last_refreshed_at_ms", "bucket_usage_scan_success",
    "bucket_usage_scan_error", "bucket_object_count", "bucket_stored_bytes", "bucket_stored_gb",
    "estimated_request_cost_usd", "estimated_monthly_storage_cost_usd"]
SEED_FAMILIES = """inflight_requests batch_waiters_current batch_buffer_payload_bytes
batch_append_payload_bytes_enqueued_total s3_put_requests_total s3_put_uploaded_bytes_total
batch_queued_payload_bytes_current batch_inflight_flush_bytes_current batch_pending_batches_current
batch_sealed_batches_current batch_oldest_pending_batch_age_seconds produce_requests_total
consume_long_poll_waiters_current consume_requests_total consume_records_returned_total
consume_bytes_returned_total consume_partition_results_total consume_blob_cache_hits_total
consume_blob_cache_misses_total consume_blob_cache_full_object_gets_total consume_blob_cache_range_gets_total
consume_long_poll_hits_total consume_long_poll_timeouts_total consume_backpressure_rejections_total
consume_request_duration_seconds consume_blob_cache_request_peak_bytes batch_backpressure_rejections_total
batch_flushes_total batch_queue_wait_seconds batch_seal_to_flush_start_seconds batch_flush_duration_seconds
oxia_operations_total s3_operations_total s3_estimated_request_cost_usd_total s3_bucket_stored_bytes
s3_bucket_stored_gb s3_bucket_objects s3_estimated_monthly_storage_cost_usd
s3_bucket_usage_refresh_timestamp_seconds s3_bucket_usage_refresh_failures_total shared_wal_blob_bytes
s3_put_failures_total oxia_operation_duration_seconds s3_operation_duration_seconds""".split()

CONFIG = Config(batch_max_bytes=1000, batch_max_delay_ms=7, batch_max_buffer_bytes=5000)


def new_metrics(**kwargs) -> BrokerMetrics:
    return BrokerMetrics(config=kwargs.pop("config", CONFIG), broker_id="broker-1", host="127.0.0.1", port=8080,
                         started_at_ms=1_760_000_000_000, roles=["write", "read"], **kwargs)


def families(metrics: BrokerMetrics) -> dict:
    return {f.name: f for f in text_string_to_metric_families(metrics.prometheus().decode())}


def closed_port_store() -> ObjectStore:
    """A real ObjectStore whose every request fails at once (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return ObjectStore(Config(s3_bucket="bucket", s3_endpoint_url=f"http://127.0.0.1:{port}", s3_max_attempts=1,
                              s3_access_key_id="key", s3_secret_access_key="secret", s3_timeout_s=2.0))


# --- snapshot -------------------------------------------------------------------------------------

def test_snapshot_has_every_seed_field():
    snapshot = new_metrics().snapshot()
    assert list(snapshot) == ["broker", "http", "batching", "writer", "oxia", "s3"]
    assert set(SEED_BROKER) <= set(snapshot["broker"])
    assert snapshot["broker"]["batch_settings"] == {"max_bytes": 1000, "max_delay_ms": 7, "max_buffer_bytes": 5000}
    assert snapshot["broker"]["roles"] == ["write", "read"]
    assert set(SEED_HTTP) <= set(snapshot["http"])
    assert list(snapshot["s3"]["billing"]) == SEED_BILLING
    assert snapshot["batching"]["flushes_total"] == 0 and snapshot["batching"]["pending_batches"] == 0


def test_http_counters_follow_the_recorded_requests():
    m = new_metrics()
    for status in (200, 200, 409, 503, 400):
        m.request_started()
        m.observe_request("/produce", status, 0.002)
    m.produce_accepted(3, 30, [("orders", 0), ("orders", 1)])
    m.produce_accepted(2, 20, [("orders", 0), ("audit", 0)])
    m.produce_accepted(1, 5, [("orders", 1)])
    m.produce_rejected(backpressure=True)
    m.produce_rejected()
    m.malformed_request()
    m.request_started()  # still in flight
    # The consume service (it needs a LogReader, so Oxia): what the metrics read of it.
    consume = types.SimpleNamespace(waiting=1, observer=None)
    m.attach(consume=consume)
    consume.observer(ConsumeStats(records=4, bytes=40, partitions=2, cache_hits=1, cache_misses=2, long_poll="hit"))
    consume.observer(ConsumeStats(partitions=1, errors=1, long_poll="timeout"))
    consume.observer(ConsumeStats(partitions=1))
    m.consume_failed(backpressure=True)
    http = m.snapshot()["http"]
    assert http["inbound_requests"] == 5 and http["inflight_requests"] == 1
    assert http["response_status_counts"] == {"200": 2, "400": 1, "409": 1, "503": 1}
    assert (http["accepted_produce_requests"], http["rejected_produce_requests"]) == (3, 2)
    assert (http["backpressure_rejected_count"], http["malformed_request_count"]) == (1, 1)
    assert (http["records_accepted"], http["request_payload_bytes_accepted"]) == (6, 55)
    assert (http["distinct_topics_seen"], http["distinct_topic_partitions_seen"]) == (2, 3)
    assert (http["consume_requests_total"], http["consume_request_errors_total"]) == (4, 2)
    assert (http["consume_records_returned_total"], http["consume_bytes_returned_total"]) == (4, 40)
    assert http["consume_partition_results_total"] == 4
    assert (http["consume_blob_cache_hits_total"], http["consume_blob_cache_misses_total"]) == (1, 2)
    assert http["consume_blob_cache_full_object_gets_total"] == http["consume_blob_cache_range_gets_total"] == 0
    assert http["consume_backpressure_rejections_total"] == 1
    assert (http["consume_long_poll_waiters_current"], http["consume_long_poll_hits_total"],
            http["consume_long_poll_timeouts_total"]) == (1, 1, 1)
    consume.waiting = 0
    assert families(m)["leaderless_log_consume_long_poll_waiters_current"].samples[0].value == 0


@pytest.mark.parametrize("path, route", [
    ("/produce", "/produce"), ("/groups/g1/commit", "/groups/{group}/commit"), ("/groups/g1", "/groups/{group}"),
    ("/topics", "/topics"), ("/topics/orders", "/topics/{topic}"), ("/metrics/prometheus", "/metrics/prometheus"),
    ("/openapi.json", "/openapi.json"), ("/groups/", "other"), ("/groups/g/x", "other"), ("/nope", "other"),
    ("/topics/a/b", "other"), ("", "other")])
def test_route_label(path, route):
    assert route_label(path) == route


# --- Prometheus -----------------------------------------------------------------------------------

def test_prometheus_parses_and_holds_the_request_histogram():
    m = new_metrics()
    m.observe_request("/produce", 200, 0.0007)
    m.observe_request("/produce", 200, 0.003)
    m.observe_request("/consume", 200, 0.2)
    m.observe_request("/groups/{group}", 404, 0.001)
    m.observe_request("/no/such/route", 404, 0.001)  # not a template: "other"
    m.observe_request("/consume", 503, 12.0)
    m.consume_done(types.SimpleNamespace(records=1, bytes=10, partitions=1, peak_bytes=2048))
    assert PROMETHEUS_CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"
    found = families(m)
    hist = found["leaderless_log_http_request_duration_seconds"]
    assert hist.type == "histogram"
    counts = {(s.labels["route"], s.labels["status_class"]): s.value for s in hist.samples if s.name.endswith("_count")}
    assert counts == {("/produce", "2xx"): 2, ("/consume", "2xx"): 1, ("/groups/{group}", "4xx"): 1,
                      ("other", "4xx"): 1, ("/consume", "5xx"): 1}
    buckets = {s.labels["le"]: s.value for s in hist.samples
               if s.name.endswith("_bucket") and s.labels["route"] == "/produce"}
    assert (buckets["0.0005"], buckets["0.001"], buckets["0.005"], buckets["10.0"], buckets["+Inf"]) == (0, 1, 2, 2, 2)
    consume = {s.name: s.value for s in found["leaderless_log_consume_request_duration_seconds"].samples}
    assert consume["leaderless_log_consume_request_duration_seconds_count"] == 2
    assert found["leaderless_log_consume_requests"].type == "counter"
    peak = {s.name: s.value for s in found["leaderless_log_consume_blob_cache_request_peak_bytes"].samples}
    assert peak["leaderless_log_consume_blob_cache_request_peak_bytes_sum"] == 2048


def test_prometheus_has_the_seed_families():
    names = set(families(new_metrics()))
    wanted = {"leaderless_log_" + n.removesuffix("_total") for n in SEED_FAMILIES}
    assert not wanted - names


def test_prometheus_uses_its_own_registry():
    from prometheus_client import REGISTRY
    new_metrics()
    assert not any(n.startswith("leaderless_log_") for n in REGISTRY._names_to_collectors)
    new_metrics().prometheus()  # two in one process do not clash


# --- billing --------------------------------------------------------------------------------------

def test_billing_arithmetic():
    pricing = S3_STANDARD_US_EAST_1
    # PUT class: 2000 put + 1000 list = 3 x $0.005; GET class: 25,000 = 25 x $0.0004.
    assert pricing.request_cost_usd({"put": 2000, "list": 1000, "get": 10_000, "range_get": 15_000,
                                     "delete": 999}) == pytest.approx(0.025)
    assert pricing.monthly_storage_cost_usd(2 * GB) == pytest.approx(0.046)


def test_billing_in_the_snapshot_reads_the_object_store_counts():
    store = closed_port_store()
    try:
        store.stats.update({"put": 4000, "put_bytes": 123, "list": 1000, "get": 5000, "range_get": 5000})
        m = new_metrics(bucket_usage_interval_s=3600)
        m.attach(objects=store)
        m.attach(objects=store)  # counted once
        s3 = m.snapshot()["s3"]
        assert (s3["put_requests"], s3["put_bytes"]) == (4000, 123)
        assert s3["operations"]["get"] == 5000
        billing = s3["billing"]
        assert billing["estimated_request_cost_usd"] == pytest.approx(5 * 0.005 + 10 * 0.0004)
        assert billing["bucket_usage_refresh_interval_seconds"] == 3600
        samples = {s.name: s.value for f in families(m).values() for s in f.samples}
        assert samples["leaderless_log_s3_estimated_request_cost_usd_total"] == pytest.approx(0.029)
        assert samples['leaderless_log_s3_put_uploaded_bytes_total'] == 123
    finally:
        m.close()
        store.close()


# --- bucket usage ---------------------------------------------------------------------------------

def test_scan_failure_is_reported_not_raised():
    now = datetime.now(timezone.utc)
    outcomes = [[ObjectInfo("llog/a", 10, now), ObjectInfo("llog/b", 32, now)], RuntimeError("boom")]
    seen = []

    def list_objects(prefix):
        seen.append(prefix)
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        yield from outcome

    scanner = BucketUsageScanner(list_objects, "llog/", interval_s=60)
    assert (scanner.usage.success, scanner.usage.error, scanner.usage.refreshed_at_ms) == (False, None, None)
    ok = scanner.refresh()
    assert (ok.success, ok.error, ok.objects, ok.stored_bytes) == (True, None, 2, 42)
    failed = scanner.refresh()  # does not raise
    assert (failed.success, failed.error) == (False, "RuntimeError: boom")
    assert (failed.objects, failed.stored_bytes, failed.refreshed_at_ms) == (2, 42, ok.refreshed_at_ms)  # last good
    assert scanner.failures == 1 and seen == ["llog/", "llog/"]


def test_scan_thread_reports_a_real_store_error():
    store = closed_port_store()
    m = new_metrics(bucket_usage_interval_s=3600)
    try:
        m.attach(objects=store)
        for _ in range(200):
            if m.bucket_usage_failures():
                break
            threading.Event().wait(0.05)
        billing = m.snapshot()["s3"]["billing"]
        assert billing["bucket_usage_scan_success"] is False
        assert "StorageError" in billing["bucket_usage_scan_error"]
        assert (billing["bucket_object_count"], billing["bucket_stored_gb"]) == (0, 0)
        samples = {s.name: s.value for f in families(m).values() for s in f.samples}
        assert samples["leaderless_log_s3_bucket_usage_refresh_failures_total"] == 1
    finally:
        m.close()
        store.close()


def test_a_slow_scan_waits_longer_than_the_interval():
    scanner = BucketUsageScanner(lambda prefix: [], "llog/", interval_s=60)
    assert scanner.wait_after(0.2) == 60  # a cheap scan: the interval
    assert scanner.wait_after(4.0) == 4.0 * SCAN_DUTY_FACTOR  # 4 s of listing: never more than 2% of the time


def test_scanner_thread_stops_on_close():
    calls = threading.Event()

    def list_objects(prefix):
        calls.set()
        return []

    scanner = BucketUsageScanner(list_objects, "llog/", interval_s=3600)
    scanner.start()
    assert calls.wait(5)
    scanner.close()
    assert not scanner._thread.is_alive() and scanner.usage.success


# --- Oxia -----------------------------------------------------------------------------------------

def test_oxia_counts_are_read_at_scrape_time():
    # A Coordination needs a running Oxia; this stands in for its ``stats`` Counter only.
    coordination = types.SimpleNamespace(stats=collections.Counter({"get": 5, "put": 7, "read_rpc": 2,
                                                                     "write_rpc": 3, "cas_conflict": 1}),
                                         timings=OpTimings())
    m = new_metrics()
    m.attach(coordination=coordination)
    coordination.stats["put"] += 1
    coordination.timings.observe("put", 0.25)
    assert m.snapshot()["oxia"] == {"operations": {"get": 5, "put": 8}, "read_rpcs": 2, "write_rpcs": 3,
                                    "cas_conflicts": 1, "latency_totals": {"put": {"count": 1, "seconds": 0.25}},
                                    "failures": {}}
    ops = {s.labels["operation"]: s.value for s in families(m)["leaderless_log_oxia_operations"].samples
           if s.name.endswith("_total")}
    assert ops == {"get": 5, "put": 8}



def test_writer_counts_are_read_at_scrape_time():
    """``failed_after_reserve`` and ``producers_evicted`` of every attached writer (section 4.6, 9.4),
    summed, in the snapshot and as counters. A LogWriter needs a running stack; this stands in for
    its ``stats`` Counter only."""
    writers = [types.SimpleNamespace(stats=collections.Counter(), coordination=None, objects=None) for _ in range(2)]
    m = new_metrics()
    for w in writers:
        m.attach(writer=w)
    m.attach(writer=writers[0])  # counted once
    assert m.snapshot()["writer"] == {"failed_after_reserve": 0, "producers_evicted": 0}
    writers[0].stats["failed_after_reserve"] += 1
    writers[1].stats["failed_after_reserve"] += 2
    writers[1].stats["producers_evicted"] += 5
    assert m.snapshot()["writer"] == {"failed_after_reserve": 3, "producers_evicted": 5}
    found = families(m)
    assert [s.value for s in found["leaderless_log_appends_failed_after_reserve"].samples
            if s.name.endswith("_total")] == [3]
    assert [s.value for s in found["leaderless_log_producers_evicted"].samples if s.name.endswith("_total")] == [5]

# --- group commit ---------------------------------------------------------------------------------

def test_batching_numbers_follow_the_batcher():
    """A Batcher with no writer: every flush fails at once, which is enough to see its state."""
    m = new_metrics()

    async def run():
        batcher = Batcher(None, CONFIG)  # type: ignore[arg-type]
        m.attach(batcher=batcher)
        first = asyncio.create_task(batcher.produce([AppendGroup("orders", 0, [b"abc", b"de"])]))
        second = asyncio.create_task(batcher.produce([AppendGroup("orders", 0, [b"fghij"])]))
        await asyncio.sleep(0)  # both admitted; the first batch's flush has not started yet
        during = m.snapshot()["batching"]
        gauges = {s.name: s.value for f in families(m).values() for s in f.samples}
        outcomes = await asyncio.gather(first, second)
        await batcher.close()
        return during, gauges, outcomes

    during, gauges, outcomes = asyncio.run(run())
    assert all(isinstance(o, AttributeError) for outcome in outcomes for o in outcome)
    assert (during["waiting_requests"], during["inflight_flushes"], during["inflight_flush_bytes"]) == (2, 1, 5)
    assert (during["pending_batches"], during["sealed_batches"], during["queued_bytes"]) == (1, 0, 5)
    assert during["buffered_bytes"] == 10 and during["oldest_pending_batch_age_ms"] >= 0
    assert gauges["leaderless_log_batch_waiters_current"] == 2
    assert gauges["leaderless_log_batch_buffer_payload_bytes"] == 10
    after = m.snapshot()["batching"]
    assert (after["enqueued_requests_total"], after["enqueued_bytes_total"]) == (2, 10)
    assert (after["flushes_total"], after["flush_failures_total"], after["records_flushed_total"]) == (2, 2, 0)
    assert after["buffered_bytes"] == after["waiting_requests"] == after["pending_batches"] == 0
    assert after["mean_flush_duration_ms"] >= 0 and after["last_flush_duration_ms"] >= 0
    samples = {s.name: s.value for f in families(m).values() for s in f.samples}
    assert samples["leaderless_log_batch_flushes_total"] == 2
    assert samples["leaderless_log_batch_queue_wait_seconds_count"] == 2
    assert samples["leaderless_log_batch_seal_to_flush_start_seconds_count"] == 2
    assert samples["leaderless_log_batch_flush_duration_seconds_count"] == 2
    assert samples["leaderless_log_shared_wal_blob_bytes_count"] == 0  # no flush wrote a blob
