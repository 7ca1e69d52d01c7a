"""Options of format("llog") reads and the driver's offset arithmetic: pure code, no servers."""

from __future__ import annotations

import pytest

from llog.keys import TopicPartition
from llog_source.lag import behind_latest, offsets_behind_latest
from llog_source.options import DEFAULT_MAX_RECORDS_PER_PARTITION, InvalidSourceOption, SourceOptions, Subscription
from llog_source.planning import PartitionOffsets as O
from llog_source.planning import (
    DataLossError, advance, cut, from_spark, rate_limit, resolve_positions, to_spark, topic_ids_of,
)

CONNECTION = {"llog.oxia.service.address": "127.0.0.1:1", "llog.s3.bucket": "b"}
A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)


def parse(streaming: bool | None = None, **options) -> SourceOptions:
    return SourceOptions.parse({**CONNECTION, **options}, streaming)


def test_defaults_follow_kafka():
    stream, batch = parse(True, topics="a"), parse(False, topics="a")
    assert stream.subscription == Subscription(topics=("a",))
    assert (stream.starting, batch.starting, batch.ending) == ("latest", "earliest", "latest")
    assert stream.fail_on_data_loss is True and stream.group_id is None
    assert stream.max_offsets_per_trigger is None and stream.min_partitions is None
    assert stream.max_records_per_partition == DEFAULT_MAX_RECORDS_PER_PARTITION


def test_every_option_parsed_case_insensitively():
    o = parse(True, TOPICPATTERN="or.*", startingoffsets="EARLIEST", maxOffsetsPerTrigger="500",
              minPartitions="4", maxRecordsPerPartition="1000", failOnDataLoss="False", groupId="g-1")
    assert o.subscription.pattern == "or.*" and o.subscription.matches("orders") and not o.subscription.matches("xorders")
    assert (o.starting, o.max_offsets_per_trigger, o.min_partitions, o.max_records_per_partition) == ("earliest", 500, 4, 1000)
    assert o.fail_on_data_loss is False and o.group_id == "g-1"


def test_topics_list_and_assign_and_json_offsets():
    assert parse(topics=" a, b ,a").subscription.topics == ("a", "b")
    o = parse(assign='{"a": [1, 0], "b": [0]}', startingOffsets='{"a": {"0": 17, "1": -2}, "b": {"0": -1}}')
    assert o.subscription.assigned == (A0, A1, B0)
    assert o.starting == {A0: 17, A1: -2, B0: -1}


