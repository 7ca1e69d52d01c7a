"""``python -m bench kafka-front-door``: llog's Kafka listener (docs/kafka.md) against a real
Apache Kafka 4.4 broker, the same Kafka clients and settings on both, on the same machine.

llog is a broker process (``python -m broker_lite --kafka-port``) on the bench's local stack
(Oxia and versitygw); Kafka is :func:`bench.kafka_broker.kafka_broker` (one KRaft node, its stock
settings). Every measure runs on Kafka, then on llog, each on topics of its own, created first
by Kafka's admin client (not timed). The clients are confluent-kafka (librdkafka); producers
use ``linger.ms=5`` and ``enable.idempotence=true`` (the Java client's default, not
librdkafka's), everything else librdkafka's defaults (no compression). Consumers use
``assign()``, ``fetch.queue.backoff.ms=10`` (:data:`CONSUMER`: librdkafka's default of 1 s
throttles a reader of this many records on either server) and librdkafka's defaults otherwise
(``fetch.wait.max.ms=500``, ``fetch.min.bytes=1``).
Values are 100 bytes.

- **produce**: ``BENCH_FRONT_DOOR_RECORDS`` records (1,000,000) into a topic of
  ``BENCH_FRONT_DOOR_PARTITIONS`` partitions (8), by ``BENCH_FRONT_DOOR_PRODUCERS`` processes (2),
  each one producer that calls ``produce()`` in a loop (no key: librdkafka's partitioner) and
  then ``flush()``; delivery reports only for errors (``delivery.report.only.error``), so the
  clients spend their time producing. Records/s are the records over the time from the start
  signal to the last producer's flush. The topic must then hold exactly those records (its end
  offsets less its start offsets), else the bench fails.
- **consume**: the records the produce phase just wrote, read from each partition's start by one
  consumer ``assign()``-ed to all the partitions (``consume()`` in batches of 10,000), until it
  has them all. Records/s are the records over the time from ``assign()`` to the last one.
- **ack**: ``BENCH_FRONT_DOOR_ACK_RATE`` records/s (1,000), each its own ``produce()`` call,
  paced, for ``BENCH_FRONT_DOOR_ACK_SECONDS`` (15 s) after 2 s of warm-up; each record's time
  from ``produce()`` to its delivery callback (a thread polls the producer). This includes
  ``linger.ms``: librdkafka holds a record up to 5 ms to batch it with others.
- **poll**: ``BENCH_FRONT_DOOR_POLL_RECORDS`` records (500) at ``BENCH_FRONT_DOOR_POLL_RATE``/s
  (50), each its own ``produce()`` call, to a consumer already waiting at the topic's end (its
  fetch parked in the broker's long poll); each record's time from ``produce()`` to the
  consumer's ``poll()`` returning it, and (``poll_ack_*``) to its delivery callback: how much of
  it is the write path.
- **spark**: Spark's real-time mode (``trigger(realTime=...)`` with ``BENCH_FRONT_DOOR_SPARK_TRIGGER``,
  by default Spark's own default, 5 minutes) copying the values of a
  1-partition topic to another, both read and written by Spark's Kafka connector through the
  server measured (on ``local[2]``: real-time mode runs every source partition as a task at once,
  so the partitions must fit the 2 slots); ``BENCH_FRONT_DOOR_SPARK_RECORDS`` records (1,200) at
  ``BENCH_FRONT_DOOR_SPARK_RATE``/s (20: a minute, within the query's first batch), after
  warm-up records until one comes out; each record's time from ``produce()`` into the first topic
  to a waiting consumer of the second returning it. ``BENCH_FRONT_DOOR_SPARK=0`` leaves this
  measure out. In real-time mode the batch duration is a checkpoint interval, not a latency
  (Spark's guide): records are passed on as they come, and only at a batch boundary does a record
  wait for the next batch's tasks to start. A shorter trigger measures those boundaries too
  (``10 seconds``: 2-3% of the records meet one, and they set the p99).

A record seen twice, or not within the phase's deadline, fails the bench. Times are
``time.monotonic()`` of one process (the consumers run in threads beside the producer), except
the produce phase's producers, which run in processes of their own and report the same clock.

The result is one JSON line: for each measure, llog's and Kafka's number and llog's over Kafka's;
whether llog meets issue 31's targets; and where llog's time went in the produce phase: CPU
seconds of the llog broker, of the S3 server, of the Kafka broker and of the whole machine, and
the llog broker's group commit as its ``/metrics`` counted it (flushes, records and bytes per
flush, time per flush, S3 and Oxia calls). ``BENCH_FRONT_DOOR_PROFILE=<path>`` runs the llog
broker under cProfile and writes its profile there when it stops: the Python work of its event
loop's thread (handlers, batch decoding), not that of its flush and read threads.

Fairness, which the numbers do not show: Kafka acknowledges a write once its one broker has it in
the page cache (no fsync, no replica); llog once its blob is in S3 and its offsets are in Oxia.
Both servers share the machine's 2 cores with the clients (and llog with Oxia and the S3 server).
"""

