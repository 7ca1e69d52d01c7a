"""``python -m bench kafka``: llog against a real Apache Kafka broker, both written and read by
Spark's own streaming connectors on the same machine.

The broker (:mod:`bench.kafka_broker`) is Kafka 4.4.0 in KRaft mode, one node that is broker and
controller at once, on loopback, with the stock settings; Spark talks to it through its own
connector, ``spark-sql-kafka-0-10`` 4.2.0 (``local_spark(packages=...)``). The workloads are
those of ``bench.sink`` and ``bench.source``, reusing their code, on ``local[2]``:

- **sink**: ``rate-micro-batch``, ``BENCH_KAFKA_ROWS`` rows (1,000,000) of 100-byte values per
  micro-batch, into ``writeStream.format("kafka")`` (an 8-partition topic) with the producer's
  defaults ("kafka_default": the connector's kafka-clients 3.9, ``acks=all``, idempotent,
  ``linger.ms=0``, 16 KiB batches) and tuned for throughput ("kafka_tuned": ``linger.ms=20``,
  ``batch.size=524288``), into ``writeStream.format("llog")`` (8 partitions), and into
  ``bench.sink``'s sink that drops its input ("drop": what Spark alone costs). Records/s are rows
  over the median micro-batch time (Spark's ``triggerExecution``) of ``BENCH_KAFKA_BATCHES`` (4)
  timed micro-batches per query, after each query's warm-up batch. What each query left in its
  topic (Kafka: the partitions' end offsets less their start; llog: their offsets from the log
  start to the high watermark) must be the rows of the micro-batches it completed, plus, of the
  one its stop cut, any part for Kafka (its tasks write as they go) and all or none for llog (it
  commits a batch at once); else the bench fails.
- **source**: ``BENCH_KAFKA_RECORDS`` records (8 x the rows per batch: 8,000,000) of 100 bytes in 8
  partitions, preloaded into both systems (not timed), each read whole with
  ``trigger(availableNow=True)`` into Spark's ``noop`` sink, as ``bench.source`` does: by
  ``readStream.format("kafka")`` with the consumer's defaults ("kafka_default") and with fetches
  the size of the llog source's reads ("kafka_tuned": 8 MiB per partition per fetch, as many
  records per poll as fill one; no ``maxOffsetsPerTrigger``, so that, as the llog source, it
  reads everything in one micro-batch), by ``readStream.format("llog")`` (its blobs 8 MB per
  partition, as the llog sink writes them), and by ``bench.arrow_floor``'s Python source that
  only yields prebuilt Arrow batches of the same schema, shape and topic name ("floor": what Spark
  alone costs a Python source). Records/s are records over the median run, from ``start()`` to
  termination.

The floors bound what any Python sink or source could reach here: ``sink_floor_ratio_vs_tuned``
and ``source_floor_ratio_vs_tuned`` are their records/s over tuned Kafka's, as llog's ratios are.

The cases take turns round by round (one untimed round first, then ``BENCH_KAFKA_ROUNDS``, 3),
so a machine that speeds up or slows down moves them all alike. They share one JVM, so each
starts from the same heap: after a Kafka read the connector's cached consumers and their fetched
records are released (a query's consumers belong to its own group, so no later query can use
them; left to the pool's 5-minute timeout they held 130-160 MB of records, and the garbage
collector's work for them fell on the cases that came next), and before every case the JVM
collects its garbage (``System.gc()``, not timed). The result is one JSON line:
llog's records/s over Kafka's (tuned and default) for the sink and the source, the same ratio in
each round, records/s per case, and CPU seconds per batch (of ``BENCH_KAFKA_ROWS`` records) of
the whole machine, of the Kafka broker, of the S3 server (versitygw), of Spark's JVM and of the
Python processes it starts (planners and workers).

Fairness, which the numbers do not show:

- Durability differs. Kafka here keeps one replica and does not fsync (its default: durability
  comes from replication, of which one node has none), so a write is acknowledged once the one
  broker has it in the page cache. llog acknowledges a micro-batch once its blobs are PUT to S3
  and its offsets committed in Oxia: durable as S3 and Oxia are.
- Delivery differs. Spark's Kafka sink is at-least-once: a micro-batch Spark replays after a
  failure is written again. llog's sink is exactly-once (it commits each micro-batch once per
  partition, under the query's id).
- Placement differs a little. Rows without keys go where each side's default puts them: Kafka's
  producer moves to another partition with every batch it fills, llog's sink sends each task's
  rows to one partition (so 2 of the 8 per micro-batch here).
- The servers share the machine's 2 cores with Spark: the Kafka broker in the Kafka cases, the
  S3 server (and Oxia) in the llog cases. Proper S3 would take none of this machine's CPU; a
  Kafka cluster would run on machines of its own too. The CPU columns show how much each took.
"""

