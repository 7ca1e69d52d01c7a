"""format("llog") from real Spark (local mode) into real Oxia and the S3 server."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.errors import PySparkException

from llog.coordination import Coordination
from llog.discovery import topic_partitions
from llog.objects import ObjectStore
from llog.partitioner import kafka_partitions
from llog.topics import create_topic, read_topic
from llog_sink import write_batch
from tests.helpers import driver_process
from tests.helpers.invariants import check_partition
from jobs.local_spark import local_spark

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def spark():
    session = local_spark("llog-sink-tests")
    yield session
    session.stop()


def _options(config) -> dict[str, str]:
    return {k.lower(): v for k, v in config.to_options().items()}


def _log(reader, topic: str, partition: int) -> list[bytes]:
    return [r.value for r in reader.read_range(topic, partition, 1)] if reader.high_watermark(topic, partition) else []


def _partitions(config, topic: str) -> list[int]:
    with Coordination(config) as coordination:
        return topic_partitions(coordination, config.root_prefix, topic)


def test_batch_write_round_trip_in_order_per_partition(spark, config, reader):
    df = spark.range(0, 3000, 1, 3).select(F.col("id").cast("string").alias("value"),
                                           (F.col("id") % 4).cast("int").alias("partition"))
    df.write.format("llog").options(**_options(config)).option("topic", "orders").mode("append").save()
    for p in range(4):
        assert _log(reader, "orders", p) == [str(i).encode() for i in range(p, 3000, 4)]


def test_topic_column_wins_and_binary_values_are_kept(spark, config, reader):
    rows = [("a", bytes([0, 255, i])) for i in range(5)] + [("b", b"\x00")]
    df = spark.createDataFrame(rows, "topic string, value binary").coalesce(1)
    df.write.format("llog").options(**_options(config)).option("topic", "ignored").mode("append").save()
    # Each topic was created on first use (the tests' 16 partitions); one task: one sticky partition each.
    assert [v for p in _partitions(config, "a") for v in _log(reader, "a", p)] == [bytes([0, 255, i]) for i in range(5)]
    assert [v for p in _partitions(config, "b") for v in _log(reader, "b", p)] == [b"\x00"]
    assert _partitions(config, "ignored") == []


def test_stream_sticky_partitions_and_every_record_once(spark, config, reader, tmp_path):
    query = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 4000).option("numPartitions", 2).load()
             .select(F.col("value").cast("string").alias("value"))
             .writeStream.format("llog").options(**_options(config)).option("topic", "events")
             .option("partitions", 8).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert query.exception() is None
    assert _partitions(config, "events") == list(range(8))  # created with the option's count
    partitions = [p for p in range(8) if reader.high_watermark("events", p)]
    assert len(partitions) == 2  # two tasks, one partition each
    values = [v for p in partitions for v in _log(reader, "events", p)]
    assert sorted(values) == sorted(str(i).encode() for i in range(4000))


def test_foreach_batch_writes_through_the_same_engine(spark, config, reader, tmp_path):
    query = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 500).load()
             .select(F.col("value").cast("string").alias("value"))
             .writeStream.foreachBatch(write_batch(topic="fb", **_options(config)))
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert query.exception() is None
    values = [v for p in _partitions(config, "fb") for v in _log(reader, "fb", p)]
    assert sorted(values) == sorted(str(i).encode() for i in range(500))


def _placed_by(reader, topic: str, partitions: int) -> dict[int, list[bytes]]:
    """Each partition's keys, after checking each key is where Kafka's partitioner puts it."""
    placed = {}
    for p in range(partitions):
        keys = [r.key for r in reader.read_range(topic, p, 1)] if reader.high_watermark(topic, p) else []
        if keys:
            assert set(kafka_partitions(pa.array(keys, pa.binary()), partitions).tolist()) == {p}
        placed[p] = keys
    return placed


def test_the_partitions_option_must_agree_with_the_topic(spark, config, reader):
    """docs/protocol.md section 10.2: the topic record's count decides; a writer that disagrees is refused."""
    with Coordination(config) as coordination:
        create_topic(coordination, config.root_prefix, "counted", 4)
    keyed = spark.createDataFrame([(f"k{i}", f"v{i}") for i in range(200)], "key string, value string").coalesce(2)

    def write(df, topic, **options):
        df.write.format("llog").options(**_options(config)).option("topic", topic).options(**options) \
            .mode("append").save()

    with pytest.raises(PySparkException, match="partitions=8 disagrees with topic 'counted', which has 4"):
        write(keyed, "counted", partitions="8")
    assert not any(reader.high_watermark("counted", p) for p in range(4))
    write(keyed, "counted")  # no option: the topic's 4
    assert sum(map(len, _placed_by(reader, "counted", 4).values())) == 200
    with pytest.raises(PySparkException, match=r"counted\[5\] does not exist: topic 'counted' has 4 partition"):
        write(spark.createDataFrame([("v", 5)], "value string, partition int"), "counted")
    assert sum(reader.high_watermark("counted", p) for p in range(4)) == 200  # nothing of it committed

    write(keyed, "fresh", partitions="3")  # a new topic gets the option's count, when the batch commits
    with Coordination(config) as coordination:
        assert read_topic(coordination, config.root_prefix, "fresh").record.partitions == 3
    assert sum(map(len, _placed_by(reader, "fresh", 3).values())) == 200


