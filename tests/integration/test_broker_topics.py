"""The HTTP broker and topics as objects (docs/protocol.md section 10) on the real stack, through a real broker
process: a produce past a topic's partition count or to a topic being deleted answers each group
with its own error and the status that says whose mistake it is; a produce to a new topic creates
it with ``LLOG_DEFAULT_PARTITIONS`` partitions or enough for the produce, and a later produce to a
higher partition grows it (without auto-creation: 404 ``TopicNotFound``); a
consume below the log start after a retention pass answers ``OffsetOutOfRange`` with the log
start, or reads from it (``auto_offset_reset``), also where the tail cache still holds the removed
records; ``GET /topics`` and ``GET /topics/{topic}`` show the records, their config and each
partition's log start."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from broker_lite.consume import LOG_START_MAX_AGE_S
from llog.clock import SYSTEM, ShiftedClock
from llog.compactor import Compactor
from llog.coordination import Coordination
from llog.reader import LogReader
from llog.records import ACTIVE, DELETING
from llog.topics import _mark_deleting, create_topic, delete_topic, read_topic
from tests.helpers.broker_process import run_broker

#: The broker's ``LLOG_DEFAULT_PARTITIONS``: not 1, so a topic it creates shows where its count came from.
DEFAULT_PARTITIONS = 3


@pytest.fixture(scope="module")
def broker(module_config):
    """A broker process whose auto-created topics get :data:`DEFAULT_PARTITIONS` partitions."""
    with run_broker(module_config, LLOG_DEFAULT_PARTITIONS=DEFAULT_PARTITIONS) as (url, _):
        yield url


@pytest.fixture(scope="module")
def coordination(module_config):
    with Coordination(module_config) as c:
        yield c


def produce(url: str, groups: list[tuple[str, int, list[str]]]) -> httpx.Response:
    return httpx.post(f"{url}/produce", timeout=30, json={"topic_partitions": [
        {"topic": t, "partition": p, "records": records} for t, p, records in groups]})


def consume(url: str, topic: str, partition: int, offset: int, **fields) -> dict:
    response = httpx.post(f"{url}/consume", timeout=30, json={
        "topic_partitions": [{"topic": topic, "partition": partition, "fetch_offset": offset}], **fields})
    assert response.status_code == 200, response.text
    result, = response.json()["results"]
    return result


def payloads(result: dict) -> list[tuple[int, str]]:
    return [(r["offset"], r["payload"]) for r in result["records"]]


def high_watermark(config, topic: str, partition: int) -> int:
    with LogReader(config) as reader:
        return reader.high_watermark(topic, partition)


# --- produce -------------------------------------------------------------------------------------


def test_a_produce_past_the_partition_count_is_404_and_each_group_names_its_own_partition(
        module_config, coordination, broker):
    create_topic(coordination, module_config.root_prefix, "counted", 2)
    response = produce(broker, [("counted", 5, ["x"]), ("counted", 7, ["y"])])
    assert response.status_code == 404, response.text
    answer = response.json()
    assert (answer["success_count"], answer["error_count"]) == (0, 2)
    five, seven = answer["results"]
    assert (five["partition"], five["ok"], five["error_type"]) == (5, False, "UnknownPartition")
    assert "counted[5] does not exist" in five["error"] and "2 partition(s), 0..1" in five["error"]
    # The writer refused the whole batch with the first group's error; each group gets its own.
    assert (seven["partition"], seven["error_type"]) == (7, "UnknownPartition") and "counted[7]" in seven["error"]
    assert answer["error_type"] == "UnknownPartition" and answer["error"].startswith(five["error"])
    assert [high_watermark(module_config, "counted", p) for p in (0, 1)] == [0, 0]  # nothing written


def test_a_produce_mixing_a_good_and_a_missing_partition_is_409_and_the_good_one_commits(
        module_config, coordination, broker):
    create_topic(coordination, module_config.root_prefix, "half", 1)
    response = produce(broker, [("half", 0, ["kept"]), ("half", 1, ["refused"])])
    assert response.status_code == 409, response.text
    good, bad = response.json()["results"]
    assert (good["ok"], good["start_offset"], good["end_offset"]) == (True, 1, 1)
    assert (bad["ok"], bad["error_type"]) == (False, "UnknownPartition") and "half[1] does not exist" in bad["error"]
    with LogReader(module_config) as reader:
        assert [r.value for r in reader.read_range("half", 0, 1)] == [b"kept"]


def test_a_produce_to_a_topic_being_deleted_is_409_naming_it(module_config, coordination, broker):
    root = module_config.root_prefix
    create_topic(coordination, root, "going", 1)
    _mark_deleting(coordination, root, "going", SYSTEM)  # a delete interrupted after its first step
    response = produce(broker, [("going", 0, ["x"])])
    assert response.status_code == 409, response.text
    result, = response.json()["results"]
    assert (result["ok"], result["error_type"]) == (False, "TopicBeingDeleted") and "'going'" in result["error"]
    assert read_topic(coordination, root, "going").record.state == DELETING
    assert high_watermark(module_config, "going", 0) == 0


def test_a_produce_to_a_new_topic_creates_it_on_first_use_and_grows_it(module_config, coordination, broker):
    """docs/protocol.md section 10.2: created with max(LLOG_DEFAULT_PARTITIONS, highest named + 1), grown
    by a produce to a higher partition, up to LLOG_MAX_AUTO_PARTITIONS (1024 by default)."""
    root = module_config.root_prefix
    assert read_topic(coordination, root, "fresh") is None
    assert produce(broker, [("fresh", 0, ["a"])]).status_code == 200
    record = read_topic(coordination, root, "fresh").record
    assert (record.partitions, record.state, record.config, record.auto_created) == (DEFAULT_PARTITIONS, ACTIVE, {},
                                                                                      True)
    last = produce(broker, [("fresh", DEFAULT_PARTITIONS - 1, ["b"])])
    assert last.status_code == 200 and last.json()["results"][0]["start_offset"] == 1
    past = produce(broker, [("fresh", DEFAULT_PARTITIONS, ["c"])])
    assert past.status_code == 200 and past.json()["results"][0]["start_offset"] == 1, past.text
    assert read_topic(coordination, root, "fresh").record.partitions == DEFAULT_PARTITIONS + 1

    # One request naming 0 and 4 of a new topic: created with 5 at once (never altered after).
    both = produce(broker, [("wide", 0, ["x"]), ("wide", DEFAULT_PARTITIONS + 1, ["y"])])
    assert both.status_code == 200, both.text
    wide = read_topic(coordination, root, "wide").record
    assert (wide.partitions, wide.updated_at_ms) == (DEFAULT_PARTITIONS + 2, wide.created_at_ms)

    over = produce(broker, [("fresh", 1024, ["z"])])
    assert over.status_code == 404 and over.json()["results"][0]["error_type"] == "UnknownPartition", over.text
    assert "at most 1024 partitions" in over.json()["results"][0]["error"]
    assert read_topic(coordination, root, "fresh").record.partitions == DEFAULT_PARTITIONS + 1


def test_without_auto_creation_a_produce_to_a_missing_topic_is_404_topic_not_found(module_config, coordination):
    with run_broker(module_config, LLOG_AUTO_CREATE_TOPICS="false") as (url, _):
        response = produce(url, [("absent", 0, ["x"])])
        assert response.status_code == 404, response.text
        answer = response.json()
        assert answer["error_type"] == "TopicNotFound" and "'absent' does not exist" in answer["error"]
        assert answer["results"][0]["error_type"] == "TopicNotFound"
        assert read_topic(coordination, module_config.root_prefix, "absent") is None
        create_topic(coordination, module_config.root_prefix, "absent", 1)
        assert produce(url, [("absent", 0, ["x"])]).status_code == 200  # created: now it takes writes


# --- consume after retention -----------------------------------------------------------------------


def test_a_consume_below_the_log_start_is_out_of_range_or_reset(module_config, coordination, broker):
    """Records 1..5 produced through the broker (so its tail cache holds them), a retention pass
    an hour later removes them (``retention.ms`` 1000), 6..8 produced after: offset 1 is out of
    range with the log start 6, from this broker's cache too; ``earliest`` reads exactly 6..8,
    ``latest`` nothing, from the log end."""
    root = module_config.root_prefix
    create_topic(coordination, root, "retained", 1, {"retention.ms": 1000})
    for i in range(5):  # five index entries
        assert produce(broker, [("retained", 0, [f"old-{i + 1}"])]).status_code == 200
    cached = consume(broker, "retained", 0, 1)
    assert cached["log_start_offset"] == 1 and len(cached["records"]) == 5  # learned: log start 1

    with Compactor(module_config, clock=ShiftedClock(3600)) as compactor:
        assert compactor.retain_partition("retained", 0).log_start_offset == 6
    assert produce(broker, [("retained", 0, ["new-6", "new-7", "new-8"])]).status_code == 200
    time.sleep(LOG_START_MAX_AGE_S + 0.2)  # past what the broker may trust of the log start it read

    gone = consume(broker, "retained", 0, 1)
    assert (gone["ok"], gone["error_type"], gone["log_start_offset"], gone["high_watermark"]) == (
        False, "OffsetOutOfRange", 6, 8)
    assert "readable offsets are 6..8" in gone["error"] and "removed by retention" in gone["error"]
    assert "records" not in gone

    earliest = consume(broker, "retained", 0, 1, auto_offset_reset="earliest")
    assert earliest["ok"] and (earliest["start_offset"], earliest["log_start_offset"]) == (6, 6)
    assert payloads(earliest) == [(6, "new-6"), (7, "new-7"), (8, "new-8")]
    assert earliest["next_fetch_offset"] == 9

    latest = consume(broker, "retained", 0, 3, auto_offset_reset="latest")
    assert latest["ok"] and latest["records"] == [] and latest["next_fetch_offset"] == 9
    assert (latest["high_watermark"], latest["log_start_offset"]) == (8, 6)

    # Within the readable range nothing is reset; past the end + 1, earliest goes to the start.
    inside = consume(broker, "retained", 0, 7, auto_offset_reset="earliest")
    assert payloads(inside) == [(7, "new-7"), (8, "new-8")] and inside["log_start_offset"] == 6
    past = consume(broker, "retained", 0, 50, auto_offset_reset="earliest")
    assert past["start_offset"] == 6 and len(past["records"]) == 3
    assert consume(broker, "retained", 0, 50)["error_type"] == "OffsetOutOfRange"


def test_a_long_poll_reset_to_latest_waits_at_the_log_end(module_config, coordination, broker):
    create_topic(coordination, module_config.root_prefix, "polled", 1)
    assert produce(broker, [("polled", 0, ["a", "b"])]).status_code == 200

    async def poll_then_produce():
        async with httpx.AsyncClient(timeout=30) as client:
            poll = asyncio.ensure_future(client.post(f"{broker}/consume", json={
                "topic_partitions": [{"topic": "polled", "partition": 0, "fetch_offset": 99}],
                "auto_offset_reset": "latest", "max_wait_ms": 5000}))
            await asyncio.sleep(0.3)
            await client.post(f"{broker}/produce", json={"topic_partitions": [
                {"topic": "polled", "partition": 0, "records": ["c"]}]})
            return (await poll).json()

    started = time.monotonic()
    result, = asyncio.run(poll_then_produce())["results"]
    assert time.monotonic() - started < 4  # woken by the produce, not timed out
    assert payloads(result) == [(3, "c")] and result["log_start_offset"] == 1


# --- GET /topics, GET /topics/{topic} -----------------------------------------------------------------


def test_topics_list_every_record_with_its_config_and_incarnation(module_config, coordination, broker):
    """Every topic has a record (docs/protocol.md section 12): the list is the records, each with its
    ``topic_id``; a deleted topic is not listed, and created again it lists its new id."""
    root = module_config.root_prefix
    record = create_topic(coordination, root, "listed-conf", 2, {"retention.ms": 1000, "compression.type": "zstd"})
    gone = create_topic(coordination, root, "listed-gone", 1)
    create_topic(coordination, root, "listed-again", 1)
    with LogReader(module_config) as reader:
        delete_topic(reader.coordination, reader.objects, root, "listed-gone")
        delete_topic(reader.coordination, reader.objects, root, "listed-again")
    again = create_topic(coordination, root, "listed-again", 2)
    topics = {t["topic"]: t for t in httpx.get(f"{broker}/topics", timeout=30).json()["topics"]}
    assert topics["listed-conf"] == {
        "topic": "listed-conf", "partitions": 2, "state": "ACTIVE", "topic_id": record.topic_id,
        "config": {"cleanup.policy": "delete", "compression.type": "zstd",
                   "retention.bytes": module_config.retention_bytes, "retention.ms": 1000}}
    assert "listed-gone" not in topics and gone.topic_id not in {t["topic_id"] for t in topics.values()}
    assert (topics["listed-again"]["topic_id"], topics["listed-again"]["partitions"]) == (again.topic_id, 2)
    assert httpx.get(f"{broker}/topics/listed-gone", timeout=30).status_code == 404
    names = list(topics)
    assert names == sorted(names)


def test_describe_topic_shows_the_record_and_each_partitions_log_start(module_config, coordination, broker):
    root = module_config.root_prefix
    record = create_topic(coordination, root, "described", 2, {"retention.ms": 1000})
    for i in range(3):
        assert produce(broker, [("described", 0, [f"r{i}"])]).status_code == 200
    with Compactor(module_config, clock=ShiftedClock(3600)) as compactor:
        assert compactor.retain_partition("described", 0).log_start_offset == 4
    assert produce(broker, [("described", 0, ["kept"]), ("described", 1, ["one"])]).status_code == 200

    described = httpx.get(f"{broker}/topics/described", timeout=30).json()
    assert {k: described[k] for k in ("topic", "partition_count", "state", "topic_id")} == {
        "topic": "described", "partition_count": 2, "state": "ACTIVE", "topic_id": record.topic_id}
    assert described["config"]["retention.ms"] == 1000 and described["config"]["cleanup.policy"] == "delete"
    assert [(p["partition"], p["log_start_offset"], p["high_watermark"], p["log_state"])
            for p in described["partitions"]] == [(0, 4, 4, "OPEN"), (1, 1, 1, "OPEN")]
    assert described["partitions"][0]["index_entries"] == 1  # the three removed entries are gone

    assert httpx.get(f"{broker}/topics/no-such-topic", timeout=30).status_code == 404
    bad = httpx.get(f"{broker}/topics/a%20b", timeout=30)
    assert bad.status_code == 400 and bad.json()["error_type"] == "InvalidTopicName"