from __future__ import annotations

import statistics
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from itertools import count
from pathlib import Path

from bench import arrow_floor, sink, source
from bench.kafka_broker import KAFKA_VERSION, KafkaBroker, kafka_broker
from bench.report import CpuMeter, SparkCpuMeter, emit, env_int, llog_records, progress, s3_server_marker
from jobs.local_spark import local_spark
from llog.config import Config
from llog_tools import progress as llog_progress

#: Spark's Kafka connector, for the pyspark this project pins, with a class of its jar.
SPARK_KAFKA_PACKAGE = "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"
SPARK_KAFKA = {SPARK_KAFKA_PACKAGE: "org.apache.spark.sql.kafka010.KafkaSourceProvider"}
PARTITIONS = sink.PARTITIONS
VALUE_BYTES = sink.VALUE_BYTES
SINK_TOPIC = "bench-sink"
LLOG_SINK_TOPIC = "bench"
SOURCE_TOPIC = "bench-source"
#: What the llog source reads of a partition per GET: one blob's body of 80,000 records of 100
#: bytes, 8 MB (``bench.source``'s default fill, one partition per blob as the sink writes them).
RECORDS_PER_BLOB = 80_000
#: The producer tuned for throughput: batches up to 512 KiB (default 16 KiB), waiting up to 20 ms
#: to fill them (the connector's kafka-clients 3.9 waits 0 ms by default).
TUNED_PRODUCER = {"kafka.linger.ms": "20", "kafka.batch.size": "524288"}
#: The consumer tuned to read as the llog source does: fetches of a blob's size, 8 MiB per
#: partition (default 1 MiB; each Spark task reads one partition), about all of it handed over
#: per poll (default 500 records).
TUNED_CONSUMER = {"kafka.max.partition.fetch.bytes": str(8 << 20), "kafka.max.poll.records": str(RECORDS_PER_BLOB)}
#: The ratios' denominators: the Kafka cases, by the name their ratio carries.
KAFKA_CASES = {"tuned": "kafka_tuned", "default": "kafka_default"}
ADMIN_TIMEOUT_S = 60


@dataclass(frozen=True)
class Sizes:
    """From the environment, for quick runs: ``BENCH_KAFKA_ROWS`` (rows per sink micro-batch,
    1,000,000), ``BENCH_KAFKA_BATCHES`` (timed micro-batches per sink query, 4),
    ``BENCH_KAFKA_RECORDS`` (records the source reads, 8 x the rows; rounded down to a multiple
    of the partitions), ``BENCH_KAFKA_ROUNDS`` (timed rounds, 3)."""

    rows: int
    batches: int
    records: int
    rounds: int

    @classmethod
    def from_env(cls) -> "Sizes":
        rows = env_int("BENCH_KAFKA_ROWS", sink.ROWS_PER_BATCH)
        records = env_int("BENCH_KAFKA_RECORDS", PARTITIONS * rows, minimum=PARTITIONS) // PARTITIONS * PARTITIONS
        return cls(rows, env_int("BENCH_KAFKA_BATCHES", sink.BATCHES), records, env_int("BENCH_KAFKA_ROUNDS", 3))

    @property
    def per_partition(self) -> int:
        return self.records // PARTITIONS


