"""``python -m bench latency``: how long a user waits from a produce to the record being visible.

A broker process (``python -m broker_lite``) takes JSON events over HTTP at a steady rate
(``BENCH_LATENCY_RATE`` records/s, default 10; ``BENCH_LATENCY_RECORDS`` of them per phase,
default 300; round robin over ``BENCH_LATENCY_PARTITIONS`` partitions, default 3), each carrying the wall-clock time its produce request was sent. Two
phases, one after the other, each after a few seconds of untimed warm-up records:

- ``query``: a running ``spark.readStream.format("llog")`` query (the default trigger: a
  micro-batch as soon as the last one ended) whose ``foreachBatch`` collects the batch on the
  driver; a record is seen when its batch's rows reach the driver. p50 and p99.
- ``delta``: a running llog -> Delta job (:mod:`jobs.llog_to_delta`, ``processing-time=0
  seconds``) with the demo's quality gate (``conf/expectations/events.json``) and a quarantine;
  a record is seen when a thread watching the table's ``_delta_log`` (every 10 ms, no Spark)
  first finds the commit that adds the file holding it. p50 and p95.

Every phase also reports where a micro-batch's time went: the medians of Spark's
``durationMs`` per batch that read records (``latestOffset``, ``queryPlanning``, ``addBatch``
(the read and the ``foreachBatch`` function), ``walCommit``, ``commitOffsets``,
``triggerExecution``), and the records per batch. The produce requests' times to their answers (``produce_ack``) are the broker's part of the
wait. A record seen twice or never fails the bench.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx

from bench.report import emit, env_int, progress
from llog.config import Config
from llog.topics import create_topic
from llog.writer import LogWriter
from llog_tools import progress as llog_progress
from loadtest.brokers import Broker

SUITE = Path(__file__).resolve().parents[1] / "conf" / "expectations" / "events.json"
TOPIC = "latency"
PARTITIONS = int(os.environ.get("BENCH_LATENCY_PARTITIONS", 3))
WARMUP_S = 5.0
#: How long after the last produce a phase waits for the records still on their way; for the
#: warm-up ones (a query's first batches start Python workers) and for the query to start, longer.
DRAIN_TIMEOUT_S, START_TIMEOUT_S = 60.0, 300.0
#: ``durationMs`` parts reported per phase (Spark's names).
PARTS = ("latestOffset", "queryPlanning", "getBatch", "addBatch", "walCommit", "commitOffsets", "triggerExecution")


class Producer(threading.Thread):
    """Produces ``count`` events at ``rate``/s through the broker at ``url``; each value is
    ``{"seq", "ts", "phase", "sent"}`` (``sent``: ``time.time()`` when its request went out)."""

    def __init__(self, url: str, phase: str, count: int, rate: float, first_seq: int = 0):
        super().__init__(name=f"latency-producer-{phase}", daemon=True)
        self.url, self.phase, self.count, self.rate, self.first_seq = url, phase, count, rate, first_seq
        self.error: BaseException | None = None
        self.ack_s: list[float] = []  # each request's time to its answer: the broker's part

    def run(self) -> None:
        try:
            with httpx.Client(timeout=10) as client:
                begin = time.monotonic()
                for i in range(self.count):
                    delay = begin + i / self.rate - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    seq = self.first_seq + i
                    sent = time.time()
                    value = json.dumps({"seq": seq, "ts": "2026-01-01 00:00:00", "phase": self.phase, "sent": sent})
                    body = {"topic_partitions": [{"topic": TOPIC, "partition": seq % PARTITIONS, "records": [value]}]}
                    response = client.post(f"{self.url}/produce", json=body)
                    self.ack_s.append(time.time() - sent)
                    if response.status_code != 200 or response.json().get("error_count"):
                        raise RuntimeError(f"produce {seq}: HTTP {response.status_code} {response.text[:300]}")
        except BaseException as e:  # noqa: BLE001 - reported by the phase
            self.error = e


class Seen:
    """When each event of a phase was first seen (by ``seq``), and duplicates."""

    def __init__(self, phase: str):
        self.phase = phase
        self.latency_s: dict[int, float] = {}
        self.duplicates = 0
        self._lock = threading.Lock()

    def add(self, values, at: float) -> None:
        with self._lock:
            for value in values:
                event = json.loads(value)
                if event.get("phase") != self.phase:
                    continue
                if event["seq"] in self.latency_s:
                    self.duplicates += 1
                else:
                    self.latency_s[event["seq"]] = at - event["sent"]

    def count(self, first: int, count: int) -> int:
        with self._lock:
            return sum(1 for s in self.latency_s if first <= s < first + count)


def _produce_and_wait(url: str, phase: str, seen: Seen, records: int, rate: float, query
                      ) -> tuple[list[float], list[float]]:
    """Once the query has planned its first batch (it starts at ``latest``), warm-up events
    (untimed), then ``records`` timed ones; their latencies once all are seen, and the timed
    produce requests' times to their answers."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while query.lastProgress is None:
        if query.exception() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"latency bench ({phase}): the query did not start: {query.exception()}")
        time.sleep(0.05)
    warmup = max(1, int(WARMUP_S * rate))
    for name, first, count in (("warm-up", 0, warmup), ("timed", warmup, records)):
        producer = Producer(url, phase, count, rate, first)
        with llog_progress.task(f"latency {phase}: {count} {name} records at {rate:g}/s"):
            producer.start()
            producer.join(count / rate + 60)
        if producer.error is not None:
            raise RuntimeError(f"latency bench ({phase}): producing failed: {producer.error}") from producer.error
        wait_s = START_TIMEOUT_S if name == "warm-up" else DRAIN_TIMEOUT_S
        deadline = time.monotonic() + wait_s
        while seen.count(first, count) < count:
            if query.exception() is not None:
                raise RuntimeError(f"latency bench ({phase}): the query failed: {query.exception()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"latency bench ({phase}): {seen.count(first, count)} of {count} {name} records "
                                   f"seen {wait_s:g} s after the last produce")
            time.sleep(0.05)
    if seen.duplicates:
        raise RuntimeError(f"latency bench ({phase}): {seen.duplicates} record(s) seen more than once")
    return [seen.latency_s[s] for s in range(warmup, warmup + records)], producer.ack_s


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def _batches(query, since_batch: int) -> dict:
    """Medians of the ``durationMs`` parts (ms) and records of the batches after ``since_batch``
    that read records."""
    batches = [p for p in query.recentProgress if p["numInputRows"] and p["batchId"] > since_batch]
    out = {"batches": len(batches),
           "records_per_batch_median": statistics.median(p["numInputRows"] for p in batches) if batches else None}
    for part in PARTS:
        values = [p["durationMs"][part] for p in batches if part in p["durationMs"]]
        if values:
            out[f"{part}_ms_median"] = statistics.median(values)
    return out