from __future__ import annotations

import functools
import json
import os
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.kafka_broker import KAFKA_VERSION, kafka_broker
from bench.report import CpuMeter, emit, env_int, progress, s3_server_marker
from llog.config import Config
from llog.errors import LlogError
from llog_tools import progress as llog_progress

VALUE_BYTES = 100
#: The producers' settings, on both servers (everything else is librdkafka's default).
PRODUCER = {"linger.ms": 5, "enable.idempotence": True}
#: The consumers' settings, on both servers: librdkafka waits 1 s (``fetch.queue.backoff.ms``)
#: before fetching a partition again once its local queue holds ``queued.min.messages`` (100,000)
#: records, which a consumer reading 125,000 records a partition runs into whatever the server;
#: with the default, both servers read at 150,000-300,000 records/s here, with 10 ms at
#: 800,000-950,000.
CONSUMER = {"fetch.queue.backoff.ms": 10}
#: A value: a sequence number and the ``time.monotonic()`` of its ``produce()``, padded.
_STAMP = struct.Struct(">qd")
_PADDING = b"x" * (VALUE_BYTES - _STAMP.size)
#: Issue 31's targets for llog: ``(measure, ">=" or "<=", bound)``.
TARGETS = (("produce_records_per_s", ">=", 200_000), ("ack_p99_ms", "<=", 50), ("consume_records_per_s", ">=", 500_000),
           ("poll_p99_ms", "<=", 25), ("spark_p99_ms", "<=", 100))
ACK_WARMUP_S = 2
#: Real-time mode's batch duration unless ``BENCH_FRONT_DOOR_SPARK_TRIGGER`` says: Spark's default.
SPARK_TRIGGER = "5 minutes"
SPARK_PARTITIONS = 1
#: Bounds on every wait: a client's answer, a phase's stragglers, a broker's start.
CLIENT_TIMEOUT_S = 60
DRAIN_TIMEOUT_S = 60
START_TIMEOUT_S = 60
SPARK_START_TIMEOUT_S = 180


@dataclass(frozen=True)
class Sizes:
    """From the environment (see the module's docstring)."""

    records: int
    partitions: int
    producers: int
    ack_rate: int
    ack_seconds: int
    poll_records: int
    poll_rate: int
    spark_records: int
    spark_rate: int
    spark: bool
    spark_trigger: str

    @classmethod
    def from_env(cls) -> "Sizes":
        return cls(records=env_int("BENCH_FRONT_DOOR_RECORDS", 1_000_000),
                   partitions=env_int("BENCH_FRONT_DOOR_PARTITIONS", 8),
                   producers=env_int("BENCH_FRONT_DOOR_PRODUCERS", 2),
                   ack_rate=env_int("BENCH_FRONT_DOOR_ACK_RATE", 1000),
                   ack_seconds=env_int("BENCH_FRONT_DOOR_ACK_SECONDS", 15),
                   poll_records=env_int("BENCH_FRONT_DOOR_POLL_RECORDS", 500),
                   poll_rate=env_int("BENCH_FRONT_DOOR_POLL_RATE", 50),
                   spark_records=env_int("BENCH_FRONT_DOOR_SPARK_RECORDS", 1200),
                   spark_rate=env_int("BENCH_FRONT_DOOR_SPARK_RATE", 20),
                   spark=env_int("BENCH_FRONT_DOOR_SPARK", 1, minimum=0) > 0,
                   spark_trigger=os.environ.get("BENCH_FRONT_DOOR_SPARK_TRIGGER", SPARK_TRIGGER))