class ServerMeters:
    """CPU seconds of the machine, the Kafka broker, the S3 server, Spark's JVM and its Python
    processes, read together (the interface of :class:`~bench.report.CpuMeter` that
    ``sink.micro_batch_seconds`` uses)."""

    def __init__(self, kafka_marker: str, s3_marker: str, jvm_pid: int):
        self.kafka, self.s3, self.spark = CpuMeter(kafka_marker), CpuMeter(s3_marker), SparkCpuMeter(jvm_pid)

    def start(self) -> "ServerMeters":
        self.kafka.start()
        self.s3.start()
        self.spark.start()
        return self

    def stop(self) -> "ServerMeters":
        self.kafka.stop()
        self.s3.stop()
        self.spark.stop()
        return self


@dataclass
class Measured:
    """One case's query in one round: its timed seconds (micro-batches of the sink, the one
    run of the source), the batches of ``Sizes.rows`` records the meters saw, and the meters."""

    seconds: list[float]
    batches: float
    meters: ServerMeters
    #: The source's run: from ``load()`` to its first trigger, and in triggers (``bench.source._stream``).
    startup_s: float | None = None
    triggers_s: float | None = None


def run(config: Config) -> dict:
    sizes = Sizes.from_env()
    config = config.replace(root_prefix=f"bench-{uuid.uuid4().hex[:8]}")
    with tempfile.TemporaryDirectory(prefix="llog-bench-kafka-") as tmp:
        progress(f"kafka: starting Kafka {KAFKA_VERSION} (KRaft, one node) in {tmp}/kafka")
        with kafka_broker(Path(tmp) / "kafka") as broker:
            spark = local_spark("llog-bench-kafka", cores=2, task_retries=1, packages=SPARK_KAFKA)
            try:
                spark.dataSource.register(sink.DropSource)
                spark.dataSource.register(arrow_floor.ArrowSource)
                _create_topics(spark, broker.bootstrap_servers, [SINK_TOPIC, SOURCE_TOPIC])
                cases = _Cases(spark, config, broker, sizes, Path(tmp))
                sink_runs = cases.sink_rounds()
                fill = cases.preload()
                source_runs = cases.source_rounds()
            finally:
                _close_cached_producers(spark)
                spark.stop()
            progress("kafka: stopping the broker")
    summary = _summary(sizes, sink_runs, source_runs, fill)
    emit(summary)
    return summary


