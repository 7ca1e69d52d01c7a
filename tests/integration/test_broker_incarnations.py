"""Issue 29 through a real broker process (docs/protocol.md section 12, "Incarnations never mix"): a
topic deleted and created again is a new incarnation whose offsets start at 1 again, and nothing
the broker cached of the deleted one (in memory, or in the directory it shares with the brokers of
its machine) is ever answered for it; consume results name the incarnation, and a group commit
lands in the incarnation the consumer read or is refused.

The scenario of each cache test is the reproduction of hole 1: ``orders[0]`` 1..20 produced
through a broker (so it caches them), the topic deleted and created again, 1..3 appended by
another writer (so the broker caches nothing of the new incarnation): a consume from offset 1
must answer exactly the new 1..3 with high watermark 3, not the cached 1..20.

A broker trusts what it read of a partition's ``meta/control`` (its log start and incarnation)
for :data:`LOG_START_MAX_AGE_S`: a broker that read the old incarnation just before the delete may
answer it (named by its old ``topic_id``) for that long, as if the delete had come that much
later, and never after, nor once any read of this broker found the new incarnation. The tests
whose broker read the old incarnation wait that long or make the broker find the new one."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from broker_lite.consume import LOG_START_MAX_AGE_S
from llog.coordination import Coordination
from llog.reader import LogReader
from llog.topics import create_topic, delete_topic, read_topic
from llog.writer import LogWriter
from tests.helpers.broker_process import run_broker

OLD = [f"old-{i}" for i in range(1, 21)]
NEW = [f"new-{i}" for i in range(1, 4)]


@pytest.fixture(scope="module")
def coordination(module_config):
    with Coordination(module_config) as c:
        yield c


def produce(url: str, topic: str, records: list[str]) -> dict:
    response = httpx.post(f"{url}/produce", timeout=30, json={"topic_partitions": [
        {"topic": topic, "partition": 0, "records": records}]})
    assert response.status_code == 200, response.text
    return response.json()["results"][0]


def consume(url: str, topic: str, offset: int) -> dict:
    response = httpx.post(f"{url}/consume", timeout=30, json={
        "topic_partitions": [{"topic": topic, "partition": 0, "fetch_offset": offset}]})
    assert response.status_code == 200, response.text
    result, = response.json()["results"]
    return result


def payloads(result: dict) -> list[str]:
    return [r["payload"] for r in result["records"]]


def http_counter(url: str, name: str) -> int:
    return httpx.get(f"{url}/metrics", timeout=30).json()["http"][name]


def recreate_and_append_elsewhere(config, coordination, topic: str) -> str:
    """Delete ``topic``, create it again (one partition) and append :data:`NEW` to partition 0
    with a writer of this process (not through any broker); the new incarnation's topic id."""
    root = config.root_prefix
    with LogReader(config) as reader:
        delete_topic(reader.coordination, reader.objects, root, topic)
    record = create_topic(coordination, root, topic, 1)
    with LogWriter(config, auto_initialize=True) as writer:
        result = writer.append(topic, 0, [r.encode() for r in NEW])
    assert (result.start_offset, result.end_offset) == (1, 3)
    return record.topic_id


def assert_exactly_the_new_incarnation(result: dict, topic_id: str) -> None:
    assert result["ok"], result
    assert payloads(result) == NEW, "records of the deleted incarnation were answered for the new one"
    assert [r["offset"] for r in result["records"]] == [1, 2, 3]
    assert (result["high_watermark"], result["next_fetch_offset"], result["topic_id"]) == (3, 4, topic_id)


def test_the_memory_cache_never_answers_a_deleted_incarnation(module_config, coordination, broker):
    old_id = create_topic(coordination, module_config.root_prefix, "orders", 1).topic_id
    assert produce(broker, "orders", OLD)["end_offset"] == 20
    new_id = recreate_and_append_elsewhere(module_config, coordination, "orders")
    assert new_id != old_id
    assert_exactly_the_new_incarnation(consume(broker, "orders", 1), new_id)
    assert consume(broker, "orders", 4)["records"] == []  # the old 4..20 are not there either


