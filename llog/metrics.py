"""Metrics of the core: per-operation latency and failures of the Oxia and S3 clients, their
Prometheus families, and the run figures that one-shot jobs leave for Prometheus.

The clients record into :class:`OpTimings`, plain bucket counts under a lock (about a
microsecond an operation, against the hundreds of microseconds of the cheapest Oxia RPC), not
into ``prometheus_client`` objects: a process may hold several clients (a broker's writer and
reader), and whoever exposes metrics sums them at scrape time (:func:`client_families`), in its
own registry. Nothing here registers anything globally, and ``prometheus_client`` is imported
only by the functions that build families (it takes 25-45 ms to import, which every process that
makes a client, a stream's planner included, would pay).

One-shot jobs (the compaction job, ``llog gc``) end before Prometheus could scrape them: they
write their run's figures in the node_exporter textfile format (:func:`write_run_metrics`),
atomically, where a node_exporter (``llog observe up`` starts one) serves them. A failed run
keeps the last success's timestamp from the file it replaces, so that an alert on
``time() - leaderless_log_<job>_last_success_timestamp_seconds`` fires on runs that keep failing
as well as on runs that stopped.
"""

from __future__ import annotations

import bisect
import collections
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

#: Every family's prefix (the reference broker's).
PREFIX = "leaderless_log_"

#: Latency buckets (upper bounds), 0.5 ms .. 10 s.
SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

#: Errors that are outcomes, not failures: a conditional write that lost (counted apart as a CAS
#: conflict) and a claim someone else holds.
NOT_FAILURES = frozenset({"VersionConflict", "ClaimHeld"})


class OpTimings:
    """Per operation name: a latency histogram as plain counts, and failures by error type.
    Thread-safe."""

    def __init__(self, buckets: tuple[float, ...] = SECONDS_BUCKETS):
        self.buckets = buckets
        self._lock = threading.Lock()
        #: op -> [count per bucket..., count above the last bucket, sum of seconds]
        self._ops: dict[str, list] = {}
        self._failures: collections.Counter[tuple[str, str]] = collections.Counter()

    def observe(self, op: str, seconds: float, error: BaseException | None = None) -> None:
        """One ``op`` that took ``seconds``; ``error``: what it raised, if it did (a failure
        unless its type is one of :data:`NOT_FAILURES`)."""
        i = bisect.bisect_left(self.buckets, seconds)  # the first bound >= seconds: Prometheus' "le"
        with self._lock:
            counts = self._ops.get(op)
            if counts is None:
                counts = self._ops[op] = [0] * (len(self.buckets) + 1) + [0.0]
            counts[i] += 1
            counts[-1] += seconds
            if error is not None and type(error).__name__ not in NOT_FAILURES:
                self._failures[(op, type(error).__name__)] += 1

    def snapshot(self) -> tuple[dict[str, list], dict[tuple[str, str], int]]:
        """Copies: op -> bucket counts and sum (as kept), and (op, error type) -> failures."""
        with self._lock:
            return {op: list(c) for op, c in self._ops.items()}, dict(self._failures)


def merged(timings: Iterable[OpTimings]) -> tuple[tuple[float, ...], dict[str, list], dict[tuple[str, str], int]]:
    """The sum of several clients' timings (they share :data:`SECONDS_BUCKETS`)."""
    ops: dict[str, list] = {}
    failures: collections.Counter[tuple[str, str]] = collections.Counter()
    buckets = SECONDS_BUCKETS
    for t in timings:
        buckets = t.buckets
        counts, failed = t.snapshot()
        for op, c in counts.items():
            into = ops.setdefault(op, [0] * len(c))
            for i, n in enumerate(c):
                into[i] += n
        failures.update(failed)
    return buckets, ops, dict(failures)


def histogram_family(name: str, documentation: str, timings: Iterable[OpTimings]) -> HistogramMetricFamily:
    """A histogram family labelled by ``operation`` from ``timings``, summed."""
    from prometheus_client.core import HistogramMetricFamily

    buckets, ops, _ = merged(timings)
    family = HistogramMetricFamily(name, documentation, labels=["operation"])
    for op, counts in sorted(ops.items()):
        cumulative, running = [], 0
        for bound, n in zip((*map(str, buckets), "+Inf"), counts[:-1]):
            running += n
            cumulative.append((bound, running))
        family.add_metric([op], cumulative, sum_value=counts[-1])
    return family