@dataclass(frozen=True)
class Server:
    """One server measured: its name in the results, where clients connect, how its topics are
    created, and the marker of its process for :class:`~bench.report.CpuMeter`."""

    name: str
    bootstrap_servers: str
    create_topic: Callable[[str, int], None]
    marker: str


def run(config: Config) -> dict:
    sizes = Sizes.from_env()
    config = config.replace(root_prefix=f"bench-{uuid.uuid4().hex[:8]}")
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="llog-bench-front-door-") as tmp:
        progress(f"kafka-front-door: starting Kafka {KAFKA_VERSION} (KRaft, one node) and an llog broker "
                 f"with a Kafka listener")
        with kafka_broker(Path(tmp) / "kafka") as kafka, _llog_broker(config, Path(tmp)) as llog:
            servers = [Server(name, bootstrap_servers, functools.partial(_create_topic, bootstrap_servers), marker)
                       for name, bootstrap_servers, marker in (("kafka", kafka.bootstrap_servers, kafka.marker),
                                                               ("llog", llog.bootstrap_servers, llog.marker))]
            s3_marker = s3_server_marker(config.s3_endpoint_url)
            for server in servers:
                results[server.name] = {}
            phases = [("produce and consume", lambda server: _throughput(server, sizes, servers, s3_marker, llog)),
                      ("ack latency", lambda server: _ack(server, sizes)),
                      ("produce -> waiting consumer", lambda server: _poll(server, sizes))]
            for what, phase in phases:
                for server in servers:
                    with llog_progress.task(f"kafka-front-door: {what}, {server.name}"):
                        measured = phase(server)
                    _show(what, server.name, measured)
                    results[server.name] |= measured
            if sizes.spark:
                for name, measured in _spark(servers, sizes, Path(tmp)).items():
                    _show("Spark real-time mode", name, measured)
                    results[name] |= measured
    summary = _summary(sizes, results)
    emit(summary)
    return summary


def _show(what: str, server: str, measured: dict) -> None:
    progress(f"kafka-front-door: {what}, {server}: " + ", ".join(
        f"{k} {v:,}" for k, v in measured.items() if isinstance(v, (int, float))))


# --- the servers ------------------------------------------------------------------------------

@dataclass
class _LlogBroker:
    bootstrap_servers: str
    url: str
    marker: str