def _summary(phase: str, latencies: tuple[list[float], list[float]], quantiles: tuple[float, ...]) -> dict:
    seen, acks = latencies
    return {f"{phase}_p{round(q * 100)}_ms": round(_quantile(seen, q) * 1000, 1) for q in quantiles} | {
        f"{phase}_max_ms": round(max(seen) * 1000, 1),
        f"{phase}_produce_ack_p50_ms": round(_quantile(acks, 0.5) * 1000, 1),
        f"{phase}_produce_ack_p99_ms": round(_quantile(acks, 0.99) * 1000, 1)}


def _query_phase(spark, config: Config, url: str, records: int, rate: float, tmp: Path) -> dict:
    from jobs.llog_to_delta import Job

    seen = Seen("query")
    options = Job(table="unused", checkpoint="unused", topics=(TOPIC,), starting_offsets="latest").source_options(config)

    def collect(batch, batch_id: int) -> None:
        rows = batch.select("value").collect()
        seen.add([bytes(r[0]) for r in rows], time.time())

    query = (spark.readStream.format("llog").options(**options).load().writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(tmp / "query-ck")).start())
    try:
        latencies = _produce_and_wait(url, "query", seen, records, rate, query)
        batches = _batches(query, 0)
    finally:
        query.stop()
    return {**_summary("query", latencies, (0.5, 0.9, 0.99)), "query_batch": batches}


class DeltaWatcher(threading.Thread):
    """Watches a Delta table's ``_delta_log``: the events in each new commit's added files are
    seen when the commit file is first found (polled every ``interval_s``)."""

    def __init__(self, table: Path, seen: Seen, interval_s: float = 0.01):
        super().__init__(name="latency-delta-watcher", daemon=True)
        self.table, self.seen, self.interval_s = table, seen, interval_s
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        import pyarrow.parquet as pq

        log, version = self.table / "_delta_log", 0
        try:
            while not self.stopping.is_set():
                commit = log / f"{version:020d}.json"
                if not commit.exists():
                    time.sleep(self.interval_s)
                    continue
                at = time.time()
                for line in commit.read_text().splitlines():
                    add = json.loads(line).get("add")
                    if add:
                        values = pq.read_table(self.table / add["path"], columns=["value"]).column("value")
                        self.seen.add(values.to_pylist(), at)
                version += 1
        except BaseException as e:  # noqa: BLE001 - reported by the phase
            self.error = e


def _delta_phase(spark, config: Config, url: str, records: int, rate: float, tmp: Path) -> dict:
    from jobs.llog_to_delta import Job, start

    seen = Seen("delta")
    work = tmp / "delta"
    job = Job(table=str(work / "table"), checkpoint=str(work / "ck"), topics=(TOPIC,), starting_offsets="latest",
              trigger="processing-time=0 seconds", expectations=str(SUITE), quarantine=str(work / "quarantine"))
    watcher = DeltaWatcher(work / "table", seen)
    watcher.start()
    query = start(spark, job, config)
    try:
        latencies = _produce_and_wait(url, "delta", seen, records, rate, query)
        batches = _batches(query, 0)
    finally:
        query.stop()
        watcher.stopping.set()
        watcher.join(10)
    if watcher.error is not None:
        raise RuntimeError(f"latency bench (delta): watching the table failed: {watcher.error}") from watcher.error
    return {**_summary("delta", latencies, (0.5, 0.95, 0.99)), "delta_batch": batches}


def run(config: Config) -> dict:
    from jobs.local_spark import local_spark

    records = env_int("BENCH_LATENCY_RECORDS", 300)
    rate = float(env_int("BENCH_LATENCY_RATE", 10))
    config = config.replace(root_prefix=f"bench-{uuid.uuid4().hex[:8]}")
    with LogWriter(config) as writer:
        create_topic(writer.coordination, config.root_prefix, TOPIC, PARTITIONS)
    with tempfile.TemporaryDirectory(prefix="llog-bench-latency-") as tmp:
        broker = Broker("latency", config, Path(tmp)).start()
        spark = local_spark("llog-bench-latency", delta=True)
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", str(records + 100))
        try:
            progress(f"latency: {records} records at {rate:g}/s per phase through {broker.url}")
            summary = {"bench": "latency", "records": records, "rate_per_s": rate, "partitions": PARTITIONS}
            summary |= _query_phase(spark, config, broker.url, records, rate, Path(tmp))
            summary |= _delta_phase(spark, config, broker.url, records, rate, Path(tmp))
        finally:
            spark.stop()
            broker.stop()
    emit(summary)
    return summary
