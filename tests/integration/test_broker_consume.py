"""The HTTP broker's read side on the real stack, as a real process: POST /consume (tail cache hit,
miss, eviction, byte limits, per-partition errors, long-poll wake-up and timeout), consumer groups
and topics over HTTP, roles, auth, and the metrics and OpenAPI documents."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llog.writer import AppendGroup, LogWriter
from tests.helpers.broker_process import REPO, run_broker


def produce(url: str, topic: str, partition: int, records: list, **kwargs) -> dict:
    response = httpx.post(f"{url}/produce", json={"topic_partitions": [
        {"topic": topic, "partition": partition, "records": records}]}, timeout=30, **kwargs)
    assert response.status_code == 200, response.text
    return response.json()["results"][0]


def consume(url: str, partitions: list[dict], timeout: float = 30, **fields) -> httpx.Response:
    return httpx.post(f"{url}/consume", json={"topic_partitions": partitions, **fields}, timeout=timeout)


def payloads(result: dict) -> list:
    return [r.get("payload", r.get("base64")) for r in result["records"]]


def metrics(url: str) -> dict:
    return httpx.get(f"{url}/metrics").json()


def test_consume_reads_what_was_produced_from_the_tail_cache(broker):
    produce(broker, "hit", 0, ["alpha", {"base64": base64.b64encode(b"\xff\x00").decode()}, "gamma"])
    before = metrics(broker)["http"]
    response = consume(broker, [{"topic": "hit", "partition": 0, "fetch_offset": 2}])
    assert response.status_code == 200
    answer = response.json()
    assert (answer["success_count"], answer["error_count"]) == (1, 0)
    result, = answer["results"]
    assert {k: result[k] for k in ("ok", "high_watermark", "start_offset", "end_offset", "next_fetch_offset",
                                   "record_count")} == {"ok": True, "high_watermark": 3, "start_offset": 2,
                                                        "end_offset": 3, "next_fetch_offset": 4, "record_count": 2}
    assert result["records"] == [{"offset": 2, "base64": base64.b64encode(b"\xff\x00").decode()},
                                 {"offset": 3, "payload": "gamma"}]
    after = metrics(broker)["http"]
    assert after["consume_blob_cache_hits_total"] - before["consume_blob_cache_hits_total"] == 1
    assert after["consume_records_returned_total"] - before["consume_records_returned_total"] == 2


def test_concurrent_produces_are_cached_per_batch_in_offset_order(broker):
    """Requests that share a batch are cached as one run per partition: a consume from the first
    offset gets every one of them, in offset order, from the cache (ASCII records take the
    broker's fast path, the others Arrow's UTF-8 conversion)."""
    async def produce_all():
        async with httpx.AsyncClient(timeout=30) as client:
            bodies = [{"topic_partitions": [{"topic": "batched", "partition": i % 2,
                                             "records": [f"r{i}.{j}" if i % 3 else f"é{i}.{j}" for j in range(3)]}]}
                      for i in range(12)]
            responses = await asyncio.gather(*(client.post(f"{broker}/produce", json=b) for b in bodies))
        return bodies, [r.json()["results"][0] for r in responses]

    bodies, results = asyncio.run(produce_all())
    before = metrics(broker)["http"]
    answer = consume(broker, [{"topic": "batched", "partition": p, "fetch_offset": 1} for p in range(2)]).json()
    after = metrics(broker)["http"]
    for p, result in enumerate(answer["results"]):
        expected = {}
        for body, produced in zip(bodies, results):
            if produced["partition"] == p:
                for k, record in enumerate(body["topic_partitions"][0]["records"]):
                    expected[produced["start_offset"] + k] = record
        assert sorted(expected) == list(range(1, 19))
        assert [(r["offset"], r["payload"]) for r in result["records"]] == sorted(expected.items())
    assert after["consume_blob_cache_hits_total"] - before["consume_blob_cache_hits_total"] == 2
    assert after["consume_blob_cache_misses_total"] == before["consume_blob_cache_misses_total"]


def test_a_miss_reads_oxia_and_s3_with_one_get_per_shared_blob(module_config, broker):
    with LogWriter(module_config, auto_initialize=True) as writer:  # not through the broker: not cached
        for batch in range(2):
            writer.append_shared([AppendGroup("miss", p, [f"{batch}.{p}.{i}".encode() for i in range(5)])
                                  for p in range(4)])
    before = metrics(broker)
    answer = consume(broker, [{"topic": "miss", "partition": p, "fetch_offset": 1} for p in range(4)]).json()
    after = metrics(broker)
    for p, result in enumerate(answer["results"]):
        assert payloads(result) == [f"{b}.{p}.{i}" for b in range(2) for i in range(5)]
        assert result["high_watermark"] == 10 and result["next_fetch_offset"] == 11
    assert after["http"]["consume_blob_cache_misses_total"] - before["http"]["consume_blob_cache_misses_total"] == 4
    gets = sum(after["s3"]["operations"].get(op, 0) - before["s3"]["operations"].get(op, 0) for op in ("get", "range_get"))
    assert gets == 2  # two blobs for eight slices


def test_a_miss_answers_records_that_are_not_utf8_in_base64(module_config, broker):
    with LogWriter(module_config, auto_initialize=True) as writer:  # not through the broker: a miss
        writer.append("miss-bytes", 0, [b"plain", b"\xff\x00", "\u00e9".encode()])
    result, = consume(broker, [{"topic": "miss-bytes", "partition": 0, "fetch_offset": 1}]).json()["results"]
    assert result["records"] == [{"offset": 1, "payload": "plain"},
                                 {"offset": 2, "base64": base64.b64encode(b"\xff\x00").decode()},
                                 {"offset": 3, "payload": "\u00e9"}]


def test_a_miss_answers_keys_headers_event_times_and_tombstones(module_config, broker):
    with LogWriter(module_config, auto_initialize=True) as writer:  # records-v2, zstd
        writer.append("miss-v2", 0, [b"v1", None, b"\xfe"], keys=["k", b"\xff", None],
                      headers=[[("h", b"x"), ("n", None)], None, [("b", b"\x80")]], timestamps=[1_700_000_000_123, None, 5])
        writer.append("miss-v2", 0, [b"plain"])  # bytes-batch-v1 after it
    result, = consume(broker, [{"topic": "miss-v2", "partition": 0, "fetch_offset": 1}]).json()["results"]
    assert result["records"] == [
        {"offset": 1, "payload": "v1", "key": "k", "headers": [{"key": "h", "value": "x"}, {"key": "n"}],
         "timestamp": 1_700_000_000_123},
        {"offset": 2, "key_base64": base64.b64encode(b"\xff").decode()},  # a tombstone: no payload
        {"offset": 3, "base64": base64.b64encode(b"\xfe").decode(),
         "headers": [{"key": "b", "value_base64": base64.b64encode(b"\x80").decode()}], "timestamp": 5},
        {"offset": 4, "payload": "plain"},  # the entry after it, a value only
    ] and result["next_fetch_offset"] == 5
    after, = consume(broker, [{"topic": "miss-v2", "partition": 0, "fetch_offset": 4}]).json()["results"]
    assert after["records"] == [{"offset": 4, "payload": "plain"}]


def test_byte_limits_per_partition_and_per_request(broker):
    produce(broker, "limits", 0, ["x" * 100] * 50)
    produce(broker, "limits", 1, ["y" * 100] * 50)
    answer = consume(broker, [{"topic": "limits", "partition": 0, "fetch_offset": 1, "partition_max_bytes": 1_000},
                              {"topic": "limits", "partition": 1, "fetch_offset": 1}], max_bytes=1_500).json()
    first, second = answer["results"]
    assert (first["record_count"], first["next_fetch_offset"]) == (10, 11)
    assert second["record_count"] == 5 and second["high_watermark"] == 50
    one, = consume(broker, [{"topic": "limits", "partition": 0, "fetch_offset": 7, "partition_max_bytes": 1}]).json()["results"]
    assert one["record_count"] == 1  # the first record always


def test_each_partition_gets_its_own_error_and_the_request_still_answers_200(broker):
    produce(broker, "errs", 0, ["a", "b"])
    response = consume(broker, [{"topic": "errs", "partition": 0, "fetch_offset": 3},
                                {"topic": "errs", "partition": 0, "fetch_offset": 9},
                                {"topic": "errs", "partition": 50, "fetch_offset": 1},  # past the count
                                {"topic": "errs", "partition": 0, "fetch_offset": 1}])
    assert response.status_code == 200
    caught_up, past, missing, ok = response.json()["results"]
    assert caught_up["ok"] and caught_up["record_count"] == 0 and caught_up["next_fetch_offset"] == 3
    assert caught_up["high_watermark"] == 2
    assert (past["ok"], past["error_type"]) == (False, "OffsetOutOfRange")
    assert (missing["ok"], missing["error_type"]) == (False, "PartitionNotInitialized")
    assert payloads(ok) == ["a", "b"]
    assert response.json()["error_count"] == 2


@pytest.mark.parametrize("body, field", [
    ({"topic_partitions": [{"topic": "t", "partition": 0, "fetch_offset": 0}]}, "fetch_offset"),
    ({"topic_partitions": []}, "topic_partitions"),
    ({"topic_partitions": [{"topic": "t", "partition": 0, "fetch_offset": 1}], "max_wait_ms": -1}, "max_wait_ms"),
    ({"topic_partitions": [{"topic": "t", "partition": 0, "fetch_offset": 1, "partition_max_bytes": 0}]}, "partition_max_bytes"),
    ({"topic_partitions": [{"topic": "bad/name", "partition": 0, "fetch_offset": 1}]}, "topic"),
])
def test_a_bad_consume_is_400_naming_the_field(broker, body, field):
    response = httpx.post(f"{broker}/consume", json=body)
    assert response.status_code == 400 and field in response.json()["error"]


def test_a_long_poll_is_woken_by_a_local_produce(broker):
    produce(broker, "poll", 0, ["first"])

    async def scenario():
        async with httpx.AsyncClient(timeout=30) as client:
            waiting = asyncio.create_task(client.post(f"{broker}/consume", json={
                "topic_partitions": [{"topic": "poll", "partition": 0, "fetch_offset": 2}], "max_wait_ms": 10_000}))
            await asyncio.sleep(0.5)
            assert not waiting.done()
            acked = time.monotonic()
            await client.post(f"{broker}/produce", json={"topic_partitions": [
                {"topic": "poll", "partition": 0, "records": ["second"]}]})
            response = await waiting
            return response, time.monotonic() - acked

    response, waited = asyncio.run(scenario())
    assert payloads(response.json()["results"][0]) == ["second"]
    assert waited < 2  # woken, not timed out at 10 s


def test_a_long_poll_is_woken_by_another_writer(module_config, broker):
    with LogWriter(module_config, auto_initialize=True) as writer:
        writer.append("remote", 0, [b"one"])

        async def scenario():
            async with httpx.AsyncClient(timeout=30) as client:
                waiting = asyncio.create_task(client.post(f"{broker}/consume", json={
                    "topic_partitions": [{"topic": "remote", "partition": 0, "fetch_offset": 2}], "max_wait_ms": 10_000}))
                await asyncio.sleep(0.5)
                await asyncio.to_thread(writer.append, "remote", 0, [b"two"])
                started = time.monotonic()
                return await waiting, time.monotonic() - started

        response, waited = asyncio.run(scenario())
    assert payloads(response.json()["results"][0]) == ["two"]
    assert waited < 2


def test_a_long_poll_times_out_empty_after_max_wait_ms(broker):
    produce(broker, "quiet", 0, ["only"])
    before = metrics(broker)["http"]
    started = time.monotonic()
    response = consume(broker, [{"topic": "quiet", "partition": 0, "fetch_offset": 2}], max_wait_ms=400)
    elapsed = time.monotonic() - started
    result, = response.json()["results"]
    assert response.status_code == 200 and result["record_count"] == 0 and result["next_fetch_offset"] == 2
    assert 0.4 <= elapsed < 5
    after = metrics(broker)["http"]
    assert after["consume_long_poll_timeouts_total"] - before["consume_long_poll_timeouts_total"] == 1


def test_min_bytes_waits_for_enough_records(broker):
    produce(broker, "minb", 0, ["a" * 10])

    async def scenario():
        async with httpx.AsyncClient(timeout=30) as client:
            waiting = asyncio.create_task(client.post(f"{broker}/consume", json={
                "topic_partitions": [{"topic": "minb", "partition": 0, "fetch_offset": 1}],
                "max_wait_ms": 10_000, "min_bytes": 25}))
            for _ in range(2):
                await asyncio.sleep(0.3)
                assert not waiting.done()  # 10, then 20 bytes: not enough
                await client.post(f"{broker}/produce", json={"topic_partitions": [
                    {"topic": "minb", "partition": 0, "records": ["b" * 10]}]})
            return await waiting

    before = metrics(broker)["http"]
    result, = asyncio.run(scenario()).json()["results"]
    after = metrics(broker)["http"]
    assert result["record_count"] == 3
    # counted as answered, not once per pass of the long poll (1, then 2, then 3 records)
    assert after["consume_records_returned_total"] - before["consume_records_returned_total"] == 3
    assert after["consume_partition_results_total"] - before["consume_partition_results_total"] == 1


def test_an_evicted_run_is_read_from_oxia_and_s3(module_config):
    with run_broker(module_config, LLOG_TAIL_CACHE_MAX_BYTES=20_000) as (url, _):
        for batch in range(10):
            produce(url, "evict", 0, [f"{batch}.{i}".ljust(100, ".") for i in range(20)])
        before = metrics(url)["http"]
        result, = consume(url, [{"topic": "evict", "partition": 0, "fetch_offset": 1}]).json()["results"]
        tail, = consume(url, [{"topic": "evict", "partition": 0, "fetch_offset": 190}]).json()["results"]
        after = metrics(url)["http"]
    assert payloads(result) == [f"{b}.{i}".ljust(100, ".") for b in range(10) for i in range(20)]
    assert payloads(tail) == [f"9.{i}".ljust(100, ".") for i in range(9, 20)]
    assert after["consume_blob_cache_misses_total"] - before["consume_blob_cache_misses_total"] == 1
    assert after["consume_blob_cache_hits_total"] - before["consume_blob_cache_hits_total"] == 1


def test_roles_serve_only_their_routes(module_config):
    with run_broker(module_config, args=["--role", "write"]) as (url, _):
        assert consume(url, [{"topic": "r", "partition": 0, "fetch_offset": 1}]).status_code == 404
        assert httpx.get(f"{url}/groups/g").status_code == 404
        produce(url, "roles", 0, ["w"])
        assert metrics(url)["broker"]["roles"] == ["write"]
    with run_broker(module_config, LLOG_BROKER_ROLE="read") as (url, _):
        assert httpx.post(f"{url}/produce", json={"topic_partitions": [
            {"topic": "roles", "partition": 0, "records": ["x"]}]}).status_code == 404
        assert payloads(consume(url, [{"topic": "roles", "partition": 0, "fetch_offset": 1}]).json()["results"][0]) == ["w"]


def test_groups_commit_forward_and_describe_lag(broker):
    produce(broker, "grp", 0, ["a"] * 10)
    produce(broker, "grp", 1, ["b"] * 4)
    response = httpx.post(f"{broker}/groups/readers/commit", json={"offsets": [
        {"topic": "grp", "partition": 0, "offset": 8}, {"topic": "grp", "partition": 1, "offset": 5}]})
    assert response.status_code == 200
    assert response.json() == {"group": "readers", "offsets": [
        {"topic": "grp", "partition": 0, "offset": 8, "moved": True}, {"topic": "grp", "partition": 1, "offset": 5, "moved": True}]}
    back = httpx.post(f"{broker}/groups/readers/commit", json={"offsets": [{"topic": "grp", "partition": 0, "offset": 3}]})
    assert back.json()["offsets"][0]["moved"] is False  # commits only move forward

    described = httpx.get(f"{broker}/groups/readers").json()
    assert described["group"] == "readers" and described["total_lag"] == 3
    assert [(p["partition"], p["committed_offset"], p["high_watermark"], p["lag"]) for p in described["partitions"]] == [
        (0, 8, 10, 3), (1, 5, 4, 0)]

    past = httpx.post(f"{broker}/groups/readers/commit", json={"offsets": [{"topic": "grp", "partition": 1, "offset": 6}]})
    assert past.status_code == 400 and "log end" in past.json()["error"]
    unknown = httpx.post(f"{broker}/groups/readers/commit", json={"offsets": [{"topic": "grp", "partition": 99, "offset": 1}]})
    assert unknown.status_code == 404
    assert httpx.get(f"{broker}/groups/no-such-group").json() == {"group": "no-such-group", "partitions": [], "total_lag": 0}


def test_topics_list_and_describe(broker):
    produce(broker, "listed", 0, ["a" * 100] * 3)
    produce(broker, "listed", 2, ["b"])
    topics = {t["topic"]: t for t in httpx.get(f"{broker}/topics").json()["topics"]}
    # Created on first use with the broker's LLOG_DEFAULT_PARTITIONS (the tests' 16).
    assert (topics["listed"]["partitions"], topics["listed"]["state"]) == (16, "ACTIVE")
    described = httpx.get(f"{broker}/topics/listed").json()
    assert described["topic"] == "listed"
    marks = [(p["partition"], p["high_watermark"], p["log_state"]) for p in described["partitions"]]
    assert marks[:3] == [(0, 3, "OPEN"), (1, 0, "OPEN"), (2, 1, "OPEN")] and len(marks) == 16
    assert described["partitions"][0]["bytes"] > 300
    assert httpx.get(f"{broker}/topics/nothing-here").status_code == 404


def test_auth_401_without_a_key_403_outside_its_topics(module_config, tmp_path: Path):
    keys = {"keys": [{"name": "ingest", "key": "s3cret-ingest", "produce": ["orders."], "consume": ["orders."]},
                     {"name": "ops", "key": "s3cret-ops", "admin": True}]}
    (tmp_path / "keys.json").write_text(json.dumps(keys))
    with run_broker(module_config, LLOG_BROKER_AUTH=str(tmp_path / "keys.json")) as (url, _):
        assert httpx.get(f"{url}/health").status_code == 200  # no key needed
        anonymous = httpx.post(f"{url}/produce", json={"topic_partitions": [{"topic": "orders.eu", "partition": 0, "records": ["x"]}]})
        assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"].startswith("Bearer")
        wrong = httpx.get(f"{url}/topics", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        ingest = {"Authorization": "Bearer s3cret-ingest"}
        produce(url, "orders.eu", 0, ["x"], headers=ingest)
        other = httpx.post(f"{url}/produce", headers=ingest, json={"topic_partitions": [
            {"topic": "orders.eu", "partition": 0, "records": ["x"]}, {"topic": "billing", "partition": 0, "records": ["y"]}]})
        assert other.status_code == 403 and "billing" in other.json()["error"]
        assert httpx.get(f"{url}/metrics", headers=ingest).status_code == 403
        assert httpx.get(f"{url}/metrics", headers={"X-API-Key": "s3cret-ops"}).status_code == 200
        assert [t["topic"] for t in httpx.get(f"{url}/topics", headers=ingest).json()["topics"]] == ["orders.eu"]


def test_metrics_json_and_prometheus(broker):
    produce(broker, "m", 0, ["x"])
    snapshot = metrics(broker)
    assert set(snapshot) >= {"broker", "http", "batching", "oxia", "s3"}
    assert snapshot["http"]["records_accepted"] >= 1 and snapshot["http"]["response_status_counts"]["200"] >= 1
    assert set(snapshot["s3"]["billing"]) >= {"pricing_model", "estimated_request_cost_usd", "bucket_stored_bytes"}
    response = httpx.get(f"{broker}/metrics/prometheus")
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    latency = families["leaderless_log_http_request_duration_seconds"]
    assert any(s.labels.get("route") == "/produce" and s.labels.get("status_class") == "2xx" for s in latency.samples)


def test_the_served_openapi_document_is_the_checked_in_one(broker):
    served = httpx.get(f"{broker}/openapi.json").json()
    assert served == json.loads((REPO / "docs" / "openapi.json").read_text())
    assert served["openapi"].startswith("3.1")


def test_brokers_share_the_tail_cache_through_a_directory(module_config, tmp_path: Path):
    shared = tmp_path / "tail-cache"
    with run_broker(module_config, args=["--role", "write"], LLOG_TAIL_CACHE_DIR=shared) as (writer, _), \
            run_broker(module_config, args=["--role", "read"], LLOG_TAIL_CACHE_DIR=shared) as (reader, _):
        first = produce(writer, "shared", 0, [f"r{i}" for i in range(5)])
        produce(writer, "shared", 0, [f"r{i}" for i in range(5, 8)])
        topic_id = httpx.get(f"{writer}/topics/shared").json()["topic_id"]  # a directory per incarnation
        directory = shared / module_config.root_prefix / "shared" / topic_id / "0"
        deadline = time.monotonic() + 10
        while len(runs := sorted(p.name for p in directory.glob("*.llb"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # written after the ack, off the event loop
        # Named by first and last offset and the entry's created_at_ms (a Kafka fetch's log-append time).
        assert [r[:41] for r in runs] == [f"{1:020d}-{5:020d}", f"{6:020d}-{8:020d}"] and first["end_offset"] == 5
        assert all(abs(int(r[42:62]) - time.time() * 1000) < 600_000 for r in runs)
        before = metrics(reader)["http"]
        result, = consume(reader, [{"topic": "shared", "partition": 0, "fetch_offset": 3}]).json()["results"]
        after = metrics(reader)
    assert payloads(result) == [f"r{i}" for i in range(2, 8)] and result["high_watermark"] == 8
    assert result["topic_id"] == topic_id
    assert after["http"]["consume_blob_cache_hits_total"] - before["consume_blob_cache_hits_total"] == 1
    assert after["http"]["consume_blob_cache_misses_total"] == before["consume_blob_cache_misses_total"]