@contextmanager
def _llog_broker(config: Config, tmp: Path) -> Iterator[_LlogBroker]:
    """A broker process with a Kafka listener on ``config``, its log in ``tmp``; under cProfile
    when ``BENCH_FRONT_DOOR_PROFILE`` names a file for its profile."""
    from loadtest.brokers import free_port

    http_port, kafka_port = free_port(), free_port()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
           "LLOG_SETTINGS_FILE": "/nonexistent", **config.to_options()}
    profile = os.environ.get("BENCH_FRONT_DOOR_PROFILE")
    python = [sys.executable, *(["-m", "cProfile", "-o", profile] if profile else [])]
    log = tmp / "llog-broker.log"
    with open(log, "ab") as output:
        proc = subprocess.Popen([*python, "-m", "broker_lite", "--port", str(http_port), "--kafka-port",
                                 str(kafka_port), "--log-level", "warning"], env=env, stdin=subprocess.DEVNULL,
                                stdout=output, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{http_port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise LlogError(f"the llog broker did not start (exit code {proc.poll()}); its log:\n"
                                + log.read_text(errors="replace")[-3000:])
            time.sleep(0.1)
        yield _LlogBroker(f"127.0.0.1:{kafka_port}", url, f"--kafka-port {kafka_port} ")
    finally:
        # The broker stops cleanly on SIGTERM, then re-raises it (uvicorn), which ends the process
        # without cProfile writing; SIGINT re-raised is a KeyboardInterrupt, after which it does.
        proc.send_signal(signal.SIGINT if profile else signal.SIGTERM)
        try:
            proc.wait(40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def _create_topic(bootstrap_servers: str, topic: str, partitions: int) -> None:
    """By Kafka's admin client (CreateTopics), on either server."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    admin.create_topics([NewTopic(topic, partitions, 1)], request_timeout=CLIENT_TIMEOUT_S)[topic].result(
        CLIENT_TIMEOUT_S)


def _topic(phase: str) -> str:
    return f"fd-{phase}-{uuid.uuid4().hex[:8]}"


# --- produce and consume throughput -----------------------------------------------------------

def _throughput(server: Server, sizes: Sizes, servers: list[Server], s3_marker: str, llog: _LlogBroker) -> dict:
    topic = _topic("produce")
    server.create_topic(topic, sizes.partitions)
    meters = {"machine": CpuMeter(server.marker), **{f"{s.name}_broker": CpuMeter(s.marker) for s in servers},
              "s3_server": CpuMeter(s3_marker)}
    seconds, client_cpu_s, (before, after) = _produce_in_processes(
        server.bootstrap_servers, topic, sizes, meters.values(), functools.partial(_metrics, llog.url))
    start, end = _offsets(server.bootstrap_servers, topic, sizes.partitions)
    landed = sum(end) - sum(start)
    if landed != sizes.records:
        raise RuntimeError(f"kafka-front-door ({server.name}): {sizes.records:,} records produced, "
                           f"{landed:,} in the topic")
    out = {"produce_records_per_s": round(sizes.records / seconds), "produce_s": round(seconds, 3),
           "produce_cpu_s": {"machine": round(meters["machine"].machine_s or 0, 2), "clients": round(client_cpu_s, 2),
                             **{k: round(m.process_s, 2) for k, m in meters.items()
                                if k != "machine" and m.process_s is not None}}}
    if server.name == "llog" and before is not None and after is not None:
        out["produce_group_commit"] = _group_commit(before, after, seconds)
    consume_s, consume_cpu_s = _consume_all(server.bootstrap_servers, topic, start, sizes.records)
    out |= {"consume_records_per_s": round(sizes.records / consume_s), "consume_s": round(consume_s, 3),
            "consume_client_cpu_s": round(consume_cpu_s, 2)}
    return out


def _produce_in_processes(bootstrap_servers: str, topic: str, sizes: Sizes, meters, metrics: Callable[[], dict | None]
                          ) -> tuple[float, float, tuple[dict | None, dict | None]]:
    """Seconds from the start signal to the last producer's flush, the producers' CPU seconds, and
    ``metrics()`` just before the start and after the end; ``meters`` run from the start to the
    end. Each producer is a process of its own (:func:`_producer_main`), started and connected
    first; it is told to start by a line on its stdin and answers a JSON line on its stdout."""
    shares = [sizes.records // sizes.producers + (i < sizes.records % sizes.producers)
              for i in range(sizes.producers)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")) if p)}
    workers = [subprocess.Popen([sys.executable, "-m", "bench.kafka_front_door", bootstrap_servers, topic, str(share)],
                                env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
               for share in shares]
    timeout_s = CLIENT_TIMEOUT_S + sizes.records / 10_000
    try:
        ready = [_answer(worker, CLIENT_TIMEOUT_S) for worker in workers]
        if any(r.get("error") for r in ready):
            raise RuntimeError(f"kafka-front-door: a producer failed to start: {ready}")
        before = metrics()
        for meter in meters:
            meter.start()
        begin = time.monotonic()
        for worker in workers:
            worker.stdin.write("go\n")
            worker.stdin.flush()
        done = [_answer(worker, timeout_s) for worker in workers]
        for meter in meters:
            meter.stop()
        after = metrics()
    finally:
        for worker in workers:
            try:
                worker.wait(CLIENT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(10)
    failed = [r for r in done if r.get("error")]
    if failed:
        raise RuntimeError(f"kafka-front-door: producing failed: {failed}")
    return max(r["done"] for r in done) - begin, sum(r["cpu_s"] for r in done), (before, after)


def _answer(worker: subprocess.Popen, timeout_s: float) -> dict:
    """The next JSON line of a producer process, within ``timeout_s``."""
    ready, _, _ = select.select([worker.stdout], [], [], timeout_s)
    line = worker.stdout.readline() if ready else ""
    if not line:
        worker.kill()
        raise RuntimeError(f"kafka-front-door: a producer process did not answer within {timeout_s:g} s "
                           f"(exit code {worker.poll()})")
    return json.loads(line)


def _producer_main(bootstrap_servers: str, topic: str, records: int) -> None:
    """One producer process: connected first (metadata of ``topic``), says so, then produces
    ``records`` records once told to (a line on stdin); answers the ``time.monotonic()`` at the
    end of its flush and its CPU seconds, or the error."""
    from confluent_kafka import Producer

    def answer(**values) -> None:
        print(json.dumps(values), flush=True)

    errors: list[str] = []

    def failed(err, msg) -> None:
        errors.append(str(err))

    producer = Producer({"bootstrap.servers": bootstrap_servers, **PRODUCER, "delivery.report.only.error": True,
                         "queue.buffering.max.messages": 1_000_000})
    producer.list_topics(topic, timeout=CLIENT_TIMEOUT_S)
    values = [os.urandom(VALUE_BYTES) for _ in range(4096)]  # not compressible, like no compression asked
    answer(ready=True)
    if sys.stdin.readline().strip() != "go":
        return
    produce, cpu = producer.produce, time.process_time()
    for i in range(records):
        while True:
            try:
                produce(topic, values[i & 4095], on_delivery=failed)
                break
            except BufferError:  # the client's queue is full: serve it, then again
                producer.poll(0.01)
    left = producer.flush(CLIENT_TIMEOUT_S + records / 10_000)
    done = time.monotonic()
    if left or errors:
        answer(error=f"{left} record(s) not delivered, {len(errors)} failed: {errors[:3]}")
    else:
        answer(done=done, cpu_s=time.process_time() - cpu)


def _offsets(bootstrap_servers: str, topic: str, partitions: int) -> tuple[list[int], list[int]]:
    """Each partition's start offset and end offset (the next to be written)."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": "bench-offsets"})
    deadline = time.monotonic() + CLIENT_TIMEOUT_S
    try:
        while True:
            try:
                marks = [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=CLIENT_TIMEOUT_S)
                         for p in range(partitions)]
                break
            except KafkaException as e:  # Kafka: a topic just made has no leader for a moment
                if not e.args[0].retriable() and e.args[0].code() != KafkaError.NOT_LEADER_FOR_PARTITION \
                        or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    finally:
        consumer.close()
    if any(m is None for m in marks):
        raise RuntimeError(f"kafka-front-door: no offsets for {topic}: {marks}")
    return [lo for lo, _ in marks], [hi for _, hi in marks]


def _consume_all(bootstrap_servers: str, topic: str, start: list[int], records: int) -> tuple[float, float]:
    """Seconds for one consumer to read ``records`` records from the ``start`` of each partition,
    and the CPU seconds of this process meanwhile (the client's, librdkafka's threads included)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": f"bench-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, **CONSUMER})
    try:
        consumer.list_topics(topic, timeout=CLIENT_TIMEOUT_S)  # connected before the clock starts
        begin, cpu = time.monotonic(), time.process_time()
        consumer.assign([TopicPartition(topic, p, offset) for p, offset in enumerate(start)])
        got, deadline = 0, begin + CLIENT_TIMEOUT_S + records / 10_000
        while got < records:
            if time.monotonic() > deadline:
                raise RuntimeError(f"kafka-front-door: {got:,} of {records:,} records consumed by the deadline")
            for message in consumer.consume(10_000, timeout=1):
                if message.error() is not None:
                    raise RuntimeError(f"kafka-front-door: consuming {topic}: {message.error()}")
                got += 1
        seconds, cpu_s = time.monotonic() - begin, time.process_time() - cpu
    finally:
        consumer.close()
    if got != records:
        raise RuntimeError(f"kafka-front-door: {got:,} records consumed, {records:,} produced")
    return seconds, cpu_s


def _metrics(url: str) -> dict | None:
    try:
        response = httpx.get(f"{url}/metrics", timeout=10)
        return response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def _group_commit(before: dict, after: dict, seconds: float) -> dict:
    """The llog broker's group commit between two ``/metrics`` snapshots ``seconds`` apart: its
    produce requests, flushes (one shared WAL blob each), records and bytes per flush, time per
    flush and the part of the phase some flush was running, and the S3 and Oxia calls with the
    seconds the broker's clients spent in them (summed over concurrent calls)."""
    b, a = before["batching"], after["batching"]
    flushes = a["flushes_total"] - b["flushes_total"]
    flush_s = sum((x["mean_flush_duration_ms"] or 0) * x["flushes_total"] / 1000 * sign
                  for x, sign in ((a, 1), (b, -1)))
    records = a["records_flushed_total"] - b["records_flushed_total"]

    def calls(system: str) -> dict:
        totals_b, totals_a = before[system]["latency_totals"], after[system]["latency_totals"]
        out = {}
        for op, t in totals_a.items():
            count = t["count"] - totals_b.get(op, {}).get("count", 0)
            if count:
                out[op] = {"calls": count, "seconds": round(t["seconds"] - totals_b.get(op, {}).get("seconds", 0), 3)}
        return out

    return {"produce_requests": a["enqueued_requests_total"] - b["enqueued_requests_total"], "flushes": flushes,
            "records_per_flush": round(records / flushes) if flushes else None,
            "mb_per_flush": round((a["bytes_flushed_total"] - b["bytes_flushed_total"]) / flushes / 1e6, 3)
            if flushes else None,
            "flush_ms_mean": round(flush_s / flushes * 1000, 1) if flushes else None,
            "flush_seconds_over_phase_seconds": round(flush_s / seconds, 2),
            "max_inflight_flushes": a["max_inflight_flushes"],
            "backpressure_rejections": a["backpressure_rejections_total"] - b["backpressure_rejections_total"],
            "s3": calls("s3"), "oxia": calls("oxia")}


# --- latencies --------------------------------------------------------------------------------

class _Acks:
    """A producer whose delivery callbacks a thread serves as they come; each record's time from
    ``produce()`` to its callback."""

    def __init__(self, bootstrap_servers: str):
        from confluent_kafka import Producer

        self.producer = Producer({"bootstrap.servers": bootstrap_servers, **PRODUCER})
        self.sent: dict[int, float] = {}
        self.acked: dict[int, float] = {}
        self.errors: list[str] = []
        self._stopping = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="bench-acks", daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        while not self._stopping.is_set():
            self.producer.poll(0.05)

    def _delivered(self, seq: int, err, msg) -> None:
        if err is not None:
            self.errors.append(str(err))
        else:
            self.acked[seq] = time.monotonic()

    def produce(self, topic: str, seq: int) -> None:
        sent = time.monotonic()
        self.sent[seq] = sent
        self.producer.produce(topic, _STAMP.pack(seq, sent) + _PADDING, on_delivery=functools.partial(
            self._delivered, seq))

    def latencies_ms(self, seqs: range) -> list[float]:
        return [(self.acked[s] - self.sent[s]) * 1000 for s in seqs]

    def close(self) -> None:
        left = self.producer.flush(CLIENT_TIMEOUT_S)
        self._stopping.set()
        self._poller.join(CLIENT_TIMEOUT_S)
        if left or self.errors:
            raise RuntimeError(f"kafka-front-door: {left} record(s) not delivered, {len(self.errors)} failed: "
                               f"{self.errors[:3]}")


def _paced(count: int, rate: float, first: int, send: Callable[[int], None]) -> None:
    """``send(first)``, ``send(first + 1)``, ... ``count`` times, at ``rate`` per second."""
    begin = time.monotonic()
    for i in range(count):
        delay = begin + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        send(first + i)


def _ack(server: Server, sizes: Sizes) -> dict:
    topic = _topic("ack")
    server.create_topic(topic, sizes.partitions)
    acks = _Acks(server.bootstrap_servers)
    warmup, timed = ACK_WARMUP_S * sizes.ack_rate, sizes.ack_seconds * sizes.ack_rate
    try:
        _paced(warmup + timed, sizes.ack_rate, 0, lambda seq: acks.produce(topic, seq))
    finally:
        acks.close()
    latencies = acks.latencies_ms(range(warmup, warmup + timed))
    return {"ack_p50_ms": _quantile(latencies, 0.5), "ack_p99_ms": _quantile(latencies, 0.99),
            "ack_max_ms": round(max(latencies), 1)}


class _Waiting(threading.Thread):
    """A consumer ``assign()``-ed to the end of ``topic``'s partitions (their end offsets when it
    is made), polling; when each record (by the sequence number in its value) was first returned."""

    def __init__(self, bootstrap_servers: str, topic: str, partitions: int):
        from confluent_kafka import Consumer, TopicPartition

        super().__init__(name=f"bench-waiting-{topic}", daemon=True)
        _, ends = _offsets(bootstrap_servers, topic, partitions)
        self.consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": f"bench-{uuid.uuid4().hex[:6]}",
                                  "enable.auto.commit": False, **CONSUMER})
        self.consumer.assign([TopicPartition(topic, p, end) for p, end in enumerate(ends)])
        self.seen: dict[int, float] = {}
        self.duplicates = 0
        self.error: BaseException | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        try:
            while not self._stopping.is_set():
                message = self.consumer.poll(0.1)
                if message is None:
                    continue
                at = time.monotonic()
                if message.error() is not None:
                    raise RuntimeError(f"consuming: {message.error()}")
                seq, _ = _STAMP.unpack_from(message.value())
                with self._lock:
                    if seq in self.seen:
                        self.duplicates += 1
                    else:
                        self.seen[seq] = at
        except BaseException as e:  # noqa: BLE001 - reported by the phase
            self.error = e

    def wait_for(self, seqs: range, what: str, timeout_s: float = DRAIN_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                missing = sum(1 for s in seqs if s not in self.seen)
            if self.error is not None:
                raise RuntimeError(f"kafka-front-door ({what}): the consumer failed: {self.error}") from self.error
            if not missing:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"kafka-front-door ({what}): {missing} of {len(seqs)} records not consumed "
                                   f"{timeout_s:g} s after the last produce")
            time.sleep(0.02)

    def close(self) -> None:
        self._stopping.set()
        self.join(CLIENT_TIMEOUT_S)
        self.consumer.close()


