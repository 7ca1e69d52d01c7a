"""Partition discovery, ``llog describe`` and the CLI, on real Oxia and the S3 server."""

from __future__ import annotations

import json

import pytest

from llog.clock import ShiftedClock
from llog.compactor import Compactor
from llog.consumer_groups import commit_offsets
from llog.control import initialize_partition
from llog.describe import describe_topic
from llog.discovery import list_topics, partitions_of, topic_partitions
from llog.topics import create_topic, delete_topic
from llog.fence import fence
from llog.keys import TopicPartition, partition_keys
from llog.config import Config
from llog.writer import LogWriter
from llog_tools.cli import main
from tests.helpers.retention import record_only


def test_discovery_finds_exactly_the_topics_partitions(config, writer):
    c, root = writer.coordination, config.root_prefix
    # "10" sorts between "1" and "2"; "orders2" and "order" share a prefix with "orders". Topics
    # whose create stopped after the record, partitions then initialized one by one: some
    # numbers are missing.
    for topic, count in (("orders", 22), ("orders2", 4), ("order", 5), ("empty", 1)):
        record_only(c, root, topic, count)
    for topic, partition in [("orders", p) for p in (0, 1, 2, 7, 10, 21)] + [("orders2", 3), ("order", 4)]:
        assert writer.initialize_partition(topic, partition)
    # A topic record sorts among the per-partition keys; a topic named "topics" is still found.
    create_topic(c, root, "topics", 2)
    # Neither a deleted topic nor keys of an earlier incarnation of a live one count.
    create_topic(c, root, "gone", 1)
    delete_topic(c, writer.objects, root, "gone")
    initialize_partition(c, partition_keys(root, "orders", 3, "an-earlier-topic-id"))
    assert topic_partitions(c, root, "orders") == [0, 1, 2, 7, 10, 21]
    assert topic_partitions(c, root, "orders2") == [3]
    assert topic_partitions(c, root, "empty") == []
    assert topic_partitions(c, root, "gone") == topic_partitions(c, root, "nothing") == []
    assert list_topics(c, root) == ["empty", "order", "orders", "orders2", "topics"]  # every record
    assert [(k.tp.topic, k.tp.partition, k.topic_id) for k in partitions_of(c, root)] == [
        (t, p, writer.keys(t, p).topic_id) for t, ps in (("order", [4]), ("orders", [0, 1, 2, 7, 10, 21]),
                                                          ("orders2", [3]), ("topics", [0, 1])) for p in ps]
    assert [str(k.tp) for k in partitions_of(c, root, ["orders2", "gone", "nothing"])] == ["orders2[3]"]


def test_describe_reports_state_high_watermark_entries_cursor(config, writer):
    create_topic(writer.coordination, config.root_prefix, "t", 2)
    for _ in range(3):
        writer.append("t", 0, [b"a", b"b"])
    writer.append("t", 1, [b"c"])
    fence(writer.coordination, writer.keys("t", 1))
    rows = {r.partition: r for r in describe_topic(writer.coordination, config.root_prefix, "t")}
    assert sorted(rows) == [0, 1]
    assert (rows[0].log_state, rows[0].high_watermark, rows[0].index_entries, rows[0].wal_entries) == ("OPEN", 6, 3, 3)
    assert (rows[1].log_state, rows[1].high_watermark, rows[1].compaction_cursor, rows[1].pending) == ("FENCED", 1, 1, None)


@pytest.fixture
def cli_env(config, monkeypatch):
    monkeypatch.setenv("LLOG_SETTINGS_FILE", "/nonexistent")
    for name, value in config.to_options().items():
        monkeypatch.setenv(name, value)


def test_cli_produce_consume_describe_fence(cli_env, tmp_path, capsys):
    lines = tmp_path / "lines.txt"
    lines.write_text("first\nsecond\nthird\n")
    assert main(["topics", "create", "events", "--partitions", "3"]) == 0
    assert main(["produce", "events", "-p", "2", "--file", str(lines)]) == 0
    assert "wrote 3 record(s) at offsets 1..3" in capsys.readouterr().out

    assert main(["consume", "events", "-p", "2", "--offset", "2", "--print-offsets"]) == 0
    assert capsys.readouterr().out == "2\tsecond\n3\tthird\n"
    with LogWriter(Config.load()) as writer:  # a keyed record and a tombstone
        writer.append("events", 2, [b"v", None], keys=[b"k", b"gone"])
    assert main(["consume", "events", "-p", "2", "--offset", "3", "--print-keys"]) == 0
    assert capsys.readouterr().out == "null\tthird\nk\tv\ngone\tnull\n"

    assert main(["describe", "events", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["partition"], r["high_watermark"], r["index_entries"]) for r in rows] == [(0, 0, 0), (1, 0, 0), (2, 5, 2)]

    assert main(["fence", "events", "2"]) == 0
    assert main(["produce", "events", "-p", "2", "--file", str(lines)]) == 1
    assert "events[2] is FENCED" in capsys.readouterr().err
    assert main(["unfence", "events", "2"]) == 0


def test_cli_reports_bad_input_clearly(cli_env, capsys):
    assert main(["consume", "no/such", "-p", "0"]) == 1
    assert "invalid topic name 'no/such'" in capsys.readouterr().err
    assert main(["consume", "absent", "-p", "0"]) == 1
    assert "topic 'absent' does not exist" in capsys.readouterr().err