def test_a_broker_that_read_the_old_incarnation_learns_the_new_one(module_config, coordination, broker):
    """The broker read the old incarnation (its topic record cached, the control known): once what
    it knows is past :data:`LOG_START_MAX_AGE_S`, its read meets the old incarnation's tombstone,
    reads the record again and drops the cached runs. Its own produce to the new incarnation is
    cached under the new id and answered from the cache."""
    old_id = create_topic(coordination, module_config.root_prefix, "known", 1).topic_id
    produce(broker, "known", OLD)
    before = consume(broker, "known", 1)
    assert payloads(before) == OLD and before["topic_id"] == old_id
    new_id = recreate_and_append_elsewhere(module_config, coordination, "known")
    time.sleep(LOG_START_MAX_AGE_S + 0.2)
    assert_exactly_the_new_incarnation(consume(broker, "known", 1), new_id)

    # The broker's writer cached the old record too: its first produce may be refused as
    # TopicRecreated (nothing written); the next goes to the new incarnation.
    response = httpx.post(f"{broker}/produce", timeout=30, json={"topic_partitions": [
        {"topic": "known", "partition": 0, "records": ["new-4"]}]})
    if response.status_code != 200:
        assert response.json()["results"][0]["error_type"] == "TopicRecreated", response.text
        response = httpx.post(f"{broker}/produce", timeout=30, json={"topic_partitions": [
            {"topic": "known", "partition": 0, "records": ["new-4"]}]})
    assert response.status_code == 200 and response.json()["results"][0]["start_offset"] == 4
    hits = http_counter(broker, "consume_blob_cache_hits_total")
    result = consume(broker, "known", 4)
    assert (payloads(result), result["high_watermark"], result["topic_id"]) == (["new-4"], 4, new_id)
    assert http_counter(broker, "consume_blob_cache_hits_total") - hits == 1  # cached under the new id
    assert payloads(consume(broker, "known", 1)) == NEW + ["new-4"]


def test_once_a_broker_found_the_new_incarnation_it_never_answers_the_old_one(module_config, coordination, broker):
    """Within :data:`LOG_START_MAX_AGE_S` of reading the old incarnation: a fetch past the cached
    runs goes to Oxia and S3 and finds the new one (out of range there), and from then on the
    cached runs of the old one are not answered, at any offset."""
    create_topic(coordination, module_config.root_prefix, "flipped", 1)
    produce(broker, "flipped", OLD)
    assert payloads(consume(broker, "flipped", 1)) == OLD
    new_id = recreate_and_append_elsewhere(module_config, coordination, "flipped")
    past = consume(broker, "flipped", 21)  # past the cached 1..20: read from the log
    assert (past["ok"], past["error_type"], past["high_watermark"], past["topic_id"]) == (
        False, "OffsetOutOfRange", 3, new_id)
    assert_exactly_the_new_incarnation(consume(broker, "flipped", 1), new_id)


def test_the_shared_directory_never_answers_a_deleted_incarnation(module_config, coordination, tmp_path: Path):
    """A write-only broker writes its runs to the directory; a read-only broker (another process)
    answers from there. After the re-create the old incarnation's runs are still in the
    directory (nothing of the new one went through the writing broker)."""
    shared = tmp_path / "tail-cache"
    old_id = create_topic(coordination, module_config.root_prefix, "shared-orders", 1).topic_id
    with run_broker(module_config, args=["--role", "write"], LLOG_TAIL_CACHE_DIR=shared) as (writer, _), \
            run_broker(module_config, args=["--role", "read"], LLOG_TAIL_CACHE_DIR=shared,
                       LLOG_TAIL_CACHE_MAX_BYTES=10**7) as (reader, _):
        produce(writer, "shared-orders", OLD)
        runs, deadline = shared / module_config.root_prefix / "shared-orders" / old_id / "0", time.monotonic() + 10
        while not list(runs.glob("*.llb")) and time.monotonic() < deadline:
            time.sleep(0.05)  # written after the ack, off the event loop
        assert [p.name[:41] for p in runs.glob("*.llb")] == [f"{1:020d}-{20:020d}"]  # then its created_at_ms
        hits = http_counter(reader, "consume_blob_cache_hits_total")
        before = consume(reader, "shared-orders", 1)
        assert payloads(before) == OLD and before["topic_id"] == old_id
        assert http_counter(reader, "consume_blob_cache_hits_total") - hits == 1  # from the directory

        new_id = recreate_and_append_elsewhere(module_config, coordination, "shared-orders")
        assert list(runs.glob("*.llb"))  # the old runs are still there
        time.sleep(LOG_START_MAX_AGE_S + 0.2)  # past what the reading broker may trust of its read
        assert_exactly_the_new_incarnation(consume(reader, "shared-orders", 1), new_id)
        assert_exactly_the_new_incarnation(consume(reader, "shared-orders", 1), new_id)  # known now: same answer


