"""The HTTP broker (``python -m broker_lite``) as a real uvicorn process on the real stack: the
seed's produce contract case by case (200, 409, 503 with Retry-After, 400, 413, 404), group
commit over HTTP, shutdown answering every accepted request, and a broker killed with SIGKILL
under load losing no acknowledged record."""

from __future__ import annotations

import asyncio
import base64
import signal
import time

import httpx
import pytest

from llog.fence import fence
from llog.reader import LogReader
from llog.topics import read_topic
from llog.writer import LogWriter
from tests.helpers.broker_process import run_broker


def _produce(url: str, body, **kwargs) -> httpx.Response:
    return httpx.post(f"{url}/produce", json=body, timeout=30, **kwargs)


def _read(config, topic: str, partition: int, start: int, end: int) -> list[bytes]:
    with LogReader(config) as reader:
        return [r.value for r in reader.read_range(topic, partition, start, end)]


def _logs(config, topic: str, partitions) -> dict[int, list[bytes]]:
    """Every record of each partition; offset ``o`` at index ``o - 1``."""
    with LogReader(config) as reader:
        return {p: [r.value for r in reader.read_range(topic, p, 1)] for p in partitions}


def test_health(broker):
    answer = httpx.get(f"{broker}/health").json()
    assert answer["status"] == "ok" and answer["host"] == "127.0.0.1" and answer["port"] == int(broker.rsplit(":", 1)[1])
    assert answer["broker_id"] and answer["started_at_ms"] <= time.time() * 1000


def test_produce_answers_each_group_with_its_offsets(module_config, broker):
    body = {"topic_partitions": [
        {"topic": "orders", "partition": 0, "records": ["alpha", {"base64": base64.b64encode(b"\x00\x01").decode()}]},
        {"topic": "orders", "partition": 1, "records": ["b"]},
        {"topic": "orders", "partition": 0, "records": ["gamma"]},
    ]}
    response = _produce(broker, body)
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    answer = response.json()
    assert (answer["success_count"], answer["error_count"]) == (3, 0) and "retry_after_ms" not in answer
    first, second, third = answer["results"]
    assert {k: first[k] for k in ("topic", "partition", "ok", "start_offset", "end_offset", "count")} == {
        "topic": "orders", "partition": 0, "ok": True, "start_offset": 1, "end_offset": 2, "count": 2}
    with LogReader(module_config) as reader:
        topic_id = read_topic(reader.coordination, module_config.root_prefix, "orders").record.topic_id
    # one body for both groups, in the topic's incarnation (docs/protocol.md section 12)
    assert first["index_key"] == f"{module_config.root_prefix}/orders/{topic_id}/partitions/0/index/{3:020d}"
    assert first["wal_uri"].startswith(f"s3://{module_config.s3_bucket}/{module_config.root_prefix}/wal-shared/")
    assert (second["partition"], second["start_offset"], third["start_offset"], third["end_offset"]) == (1, 1, 3, 3)
    assert first["wal_uri"] == second["wal_uri"] == third["wal_uri"]  # one request, one blob
    assert _read(module_config, "orders", 0, 1, 3) == [b"alpha", b"\x00\x01", b"gamma"]


def test_concurrent_requests_share_blobs_and_every_ack_reads_back(module_config, broker):
    async def send_all():
        async with httpx.AsyncClient(timeout=30) as client:
            return await asyncio.gather(*(
                client.post(f"{broker}/produce", json={"topic_partitions": [
                    {"topic": "many", "partition": i % 4, "records": [f"{i}/{j}" for j in range(10)]}]})
                for i in range(64)))

    responses = asyncio.run(send_all())
    assert [r.status_code for r in responses] == [200] * 64
    results = [r.json()["results"][0] for r in responses]
    assert len({r["wal_uri"] for r in results}) < 64 / 2  # group commit: far fewer PUTs than requests
    logs = _logs(module_config, "many", range(4))
    for i, r in enumerate(results):
        assert logs[i % 4][r["start_offset"] - 1:r["end_offset"]] == [f"{i}/{j}".encode() for j in range(10)]


