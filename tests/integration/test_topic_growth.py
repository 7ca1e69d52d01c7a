"""Topics created on first use grow (docs/protocol.md section 10.2) on real Oxia and S3: writers racing
to grow one topic all succeed and the count ends at the largest asked for; a topic record
written before ``auto_created`` existed reads as explicit and is not grown."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from llog.control import read_control
from llog.coordination import EXPECTED_ABSENT
from llog.errors import UnknownPartition
from llog.keys import TOPICS_PARTITION_KEY, topic_key
from llog.topics import create_topic, grow_topic, initialize_partitions, read_topic
from llog.writer import LogWriter
from tests.helpers.retention import current_keys


def test_writers_racing_to_grow_a_topic_all_succeed_and_the_count_is_the_largest(config, reader):
    """Eight writers, each its own process-like client (its own Oxia connection and topic cache),
    each appending to a partition past the count at the same moment: every append commits, the
    count ends at the highest partition + 1, and every partition below it is initialized."""
    config = config.replace(default_partitions=1)
    writers = [LogWriter(config, auto_initialize=True) for _ in range(8)]
    try:
        writers[0].append("raced", 0, [b"first"])  # created on first use, with 1 partition
        for w in writers:
            assert w.topics.get("raced").partitions == 1  # each caches the count before the race
        start = threading.Barrier(len(writers), timeout=60)

        def grow(i: int) -> int:
            start.wait()
            return writers[i].append("raced", 3 + 2 * i, [f"w{i}".encode()]).start_offset

        with ThreadPoolExecutor(len(writers)) as pool:
            assert list(pool.map(grow, range(len(writers)), timeout=120)) == [1] * len(writers)
        record = read_topic(writers[0].coordination, config.root_prefix, "raced").record
        assert (record.partitions, record.auto_created) == (3 + 2 * 7 + 1, True)
        c = writers[0].coordination
        controls = [read_control(c, current_keys(c, config.root_prefix, "raced", p)).record
                    for p in range(record.partitions)]
        assert {control.topic_id for control in controls} == {record.topic_id}
    finally:
        for w in writers:
            w.close()
    assert [[r.value for r in reader.read_range("raced", 3 + 2 * i, 1)] for i in range(8)] \
        == [[f"w{i}".encode()] for i in range(8)]


def test_growing_by_several_at_once_leaves_the_larger_count(config, writer):
    """grow_topic asked for less than the record has is the record as it is (a loser of the race)."""
    c, root = writer.coordination, config.root_prefix
    create_topic(c, root, "g", 2, auto_created=True)
    assert grow_topic(c, root, "g", 6, limit=10).partitions == 6
    before = read_topic(c, root, "g")
    assert grow_topic(c, root, "g", 4, limit=10) == before.record
    assert read_topic(c, root, "g").version == before.version  # nothing written
    with pytest.raises(UnknownPartition, match=r"g\[10\] does not exist: .* at most 10 partitions"):
        grow_topic(c, root, "g", 11, limit=10)


def test_a_record_without_auto_created_reads_as_explicit(config, writer, reader):
    """A record as v1.2 wrote it before the field existed (the exact keys create wrote): a write
    past its count is refused, whatever LLOG_AUTO_CREATE_TOPICS says, and it keeps its count."""
    c, root = writer.coordination, config.root_prefix
    old = {"topic": "old", "topic_id": "0b5d3c3e-5d29-4c4e-9d0a-6c1c2b8f0a11", "state": "ACTIVE", "partitions": 2,
           "config": {}, "created_at_ms": 1, "updated_at_ms": 1}
    c.put(topic_key(root, "old"), json.dumps(old).encode(), TOPICS_PARTITION_KEY, EXPECTED_ABSENT)
    record = read_topic(c, root, "old").record
    assert record.auto_created is False
    initialize_partitions(c, root, record, range(2))
    assert writer.append("old", 1, [b"ok"]).start_offset == 1
    with pytest.raises(UnknownPartition, match=r"old\[2\] does not exist: .* the topic was created explicitly"):
        writer.append("old", 2, [b"no"])
    assert json.loads(c.get(topic_key(root, "old"), TOPICS_PARTITION_KEY).value) == old  # not rewritten
    assert [r.value for r in reader.read_range("old", 1, 1)] == [b"ok"]
    with pytest.raises(UnknownPartition, match="created explicitly"):
        grow_topic(c, root, "old", 3, limit=10)



@pytest.mark.parametrize("other,wanted,final", [(10, 6, 10), (4, 6, 6)])
def test_a_growth_that_loses_its_cas_reads_again(config, writer, hooks, other, wanted, final):
    """Another writer grows the topic to ``other`` between this one's read and its CAS: the CAS
    conflicts, the record is read again, and it is the answer (it has enough) or is grown again."""
    c, root = writer.coordination, config.root_prefix
    create_topic(c, root, "g", 2, auto_created=True)

    def meanwhile():
        del hooks["topics.before_update_cas"]
        grow_topic(c, root, "g", other, limit=100)

    hooks["topics.before_update_cas"] = meanwhile
    conflicts = c.stats["cas_conflict"]
    assert grow_topic(c, root, "g", wanted, limit=100).partitions == final
    assert c.stats["cas_conflict"] == conflicts + 1 and "topics.before_update_cas" not in hooks
    record = read_topic(c, root, "g").record
    assert record.partitions == final
    assert {read_control(c, current_keys(c, root, "g", p)).record.topic_id for p in range(final)} == {record.topic_id}