def test_a_group_commit_lands_in_the_incarnation_read_or_is_refused(module_config, coordination, broker):
    root = module_config.root_prefix
    old_id = create_topic(coordination, root, "committed", 1).topic_id
    produce(broker, "committed", OLD)
    read = consume(broker, "committed", 1)
    assert read["topic_id"] == old_id
    commit = {"topic": "committed", "partition": 0, "offset": 11, "topic_id": old_id}
    response = httpx.post(f"{broker}/groups/g/commit", json={"offsets": [commit]}, timeout=30)
    assert response.status_code == 200 and response.json()["offsets"][0]["moved"] is True

    new_id = recreate_and_append_elsewhere(module_config, coordination, "committed")
    # The old incarnation's offset is not the new one's: the re-created topic starts with none.
    assert httpx.get(f"{broker}/groups/g", timeout=30).json()["partitions"] == []
    # A commit of offsets read from the deleted incarnation is refused, and nothing lands.
    late = httpx.post(f"{broker}/groups/g/commit", json={"offsets": [{**commit, "offset": 3}]}, timeout=30)
    assert late.status_code == 409 and late.json()["error_type"] == "UnknownTopicId", late.text
    assert old_id in late.json()["error"] and new_id in late.json()["error"]
    assert httpx.get(f"{broker}/groups/g", timeout=30).json()["partitions"] == []
    # With the new id (what a consume of it says: the broker found it when it handled the
    # commit), or without one, it goes to the new incarnation.
    assert_exactly_the_new_incarnation(consume(broker, "committed", 1), new_id)
    ok = httpx.post(f"{broker}/groups/g/commit", timeout=30, json={"offsets": [
        {"topic": "committed", "partition": 0, "offset": 2, "topic_id": new_id}]})
    assert ok.status_code == 200 and ok.json()["offsets"][0]["moved"] is True
    plain = httpx.post(f"{broker}/groups/g/commit", timeout=30, json={"offsets": [
        {"topic": "committed", "partition": 0, "offset": 4}]})
    assert plain.status_code == 200 and plain.json()["offsets"][0]["moved"] is True
    described = httpx.get(f"{broker}/groups/g", timeout=30).json()["partitions"]
    assert [(p["partition"], p["committed_offset"], p["high_watermark"]) for p in described] == [(0, 4, 3)]
    past = httpx.post(f"{broker}/groups/g/commit", timeout=30, json={"offsets": [
        {"topic": "committed", "partition": 0, "offset": 5, "topic_id": new_id}]})
    assert past.status_code == 400 and "log end 4" in past.json()["error"]  # the new incarnation's end


def test_a_commit_for_a_deleted_topic_is_404(module_config, coordination, broker):
    root = module_config.root_prefix
    old_id = create_topic(coordination, root, "dropped", 1).topic_id
    produce(broker, "dropped", ["x"])
    with LogReader(module_config) as reader:
        delete_topic(reader.coordination, reader.objects, root, "dropped")
    assert read_topic(coordination, root, "dropped") is None
    for offset in ({"topic": "dropped", "partition": 0, "offset": 1, "topic_id": old_id},
                   {"topic": "dropped", "partition": 0, "offset": 1}):
        response = httpx.post(f"{broker}/groups/g/commit", json={"offsets": [offset]}, timeout=30)
        assert response.status_code == 404 and response.json()["error_type"] == "TopicNotFound", response.text