def _poll(server: Server, sizes: Sizes) -> dict:
    topic = _topic("poll")
    server.create_topic(topic, sizes.partitions)
    acks = _Acks(server.bootstrap_servers)
    consumer = _Waiting(server.bootstrap_servers, topic, sizes.partitions)
    consumer.start()
    warmup = max(10, sizes.poll_rate)
    try:
        _paced(warmup, sizes.poll_rate, 0, lambda seq: acks.produce(topic, seq))
        consumer.wait_for(range(warmup), f"{server.name} poll, warm-up")
        _paced(sizes.poll_records, sizes.poll_rate, warmup, lambda seq: acks.produce(topic, seq))
        consumer.wait_for(range(warmup, warmup + sizes.poll_records), f"{server.name} poll")
    finally:
        consumer.close()
        acks.close()
    if consumer.duplicates:
        raise RuntimeError(f"kafka-front-door ({server.name} poll): {consumer.duplicates} record(s) consumed twice")
    seqs = range(warmup, warmup + sizes.poll_records)
    latencies = [(consumer.seen[s] - acks.sent[s]) * 1000 for s in seqs]
    # The same records' acknowledgements: the share of the write path in the latency above.
    acked = [acks.acked[s] - acks.sent[s] for s in seqs if s in acks.acked]
    return {"poll_p50_ms": _quantile(latencies, 0.5), "poll_p99_ms": _quantile(latencies, 0.99),
            "poll_max_ms": round(max(latencies), 1),
            "poll_ack_p50_ms": _quantile([a * 1000 for a in acked], 0.5),
            "poll_ack_p99_ms": _quantile([a * 1000 for a in acked], 0.99)}