BAD = {
    "no subscription": ({}, "exactly one of the options topics, topicPattern, assign is required"),
    "two subscriptions": ({"topics": "a", "assign": '{"a": [0]}'}, "got topics, assign"),
    "bad topic name": ({"topics": "a/b"}, "invalid topic name 'a/b'"),
    "bad pattern": ({"topicPattern": "("}, "not a valid regular expression"),
    "assign not json": ({"assign": "a:0"}, "assign 'a:0' is not valid JSON"),
    "assign empty list": ({"assign": '{"a": []}'}, "needs a non-empty list"),
    "assign negative partition": ({"assign": '{"a": [-1]}'}, "partition -1 of topic 'a' must be an int >= 0"),
    "malformed offsets": ({"topics": "a", "startingOffsets": '{"a": {"0": 1}'}, "startingOffsets .* is not valid JSON"),
    "offsets word": ({"topics": "a", "startingOffsets": "newest"}, "startingOffsets 'newest' is not valid JSON"),
    "offset zero": ({"topics": "a", "startingOffsets": '{"a": {"0": 0}}'}, "offset 0 of a\\[0\\] must be an offset >= 1"),
    "offset not int": ({"topics": "a", "startingOffsets": '{"a": {"0": "5"}}'}, "offset '5' of a\\[0\\]"),
    "offset partition not number": ({"topics": "a", "startingOffsets": '{"a": {"x": 5}}'}, "partition 'x'"),
    "offsets topic outside subscription": ({"topics": "a", "startingOffsets": '{"b": {"0": 1}}'},
                                           "names topic 'b', which is not in the subscription"),
    "offsets partition not assigned": ({"assign": '{"a": [0]}', "startingOffsets": '{"a": {"1": 1}}'},
                                       "names a\\[1\\], which is not assigned"),
    "negative limit": ({"topics": "a", "maxOffsetsPerTrigger": "-5"}, "maxOffsetsPerTrigger must be a positive integer, got -5"),
    "zero limit": ({"topics": "a", "maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger must be a positive integer, got 0"),
    "limit not a number": ({"topics": "a", "maxOffsetsPerTrigger": "lots"}, "got 'lots'"),
    "min partitions": ({"topics": "a", "minPartitions": "0"}, "minPartitions must be a positive integer"),
    "fail on data loss": ({"topics": "a", "failOnDataLoss": "maybe"}, "failOnDataLoss must be true or false"),
    "bad group": ({"topics": "a", "groupId": "g/1"}, "groupId: invalid consumer group id 'g/1'"),
    "unknown option": ({"topics": "a", "startingOffset": "earliest"}, "unknown option\\(s\\) startingOffset"),
    "unknown llog setting": ({"topics": "a", "llog.no.such": "1"}, "unknown llog option"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_options_are_named(case):
    options, message = BAD[case]
    with pytest.raises(ValueError, match=message):
        parse(**options)


@pytest.mark.parametrize("options, streaming, message", [
    ({"endingOffsets": "latest"}, True, "endingOffsets is for batch reads"),
    ({"startingOffsets": "latest"}, False, "startingOffsets latest .* is not allowed in a batch read"),
    ({"startingOffsets": '{"a": {"0": -1}}'}, False, "startingOffsets latest"),
    ({"endingOffsets": "earliest"}, False, "endingOffsets earliest .* is not allowed in a batch read"),
])
def test_checks_of_one_kind_of_read(options, streaming, message):
    parse(None, topics="a", **options)  # load() does not know the kind yet
    with pytest.raises(InvalidSourceOption, match=message):
        parse(streaming, topics="a", **options)


def test_missing_connection_settings_are_named(monkeypatch):
    monkeypatch.setenv("LLOG_SETTINGS_FILE", "/nonexistent")
    for name in ("LLOG_OXIA_SERVICE_ADDRESS", "LLOG_S3_BUCKET"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(InvalidSourceOption, match="missing llog settings: LLOG_OXIA_SERVICE_ADDRESS, LLOG_S3_BUCKET"):
        SourceOptions.parse({"topics": "a"}, True)


def test_resolve_positions():
    found = {A0: O(1, 10), A1: O(1, 0)}
    assert resolve_positions("s", "earliest", found, True) == {A0: 1, A1: 1}
    assert resolve_positions("s", "latest", found, True) == {A0: 11, A1: 1}
    assert resolve_positions("s", {A0: -2, A1: -1}, found, True) == {A0: 1, A1: 1}
    assert resolve_positions("s", {A0: 5, A1: 1}, found, True) == {A0: 5, A1: 1}
    with pytest.raises(InvalidSourceOption, match="not for a\\[1\\]"):
        resolve_positions("s", {A0: 5}, found, True)
    with pytest.raises(InvalidSourceOption, match="unknown partition\\(s\\) b\\[0\\]"):
        resolve_positions("s", {A0: 5, A1: 1, B0: 1}, found, True)
    with pytest.raises(DataLossError, match="offset 12 of a\\[0\\] is past its end"):
        resolve_positions("s", {A0: 12, A1: 1}, found, True)
    assert resolve_positions("s", {A0: 12, A1: 1}, found, False) == {A0: 11, A1: 1}


def test_advance_discovers_new_partitions_from_earliest_and_reports_data_loss():
    start, latest = advance({A0: 4}, {A0: O(1, 9), A1: O(1, 3)}, True)
    assert start == {A0: 4, A1: 1} and latest == {A0: 10, A1: 4}
    with pytest.raises(DataLossError, match="partition a\\[1\\] no longer exists"):
        advance({A0: 4, A1: 2}, {A0: O(1, 9)}, True)
    assert advance({A0: 4, A1: 2}, {A0: O(1, 9)}, False) == ({A0: 4}, {A0: 10})
    with pytest.raises(DataLossError, match="a\\[0\\] was at offset 20 but its high watermark is now 9"):
        advance({A0: 20}, {A0: O(1, 9)}, True)
    assert advance({A0: 20}, {A0: O(1, 9)}, False) == ({A0: 1}, {A0: 10})


def test_earliest_is_the_log_start_and_positions_below_it_are_data_loss():
    """docs/protocol.md section 10.3."""
    found = {A0: O(6, 10), A1: O(4, 3)}  # a[1]: everything retained away, the next offset is 4
    assert resolve_positions("s", "earliest", found, True) == {A0: 6, A1: 4}
    assert resolve_positions("s", {A0: -2, A1: 4}, found, True) == {A0: 6, A1: 4}
    with pytest.raises(DataLossError, match=r"offsets 2..5 of a\[0\] were removed by retention \(its log start offset is 6\)"):
        resolve_positions("s", {A0: 2, A1: 4}, found, True)
    assert resolve_positions("s", {A0: 2, A1: 4}, found, False) == {A0: 6, A1: 4}
    assert advance({}, found, True) == ({A0: 6, A1: 4}, {A0: 11, A1: 4})  # new partitions start at their log start
    with pytest.raises(DataLossError, match=r"offsets 3..5 of a\[0\] were removed by retention"):
        advance({A0: 3}, found, True)
    assert advance({A0: 3}, found, False)[0] == {A0: 6, A1: 4}


def test_advance_with_an_available_now_target():
    start, latest = advance({A0: 4}, {A0: O(1, 50), A1: O(1, 9), B0: O(1, 3)}, True, target={A0: 21, A1: 5})
    assert latest == {A0: 21, A1: 5}  # capped; b[0] appeared after the target was taken
    assert start == {A0: 4, A1: 1}


def test_rate_limit_is_proportional_to_backlog_and_exact():
    start = {A0: 1, A1: 1, B0: 1}
    latest = {A0: 901, A1: 101, B0: 1}
    end = rate_limit(start, latest, 100)
    assert end == {A0: 91, A1: 11, B0: 1}
    assert sum(end[tp] - start[tp] for tp in end) == 100
    assert rate_limit(start, latest, 10_000) == latest
    odd = rate_limit({A0: 1, A1: 1, B0: 1}, {A0: 4, A1: 4, B0: 4}, 7)
    assert sum(odd[tp] - 1 for tp in odd) == 7 and all(1 <= odd[tp] <= 4 for tp in odd)


def test_spark_offsets_are_sorted_json_of_next_offsets():
    positions = {B0: 3, A1: 7, A0: 5}
    assert list(to_spark(positions)) == ["a", "b"] and list(to_spark(positions)["a"]) == ["0", "1"]
    assert from_spark(to_spark(positions)) == positions


def test_spark_offsets_name_each_topics_incarnation_and_read_those_that_do_not():
    """docs/protocol.md section 12.6: a topic's ``topic_id`` rides with its positions; an offset
    checkpointed by 1.2 has none and still reads."""
    positions = {B0: 3, A1: 7, A0: 5}
    offset = to_spark(positions, {"a": "id-a", "b": None})
    assert offset == {"a": {"0": 5, "1": 7, "topic_id": "id-a"}, "b": {"0": 3}}
    assert from_spark(offset) == positions and topic_ids_of(offset) == {"a": "id-a"}
    assert (from_spark({"a": {"0": 5}}), topic_ids_of({"a": {"0": 5}})) == ({A0: 5}, {})
    progress = {"endOffset": '{"a": {"0": 5, "topic_id": "x"}}', "latestOffset": '{"a": {"0": 8, "topic_id": "x"}}'}
    assert offsets_behind_latest(progress)["maxOffsetsBehindLatest"] == 3


def test_advance_reads_a_topic_created_again_from_its_log_start_as_data_loss(capsys):
    found = {A0: O(1, 20, "new")}
    with pytest.raises(DataLossError, match=r"topic 'a' was deleted and created again \(incarnation old, now new\)"):
        advance({A0: 6}, found, True, start_ids={"a": "old"})
    assert advance({A0: 6}, found, False, start_ids={"a": "old"}) == ({A0: 1}, {A0: 21})
    assert "a[0] was read up to offset 5" in capsys.readouterr().err
    assert advance({A0: 6}, found, True, start_ids={"a": "new"}) == ({A0: 6}, {A0: 21})
    assert advance({A0: 6}, found, True) == ({A0: 6}, {A0: 21})  # a 1.2 checkpoint: positions only


def test_offsets_behind_latest():
    assert behind_latest({A0: 5, A1: 10}, {A0: 15, A1: 10}) == {
        "minOffsetsBehindLatest": 0, "avgOffsetsBehindLatest": 5.0, "maxOffsetsBehindLatest": 10}
    progress = {"endOffset": '{"a": {"0": 5}}', "latestOffset": '{"a": {"0": 8}}'}
    assert offsets_behind_latest(progress)["maxOffsetsBehindLatest"] == 3


@pytest.mark.parametrize("boundaries, share, expected", [
    ([100, 200, 300, 400, 500, 600], 250, [(1, 200), (201, 400), (401, 600)]),
    ([100, 200, 300, 400, 500, 600], 200, [(1, 200), (201, 400), (401, 600)]),
    ([100, 600], 250, [(1, 100), (101, 350), (351, 600)]),  # one entry wider than a share
    ([600], 1000, [(1, 600)]),
    ([10, 20, 30], 1, [(i, i) for i in range(1, 31)]),
])
def test_cut_at_entry_ends_within_the_share(boundaries, share, expected):
    ranges = cut(1, boundaries[-1], boundaries, share)
    assert ranges == expected
    assert all(hi - lo + 1 <= share for lo, hi in ranges)