class _Cases:
    """The cases of one run: each measures one query on the same session, broker and stack."""

    def __init__(self, spark, config: Config, broker: KafkaBroker, sizes: Sizes, tmp: Path):
        self.spark, self.config, self.broker, self.sizes = spark, config, broker, sizes
        self.checkpoints = (tmp / f"ck-{i}" for i in count())
        self.kafka = {"kafka.bootstrap.servers": broker.bootstrap_servers}
        self.llog = {k.lower(): v for k, v in config.to_options().items()}
        self.s3_marker = s3_server_marker(config.s3_endpoint_url)
        self.jvm_pid = spark._jvm.java.lang.ProcessHandle.current().pid()

    def sink_rounds(self) -> dict[str, list[Measured]]:
        progress(f"kafka: sink, {self.sizes.rounds} round(s) after an untimed one, {self.sizes.batches} timed "
                 f"micro-batches of {self.sizes.rows:,} rows per case and round")
        return _in_rounds(self.spark, "sink", {
            "kafka_default": lambda warm_up: self._sink("kafka", {**self.kafka, "topic": SINK_TOPIC}, warm_up,
                                                        self._kafka_records),
            "kafka_tuned": lambda warm_up: self._sink("kafka", {**self.kafka, **TUNED_PRODUCER, "topic": SINK_TOPIC},
                                                      warm_up, self._kafka_records),
            "llog": lambda warm_up: self._sink("llog", {**self.llog, "topic": LLOG_SINK_TOPIC,
                                                        "partitions": str(PARTITIONS)}, warm_up,
                                               lambda: llog_records(self.config, LLOG_SINK_TOPIC)),
            "drop": lambda warm_up: self._sink("llog_bench_drop", {}, warm_up),
        }, self.sizes.rounds)

    def source_rounds(self) -> dict[str, list[Measured]]:
        progress(f"kafka: source, {self.sizes.rounds} round(s) after an untimed one, an availableNow read of "
                 f"{self.sizes.records:,} records per case and round")
        kafka = {**self.kafka, "subscribe": SOURCE_TOPIC, "startingOffsets": "earliest"}
        blob_rows = min(RECORDS_PER_BLOB, self.sizes.per_partition)  # as preload() fills llog
        return _in_rounds(self.spark, "source", {
            "kafka_default": lambda warm_up: self._source("kafka", kafka),
            "kafka_tuned": lambda warm_up: self._source("kafka", {**kafka, **TUNED_CONSUMER}),
            "llog": lambda warm_up: self._source("llog", {**self.llog, "topics": SOURCE_TOPIC,
                                                          "startingOffsets": "earliest"}),
            "floor": lambda warm_up: self._source("llog_bench_arrow", {
                "partitions": str(PARTITIONS), "batchRows": str(blob_rows), "topic": SOURCE_TOPIC,
                "splitRows": source.split_rows(self.sizes.per_partition, blob_rows)}),
        }, self.sizes.rounds)

    def preload(self) -> dict:
        """The source's records in both systems, not timed: into llog as ``bench.source`` fills
        a topic (``append_shared``, one partition per 8 MB blob), into Kafka by a Spark batch
        write (``sizes.per_partition`` records to each partition, the tuned producer)."""
        from pyspark.sql import functions as F

        sizes = self.sizes
        progress(f"kafka: preloading {sizes.records:,} records into llog and into Kafka")
        per_append = min(RECORDS_PER_BLOB, sizes.per_partition)
        llog_fill = source._fill(self.config, SOURCE_TOPIC, source.Sizes(sizes.records, PARTITIONS, per_append, 1, 1),
                                 sizes.per_partition)
        with llog_progress.task("kafka: preloading Kafka"):
            (self.spark.range(sizes.records)
             .select(F.lpad(F.col("id").cast("string"), VALUE_BYTES, "x").cast("binary").alias("value"),
                     (F.col("id") % PARTITIONS).cast("int").alias("partition"))
             .write.format("kafka").options(**self.kafka, **TUNED_PRODUCER).option("topic", SOURCE_TOPIC).save())
        return {"llog_s": llog_fill["seconds"], "llog_blob_mb": llog_fill["blob_mb"]}

    def _meters(self) -> ServerMeters:
        return ServerMeters(self.broker.marker, self.s3_marker, self.jvm_pid)

    def _sink(self, fmt: str, options: dict[str, str], warm_up: bool, landed: Callable[[], int] | None = None
              ) -> Measured:
        """``sink.micro_batch_seconds`` of one query (one timed micro-batch when warming up),
        checking what landed in its topic by ``landed`` (Kafka writes as its tasks go)."""
        meters = self._meters()
        seconds, batches = sink.micro_batch_seconds(self.spark, sink._values(), fmt, options, next(self.checkpoints),
                                                    meters, rows=self.sizes.rows,
                                                    batches=1 if warm_up else self.sizes.batches, landed=landed,
                                                    whole_batches=fmt != "kafka")
        return Measured(seconds, batches, meters)

    def _kafka_records(self) -> int:
        """The records in the Kafka sink's topic: over its partitions, the latest offset less
        the earliest (Kafka's ``Admin`` in Spark's JVM)."""
        jvm = self.spark._jvm
        admin_api = jvm.org.apache.kafka.clients.admin
        partitions = [jvm.org.apache.kafka.common.TopicPartition(SINK_TOPIC, p) for p in range(PARTITIONS)]
        admin = _admin(self.spark, self.broker.bootstrap_servers)
        try:
            def offsets(spec) -> int:
                request = jvm.java.util.HashMap()
                for partition in partitions:
                    request.put(partition, spec)
                answer = admin.listOffsets(request).all().get(ADMIN_TIMEOUT_S,
                                                              jvm.java.util.concurrent.TimeUnit.SECONDS)
                return sum(answer.get(partition).offset() for partition in partitions)
            return offsets(admin_api.OffsetSpec.latest()) - offsets(admin_api.OffsetSpec.earliest())
        finally:
            admin.close()

    def _source(self, fmt: str, options: dict[str, str]) -> Measured:
        """``source._stream``: one availableNow read of every preloaded record."""
        meters = self._meters().start()
        read = source._stream(self.spark, fmt, options, next(self.checkpoints), self.sizes.records)
        meters.stop()
        if fmt == "kafka":
            _release_cached_consumers(self.spark)
        return Measured([read["seconds"]], self.sizes.records / self.sizes.rows, meters, read["startup_s"],
                        read["triggers_s"])