# --- Spark's real-time mode -------------------------------------------------------------------

def _spark(servers: list[Server], sizes: Sizes, tmp: Path) -> dict[str, dict]:
    from bench.kafka import SPARK_KAFKA
    from jobs.local_spark import local_spark

    with llog_progress.task("kafka-front-door: starting Spark"):
        spark = local_spark("llog-bench-kafka-front-door", cores=2, packages=SPARK_KAFKA)
    out = {}
    try:
        for server in servers:
            with llog_progress.task(f"kafka-front-door: Spark real-time mode, {server.name}"):
                out[server.name] = _spark_query(spark, server, sizes, tmp)
    finally:
        spark.stop()
    return out


def _spark_query(spark, server: Server, sizes: Sizes, tmp: Path) -> dict:
    from jobs.local_spark import wait_for_running_tasks

    source, sink = _topic("rtm-in"), _topic("rtm-out")
    for topic in (source, sink):
        server.create_topic(topic, SPARK_PARTITIONS)
    kafka = {"kafka.bootstrap.servers": server.bootstrap_servers}
    consumer = _Waiting(server.bootstrap_servers, sink, SPARK_PARTITIONS)
    consumer.start()
    acks = _Acks(server.bootstrap_servers)
    query = (spark.readStream.format("kafka").options(**kafka, subscribe=source, startingOffsets="latest").load()
             .select("value").writeStream.format("kafka").options(**kafka, topic=sink)
             .option("checkpointLocation", str(tmp / f"ck-{sink}")).outputMode("update")
             .trigger(realTime=sizes.spark_trigger).start())
    try:
        seq, deadline = 0, time.monotonic() + SPARK_START_TIMEOUT_S
        while not consumer.seen:  # warm-up until the query passes records on
            if query.exception() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"kafka-front-door ({server.name} spark): no record came out of the query "
                                   f"within {SPARK_START_TIMEOUT_S} s: {query.exception()}")
            acks.produce(source, seq)
            seq += 1
            time.sleep(0.5)
        first = seq + 1000  # past every warm-up record
        _paced(sizes.spark_records, sizes.spark_rate, first, lambda s: acks.produce(source, s))
        consumer.wait_for(range(first, first + sizes.spark_records), f"{server.name} spark")
        if query.exception() is not None:
            raise RuntimeError(f"kafka-front-door ({server.name} spark): the query failed: {query.exception()}")
    finally:
        spark.sparkContext.setLogLevel("OFF")  # a stop interrupts the query's tasks, which log it at length
        query.stop()
        wait_for_running_tasks(spark)
        time.sleep(0.5)  # the cancelled tasks' last log lines
        spark.sparkContext.setLogLevel("WARN")
        consumer.close()
        acks.close()
    if consumer.duplicates:
        raise RuntimeError(f"kafka-front-door ({server.name} spark): {consumer.duplicates} record(s) seen twice")
    latencies = [(consumer.seen[s] - acks.sent[s]) * 1000 for s in range(first, first + sizes.spark_records)]
    return {"spark_p50_ms": _quantile(latencies, 0.5), "spark_p90_ms": _quantile(latencies, 0.9),
            "spark_p99_ms": _quantile(latencies, 0.99),
            "spark_max_ms": round(max(latencies), 1)}


