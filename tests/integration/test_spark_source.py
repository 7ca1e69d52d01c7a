"""spark.read / spark.readStream .format("llog") from real Spark (local mode) over real Oxia and
S3 (versitygw)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyspark.errors import PySparkException

from llog.consumer_groups import describe_group
from llog.coordination import Coordination
from llog.objects import ObjectStore
from llog.records import ControlRecord, IndexEntry
from llog.topics import alter_topic, create_topic
from llog_source.lag import offsets_behind_latest
from tests.helpers import writer_process
from jobs.local_spark import local_spark

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def spark():
    session = local_spark("llog-source-tests")
    yield session
    session.stop()


def _options(config) -> dict[str, str]:
    return {k.lower(): v for k, v in config.to_options().items()}


def _read(spark, config, **options):
    return spark.read.format("llog").options(**_options(config)).options(**options).load()


def _fill(writer, topic: str, partitions: int, appends: int, records: int) -> dict[int, list[bytes]]:
    """``appends`` appends of ``records`` records to each partition of ``topic`` (created with
    ``partitions`` partitions if new); the values per partition."""
    create_topic(writer.coordination, writer.config.root_prefix, topic, partitions, if_not_exists=True)
    values = {p: [] for p in range(partitions)}
    for a in range(appends):
        for p in range(partitions):
            batch = [f"{topic}/{p}/{a}/{i}".encode() for i in range(records)]
            writer.append(topic, p, batch)
            values[p] += batch
    return values


def _rows(df) -> dict[int, list[tuple[int, bytes]]]:
    out: dict[int, list[tuple[int, bytes]]] = {}
    for r in df.orderBy("partition", "offset").collect():
        out.setdefault(r.partition, []).append((r.offset, bytes(r.value)))
    return out


def test_batch_read_returns_every_record_with_kafkas_columns(spark, config, writer):
    values = _fill(writer, "orders", 3, 3, 200)
    df = _read(spark, config, topics="orders")
    assert df.schema.simpleString() == ("struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
                                        "timestamp:timestamp,timestampType:int>")
    assert _rows(df) == {p: list(enumerate(v, start=1)) for p, v in values.items()}
    with Coordination(config) as coordination:
        keys = writer.keys("orders", 1)
        entry = IndexEntry.from_json(coordination.get(keys.index(400), keys.partition_key).value)
    row = df.where("partition = 1 and offset = 400").collect()[0]
    assert row.topic == "orders" and row.timestampType == 1
    assert int(row.timestamp.timestamp() * 1000) == entry.created_at_ms


def test_batch_offsets_assign_and_pattern(spark, config, writer):
    a = _fill(writer, "pay.eu", 2, 2, 50)
    b = _fill(writer, "pay.us", 1, 1, 30)
    _fill(writer, "other", 1, 1, 5)
    ranged = _read(spark, config, topics="pay.eu", startingOffsets='{"pay.eu": {"0": 11, "1": -2}}',
                   endingOffsets='{"pay.eu": {"0": 21, "1": -1}}')
    assert _rows(ranged) == {0: list(enumerate(a[0][10:20], start=11)), 1: list(enumerate(a[1], start=1))}
    assigned = _read(spark, config, assign='{"pay.eu": [1], "pay.us": [0]}')
    assert {(r.topic, r.partition) for r in assigned.select("topic", "partition").distinct().collect()} == {
        ("pay.eu", 1), ("pay.us", 0)}
    assert assigned.count() == len(a[1]) + len(b[0])
    pattern = _read(spark, config, topicPattern=r"pay\..*")
    assert pattern.count() == len(a[0]) + len(a[1]) + len(b[0])
    assert _read(spark, config, topicPattern="nothing.*").count() == 0


def test_busy_partitions_split_at_index_entries(spark, config, writer):
    _fill(writer, "big", 2, 6, 100)  # 6 entries of 100 per partition
    assert _read(spark, config, topics="big").rdd.getNumPartitions() == 2
    df = _read(spark, config, topics="big", minPartitions="6")
    assert df.rdd.getNumPartitions() == 6  # 200-record shares, cut at entry ends
    assert df.count() == 1200 and df.select("partition", "offset").distinct().count() == 1200
    assert _read(spark, config, topics="big", maxRecordsPerPartition="250").rdd.getNumPartitions() == 6


LOAD_ERRORS = {
    "unknown topic": ({"topics": "nosuch"}, "unknown topic 'nosuch'"),
    "topics and assign": ({"topics": "orders", "assign": '{"orders": [0]}'}, "exactly one of the options"),
    "malformed offsets": ({"topics": "orders", "startingOffsets": '{"orders": {"0": 1'}, "is not valid JSON"),
    "negative limit": ({"topics": "orders", "maxOffsetsPerTrigger": "-1"}, "maxOffsetsPerTrigger must be a positive"),
    "unknown partition": ({"assign": '{"orders": [7]}'}, "unknown partition\\(s\\) orders\\[7\\]"),
    "offsets miss a partition": ({"topics": "orders", "startingOffsets": '{"orders": {"0": 1}}'},
                                 "but not for orders\\[1\\]"),
}


@pytest.mark.parametrize("case", list(LOAD_ERRORS))
def test_bad_options_fail_at_load_with_a_clear_error(spark, config, writer, case):
    _fill(writer, "orders", 2, 1, 1)
    options, message = LOAD_ERRORS[case]
    if case == "offsets miss a partition":  # needs Oxia: fails when the read is planned
        with pytest.raises(PySparkException, match=message):
            _read(spark, config, **options).collect()
        return
    for load in (spark.read, spark.readStream):
        with pytest.raises(PySparkException, match=message):
            load.format("llog").options(**_options(config)).options(**options).load()


def test_a_user_schema_is_rejected(spark, config, writer):
    _fill(writer, "orders", 1, 1, 1)
    with pytest.raises(PySparkException, match="fixed schema"):
        spark.read.format("llog").schema("value string").options(**_options(config)).option("topics", "orders").load().collect()


def _stream(spark, config, **options):
    return spark.readStream.format("llog").options(**_options(config)).options(**options).load()


class _Batches:
    """A foreachBatch sink that keeps every batch's rows: ``[(batch_id, [(topic, partition,
    offset, value)])]``, and runs ``hook(batch_id)`` after each."""

    def __init__(self, hook=None):
        self.batches, self.hook = [], hook

    def __call__(self, df, batch_id):
        rows = [(r.topic, r.partition, r.offset, bytes(r.value)) for r in df.collect()]
        self.batches.append((batch_id, rows))
        if self.hook:
            self.hook(batch_id)

    def rows(self):
        return [row for _, rows in self.batches for row in rows]


def _in_order_once(rows, topic, partition, values):
    """``rows`` (in arrival order) hold exactly offsets 1..n of the partition, in order."""
    got = [(o, v) for t, p, o, v in rows if (t, p) == (topic, partition)]
    assert got == list(enumerate(values, start=1))


def _wait_for(condition, query, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert query.exception() is None
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_stream_tails_appends_in_order_once(spark, config, writer, tmp_path):
    values = _fill(writer, "tail", 2, 1, 100)
    sink = _Batches()
    query = (_stream(spark, config, topics="tail", startingOffsets="earliest").writeStream.foreachBatch(sink)
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="200 milliseconds").start())
    try:
        for round_ in range(4):
            _wait_for(lambda: len(sink.rows()) == sum(map(len, values.values())), query)
            more = _fill(writer, "tail", 2, 1, 50 + round_)  # appended while the query runs
            for p in more:
                values[p] += more[p]
        _wait_for(lambda: len(sink.rows()) >= sum(map(len, values.values())), query)
    finally:
        query.stop()
    for p in values:
        _in_order_once(sink.rows(), "tail", p, values[p])
    assert len(sink.batches) >= 5  # it tailed, batch after batch


def test_limit_bounds_every_batch_and_available_now_stops_at_the_start_time_end(spark, config, writer, tmp_path):
    values = _fill(writer, "capped", 3, 2, 100)

    def append_during_the_run(batch_id):
        if batch_id == 0:
            writer.append("capped", 0, [b"late"] * 50)  # after the run began: not read by it

    sink = _Batches(append_during_the_run)
    query = (_stream(spark, config, topics="capped", startingOffsets="earliest", maxOffsetsPerTrigger="130")
             .writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(180)
    assert query.exception() is None
    sizes = [len(rows) for _, rows in sink.batches]
    assert max(sizes) <= 130 and sum(sizes) == 600 and len(sizes) == 5
    for p in values:
        _in_order_once(sink.rows(), "capped", p, values[p])
    progress = query.recentProgress[-1]["sources"][0]
    topic_id = writer.topics.get("capped").topic_id  # offsets name their incarnation (protocol 12.6)
    assert json.loads(progress["endOffset"]) == {"capped": {"0": 201, "1": 201, "2": 201, "topic_id": topic_id}}
    assert offsets_behind_latest(progress)["maxOffsetsBehindLatest"] == 0


def test_pattern_discovers_new_topics_and_partitions_from_earliest(spark, config, writer, tmp_path):
    _fill(writer, "disc.a", 1, 1, 10)
    sink = _Batches()
    query = (_stream(spark, config, topicPattern=r"disc\..*").writeStream.foreachBatch(sink)  # startingOffsets latest
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="200 milliseconds").start())
    try:
        _wait_for(lambda: query.recentProgress, query)
        new_topic = _fill(writer, "disc.b", 1, 1, 7)[0]
        alter_topic(writer.coordination, config.root_prefix, "disc.a", partitions=4)  # partitions 1..3 are new
        writer.append("disc.a", 3, [b"p3-1", b"p3-2"])
        _wait_for(lambda: len(sink.rows()) >= 9, query)
    finally:
        query.stop()
    rows = sink.rows()
    _in_order_once(rows, "disc.b", 0, new_topic)
    _in_order_once(rows, "disc.a", 3, [b"p3-1", b"p3-2"])
    assert not [r for r in rows if r[:2] == ("disc.a", 0)]  # it started at latest


def _lag(config, group):
    with Coordination(config) as coordination:
        return {(r.topic, r.partition): r.lag for r in describe_group(coordination, config.root_prefix, group)}


def test_group_commits_and_lag_goes_to_zero(spark, config, writer, tmp_path):
    _fill(writer, "grouped", 2, 3, 100)
    lags = []
    sink = _Batches(lambda batch_id: lags.append(sum(_lag(config, "billing").values())))
    query = (_stream(spark, config, topics="grouped", startingOffsets="earliest", maxOffsetsPerTrigger="200",
                     groupId="billing")
             .writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(180) and query.exception() is None
    # While batch n runs, the group has committed up to the end of batch n-1.
    assert lags == [600, 400, 200]
    env = {**os.environ, "LLOG_SETTINGS_FILE": "/nonexistent", **config.to_options()}
    out = subprocess.run([sys.executable, "-m", "llog_tools", "groups", "describe", "billing"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "total lag 0" in out.stdout
    # Kafka's vocabulary: a caught-up group's current offset is the log-end offset (the next to be written).
    assert out.stdout.splitlines()[1].split() == ["TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-START-OFFSET",
                                                  "LOG-END-OFFSET", "LAG"]
    assert [line.split() for line in out.stdout.splitlines()[2:]] == [
        ["grouped", "0", "301", "1", "301", "0"], ["grouped", "1", "301", "1", "301", "0"]]


def test_reads_see_a_pending_append(spark, config, writer):
    _fill(writer, "t", 2, 1, 10)
    proc = writer_process.start(config, "crashed", "t", [0, 1], 1, 5, "writer.after_reserve")
    proc.communicate(timeout=120)
    assert proc.returncode == -9  # killed after the reserving CAS: pending set, no index entry
    with Coordination(config) as coordination:
        keys = writer.keys("t", 0)
        control = ControlRecord.from_json(coordination.get(keys.control, keys.partition_key).value)
    assert control.pending is not None and control.high_watermark == 15
    rows = _rows(_read(spark, config, topics="t"))
    assert rows[0][10:] == [(11 + i, writer_process.record_value("crashed", 0, 0, i)) for i in range(5)]
    assert [o for o, _ in rows[1]] == list(range(1, 16))


def test_fail_on_data_loss(spark, config, writer):
    values = _fill(writer, "lossy", 1, 3, 10)
    with Coordination(config) as coordination:
        keys = writer.keys("lossy", 0)
        lost = IndexEntry.from_json(coordination.get(keys.index(20), keys.partition_key).value)
    objects = ObjectStore(config)
    try:
        objects.delete_many([lost.data_key])
    finally:
        objects.close()
    with pytest.raises(PySparkException, match="offsets 11..20 of lossy\\[0\\].*does not exist.*failOnDataLoss=false"):
        _read(spark, config, topics="lossy").collect()
    rows = _rows(_read(spark, config, topics="lossy", failOnDataLoss="false"))
    assert rows[0] == list(enumerate(values[0][:10], start=1)) + list(enumerate(values[0][20:], start=21))
