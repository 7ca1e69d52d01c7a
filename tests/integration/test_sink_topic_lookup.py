"""The sink reads the topic's record afresh for every write: Spark reuses its Python workers, and
one that looked the topic up before an earlier write (committed in another worker) created it,
or before the topic grew, must not place the next write's rows by an old partition count."""

from __future__ import annotations

import pytest

from llog.coordination import Coordination
from llog.discovery import topic_partitions
from llog.topics import alter_topic
from jobs.local_spark import local_spark


@pytest.fixture(scope="module")
def spark():
    session = local_spark("llog-sink-topic-lookup-tests")
    yield session
    session.stop()


def test_a_write_after_the_one_that_created_the_topic_uses_its_count(spark, config, reader):
    options = {k.lower(): v for k, v in config.to_options().items()}
    assert config.default_partitions != 3
    for attempt, partitions in enumerate(("3", None, None)):
        writer = (spark.createDataFrame([(f"k{i}", f"{attempt}/{i}") for i in range(300)], "key string, value string")
                  .write.format("llog").options(**options).option("topic", "looked_up").mode("append"))
        (writer.option("partitions", partitions) if partitions else writer).save()
    with Coordination(config) as coordination:
        assert topic_partitions(coordination, config.root_prefix, "looked_up") == [0, 1, 2]
    values = [r.value for p in range(3) for r in reader.read_range("looked_up", p, 1)]
    assert sorted(values) == sorted(f"{a}/{i}".encode() for a in range(3) for i in range(300))


def test_a_write_after_the_topic_grew_uses_the_new_count(spark, config, reader):
    """The cached record (30 s) of the writes before says 2 partitions; the topic now has 5. A
    write placed by 2 would be refused at commit (PartitionCountMismatch)."""
    options = {k.lower(): v for k, v in config.to_options().items()}

    def write(attempt: int) -> None:
        (spark.createDataFrame([(f"k{i}", f"{attempt}/{i}") for i in range(300)], "key string, value string")
         .write.format("llog").options(**options).option("topic", "grown").mode("append").save())

    (spark.createDataFrame([("k", "0/0")], "key string, value string").write.format("llog").options(**options)
     .option("topic", "grown").option("partitions", "2").mode("append").save())
    write(1)  # looks the topic up: 2 partitions, cached in the worker
    with Coordination(config) as coordination:
        alter_topic(coordination, config.root_prefix, "grown", partitions=5)
    write(2)
    placed = {p: [r.value for r in reader.read_range("grown", p, 1)] for p in range(5)}
    assert sorted(v for values in placed.values() for v in values if v.startswith(b"2/")) == sorted(
        f"2/{i}".encode() for i in range(300))
    assert all(any(v.startswith(b"2/") for v in placed[p]) for p in range(5))  # 300 keys over all 5