def test_a_failed_partition_gives_409_with_the_others_committed(module_config, broker):
    with LogWriter(module_config, auto_initialize=True) as writer:
        writer.append("mixed", 1, [b"x"])
        fence(writer.coordination, writer.keys("mixed", 1), module_config)
    response = _produce(broker, {"topic_partitions": [{"topic": "mixed", "partition": 0, "records": ["ok"]},
                                                      {"topic": "mixed", "partition": 1, "records": ["no"]}]})
    assert response.status_code == 409
    answer = response.json()
    assert (answer["success_count"], answer["error_count"]) == (1, 1)
    ok, failed = answer["results"]
    assert ok["ok"] and ok["start_offset"] == 1
    assert failed == {"topic": "mixed", "partition": 1, "ok": False, "error_type": "LogFenced",
                      "error": failed["error"]} and "fenced" in failed["error"].lower()


@pytest.mark.parametrize("body, message", [
    (b"{", "not UTF-8 JSON: Input data was truncated"),
    (b"\xff\xfe", "not UTF-8 JSON"),
    (b"[]", "Expected `object`"),
    (b'{"topic_partitions": []}', "length >= 1 - at `$.topic_partitions`"),
    (b'{"topic_partitions": [{"topic": "t", "partition": -1, "records": ["a"]}]}', ">= 0 - at `$.topic_partitions[0].partition`"),
    (b'{"topic_partitions": [{"topic": "t", "partition": 0, "records": []}]}', "length >= 1 - at `$.topic_partitions[0].records`"),
    (b'{"topic_partitions": [{"topic": "", "partition": 0, "records": ["a"]}]}', "length >= 1 - at `$.topic_partitions[0].topic`"),
    (b'{"topic_partitions": [{"topic": "t", "partition": 0, "records": [1]}]}', "at `$.topic_partitions[0].records[0]`"),
    (b'{"topic_partitions": [{"topic": "t", "partition": 0, "records": [{"base64": "AA==", "x": 1}]}]}',
     "unknown field `x`"),
    (b'{"topic_partitions": [{"topic": "t", "partition": 0, "records": [{"base64": "***"}]}]}', "Invalid base64"),
    (b'{"topic_partitions": [{"topic": "t", "partition": 0, "records": ["a"]}], "extra": 1}', "unknown field `extra`"),
    (b'{"topic_partitions": [{"topic": "no/slash", "partition": 0, "records": ["a"]}]}', "no/slash"),
])
def test_bad_requests_get_400_naming_the_problem(broker, body, message):
    response = httpx.post(f"{broker}/produce", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert message.lower() in response.json()["error"].lower()


def test_missing_content_length_empty_body_and_unknown_paths(broker):
    chunked = httpx.post(f"{broker}/produce", content=iter([b'{"topic_partitions": []}']))
    assert chunked.status_code == 400 and chunked.json()["error_type"] == "LengthRequired"
    empty = httpx.post(f"{broker}/produce", content=b"")
    assert empty.status_code == 400 and empty.json()["error_type"] == "EmptyBody"
    assert httpx.get(f"{broker}/nope").status_code == 404
    assert httpx.post(f"{broker}/nope", content=b"{}").status_code == 404
    assert httpx.get(f"{broker}/produce").status_code == 404  # the seed: 404, not 405


def test_a_body_over_the_limit_gets_413_before_it_is_read(config):
    with run_broker(config, LLOG_BROKER_MAX_REQUEST_BYTES=1000) as (url, _):
        body = {"topic_partitions": [{"topic": "big", "partition": 0, "records": ["x" * 2000]}]}
        response = _produce(url, body)
        assert response.status_code == 413 and "more than the 1000" in response.json()["error"]
        small = _produce(url, {"topic_partitions": [{"topic": "big", "partition": 0, "records": ["x" * 100]}]})
        assert small.status_code == 200 and small.json()["results"][0]["start_offset"] == 1


def test_backpressure_gives_503_with_retry_after_and_nothing_is_lost(config):
    record = "r" * 1000
    with run_broker(config, LLOG_BATCH_MAX_BUFFER_BYTES=30_000, LLOG_BROKER_MAX_REQUEST_BYTES=30_000) as (url, _):
        async def send(client, i):
            body = {"topic_partitions": [{"topic": "bp", "partition": i % 2, "records": [f"{i}:{record}"] * 20}]}
            refused = 0
            while True:
                response = await client.post(f"{url}/produce", json=body)
                if response.status_code != 503:
                    return response, refused
                answer = response.json()
                assert int(response.headers["retry-after"]) >= 1 and answer["retry_after_ms"] >= 1000
                assert answer["error_count"] == 1 and answer["results"][0]["error_type"] == "BackPressureRejected"
                refused += 1
                await asyncio.sleep(0.05)  # sooner than Retry-After asks: a test, not a client

        async def send_all():
            async with httpx.AsyncClient(timeout=60) as client:
                return await asyncio.gather(*(send(client, i) for i in range(40)))

        outcomes = asyncio.run(send_all())
    assert sum(refused for _, refused in outcomes) > 0  # 40 x 20 KB against a 30 KB buffer
    logs = _logs(config, "bp", range(2))
    for i, (response, _) in enumerate(outcomes):
        assert response.status_code == 200
        result = response.json()["results"][0]
        assert logs[i % 2][result["start_offset"] - 1:result["end_offset"]] == [f"{i}:{record}".encode()] * 20


def test_stopping_answers_every_accepted_request(config):
    """SIGTERM while requests wait in the open batch (a long delay, so they are there): each is
    answered after its commit, none dropped."""
    with run_broker(config, LLOG_BATCH_MAX_DELAY_MS=3000) as (url, proc):
        async def send_all():
            async with httpx.AsyncClient(timeout=60) as client:
                first = asyncio.ensure_future(client.post(f"{url}/produce", json={"topic_partitions": [
                    {"topic": "stop", "partition": 0, "records": ["first"]}]}))
                await asyncio.sleep(0.3)  # the first flushes alone; these then wait for the window
                rest = [asyncio.ensure_future(client.post(f"{url}/produce", json={"topic_partitions": [
                    {"topic": "stop", "partition": 0, "records": [f"{i}"]}]})) for i in range(10)]
                await asyncio.sleep(0.5)
                proc.send_signal(signal.SIGTERM)
                return [await first] + [await r for r in rest]

        responses = asyncio.run(send_all())
        assert proc.wait(40) == -signal.SIGTERM  # uvicorn re-raises the signal after its graceful shutdown
    assert [r.status_code for r in responses] == [200] * 11
    offsets = sorted(r.json()["results"][0]["start_offset"] for r in responses)
    assert offsets == list(range(1, 12))
    assert sorted(_read(config, "stop", 0, 1, 11)) == sorted([b"first"] + [f"{i}".encode() for i in range(10)])


def test_a_broker_killed_under_load_loses_no_acknowledged_record(config):
    acked: list[tuple[int, int, int, str]] = []

    with run_broker(config) as (url, proc):
        async def client_loop(client, c):
            for n in range(10_000):
                tag = f"c{c}/{n}"
                try:
                    response = await client.post(f"{url}/produce", json={"topic_partitions": [
                        {"topic": "kill", "partition": c % 3, "records": [f"{tag}/{j}" for j in range(5)]}]})
                except httpx.TransportError:
                    return  # the broker is gone
                if response.status_code == 200:
                    r = response.json()["results"][0]
                    acked.append((c % 3, r["start_offset"], r["end_offset"], tag))

        async def load():
            async with httpx.AsyncClient(timeout=30) as client:
                clients = [asyncio.ensure_future(client_loop(client, c)) for c in range(16)]
                await asyncio.sleep(3)
                proc.kill()
                await asyncio.gather(*clients)

        asyncio.run(load())
    assert len(acked) > 20
    logs = _logs(config, "kill", range(3))
    for partition, start, end, tag in acked:
        assert logs[partition][start - 1:end] == [f"{tag}/{j}".encode() for j in range(5)]