def _in_rounds(spark, direction: str, cases: dict[str, Callable[[bool], Measured]], rounds: int
               ) -> dict[str, list[Measured]]:
    """Each case once per round, in turn (a, b, c, a, b, c, ...), after one untimed round (called
    with ``warm_up=True``), each after a full garbage collection of the JVM: what each timed
    call measured, per case."""
    measured: dict[str, list[Measured]] = {case: [] for case in cases}
    with llog_progress.task(f"kafka: {direction} rounds", total=rounds + 1, unit="rounds") as advance:
        for round_number in range(rounds + 1):
            for case, measure in cases.items():
                progress(f"kafka: {direction} {case}, " + (f"round {round_number} of {rounds}" if round_number
                                                           else "untimed round"))
                spark._jvm.java.lang.System.gc()
                result = measure(round_number == 0)
                if round_number:
                    measured[case].append(result)
            advance()
    return measured


def _create_topics(spark, bootstrap_servers: str, topics: list[str]) -> None:
    """``topics`` with :data:`PARTITIONS` partitions each, all on the one node (replication
    factor 1), made by Kafka's ``Admin`` client in Spark's JVM (the connector brings it)."""
    jvm = spark._jvm
    admin_api = jvm.org.apache.kafka.clients.admin
    admin = _admin(spark, bootstrap_servers)
    try:
        assignment = {partition: [1] for partition in range(PARTITIONS)}  # node.id 1 (bench.kafka_broker)
        created = admin.createTopics([admin_api.NewTopic(topic, assignment) for topic in topics])
        created.all().get(ADMIN_TIMEOUT_S, jvm.java.util.concurrent.TimeUnit.SECONDS)
    finally:
        admin.close()


def _admin(spark, bootstrap_servers: str):
    """Kafka's ``Admin`` client in Spark's JVM (the connector brings it); the caller closes it."""
    properties = spark._jvm.java.util.Properties()
    properties.setProperty("bootstrap.servers", bootstrap_servers)
    return spark._jvm.org.apache.kafka.clients.admin.Admin.create(properties)


def _close_cached_producers(spark) -> None:
    """Close the producers Spark's Kafka sink keeps for later queries (``InternalKafkaProducerPool``,
    internal to the connector), while the broker still runs: left open, they would try to reach
    it again, logging a warning each time, for as long as this process's JVM lives."""
    pool = getattr(getattr(spark._jvm, "org.apache.spark.sql.kafka010.producer.InternalKafkaProducerPool$"), "MODULE$")
    pool.reset()


def _release_cached_consumers(spark) -> None:
    """Close the consumers Spark's Kafka source keeps after a query, and drop the records they
    fetched (``KafkaDataConsumer``'s pools, internal to the connector; their ``reset`` is what
    the connector's own tests use). Every query reads under a group of its own, so nothing
    cached by one is used by another: this only frees the heap the next case would share."""
    jvm = spark._jvm
    owner = getattr(getattr(jvm, "org.apache.spark.sql.kafka010.consumer.KafkaDataConsumer$"), "MODULE$").getClass()
    for name in ("consumerPool", "fetchedDataPool"):
        field = owner.getDeclaredField(name)
        field.setAccessible(True)
        field.get(None).reset()


