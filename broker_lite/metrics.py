"""The broker's metrics: ``GET /metrics`` (a JSON snapshot) and ``GET /metrics/prometheus``
(Prometheus text, ``text/plain; version=0.0.4``), the reference implementation's metrics contract.

One :class:`BrokerMetrics` per process. Its own numbers (HTTP, produce, consume) are plain
counters under a lock, updated by the app on the event loop; numbers that live elsewhere are read
when scraped: the group commit's state and counts (:class:`~broker_lite.batcher.Batcher`), and
the Oxia and S3 operation counts of the clients (``Coordination.stats``, ``ObjectStore.stats``).
Distributions (request latency, batch timings, blob sizes) are ``prometheus_client`` histograms.
Everything is exposed through the broker's own ``CollectorRegistry``, never the global one.

``s3.billing`` is an estimate at S3 Standard us-east-1 list prices (:data:`S3_STANDARD_US_EAST_1`),
not a bill: request cost from the observed ``put``+``list`` (PUT class) and ``get``+``range_get``
(GET class) counts; storage from a scan of the bucket under ``LLOG_ROOT_PREFIX`` that a background
thread repeats every ``bucket_usage_interval_s`` (:class:`BucketUsageScanner`; its ``LIST`` calls
are counted like any other). Transfer, replication, lifecycle, KMS and taxes are left out.
Request-cost counters may be summed across brokers; bucket-size and storage-cost gauges are
aggregated with ``max``.
"""

from __future__ import annotations

import collections
import gc
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from broker_lite.batcher import Batcher
from llog.config import Config
from llog.consumer_groups import topic_group_lags
from llog.discovery import partitions_of
from llog.metrics import OXIA_OTHER, PREFIX, SECONDS_BUCKETS, _counts, client_families, merged
from llog.objects import ObjectInfo

log = logging.getLogger(__name__)

#: The seed's content type for ``GET /metrics/prometheus`` (prometheus_client's
#: ``CONTENT_TYPE_LATEST`` is the 1.0.0 format).
PROMETHEUS_CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

#: Route labels of the request histogram; any other path is ``OTHER_ROUTE`` (bounded labels).
ROUTES = frozenset({"/produce", "/consume", "/groups/{group}/commit", "/groups/{group}", "/topics",
                    "/topics/{topic}", "/health", "/metrics", "/metrics/prometheus", "/openapi.json"})
OTHER_ROUTE = "other"

#: Size buckets, 1 KiB .. 256 MiB.
BYTES_BUCKETS = tuple(float(1024 * 4 ** i) for i in range(10))

#: Bytes in the GB of S3's GB-month.
GB = 1024 ** 3

#: ObjectStore operations that AWS bills in the PUT class and in the GET class.
PUT_CLASS_OPS = ("put", "list")
GET_CLASS_OPS = ("get", "range_get")


def route_label(path: str) -> str:
    """The route template of a request path (``/groups/g1/commit`` -> ``/groups/{group}/commit``),
    or ``"other"``."""
    if path in ROUTES:
        return path
    parts = path.split("/")
    if len(parts) == 3 and parts[2]:
        if parts[1] == "groups":
            return "/groups/{group}"
        if parts[1] == "topics":
            return "/topics/{topic}"
    if len(parts) == 4 and parts[1] == "groups" and parts[2] and parts[3] == "commit":
        return "/groups/{group}/commit"
    return OTHER_ROUTE


def status_class(status: int) -> str:
    """``"2xx"``, ``"4xx"``, ``"5xx"`` (and so on) for an HTTP status."""
    return f"{status // 100}xx"


# --- billing --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class S3Pricing:
    """List prices for an estimate of what the bucket costs."""

    pricing_model: str
    storage_usd_per_gb_month: float
    put_usd_per_1000: float
    get_usd_per_1000: float

    def request_cost_usd(self, operations: Mapping[str, int]) -> float:
        """The cost of ``operations`` (ObjectStore op name -> count), PUT and GET classes."""
        puts = sum(operations.get(op, 0) for op in PUT_CLASS_OPS)
        gets = sum(operations.get(op, 0) for op in GET_CLASS_OPS)
        return puts / 1000 * self.put_usd_per_1000 + gets / 1000 * self.get_usd_per_1000

    def monthly_storage_cost_usd(self, stored_bytes: int) -> float:
        return stored_bytes / GB * self.storage_usd_per_gb_month


#: S3 Standard, us-east-1: $0.023 per GB-month (first 50 TB), $0.005 per 1,000
#: PUT/COPY/POST/LIST, $0.0004 per 1,000 GET/SELECT.
S3_STANDARD_US_EAST_1 = S3Pricing("s3_standard_us_east_1", 0.023, 0.005, 0.0004)