# --- the result -------------------------------------------------------------------------------

def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))], 1)


def _summary(sizes: Sizes, results: dict[str, dict]) -> dict:
    llog, kafka = results["llog"], results["kafka"]
    measures = [k for k in kafka if isinstance(kafka[k], (int, float)) and k in llog]
    summary: dict = {"bench": "kafka-front-door", "kafka_version": KAFKA_VERSION,
                     "sizes": {k: getattr(sizes, k) for k in sizes.__dataclass_fields__}}
    for measure in measures:
        summary[measure] = {"llog": llog[measure], "kafka": kafka[measure],
                            "llog_over_kafka": round(llog[measure] / kafka[measure], 3) if kafka[measure] else None}
    summary["targets"] = {measure: {"target": f"{op} {bound:,}", "llog": llog[measure],
                                    "met": llog[measure] >= bound if op == ">=" else llog[measure] <= bound}
                          for measure, op, bound in TARGETS if measure in llog}
    summary["produce_cpu_s"] = {"llog": llog.get("produce_cpu_s"), "kafka": kafka.get("produce_cpu_s")}
    if "produce_group_commit" in llog:
        summary["llog_produce_group_commit"] = llog["produce_group_commit"]
    return summary


if __name__ == "__main__":  # a producer process of the produce phase (_produce_in_processes)
    _producer_main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
