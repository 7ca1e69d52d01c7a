"""Partition discovery, ``llog describe`` and the CLI, on real Oxia and SeaweedFS."""

from __future__ import annotations

import json

import pytest

from llog.cli import main
from llog.describe import describe_topic
from llog.discovery import topic_partitions
from llog.fence import fence
from llog.config import Config
from llog.writer import AppendGroup, LogWriter


def test_discovery_finds_exactly_the_topics_partitions(config, writer):
    # "10" sorts between "1" and "2"; "orders2" and "order" share a prefix with "orders".
    writer.append_shared([AppendGroup("orders", p, [b"x"] * (p + 1)) for p in (0, 1, 2, 10, 21)]
                         + [AppendGroup("orders2", 3, [b"y"]), AppendGroup("order", 4, [b"z"])])
    writer.initialize_partition("orders", 7)  # initialized, never written
    assert topic_partitions(writer.coordination, config.root_prefix, "orders") == [0, 1, 2, 7, 10, 21]
    assert topic_partitions(writer.coordination, config.root_prefix, "orders2") == [3]
    assert topic_partitions(writer.coordination, config.root_prefix, "nothing") == []


def test_describe_reports_state_high_watermark_entries_cursor(config, writer):
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
    assert main(["produce", "events", "-p", "2", "--file", str(lines)]) == 0
    assert "wrote 3 record(s) at offsets 1..3" in capsys.readouterr().out

    assert main(["consume", "events", "-p", "2", "--offset", "2", "--print-offsets"]) == 0
    assert capsys.readouterr().out == "2\tsecond\n3\tthird\n"
    with LogWriter(Config.load()) as writer:  # a keyed record and a tombstone
        writer.append("events", 2, [b"v", None], keys=[b"k", b"gone"])
    assert main(["consume", "events", "-p", "2", "--offset", "3", "--print-keys"]) == 0
    assert capsys.readouterr().out == "null\tthird\nk\tv\ngone\tnull\n"

    assert main(["describe", "events", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert (row["partition"], row["high_watermark"], row["index_entries"]) == (2, 5, 2)

    assert main(["fence", "events", "2"]) == 0
    assert main(["produce", "events", "-p", "2", "--file", str(lines)]) == 1
    assert "events[2] is FENCED" in capsys.readouterr().err
    assert main(["unfence", "events", "2"]) == 0


def test_cli_reports_bad_input_clearly(cli_env, capsys):
    assert main(["consume", "no/such", "-p", "0"]) == 1
    assert "invalid topic name 'no/such'" in capsys.readouterr().err
    assert main(["consume", "absent", "-p", "0"]) == 1
    assert "absent[0] is not initialized" in capsys.readouterr().err