@dataclass(frozen=True)
class BucketUsage:
    """The last bucket scan: the objects and bytes of the last successful one (kept while later
    scans fail), whether the latest succeeded, and its error if not. Before the first scan
    finishes: ``success`` False and ``error`` None."""

    refreshed_at_ms: int | None = None
    success: bool = False
    error: str | None = None
    objects: int = 0
    stored_bytes: int = 0


#: A bucket usage scan runs at most one part in this many of the time.
SCAN_DUTY_FACTOR = 50


class _PeriodicScan:
    """:meth:`refresh` now and then every ``interval_s`` (stretched: :meth:`wait_after`), in a
    daemon thread. ``refresh`` reports its own failures."""

    thread_name = "llog-broker-scan"

    def __init__(self, interval_s: float):
        if interval_s <= 0:
            raise ValueError(f"the scan interval must be > 0 s, got {interval_s}")
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def failures(self) -> int:
        """Scans that raised."""
        with self._lock:
            return self._failures

    def refresh(self) -> object:
        raise NotImplementedError

    def start(self) -> None:
        """Start scanning (now, then every ``interval_s``); a second call does nothing."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
            self._thread.start()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the thread; waits at most ``timeout_s`` for a scan under way (it is a daemon)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def wait_after(self, scan_s: float) -> float:
        """Seconds to wait after a scan that took ``scan_s``: the interval, stretched so that
        scanning takes at most 1 / :data:`SCAN_DUTY_FACTOR` of the time. A listing of a large
        bucket is seconds of CPU in the broker's process (tens of thousands of objects parsed),
        which every request in flight would feel."""
        return max(self.interval_s, scan_s * SCAN_DUTY_FACTOR)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.refresh()
            self._stop.wait(self.wait_after(time.monotonic() - started))


class BucketUsageScanner(_PeriodicScan):
    """Scans the objects under ``prefix`` every ``interval_s`` in a daemon thread; :attr:`usage`
    is the last result and never blocks. A failing scan is logged and reported, never raised."""

    thread_name = "llog-broker-bucket-usage"

    def __init__(self, list_objects: Callable[[str], Iterable[ObjectInfo]], prefix: str,
                 interval_s: float = 60.0):
        super().__init__(interval_s)
        self.prefix = prefix
        self._list = list_objects
        self._usage = BucketUsage()

    @property
    def usage(self) -> BucketUsage:
        with self._lock:
            return self._usage

    def refresh(self) -> BucketUsage:
        """Scan once in the calling thread (a blocking call: never on the event loop)."""
        try:
            objects = stored = 0
            for info in self._list(self.prefix):
                objects += 1
                stored += info.size
        except Exception as e:  # noqa: BLE001 - reported in the metrics, the scan runs again later
            log.warning("bucket usage scan under %r failed: %s", self.prefix, e)
            with self._lock:
                self._failures += 1
                last = self._usage
                self._usage = BucketUsage(last.refreshed_at_ms, False, f"{type(e).__name__}: {e}",
                                          last.objects, last.stored_bytes)
                return self._usage
        with self._lock:
            self._usage = BucketUsage(int(time.time() * 1000), True, None, objects, stored)
            return self._usage


class GroupLagScanner(_PeriodicScan):
    """Every ``interval_s``: per consumer group and topic, the records the group has not read
    (:attr:`llog.consumer_groups.PartitionLag.lag`, summed over the topic's partitions), from
    Oxia: one range scan of ``P/consumers/`` per partition, and one read of the controls per
    topic. :attr:`lags` is the last successful scan's and never blocks."""

    thread_name = "llog-broker-group-lag"

    def __init__(self, coordination: object, root: str, interval_s: float = 60.0):
        super().__init__(interval_s)
        self._coordination, self._root = coordination, root
        self._lags: dict[tuple[str, str], int] = {}
        self.refreshed_at: float | None = None

    @property
    def lags(self) -> dict[tuple[str, str], int]:
        """(group, topic) -> records not yet read."""
        with self._lock:
            return dict(self._lags)

    def refresh(self) -> dict[tuple[str, str], int]:
        """Scan once in the calling thread (blocking: never on the event loop)."""
        try:
            topics = sorted({k.tp.topic for k in partitions_of(self._coordination, self._root)})
            lags = {(group, topic): sum(r.lag for r in rows)
                    for topic in topics
                    for group, rows in topic_group_lags(self._coordination, self._root, topic).items()}
        except Exception as e:  # noqa: BLE001 - reported in the metrics, the scan runs again later
            log.warning("consumer group lag scan failed: %s", e)
            with self._lock:
                self._failures += 1
                return dict(self._lags)
        with self._lock:
            self._lags, self.refreshed_at = lags, time.time()
            return dict(lags)


# --- the metrics ----------------------------------------------------------------------------------

@dataclass
class _Http:
    """The counters the app drives (``http`` of the snapshot). Guarded by ``BrokerMetrics._lock``."""

    inbound_requests: int = 0
    inflight_requests: int = 0
    accepted_produce_requests: int = 0
    rejected_produce_requests: int = 0
    malformed_request_count: int = 0
    backpressure_rejected_count: int = 0
    records_accepted: int = 0
    request_payload_bytes_accepted: int = 0
    consume_requests_total: int = 0
    consume_request_errors_total: int = 0
    consume_records_returned_total: int = 0
    consume_bytes_returned_total: int = 0
    consume_partition_results_total: int = 0
    consume_blob_cache_hits_total: int = 0
    consume_blob_cache_misses_total: int = 0
    consume_blob_cache_full_object_gets_total: int = 0
    consume_blob_cache_range_gets_total: int = 0
    consume_long_poll_hits_total: int = 0
    consume_long_poll_timeouts_total: int = 0
    consume_backpressure_rejections_total: int = 0


#: ``_Http`` fields exported as Prometheus counters under the seed's names (the rest are gauges
#: or exported otherwise).
_HTTP_COUNTERS = {
    "consume_requests_total": "Consume requests answered",
    "consume_request_errors_total": "Consume requests answered with an error",
    "consume_records_returned_total": "Records returned by consume requests",
    "consume_bytes_returned_total": "Record bytes returned by consume requests",
    "consume_partition_results_total": "Partition results returned by consume requests",
    "consume_blob_cache_hits_total": "Consume blob reads served from the cache",
    "consume_blob_cache_misses_total": "Consume blob reads that went to S3",
    "consume_blob_cache_full_object_gets_total": "Whole-object S3 GETs of this broker (its reads: consumes)",
    "consume_blob_cache_range_gets_total": "Ranged S3 GETs of this broker (its reads: consumes)",
    "consume_long_poll_hits_total": "Long polls answered because records arrived",
    "consume_long_poll_timeouts_total": "Long polls answered at max_wait_ms without enough records",
    "consume_backpressure_rejections_total": "Consume requests refused for backpressure",
}


class BrokerMetrics:
    """The metrics of one broker process. Recording methods are cheap and called on the event
    loop; :meth:`snapshot` and :meth:`prometheus` do no I/O and may be called from any thread."""

    def __init__(self, *, config: Config, broker_id: str, host: str, port: int, started_at_ms: int,
                 roles: Sequence[str], bucket_usage_interval_s: float | None = None,
                 pricing: S3Pricing = S3_STANDARD_US_EAST_1):
        self.config = config
        self.broker_id, self.host, self.port = broker_id, host, port
        self.started_at_ms = started_at_ms
        self.roles = list(roles)
        self.pricing = pricing
        #: Seconds between bucket scans and between group lag scans (``LLOG_METRICS_SCAN_INTERVAL_S``).
        self.bucket_usage_interval_s = bucket_usage_interval_s or config.metrics_scan_interval_s
        self._lock = threading.Lock()
        self._http = _Http()
        self._statuses: collections.Counter[int] = collections.Counter()
        self._topics: set[str] = set()
        self._topic_partitions: set[tuple[str, int]] = set()
        self._batcher: Batcher | None = None
        self._consume: object | None = None
        self._coordinations: list[object] = []
        #: The LogWriters attached: their ``stats`` (section 4.6's rounds not finished after a
        #: reserve, section 9.4's evicted producers) are read at scrape time.
        self._writers: list[object] = []
        self._object_stores: list[object] = []
        self._scanner: BucketUsageScanner | None = None
        self._lag_scanner: GroupLagScanner | None = None

        self.registry = CollectorRegistry()
        self._request_seconds = Histogram(
            PREFIX + "http_request_duration_seconds", "HTTP request duration, by route template and status class",
            ["route", "status_class"], buckets=SECONDS_BUCKETS, registry=self.registry)
        self._request_children: dict[tuple[str, int], Histogram] = {}
        self._kafka_seconds = Histogram(
            PREFIX + "kafka_request_duration_seconds", "Kafka listener request duration (docs/kafka.md), by API",
            ["api"], buckets=SECONDS_BUCKETS, registry=self.registry)
        self._kafka_errors = Counter(
            PREFIX + "kafka_partition_errors_total", "Kafka listener per-partition error codes answered, by API "
            "and Kafka error name", ["api", "error"], registry=self.registry)
        self._kafka_fetched = Counter(
            PREFIX + "kafka_fetch_partitions_total", "Partitions the Kafka listener's fetches read, by where from: "
            "tail_cache (this broker's memory) or log (Oxia and S3)", ["source"], registry=self.registry)
        self._consume_seconds = Histogram(
            PREFIX + "consume_request_duration_seconds", "Duration of consume requests (long polls included)",
            buckets=SECONDS_BUCKETS, registry=self.registry)
        self._consume_peak_bytes = Histogram(
            PREFIX + "consume_blob_cache_request_peak_bytes", "Most record bytes one consume request held at once",
            buckets=BYTES_BUCKETS, registry=self.registry)
        self._batch_histograms = {
            "queue_wait_s": Histogram(
                PREFIX + "batch_queue_wait_seconds", "Time from a produce request's admission to its batch's flush",
                buckets=SECONDS_BUCKETS, registry=self.registry),
            "seal_to_flush_start_s": Histogram(
                PREFIX + "batch_seal_to_flush_start_seconds", "Time from a batch's sealing to its flush",
                buckets=SECONDS_BUCKETS, registry=self.registry),
            "flush_duration_s": Histogram(
                PREFIX + "batch_flush_duration_seconds", "Duration of a batch flush (one shared append)",
                buckets=SECONDS_BUCKETS, registry=self.registry),
            "flush_bytes": Histogram(
                PREFIX + "shared_wal_blob_bytes", "Record bytes of each shared WAL blob (before framing)",
                buckets=BYTES_BUCKETS, registry=self.registry),
        }
        batcher_gauges = {
            "batch_waiters_current": ("Produce requests waiting for their batch to commit", "waiting_requests"),
            "batch_buffer_payload_bytes": ("Record bytes admitted and not yet committed", "buffered_bytes"),
            "batch_queued_payload_bytes_current": ("Record bytes in batches not yet flushing", "queued_bytes"),
            "batch_inflight_flush_bytes_current": ("Record bytes of the batches being flushed", "inflight_bytes"),
            "batch_pending_batches_current": ("Batches not yet flushing (open and sealed)", "pending_batches"),
            "batch_sealed_batches_current": ("Sealed batches waiting for a flush", "sealed_batches"),
            "batch_inflight_flushes_current": ("Flushes running", "inflight_flushes"),
            "batch_oldest_pending_batch_age_seconds": ("Age of the oldest batch not yet flushing",
                                                       "oldest_pending_age_s"),
        }
        for name, (documentation, attribute) in batcher_gauges.items():
            Gauge(PREFIX + name, documentation, registry=self.registry).set_function(self._batcher_reader(attribute))
        self._gc_pause = Histogram(
            PREFIX + "gc_pause_seconds", "Garbage collector pauses of this process (every thread waits them out)",
            ["generation"], buckets=SECONDS_BUCKETS, registry=self.registry)
        self._gc_started = 0.0
        gc.callbacks.append(self._on_gc)
        self.registry.register(_Collector(self))

    # --- wiring ----------------------------------------------------------------------------------

    def attach(self, *, writer: object | None = None, reader: object | None = None, batcher: Batcher | None = None,
               consume: object | None = None, coordination: object | None = None,
               objects: object | None = None) -> None:
        """Read from the broker's parts once they exist. ``writer``/``reader``: a LogWriter and a
        LogReader (their ``coordination`` and ``objects`` are read, each client counted once);
        ``batcher`` and ``consume`` (the consume service: its ``waiting`` is read, and its
        ``observer`` set to :meth:`consume_done`) get their observers set; ``coordination`` and
        ``objects``: clients held otherwise. The first ObjectStore starts the bucket usage scans,
        a ``reader`` of a broker with the ``read`` role the consumer group lag scans. May be
        called more than once."""
        clients = [c for c in (writer, reader) if c is not None]
        with self._lock:
            for found, into in (([coordination, *(c.coordination for c in clients)], self._coordinations),
                                ([objects, *(c.objects for c in clients)], self._object_stores)):
                for client in found:
                    if client is not None and all(client is not known for known in into):
                        into.append(client)
            if writer is not None and all(writer is not known for known in self._writers):
                self._writers.append(writer)
            if batcher is not None:
                self._batcher = batcher
                batcher.observer = self._observe_batch
            if consume is not None:
                self._consume = consume
                consume.observer = self.consume_done
            if self._scanner is None and self._object_stores:
                self._scanner = BucketUsageScanner(self._object_stores[0].list, f"{self.config.root_prefix}/",
                                                   self.bucket_usage_interval_s)
                self._scanner.start()
            if self._lag_scanner is None and reader is not None and "read" in self.roles:
                self._lag_scanner = GroupLagScanner(reader.coordination, self.config.root_prefix,
                                                    self.bucket_usage_interval_s)
                self._lag_scanner.start()

    def close(self) -> None:
        """Stop the bucket scans (before the clients are closed)."""
        for scanner in (self._scanner, self._lag_scanner):
            if scanner is not None:
                scanner.close()
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self._gc_pause.labels(str(info["generation"])).observe(time.perf_counter() - self._gc_started)

    # --- recording (on the event loop) -----------------------------------------------------------

    def request_started(self) -> None:
        """A request arrived (pairs with :meth:`observe_request`, for the in-flight gauge)."""
        with self._lock:
            self._http.inflight_requests += 1

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        """A request was answered: ``route`` a template of :data:`ROUTES` (:func:`route_label`;
        anything else counts as ``"other"``), ``status`` the HTTP status, ``seconds`` from its
        arrival to its response."""
        with self._lock:
            self._http.inbound_requests += 1
            self._http.inflight_requests = max(0, self._http.inflight_requests - 1)
            self._statuses[status] += 1
        key = (route if route in ROUTES else OTHER_ROUTE, status // 100)
        child = self._request_children.get(key)
        if child is None:
            child = self._request_children[key] = self._request_seconds.labels(key[0], status_class(status))
        child.observe(seconds)
        if route == "/consume":
            self._consume_seconds.observe(seconds)

    def observe_kafka_request(self, api: str, seconds: float, errors: Iterable[str] = ()) -> None:
        """A Kafka request was answered: its API's name, its duration, and the error names of
        the partitions (or topics) answered with one."""
        self._kafka_seconds.labels(api).observe(seconds)
        for error in errors:
            self._kafka_errors.labels(api, error).inc()

    def kafka_fetched(self, cache_hits: int, cache_misses: int) -> None:
        """A pass of a Kafka fetch read ``cache_hits`` partitions from the tail cache and
        ``cache_misses`` from Oxia and S3."""
        if cache_hits:
            self._kafka_fetched.labels("tail_cache").inc(cache_hits)
        if cache_misses:
            self._kafka_fetched.labels("log").inc(cache_misses)

    def produce_accepted(self, records: int, payload_bytes: int, topic_partitions: Iterable[tuple[str, int]]) -> None:
        """A produce request answered 200 or 409: ``records``, ``payload_bytes`` and
        ``topic_partitions`` of its committed groups."""
        tps = set(topic_partitions)
        with self._lock:
            self._http.accepted_produce_requests += 1
            self._http.records_accepted += records
            self._http.request_payload_bytes_accepted += payload_bytes
            self._topic_partitions |= tps
            self._topics.update(t for t, _ in tps)

    def produce_rejected(self, *, backpressure: bool = False) -> None:
        """A produce request refused as a whole (400, 413, 503); ``backpressure`` for a 503 of
        :class:`~broker_lite.batcher.BackPressure`."""
        with self._lock:
            self._http.rejected_produce_requests += 1
            self._http.backpressure_rejected_count += backpressure

    def malformed_request(self) -> None:
        """A request refused for its body (400: not JSON, wrong shape, no Content-Length), on any
        route; a produce request also counts in :meth:`produce_rejected`."""
        with self._lock:
            self._http.malformed_request_count += 1

    def consume_done(self, stats: object) -> None:
        """A consume request answered with its results (the consume service's observer, set by
        :meth:`attach`). ``stats`` is a ``broker_lite.consume.ConsumeStats``: ``records``,
        ``bytes``, ``partitions``, ``errors`` (failed partitions: the request counts as an
        error), ``cache_hits``, ``cache_misses``, ``long_poll`` (``"hit"``, ``"timeout"`` or
        None), ``peak_bytes`` (the most record bytes it held at once). Its S3 GETs are the broker's
        ObjectStore counts (:meth:`_http_state`)."""
        long_poll = getattr(stats, "long_poll", None)
        with self._lock:
            h = self._http
            h.consume_requests_total += 1
            h.consume_request_errors_total += getattr(stats, "errors", 0) > 0
            h.consume_records_returned_total += getattr(stats, "records", 0)
            h.consume_bytes_returned_total += getattr(stats, "bytes", 0)
            h.consume_partition_results_total += getattr(stats, "partitions", 0)
            h.consume_blob_cache_hits_total += getattr(stats, "cache_hits", 0)
            h.consume_blob_cache_misses_total += getattr(stats, "cache_misses", 0)
            h.consume_long_poll_hits_total += long_poll == "hit"
            h.consume_long_poll_timeouts_total += long_poll == "timeout"
        peak_bytes = getattr(stats, "peak_bytes", None)
        if peak_bytes is not None:
            self._consume_peak_bytes.observe(peak_bytes)

    def consume_failed(self, *, backpressure: bool = False) -> None:
        """A consume request refused as a whole (400, 503...); ``backpressure`` for a 503 of
        ``ConsumeBusy``."""
        with self._lock:
            self._http.consume_requests_total += 1
            self._http.consume_request_errors_total += 1
            self._http.consume_backpressure_rejections_total += backpressure

    def long_poll_waiters(self) -> int:
        """Consume requests long-polling now (the consume service's ``waiting``)."""
        consume = self._consume
        return consume.waiting if consume is not None else 0

    def _observe_batch(self, name: str, value: float) -> None:
        histogram = self._batch_histograms.get(name)
        if histogram is not None:
            histogram.observe(value)

    # --- reading ---------------------------------------------------------------------------------

    def snapshot(self) -> dict:
        """The body of ``GET /metrics``: ``broker``, ``http``, ``batching``, ``writer``, ``oxia``, ``s3``."""
        http, statuses, topics, tps = self._http_state()
        return {
            "broker": {
                "broker_id": self.broker_id,
                "host": self.host,
                "port": self.port,
                "started_at_ms": self.started_at_ms,
                "roles": list(self.roles),
                "batch_settings": {
                    "max_bytes": self.config.batch_max_bytes,
                    "max_delay_ms": self.config.batch_max_delay_ms,
                    "max_buffer_bytes": self.config.batch_max_buffer_bytes,
                },
            },
            "http": {
                **{k: v for k, v in vars(http).items() if k != "inflight_requests"},
                "response_status_counts": {str(s): n for s, n in sorted(statuses.items())},
                "distinct_topics_seen": topics,
                "distinct_topic_partitions_seen": tps,
                "consume_long_poll_waiters_current": self.long_poll_waiters(),
                "inflight_requests": http.inflight_requests,
            },
            "batching": self._batching(),
            "writer": self.writer_counts(),
            "oxia": self._oxia(),
            "s3": self._s3(),
        }

    def prometheus(self) -> bytes:
        """The body of ``GET /metrics/prometheus``, of type :data:`PROMETHEUS_CONTENT_TYPE`."""
        return generate_latest(self.registry)

    def bucket_usage(self) -> BucketUsage:
        return self._scanner.usage if self._scanner is not None else BucketUsage()

    def bucket_usage_failures(self) -> int:
        return self._scanner.failures if self._scanner is not None else 0

    def s3_operations(self) -> collections.Counter[str]:
        """ObjectStore counts by operation and ``<op>_bytes``, over the attached stores."""
        with self._lock:
            stores = list(self._object_stores)
        return _counts(stores)

    def oxia_operations(self) -> collections.Counter[str]:
        """Coordination counts: per operation, ``read_rpc``, ``write_rpc``, ``cas_conflict``."""
        with self._lock:
            coordinations = list(self._coordinations)
        return _counts(coordinations)

    def _http_state(self) -> tuple[_Http, collections.Counter[int], int, int]:
        """A copy of the HTTP counters. The seed's consume GET counters are the S3 GETs of the
        broker's object store: consumes are what reads there (the writer reads only to finish
        someone's pending append), and a request's own GETs are not counted apart."""
        s3 = self.s3_operations()
        with self._lock:
            http = _Http(**vars(self._http))
            statuses, topics, tps = collections.Counter(self._statuses), len(self._topics), len(self._topic_partitions)
        http.consume_blob_cache_full_object_gets_total = s3["get"]
        http.consume_blob_cache_range_gets_total = s3["range_get"]
        return http, statuses, topics, tps

    def writer_counts(self) -> dict[str, int]:
        """What went wrong in the attached writers without changing an answer, summed:
        ``failed_after_reserve`` (rounds whose reserved appends were not finished, in doubt or
        left to the next writer, docs/protocol.md section 4.6) and ``producers_evicted`` (Kafka
        producers forgotten past 128 per partition, section 9.4)."""
        with self._lock:
            writers = list(self._writers)
        return {key: sum(w.stats[key] for w in writers) for key in WRITER_COUNTERS.values()}

    def _batching(self) -> dict:
        b = self._batcher
        stats = dict(b.stats) if b is not None else {}
        flushes = stats.get("flushes", 0)
        return {
            "enqueued_requests_total": stats.get("requests", 0),
            "enqueued_bytes_total": stats.get("enqueued_bytes", 0),
            "flushes_total": flushes,
            "flush_failures_total": stats.get("flush_failures", 0),
            "records_flushed_total": stats.get("flushed_records", 0),
            "bytes_flushed_total": stats.get("flushed_bytes", 0),
            "mean_flush_duration_ms": 1000 * stats.get("flush_seconds", 0.0) / flushes if flushes else None,
            "last_flush_duration_ms": 1000 * b.last_flush_s if b is not None and b.last_flush_s is not None else None,
            "backpressure_rejections_total": stats.get("backpressure_rejections", 0),
            "buffered_bytes": b.buffered_bytes if b is not None else 0,
            "queued_bytes": b.queued_bytes if b is not None else 0,
            "inflight_flush_bytes": b.inflight_bytes if b is not None else 0,
            "waiting_requests": b.waiting_requests if b is not None else 0,
            "pending_batches": b.pending_batches if b is not None else 0,
            "sealed_batches": b.sealed_batches if b is not None else 0,
            "inflight_flushes": b.inflight_flushes if b is not None else 0,
            "max_inflight_flushes": b.max_inflight if b is not None else 0,
            "oldest_pending_batch_age_ms": 1000 * b.oldest_pending_age_s if b is not None else 0.0,
        }

    def _oxia(self) -> dict:
        counts = self.oxia_operations()
        return {
            "operations": {op: n for op, n in sorted(counts.items()) if op not in OXIA_OTHER},
            "read_rpcs": counts["read_rpc"],
            "write_rpcs": counts["write_rpc"],
            "cas_conflicts": counts["cas_conflict"],
            **_timing_totals(c.timings for c in self._clients(self._coordinations)),
        }

    def _clients(self, which: list) -> list:
        with self._lock:
            return list(which)

    def _s3(self) -> dict:
        counts = self.s3_operations()
        operations = {op: n for op, n in sorted(counts.items()) if not op.endswith("_bytes")}
        usage = self.bucket_usage()
        totals = _timing_totals(s.timings for s in self._clients(self._object_stores))
        return {
            "operations": operations,
            "put_requests": counts["put"],
            "put_bytes": counts["put_bytes"],
            "get_bytes": counts["get_bytes"],
            **totals,
            "put_failures": sum(totals["failures"].get("put", {}).values()),
            "billing": {
                "pricing_model": self.pricing.pricing_model,
                "storage_usd_per_gb_month": self.pricing.storage_usd_per_gb_month,
                "put_usd_per_1000": self.pricing.put_usd_per_1000,
                "get_usd_per_1000": self.pricing.get_usd_per_1000,
                "bucket_usage_refresh_interval_seconds": self.bucket_usage_interval_s,
                "bucket_usage_last_refreshed_at_ms": usage.refreshed_at_ms,
                "bucket_usage_scan_success": usage.success,
                "bucket_usage_scan_error": usage.error,
                "bucket_object_count": usage.objects,
                "bucket_stored_bytes": usage.stored_bytes,
                "bucket_stored_gb": usage.stored_bytes / GB,
                "estimated_request_cost_usd": self.pricing.request_cost_usd(operations),
                "estimated_monthly_storage_cost_usd": self.pricing.monthly_storage_cost_usd(usage.stored_bytes),
            },
        }

    def _batcher_reader(self, attribute: str) -> Callable[[], float]:
        def read() -> float:
            b = self._batcher
            return getattr(b, attribute) if b is not None else 0
        return read


def _timing_totals(timings) -> dict:
    """The snapshot's latency totals and failures of some clients' ``timings``:
    ``latency_totals`` (per operation ``count`` and ``seconds``), ``failures`` (per operation, per
    error type)."""
    _, ops, failures = merged(timings)
    by_op: dict[str, dict[str, int]] = {}
    for (op, error_type), n in sorted(failures.items()):
        by_op.setdefault(op, {})[error_type] = n
    return {
        "latency_totals": {op: {"count": sum(c[:-1]), "seconds": round(c[-1], 6)} for op, c in sorted(ops.items())},
        "failures": by_op,
    }


#: Group-commit counters: family name -> (help, ``Batcher.stats`` key).
_BATCH_COUNTERS = {
    "batch_append_payload_bytes_enqueued_total": ("Record bytes admitted into the group commit", "enqueued_bytes"),
    "batch_requests_enqueued_total": ("Produce requests admitted into the group commit", "requests"),
    "batch_backpressure_rejections_total": ("Produce requests the group commit refused (buffer full)",
                                            "backpressure_rejections"),
    "batch_flushes_total": ("Batch flushes (shared appends), failed ones included", "flushes"),
    "batch_flush_failures_total": ("Batch flushes that failed in whole or in part", "flush_failures"),
    "batch_flushed_records_total": ("Records of batches flushed without error", "flushed_records"),
    "batch_flushed_payload_bytes_total": ("Record bytes of batches flushed without error", "flushed_bytes"),
}

#: Writer counters: family name -> ``LogWriter.stats`` key (:meth:`BrokerMetrics.writer_counts`).
WRITER_COUNTERS = {
    "appends_failed_after_reserve_total": "failed_after_reserve",
    "producers_evicted_total": "producers_evicted",
}
_WRITER_HELP = {
    "failed_after_reserve": "Append rounds whose reservation landed but that were not finished "
                            "(answered in doubt or failed; the next writer finishes them)",
    "producers_evicted": "Producers forgotten past the 128 remembered per partition (a resend of their "
                         "last batch is then written again)",
}


class _Collector:
    """Families whose numbers live elsewhere, read at scrape time."""

    def __init__(self, metrics: BrokerMetrics):
        self.m = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.m
        yield InfoMetricFamily(PREFIX + "broker", "This broker", value={
            "broker_id": m.broker_id, "host": m.host, "port": str(m.port), "roles": ",".join(m.roles)})
        yield GaugeMetricFamily(PREFIX + "broker_start_time_seconds", "When this broker started",
                                value=m.started_at_ms / 1000)
        yield from self._http()
        yield from self._batching()
        for name, key in WRITER_COUNTERS.items():
            yield _counter(name, _WRITER_HELP[key], m.writer_counts()[key])
        with m._lock:
            coordinations, stores = list(m._coordinations), list(m._object_stores)
        yield from client_families(coordinations, stores)
        yield from self._s3()
        yield from self._group_lag()

    def _group_lag(self) -> Iterator[Metric]:
        scanner = self.m._lag_scanner
        lag = GaugeMetricFamily(PREFIX + "consumer_group_lag_records", "Records a consumer group has not read yet, per "
                                "topic (last scan; aggregate across brokers with max)", labels=["group", "topic"])
        for (group, topic), n in sorted((scanner.lags if scanner is not None else {}).items()):
            lag.add_metric([group, topic], n)
        yield lag
        yield GaugeMetricFamily(PREFIX + "consumer_group_lag_scan_timestamp_seconds",
                                "When the consumer group lags were last scanned successfully (0: never)",
                                value=(scanner.refreshed_at or 0.0) if scanner is not None else 0.0)
        yield _counter("consumer_group_lag_scan_failures_total", "Consumer group lag scans that failed",
                       scanner.failures if scanner is not None else 0)

    def _http(self) -> Iterator[Metric]:
        http, statuses, topics, tps = self.m._http_state()
        yield GaugeMetricFamily(PREFIX + "inflight_requests", "HTTP requests being handled",
                                value=http.inflight_requests)
        responses = CounterMetricFamily(PREFIX + "http_responses_total", "HTTP responses by status", labels=["status"])
        for status, n in sorted(statuses.items()):
            responses.add_metric([str(status)], n)
        yield responses
        yield _counter("malformed_requests_total", "Requests refused for a malformed body",
                       http.malformed_request_count)
        produce = CounterMetricFamily(PREFIX + "produce_requests_total", "Produce requests by outcome (accepted: "
                                      "200 or 409; rejected: refused as a whole)", labels=["outcome"])
        produce.add_metric(["accepted"], http.accepted_produce_requests)
        produce.add_metric(["rejected"], http.rejected_produce_requests)
        yield produce
        yield _counter("produce_backpressure_rejections_total", "Produce requests refused for backpressure (503)",
                       http.backpressure_rejected_count)
        yield _counter("produce_records_accepted_total", "Records committed by produce requests", http.records_accepted)
        yield _counter("produce_payload_bytes_accepted_total", "Record bytes committed by produce requests",
                       http.request_payload_bytes_accepted)
        yield GaugeMetricFamily(PREFIX + "distinct_topics_seen", "Topics produced to", value=topics)
        yield GaugeMetricFamily(PREFIX + "distinct_topic_partitions_seen", "Topic-partitions produced to", value=tps)
        yield GaugeMetricFamily(PREFIX + "consume_long_poll_waiters_current", "Consume requests waiting for records",
                                value=self.m.long_poll_waiters())
        for name, documentation in _HTTP_COUNTERS.items():
            yield _counter(name, documentation, getattr(http, name))

    def _batching(self) -> Iterator[Metric]:
        b = self.m._batcher
        stats = dict(b.stats) if b is not None else {}
        for name, (documentation, key) in _BATCH_COUNTERS.items():
            yield _counter(name, documentation, stats.get(key, 0))

    def _s3(self) -> Iterator[Metric]:
        m = self.m
        counts = m.s3_operations()
        operations = {op: n for op, n in sorted(counts.items()) if not op.endswith("_bytes")}
        yield _counter("s3_estimated_request_cost_usd_total", f"Estimated S3 request cost ({m.pricing.pricing_model})",
                       m.pricing.request_cost_usd(operations))
        usage = m.bucket_usage()
        yield GaugeMetricFamily(PREFIX + "s3_bucket_stored_bytes", "Bytes under the root prefix (last scan)",
                                value=usage.stored_bytes)
        yield GaugeMetricFamily(PREFIX + "s3_bucket_stored_gb", "GB (2^30 bytes) under the root prefix (last scan)",
                                value=usage.stored_bytes / GB)
        yield GaugeMetricFamily(PREFIX + "s3_bucket_objects", "Objects under the root prefix (last scan)",
                                value=usage.objects)
        yield GaugeMetricFamily(PREFIX + "s3_estimated_monthly_storage_cost_usd",
                                f"Estimated monthly storage cost ({m.pricing.pricing_model})",
                                value=m.pricing.monthly_storage_cost_usd(usage.stored_bytes))
        yield GaugeMetricFamily(PREFIX + "s3_bucket_usage_refresh_timestamp_seconds",
                                "When the bucket was last scanned successfully (0: never)",
                                value=(usage.refreshed_at_ms or 0) / 1000)
        yield _counter("s3_bucket_usage_refresh_failures_total", "Bucket scans that failed", m.bucket_usage_failures())


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, documentation, value=value)