def failures_family(name: str, documentation: str, timings: Iterable[OpTimings]) -> CounterMetricFamily:
    """A counter family labelled by ``operation`` and ``error_type`` from ``timings``, summed."""
    from prometheus_client.core import CounterMetricFamily

    _, _, failures = merged(timings)
    family = CounterMetricFamily(name, documentation, labels=["operation", "error_type"])
    for (op, error_type), n in sorted(failures.items()):
        family.add_metric([op, error_type], n)
    return family


def _counts(sources: Iterable[object]) -> collections.Counter[str]:
    """The sum of the ``stats`` counters of ``sources`` (updated by other threads: ``dict()`` of a
    Counter copies it in one step under the GIL)."""
    total: collections.Counter[str] = collections.Counter()
    for source in sources:
        total.update(dict(source.stats))
    return total


#: Coordination.stats keys that are not operations (the others are: get, put, delete, ...).
OXIA_OTHER = frozenset({"read_rpc", "write_rpc", "cas_conflict"})


def client_families(coordinations: Iterable[object], object_stores: Iterable[object]) -> Iterator[Metric]:
    """The Oxia and S3 families of a process's clients (``llog.coordination.Coordination``,
    ``llog.objects.ObjectStore``): operation counts, latency histograms and failures, summed."""
    from prometheus_client.core import CounterMetricFamily

    coordinations, object_stores = list(coordinations), list(object_stores)
    counts = _counts(coordinations)
    operations = CounterMetricFamily(PREFIX + "oxia_operations_total", "Oxia operations (keys for batched puts)",
                                     labels=["operation"])
    for op, n in sorted(counts.items()):
        if op not in OXIA_OTHER:
            operations.add_metric([op], n)
    yield operations
    rpcs = CounterMetricFamily(PREFIX + "oxia_rpcs_total", "Oxia Read and Write RPCs (each batching keys)",
                               labels=["kind"])
    rpcs.add_metric(["read"], counts["read_rpc"])
    rpcs.add_metric(["write"], counts["write_rpc"])
    yield rpcs
    yield CounterMetricFamily(PREFIX + "oxia_cas_conflicts_total",
                              "Conditional Oxia writes that lost to another writer", value=counts["cas_conflict"])
    oxia_timings = [c.timings for c in coordinations]
    yield histogram_family(PREFIX + "oxia_operation_duration_seconds",
                           "Duration of Oxia operations as callers see them (retries included)", oxia_timings)
    yield failures_family(PREFIX + "oxia_operation_failures_total",
                          "Oxia operations that raised, by error type (lost CAS and held claims left out)",
                          oxia_timings)

    s3 = _counts(object_stores)
    family = CounterMetricFamily(PREFIX + "s3_operations_total", "S3 requests by operation", labels=["operation"])
    for op, n in sorted(s3.items()):
        if not op.endswith("_bytes"):
            family.add_metric([op], n)
    yield family
    yield CounterMetricFamily(PREFIX + "s3_put_requests_total", "S3 PUT requests", value=s3["put"])
    yield CounterMetricFamily(PREFIX + "s3_put_uploaded_bytes_total", "Bytes uploaded by S3 PUT requests",
                              value=s3["put_bytes"])
    yield CounterMetricFamily(PREFIX + "s3_get_downloaded_bytes_total", "Bytes downloaded by S3 GET requests",
                              value=s3["get_bytes"])
    s3_timings = [s.timings for s in object_stores]
    yield histogram_family(PREFIX + "s3_operation_duration_seconds",
                           "Duration of S3 operations as callers see them (retries included)", s3_timings)
    failures = failures_family(PREFIX + "s3_operation_failures_total", "S3 operations that raised, by error type",
                               s3_timings)
    yield failures
    put_failures = sum(s.value for s in failures.samples if s.labels["operation"] == "put")
    yield CounterMetricFamily(PREFIX + "s3_put_failures_total", "S3 PUTs that failed (after their retries)",
                              value=put_failures)