def _summary(sizes: Sizes, sink_runs: dict[str, list[Measured]], source_runs: dict[str, list[Measured]],
             fill: dict) -> dict:
    """The one JSON line: llog's records/s over Kafka's (overall and per round), the floors' over
    tuned Kafka's, then per case."""
    directions = {"sink": sink_runs, "source": source_runs}
    summary: dict = {"bench": "kafka"}
    summary.update({f"{direction}_ratio_vs_{name}": _ratio(runs["llog"], runs[case])
                    for direction, runs in directions.items() for name, case in KAFKA_CASES.items()})
    summary.update({f"{direction}_ratio_vs_{name}_per_round": [_ratio([llog], [kafka])
                                                               for llog, kafka in zip(runs["llog"], runs[case])]
                    for direction, runs in directions.items() for name, case in KAFKA_CASES.items()})
    floors = {"sink": "drop", "source": "floor"}
    summary.update({f"{direction}_floor_ratio_vs_tuned": _ratio(runs[floors[direction]], runs[KAFKA_CASES["tuned"]])
                    for direction, runs in directions.items()})
    summary.update({f"{direction}_floor_ratio_vs_tuned_per_round": [
        _ratio([floor], [kafka]) for floor, kafka in zip(runs[floors[direction]], runs[KAFKA_CASES["tuned"]])]
        for direction, runs in directions.items()})
    for direction, runs, records in (("sink", sink_runs, sizes.rows), ("source", source_runs, sizes.records)):
        summary[direction] = {case: _case_summary(measured, records) for case, measured in runs.items()}
    summary.update({"kafka_version": KAFKA_VERSION, "spark_kafka": SPARK_KAFKA_PACKAGE, "partitions": PARTITIONS,
                    "value_bytes": VALUE_BYTES, "rows_per_batch": sizes.rows, "timed_batches_per_query": sizes.batches,
                    "source_records": sizes.records, "rounds": sizes.rounds, "fill": fill})
    return summary


def _ratio(llog: list[Measured], kafka: list[Measured]) -> float:
    """llog's records/s over Kafka's, at each one's median time over ``llog`` and ``kafka``."""
    return round(_median(kafka) / _median(llog), 3)


def _median(measured: list[Measured]) -> float:
    return statistics.median(s for m in measured for s in m.seconds)


def _case_summary(measured: list[Measured], records: int) -> dict:
    """Records/s at the median time; CPU seconds per batch (of ``Sizes.rows`` records) of the
    machine, the Kafka broker, the S3 server, Spark's JVM and its Python processes, over every
    timed round."""
    batches = sum(m.batches for m in measured)

    def per_batch(readings: list[float | None]) -> float | None:
        return None if None in readings or batches <= 0 else round(sum(readings) / batches, 3)

    return {"records_per_s": round(records / _median(measured)), "median_s": round(_median(measured), 3),
            "seconds": [round(s, 3) for m in measured for s in m.seconds],
            "cpu_s_per_batch": per_batch([m.meters.kafka.machine_s for m in measured]),
            "kafka_cpu_s_per_batch": per_batch([m.meters.kafka.process_s for m in measured]),
            "s3_server_cpu_s_per_batch": per_batch([m.meters.s3.process_s for m in measured]),
            "spark_jvm_cpu_s_per_batch": per_batch([m.meters.spark.jvm_s for m in measured]),
            "spark_python_cpu_s_per_batch": per_batch([m.meters.spark.python_s for m in measured]),
            **({"startup_s": [round(m.startup_s, 2) for m in measured],
                "triggers_s": [round(m.triggers_s, 2) for m in measured]} if measured[0].startup_s is not None else {})}
