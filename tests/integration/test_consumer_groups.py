"""Consumer-group offsets (docs/protocol.md section 9): commits by CAS, only forward; `llog groups
reset` for the deliberate move back. On real Oxia."""

from __future__ import annotations

import json
import threading

import pytest

from llog.consumer_groups import commit_offsets, committed_offsets, describe_group, reset_offsets
from llog.errors import InvalidOffset, PartitionNotInitialized, TopicNotFound
from llog.keys import TopicPartition
from llog.writer import AppendGroup
from llog_tools.cli import main

A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)


def _offsets(writer, config, group: str, partitions=(A0, A1)) -> dict[TopicPartition, int]:
    found = committed_offsets(writer.coordination, config.root_prefix, group, partitions)
    return {tp: o.offset for tp, o in found.items()}


@pytest.fixture
def log(writer):
    """a[0] with 10 records, a[1] with 4."""
    writer.append_shared([AppendGroup("a", 0, [b"x"] * 10), AppendGroup("a", 1, [b"y"] * 4)])
    return writer


def test_commits_move_forward_and_a_late_commit_does_not_move_a_group_back(config, log):
    c, root = log.coordination, config.root_prefix
    assert commit_offsets(c, root, "g", {A0: 3, A1: 2}) == {A0: 3, A1: 2}
    assert commit_offsets(c, root, "g", {A0: 8}) == {A0: 8}
    # A straggler commits what it had read before: nothing moves back.
    late = commit_offsets(c, root, "g", {A0: 5, A1: 2})
    assert _offsets(log, config, "g") == {A0: 8, A1: 2}
    assert late == {}
    assert [(r.partition, r.committed_offset, r.lag) for r in describe_group(c, root, "g")] == [(0, 8, 3), (1, 2, 3)]


def test_concurrent_committers_end_at_the_highest_offset(config, log):
    c, root, errors = log.coordination, config.root_prefix, []

    def commit(offsets):
        try:
            for offset in offsets:
                commit_offsets(c, root, "race", {A0: offset, A1: min(offset, 5)})
        except Exception as e:  # noqa: BLE001 - any failure is the finding
            errors.append(e)

    threads = [threading.Thread(target=commit, args=(range(start, 11, 3),)) for start in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and _offsets(log, config, "race") == {A0: 10, A1: 5}


def test_reset_moves_a_group_to_earliest_latest_or_given_offsets(config, log):
    c, root = log.coordination, config.root_prefix
    commit_offsets(c, root, "g", {A0: 8, A1: 3})
    assert reset_offsets(c, root, "g", "earliest") == {A0: 1, A1: 1}
    assert _offsets(log, config, "g") == {A0: 1, A1: 1}
    assert reset_offsets(c, root, "g", "latest", topics=["a"]) == {A0: 11, A1: 5}
    assert sum(r.lag for r in describe_group(c, root, "g")) == 0
    assert reset_offsets(c, root, "g", '{"a": {"0": 4, "1": -2}}') == {A0: 4, A1: 1}
    assert reset_offsets(c, root, "g", '{"a": {"0": 2}}', dry_run=True) == {A0: 2}
    assert _offsets(log, config, "g") == {A0: 4, A1: 1}  # the dry run set nothing
    # JSON may name a partition the group has not committed yet.
    assert reset_offsets(c, root, "new", '{"a": {"1": -1}}') == {A1: 5}


def test_reset_applies_to_the_topics_named(config, log):
    c, root = log.coordination, config.root_prefix
    log.append_shared([AppendGroup("b", 0, [b"z"] * 3)])
    commit_offsets(c, root, "g", {A0: 8, A1: 3, B0: 2})
    assert reset_offsets(c, root, "g", "latest", topics=["b"]) == {B0: 4}
    assert reset_offsets(c, root, "g", '{"a": {"0": 1}, "b": {"0": 1}}', topics=iter(["a"])) == {A0: 1}
    assert _offsets(log, config, "g", (A0, A1, B0)) == {A0: 1, A1: 3, B0: 4}
    with pytest.raises(TopicNotFound, match="'nosuch' does not exist"):
        reset_offsets(c, root, "g", "earliest", topics=["b", "nosuch"])
    with pytest.raises(TopicNotFound, match="'nosuch' does not exist"):
        commit_offsets(c, root, "g", {B0: 1, TopicPartition("nosuch", 0): 1})
    assert _offsets(log, config, "g", (A0, A1, B0)) == {A0: 1, A1: 3, B0: 4}


@pytest.mark.parametrize("to, error, message", [
    ("soon", InvalidOffset, "--to must be earliest, latest or JSON"),
    ('{"a": [1]}', InvalidOffset, "topic 'a' needs an object of partition to offset"),
    ('{"a": {"x": 1}}', InvalidOffset, "partition 'x' of topic 'a' is not a number"),
    ('{"a": {"0": 0}}', InvalidOffset, "offset 0 of a\\[0\\] must be an offset >= 1"),
    ('{"a": {"0": 12}}', InvalidOffset, "a\\[0\\]: offset 12 is outside 1..11"),
    ('{"a": {"70": 1}}', PartitionNotInitialized, "a\\[70\\] is not initialized"),
])
def test_bad_resets_name_the_problem_and_change_nothing(config, log, to, error, message):
    commit_offsets(log.coordination, config.root_prefix, "g", {A0: 5})
    with pytest.raises(error, match=message):
        reset_offsets(log.coordination, config.root_prefix, "g", to)
    assert _offsets(log, config, "g") == {A0: 5}


@pytest.fixture
def cli_env(config, monkeypatch):
    monkeypatch.setenv("LLOG_SETTINGS_FILE", "/nonexistent")
    for name, value in config.to_options().items():
        monkeypatch.setenv(name, value)


def test_cli_groups_reset(cli_env, config, log, capsys):
    commit_offsets(log.coordination, config.root_prefix, "cli", {A0: 9, A1: 4})
    assert main(["groups", "reset", "cli", "--to", "earliest", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("group cli: would reset 2 partition(s)") and "NEW_OFFSET" in out
    assert _offsets(log, config, "cli") == {A0: 9, A1: 4}
    assert main(["groups", "reset", "cli", "--to", '{"a": {"0": 2}}', "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"topic": "a", "partition": 0, "offset": 2}]
    assert _offsets(log, config, "cli") == {A0: 2, A1: 4}
    assert main(["groups", "reset", "cli", "--to", "later"]) == 1
    assert "--to must be earliest, latest or JSON" in capsys.readouterr().err
