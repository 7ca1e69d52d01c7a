"""The sink reads the topic's record afresh for every write: Spark reuses its Python workers, and
one that looked the topic up before an earlier write (committed in another worker) created it
must not place the next write's rows by the default partition count."""

from __future__ import annotations

import pytest

from llog.coordination import Coordination
from llog.discovery import topic_partitions
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