def test_a_topic_column_places_each_topics_rows_by_its_own_count(spark, config, reader):
    with Coordination(config) as coordination:
        create_topic(coordination, config.root_prefix, "two", 2)
    rows = [(t, f"k{i}", f"v{i}") for t in ("two", "new") for i in range(100)]
    spark.createDataFrame(rows, "topic string, key string, value string").coalesce(2).write.format("llog") \
        .options(**_options(config)).mode("append").save()
    with Coordination(config) as coordination:  # "new" was created on first use when the batch committed
        assert read_topic(coordination, config.root_prefix, "new").record.partitions == config.default_partitions
    assert sum(map(len, _placed_by(reader, "two", 2).values())) == 100
    assert sum(map(len, _placed_by(reader, "new", config.default_partitions).values())) == 100


BAD_INPUTS = {
    "int value": ("value int", [(1,)], "column 'value' must be binary or string"),
    "int key": ("key int, value string", [(1, "v")], "column 'key' must be binary or string"),
    "headers not Kafka's": ("value string, headers map<string,binary>", [("v", {"h": b"x"})],
                            "column 'headers' must be array<struct<key:string,value:binary>>"),
    "null header key": ("value string, headers array<struct<key:string,value:binary>>", [("v", [(None, b"x")])],
                        "null header or a header with a null key"),
    "string timestamp": ("value string, timestamp string", [("v", "now")], "column 'timestamp' must be a timestamp"),
    "record too large": ("value binary", [(b"x" * ((1 << 20) + 1),)], "over the 1048576-byte limit"),
    "no topic": ("value string", [("v",)], "no topic"),
    "bad topic name": ("topic string, value string", [("no/slash", "v")], "column 'topic' or option 'topic'"),
    "negative partition": ("value string, partition int", [("v", -1)], "negative value"),
    "null partition": ("value string, partition int", [("v", None)], "column 'partition' holds 1 null"),
    "partition not int": ("value string, partition string", [("v", "1")], "'partition' must be an integer"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_fails_with_a_clear_error_and_writes_nothing(spark, config, case):
    schema, rows, message = BAD_INPUTS[case]
    # One task: it checks each Arrow batch before buffering it, so it fails before any upload. (With
    # several tasks, one holding only good rows may stage a blob; nothing of it is committed.)
    df = spark.createDataFrame(rows, schema).coalesce(1)
    writer = df.write.format("llog").options(**_options(config)).mode("append")
    if case != "no topic":
        writer = writer.option("topic", "bad")
    with pytest.raises(PySparkException, match=message):
        writer.save()
    assert _partitions(config, "bad") == []
    objects = ObjectStore(config)
    try:
        assert list(objects.list(f"{config.root_prefix}/")) == []  # not even a staged blob
    finally:
        objects.close()


def _run_query(config, topic: str, checkpoint: Path, failpoint: str | None = None, batches: int = 3,
               rows: int = 600) -> subprocess.CompletedProcess:
    return driver_process.run(config, ["tests.helpers.sink_query", "--topic", topic, "--checkpoint", str(checkpoint),
                                       "--rows", str(rows), "--batches", str(batches)], failpoint)


def _check_exactly_once_prefix(config, reader, topic: str, rows: int, min_batches: int) -> None:
    """Every value 0..n-1 exactly once, for n a whole number of batches, each partition in order."""
    values = []
    for p in _partitions(config, topic):
        with Coordination(config) as coordination:
            check_partition(coordination, config.root_prefix, topic, p)
        in_partition = [int(v) for v in _log(reader, topic, p)]
        assert all(v % 3 == p for v in in_partition)
        values += in_partition
    counts = collections.Counter(values)
    assert max(counts.values()) == 1, f"duplicates: {[v for v, c in counts.items() if c > 1][:10]}"
    assert sorted(values) == list(range(len(values))) and len(values) % rows == 0
    assert len(values) >= min_batches * rows


#: Where the chained crash test kills the driver, run after run. The first three kills land in
#: the first batch, so the next run replays it. After the kill at ``sink.after_commit`` that
#: replay finds all its slices committed and says so, and the run goes on to the next batch, where
#: ``writer.after_staged_slice`` kills it with some of that batch's slices committed, which the
#: last run finds. A run killed at ``sink.after_commit`` prints no such line (the commit prints it
#: after that point), so that kill does not follow ``writer.after_staged_slice``.
CRASHES = ["writer.after_blob_put", "sink.before_commit", "sink.after_commit", "writer.after_staged_slice"]


def test_driver_killed_at_each_failpoint_in_turn_then_restarted_leaves_every_record_exactly_once(
        config, reader, tmp_path):
    """The query is killed at one failpoint, restarted and killed at the next (in the replay of
    the batch the last kill interrupted), and so on; the run after the last kill finishes. The
    topic then holds every record of the three batches exactly once, in order: a replay recovers
    from whatever a killed run left, also when that run was itself a replay."""
    checkpoint = tmp_path / "ck"
    run = _run_query(config, "crash", checkpoint, CRASHES[0])
    for killed_at, next_kill in zip(CRASHES, [*CRASHES[1:], None]):
        assert run.returncode == -signal.SIGKILL, f"not killed at {killed_at}: {run.stderr[-3000:]}"
        run = _run_query(config, "crash", checkpoint, next_kill)
        if killed_at in ("writer.after_staged_slice", "sink.after_commit"):
            assert any(f"; {n} slice(s) were already committed" in run.stderr for n in range(1, 100)), (
                f"the run after the kill at {killed_at} found no committed slices: {run.stderr[-3000:]}")
    assert run.returncode == 0, run.stderr[-3000:]
    _check_exactly_once_prefix(config, reader, "crash", 600, 3)


def test_two_queries_into_the_same_partitions(config, tmp_path):
    procs = [subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.sink_query", "--topic", "shared", "--checkpoint", str(tmp_path / f"ck{i}"),
         "--rows", "500", "--batches", "3"],
        cwd=REPO, env={**os.environ, "LLOG_SETTINGS_FILE": "/nonexistent", **config.to_options()},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
    with Coordination(config) as coordination:
        total = 0
        for p in topic_partitions(coordination, config.root_prefix, "shared"):
            total += check_partition(coordination, config.root_prefix, "shared", p).high_watermark
    assert total >= 2 * 3 * 500


# --- H1: several writes of one micro-batch (docs/protocol.md section 9.1) ---------------------------


def _values(config, reader, topic: str) -> list[int]:
    return sorted(int(v) for p in _partitions(config, topic) for v in _log(reader, topic, p))


def _foreach_batch_query(spark, write, checkpoint: Path, rows: int):
    query = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", rows).load()
             .select(F.col("value").cast("string").alias("value"))
             .writeStream.foreachBatch(write).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination(180)
    except Exception:  # noqa: BLE001 - the query's own failure: query.exception() holds it
        pass
    return query


def test_foreach_batch_writing_two_topics_commits_both(spark, config, reader, tmp_path):
    """Spark's canonical foreachBatch: the evens to one topic, every row to another."""
    options = _options(config)

    def to_both(df, batch_id):
        write_batch(topic="evens", **options)(df.filter(F.col("value").cast("long") % 2 == 0), batch_id)
        write_batch(topic="all", **options)(df, batch_id)

    query = _foreach_batch_query(spark, to_both, tmp_path / "ck", 200)
    assert query.exception() is None
    assert _values(config, reader, "all") == list(range(200))
    assert _values(config, reader, "evens") == list(range(0, 200, 2))


def test_foreach_batch_empty_then_filtered_writes_to_one_topic_exactly_once_across_a_replay(
        spark, config, reader, tmp_path):
    """One topic, three writes per micro-batch: an empty one, then the odds, then the evens. The
    first run fails inside the batch after its writes; the restart replays the batch (same
    writes, same order) and commits nothing twice."""
    options = _options(config)
    crashed = tmp_path / "crashed"

    def split(df, batch_id):
        value = F.col("value").cast("long")
        write_batch(topic="split", **options)(df.filter(F.lit(False)), batch_id)
        write_batch(topic="split", **options)(df.filter(value % 2 == 1), batch_id)
        write_batch(topic="split", **options)(df.filter(value % 2 == 0), batch_id)
        if not crashed.exists():
            crashed.touch()
            raise RuntimeError("the driver fails after the batch's writes")

    first = _foreach_batch_query(spark, split, tmp_path / "ck", 150)
    assert first.exception() is not None and "after the batch's writes" in str(first.exception())
    assert _values(config, reader, "split") == list(range(150))
    again = _foreach_batch_query(spark, split, tmp_path / "ck", 150)
    assert again.exception() is None
    batches = [p["batchId"] for p in again.recentProgress]
    assert batches[0] == 0  # batch 0 again: a replay (then the run may go on to the next batch)
    assert _values(config, reader, "split") == list(range(150 * (batches[-1] + 1)))  # each row once


def test_a_batch_write_naming_a_sink_needs_a_batch_id(spark, config):
    df = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(PySparkException, match=r"llog\.sink\.id.*llog\.sink\.batch\.id"):
        df.write.format("llog").options(**_options(config)).option("topic", "named").option("llog.sink.id", "s1") \
            .mode("append").save()
    assert _partitions(config, "named") == []