def test_cli_topics_create_list_describe_alter_retention_delete(cli_env, config, capsys):
    assert main(["topics", "create", "orders", "--partitions", "2", "--config", "retention.ms=3600000",
                 "--config", "compression.type=zstd"]) == 0
    assert "Created topic orders (2 partition(s)" in capsys.readouterr().out
    assert main(["topics", "create", "orders"]) == 1
    assert "topic 'orders' already exists" in capsys.readouterr().err
    assert main(["topics", "create", "orders", "--if-not-exists"]) == 0
    assert main(["topics", "create", "bad", "--config", "retention.ms=soon"]) == 1
    assert "retention.ms='soon' must be an integer >= -1" in capsys.readouterr().err
    capsys.readouterr()

    assert main(["topics", "list", "--json"]) == 0
    [listed] = json.loads(capsys.readouterr().out)
    assert (listed["topic"], listed["partitions"], listed["config"]) == ("orders", 2, {"retention.ms": 3600000,
                                                                                     "compression.type": "zstd"})
    assert listed["effective_config"]["retention.bytes"] == -1

    assert main(["topics", "alter", "orders", "--partitions", "4", "--delete-config", "compression.type"]) == 0
    assert "orders: 4 partition(s), config retention.ms=3600000" in capsys.readouterr().out
    assert main(["topics", "alter", "orders", "--partitions", "3"]) == 1
    assert "cannot become 3" in capsys.readouterr().err

    assert main(["topics", "describe", "orders"]) == 0
    out = capsys.readouterr().out
    assert "partitions=4" in out and "retention.ms=3600000" in out and "est. monthly cost" in out
    assert main(["retention", "--topic", "orders", "--json"]) == 0
    assert [r["log_start_offset"] for r in json.loads(capsys.readouterr().out)] == [1, 1, 1, 1]

    assert main(["topics", "delete", "orders"]) == 0
    assert "Deleted topic orders: 4 partition(s)" in capsys.readouterr().out
    assert main(["topics", "delete", "orders"]) == 1
    assert "topic 'orders' does not exist" in capsys.readouterr().err
    assert main(["topics", "delete", "orders", "--if-exists"]) == 0


def test_cli_consume_starts_at_the_log_start_and_names_removed_offsets(cli_env, config, writer, capsys):
    """docs/protocol.md section 10.3: without --offset, consume reads from the log start offset."""
    create_topic(writer.coordination, config.root_prefix, "kept", 1, {"retention.ms": 1000})
    writer.append("kept", 0, [b"old-1", b"old-2"])
    with Compactor(config, clock=ShiftedClock(3600)) as compactor:  # the entry is old now
        assert compactor.retain_partition("kept", 0).log_start_offset == 3
    writer.append("kept", 0, [b"new"])
    capsys.readouterr()
    assert main(["consume", "kept", "--print-offsets"]) == 0
    assert capsys.readouterr().out == "3\tnew\n"
    assert main(["consume", "kept", "--offset", "1"]) == 1
    assert "offsets 1..2 were removed by retention; readable offsets are 3..3" in capsys.readouterr().err


def test_cli_group_and_topic_lag_in_kafkas_vocabulary(cli_env, config, writer, capsys):
    """LOG-END-OFFSET is the next offset to be written and LAG = log end - current (committed)
    offset, as kafka-consumer-groups --describe prints them; llog describe shows every group's."""
    create_topic(writer.coordination, config.root_prefix, "lagged", 2)
    writer.append("lagged", 0, [b"a", b"b", b"c"])
    writer.append("lagged", 1, [b"d"])
    commit_offsets(writer.coordination, config.root_prefix, "caught-up",
                   {TopicPartition("lagged", 0): 4, TopicPartition("lagged", 1): 2})
    commit_offsets(writer.coordination, config.root_prefix, "behind", {TopicPartition("lagged", 0): 2})
    capsys.readouterr()

    assert main(["groups", "describe", "behind"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "group behind: 1 partition(s), total lag 2"
    assert [line.split() for line in lines[1:]] == [
        ["TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-START-OFFSET", "LOG-END-OFFSET", "LAG"],
        ["lagged", "0", "2", "1", "4", "2"]]
    assert main(["groups", "describe", "caught-up", "--json"]) == 0
    assert [(r["committed_offset"], r["high_watermark"], r["log_end_offset"], r["lag"])
            for r in json.loads(capsys.readouterr().out)] == [(4, 3, 4, 0), (2, 1, 2, 0)]

    assert main(["describe", "lagged"]) == 0
    out = capsys.readouterr().out
    partitions, groups = out.split("\n\n")
    assert partitions.splitlines()[1].split()[:4] == ["PARTITION", "STATE", "LOG-START-OFFSET", "LOG-END-OFFSET"]
    assert [line.split()[:4] for line in partitions.splitlines()[2:]] == [["0", "OPEN", "1", "4"],
                                                                          ["1", "OPEN", "1", "2"]]
    assert groups.splitlines()[0] == "consumer groups: 2, total lag: behind 2, caught-up 0"
    assert [line.split() for line in groups.splitlines()[1:]] == [
        ["GROUP", "PARTITION", "CURRENT-OFFSET", "LOG-START-OFFSET", "LOG-END-OFFSET", "LAG"],
        ["behind", "0", "2", "1", "4", "2"], ["caught-up", "0", "4", "1", "4", "0"], ["caught-up", "1", "2", "1", "2", "0"]]