class ClientCollector:
    """A collector of :func:`client_families` over clients known when it is made."""

    def __init__(self, coordinations: Iterable[object] = (), object_stores: Iterable[object] = ()):
        self.coordinations, self.object_stores = list(coordinations), list(object_stores)

    def collect(self) -> Iterator[Metric]:
        return client_families(self.coordinations, self.object_stores)


# --- one-shot jobs' textfiles ---------------------------------------------------------------------

def metrics_file(option: str | None, textfile_dir: str | None, job: str) -> Path | None:
    """Where ``job`` writes its run's metrics: the ``--metrics-file`` ``option``, else
    ``<LLOG_METRICS_TEXTFILE_DIR>/<job>.prom``, else nowhere (None). node_exporter reads only
    files ending ``.prom``: ValueError for any other name."""
    if option:
        path = Path(option)
    elif textfile_dir:
        path = Path(textfile_dir) / f"{job}.prom"
    else:
        return None
    if path.suffix != ".prom":
        raise ValueError(f"metrics file {path} must end in .prom (node_exporter's textfile collector reads "
                         "only those)")
    return path


def _previous(path: Path, name: str, labels: Mapping[str, str] | None = None) -> float | None:
    """The value of sample ``name`` (with ``labels``) in the textfile at ``path``, if any."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = path.read_text()
    except OSError:
        return None
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and (labels is None or sample.labels == dict(labels)):
                    return sample.value
    except ValueError:  # a damaged file starts the figures afresh
        return None
    return None


def write_run_metrics(path: Path, job: str, *, success: bool, duration_s: float,
                      figures: Mapping[str, tuple[str, float]], error_type: str | None = None,
                      now: float | None = None) -> None:
    """Write one run's metrics of ``job`` (``compaction``, ``gc``) to ``path``, atomically (a
    temporary file renamed over it), as ``leaderless_log_<job>_...``:

    - ``last_run_timestamp_seconds``, ``last_run_success`` (1/0), ``last_run_duration_seconds``;
    - ``last_success_timestamp_seconds``: this run's end if it succeeded, else the previous file's
      value (0 if there never was one);
    - ``runs_total{outcome="success"|"failure"}``: carried over from the previous file and
      counted up (a counter that survives the job's processes);
    - ``last_run_failure_info{error_type}``: 1 for the error of a failed run;
    - ``last_run_<name>`` for each of ``figures`` (name -> (help, value)).
    """
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.exposition import write_to_textfile

    now = time.time() if now is None else now
    base = f"{PREFIX}{job}_"
    last_success = now if success else (_previous(path, base + "last_success_timestamp_seconds") or 0.0)
    runs = {outcome: _previous(path, base + "runs_total", {"outcome": outcome}) or 0.0
            for outcome in ("success", "failure")}
    runs["success" if success else "failure"] += 1

    registry = CollectorRegistry()

    class _Run:
        def collect(self) -> Iterator[Metric]:
            yield GaugeMetricFamily(base + "last_run_timestamp_seconds", f"When the last {job} run ended", value=now)
            yield GaugeMetricFamily(base + "last_success_timestamp_seconds",
                                    f"When the last successful {job} run ended (0: none yet)", value=last_success)
            yield GaugeMetricFamily(base + "last_run_success", f"1 if the last {job} run succeeded, else 0",
                                    value=1.0 if success else 0.0)
            yield GaugeMetricFamily(base + "last_run_duration_seconds", f"Duration of the last {job} run",
                                    value=duration_s)
            total = CounterMetricFamily(base + "runs", f"{job} runs by outcome", labels=["outcome"])
            for outcome, n in runs.items():
                total.add_metric([outcome], n)
            yield total
            info = GaugeMetricFamily(base + "last_run_failure_info", f"The error of the last {job} run, if it failed",
                                     labels=["error_type"])
            if not success:
                info.add_metric([error_type or "unknown"], 1.0)
            yield info
            for name, (documentation, value) in figures.items():
                yield GaugeMetricFamily(base + "last_run_" + name, documentation, value=float(value))

    registry.register(_Run())
    path.parent.mkdir(parents=True, exist_ok=True)
    write_to_textfile(str(path), registry)  # a temporary file beside it, then os.replace

