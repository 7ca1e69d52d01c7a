"""Pinned sink batches of any size, and Oxia value sizes (docs/protocol.md sections 2, 9.1, 9.2):
a batch of 25,600 slices (200 tasks x 128 partitions) or ten times that pins, replays, commits
and is read by GC; a value over the budget is refused before it is sent; GC is not wedged by a
pinned record it cannot read, and the operator can remove such a record."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from llog.coordination import Coordination
from llog.errors import ObjectNotFound
from llog.gc import gc_pass
from llog.keys import partition_keys
from llog.objects import ObjectStore
from llog.reader import LogReader
from llog.sink_batches import SINKS_PARTITION_KEY, pin_batch, sink_batch_key, unpin_unreadable
from llog.topics import create_topic, read_topic
from llog.writer import AppendGroup, LogWriter, SinkBatch, stage
from llog_tools.cli import main as llog_main
from tests.helpers.clocks import past_the_lag

PARTITIONS = 128
TASKS = 200


@pytest.fixture
def objects(config):
    store = ObjectStore(config)
    yield store
    store.close()


def _stage_wide(config, objects, topics: list[str]) -> list:
    """Each of :data:`TASKS` tasks stages one blob with one record for every partition of
    ``topics``: ``TASKS x len(topics) x PARTITIONS`` slices, in task order."""
    def task(t: int):
        return stage(objects, config, [AppendGroup(topic, p, [f"{topic}-{p}-{t}".encode()])
                                       for topic in topics for p in range(PARTITIONS)])
    with ThreadPoolExecutor(16) as pool:
        return [s for slices in pool.map(task, range(TASKS)) for s in slices]


@pytest.mark.parametrize("topics", [1, 10], ids=["25600-slices", "256000-slices"])
def test_a_pin_of_any_slice_count_commits_replays_and_gc_reads_it(config, objects, topics):
    names = [f"wide{i}" for i in range(topics)]
    with Coordination(config) as coordination:
        for name in names:
            create_topic(coordination, config.root_prefix, name, PARTITIONS)
        slices = _stage_wide(config, objects, names)
        assert len(slices) == TASKS * PARTITIONS * topics
        with LogWriter(config) as writer:
            pinned = pin_batch(coordination, objects, config, "wide-sink", 0, slices, writer.clock)
            assert pinned == slices
            found = coordination.get(sink_batch_key(config.root_prefix, "wide-sink"), SINKS_PARTITION_KEY)
            assert len(found.value) < 64 * 1024  # the record is small, whatever the cut
            report = gc_pass(coordination, objects, config.root_prefix, config.gc_grace_ms, clock=past_the_lag())
            assert report.deleted == 0 and report.referenced >= TASKS  # every staged blob is pinned
            replay = pin_batch(coordination, objects, config, "wide-sink", 0, slices[::-1], writer.clock)
            assert replay == slices  # the pinned cut, read back
            if topics == 1:  # committing 256,000 slices adds nothing the smaller batch does not show
                writer.commit_staged(replay, SinkBatch("wide-sink", 0))
    if topics == 1:
        with LogReader(config) as reader:
            assert [reader.high_watermark("wide0", p) for p in range(PARTITIONS)] == [TASKS] * PARTITIONS


def test_a_value_over_the_budget_is_refused_before_it_is_sent(config):
    from llog.coordination import MAX_VALUE_BYTES
    from llog.errors import ValueTooLarge

    key = f"{config.root_prefix}/too-big"
    with Coordination(config) as coordination:
        puts = coordination.stats["put"]
        for attempt in (lambda v: coordination.put(key, v, "sinks"),
                        lambda v: coordination.put_many([(key, v, "sinks", None)])):
            with pytest.raises(ValueTooLarge, match=rf"{key}: .*{MAX_VALUE_BYTES + 1} bytes.*{MAX_VALUE_BYTES}"):
                attempt(b"x" * (MAX_VALUE_BYTES + 1))
        assert coordination.stats["put"] == puts and coordination.get(key, "sinks") is None
        coordination.put(key, b"x" * MAX_VALUE_BYTES, "sinks")  # at the budget: written, and read back
        assert len(coordination.get(key, "sinks").value) == MAX_VALUE_BYTES


def test_gc_with_an_unreadable_pin_collects_what_is_safe_names_it_and_the_operator_removes_it(
        config, objects, monkeypatch):
    monkeypatch.setenv("LLOG_SETTINGS_FILE", "/nonexistent")
    for name, value in config.to_options().items():
        monkeypatch.setenv(name, value)
    with Coordination(config) as coordination:
        create_topic(coordination, config.root_prefix, "t", 1)
        topic_id = read_topic(coordination, config.root_prefix, "t").record.topic_id
        orphan_wal = stage(objects, config, [AppendGroup("t", 0, [b"never committed"])])[0].wal_uri
        orphan_compacted = objects.put(partition_keys(config.root_prefix, "t", 0, topic_id).compacted_object(),
                                       b"a compactor died before its record")
        key = sink_batch_key(config.root_prefix, "broken")
        coordination.put(key, b'{"sink_id": "broken", "batch_id": 3, "slices": [{"topic": ', SINKS_PARTITION_KEY)
        report = gc_pass(coordination, objects, config.root_prefix, config.gc_grace_ms, clock=past_the_lag())
        assert report.unreadable_pins == [key]
        assert orphan_compacted in report.deleted_uris  # a pin never references a compacted blob
        assert orphan_wal not in report.deleted_uris and objects.get(orphan_wal)  # the pin may reference it
        assert llog_main(["sinks", "unpin", "broken"]) == 0
        assert coordination.get(key, SINKS_PARTITION_KEY) is None
        assert orphan_wal in gc_pass(coordination, objects, config.root_prefix, config.gc_grace_ms,
                                     clock=past_the_lag()).deleted_uris


def test_a_pin_whose_cut_object_is_gone_is_unreadable_not_a_wedge(config, objects):
    """A record naming a cut object that no longer exists: GC names it and keeps every WAL blob;
    the sink's own next commit of that batch fails loudly (it cannot know the pinned cut)."""
    with Coordination(config) as coordination:
        names = ["wide0"]
        create_topic(coordination, config.root_prefix, "wide0", PARTITIONS)
        slices = _stage_wide(config, objects, names)[:PARTITIONS * 50]  # 6,400 slices: over the inline limit
        with LogWriter(config) as writer:
            pin_batch(coordination, objects, config, "gone", 0, slices, writer.clock)
            key = sink_batch_key(config.root_prefix, "gone")
            cut_uri = json.loads(coordination.get(key, SINKS_PARTITION_KEY).value)["cut_uri"]
            objects.delete_many([cut_uri])
            report = gc_pass(coordination, objects, config.root_prefix, config.gc_grace_ms, clock=past_the_lag())
            assert report.unreadable_pins == [key] and report.deleted == 0
            with pytest.raises(ObjectNotFound):
                pin_batch(coordination, objects, config, "gone", 0, slices, writer.clock)
            assert unpin_unreadable(coordination, objects, config.root_prefix, "gone").endswith(
                f"deleted (it could not be read: object {cut_uri} does not exist)")
