"""Per-topic and per-group keys (broker_lite/auth.py) end to end, on broker processes with
``LLOG_BROKER_AUTH``: a key reads only its topics, commits and reads only its groups' offsets
on its topics, and a refused request writes nothing of itself (read back with a key that may
see everything); and the Kafka listener, which has no authentication, is refused beside auth."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid

import httpx
import pytest

from tests.helpers.broker_process import REPO, free_port, run_broker

KEYS = {"keys": [
    {"name": "team-a", "key": "key-of-team-a", "produce": ["a."], "consume": ["a."], "groups": ["ga-"]},
    {"name": "ops", "key": "key-of-ops", "produce": ["*"], "consume": ["*"], "groups": ["*"], "admin": True},
]}
TEAM_A = {"Authorization": "Bearer key-of-team-a"}
OPS = {"X-API-Key": "key-of-ops"}


@pytest.fixture(scope="module")
def broker(module_config):
    with run_broker(module_config, LLOG_BROKER_AUTH=json.dumps(KEYS)) as (url, _):
        yield url


def _names() -> tuple[str, str]:
    """A topic team-a may use and one it may not."""
    suffix = uuid.uuid4().hex[:8]
    return f"a.{suffix}", f"b.{suffix}"


def _produce(url: str, headers: dict, *parts: tuple[str, list[str]]) -> httpx.Response:
    return httpx.post(f"{url}/produce", headers=headers, timeout=30, json={"topic_partitions": [
        {"topic": topic, "partition": 0, "records": records} for topic, records in parts]})


def _consume(url: str, headers: dict, *topics: str) -> httpx.Response:
    return httpx.post(f"{url}/consume", headers=headers, timeout=30, json={"topic_partitions": [
        {"topic": topic, "partition": 0, "fetch_offset": 1} for topic in topics]})


def _read(url: str, topic: str) -> list[str]:
    """Every record of ``topic``'s partition 0, read with the ops key."""
    response = _consume(url, OPS, topic)
    assert response.status_code == 200, response.text
    (result,) = response.json()["results"]
    return [r.get("payload") for r in result["records"]]


def _commit(url: str, headers: dict, group: str, *offsets: tuple[str, int]) -> httpx.Response:
    return httpx.post(f"{url}/groups/{group}/commit", headers=headers, timeout=30, json={"offsets": [
        {"topic": topic, "partition": 0, "offset": offset} for topic, offset in offsets]})


def _committed(url: str, headers: dict, group: str) -> dict[str, int]:
    response = httpx.get(f"{url}/groups/{group}", headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    return {p["topic"]: p["committed_offset"] for p in response.json()["partitions"]}


def _forbidden(response: httpx.Response, name: str) -> bool:
    return (response.status_code == 403 and response.json()["error_type"] == "Forbidden"
            and "team-a" in response.json()["error"] and repr(name) in response.json()["error"])


def test_a_key_consumes_and_describes_only_its_own_topics(broker):
    mine, theirs = _names()
    assert _produce(broker, OPS, (mine, ["m1", "m2"]), (theirs, ["t1"])).status_code == 200

    own = _consume(broker, TEAM_A, mine)
    assert own.status_code == 200 and [r["payload"] for r in own.json()["results"][0]["records"]] == ["m1", "m2"]
    other = _consume(broker, TEAM_A, theirs)
    assert _forbidden(other, theirs) and "t1" not in other.text
    both = _consume(broker, TEAM_A, mine, theirs)  # one forbidden topic refuses the whole request
    assert _forbidden(both, theirs) and "m1" not in both.text and "t1" not in both.text

    assert httpx.get(f"{broker}/topics/{mine}", headers=TEAM_A).status_code == 200
    assert _forbidden(httpx.get(f"{broker}/topics/{theirs}", headers=TEAM_A), theirs)
    listed = [t["topic"] for t in httpx.get(f"{broker}/topics", headers=TEAM_A).json()["topics"]]
    assert mine in listed and theirs not in listed


def test_a_key_commits_and_reads_only_its_groups_offsets_on_its_topics(broker):
    mine, theirs = _names()
    suffix = uuid.uuid4().hex[:8]
    own_group, other_group = f"ga-{suffix}", f"gb-{suffix}"
    assert _produce(broker, OPS, (mine, ["m"] * 5), (theirs, ["t"] * 5)).status_code == 200

    assert _commit(broker, TEAM_A, own_group, (mine, 3)).status_code == 200
    assert _forbidden(_commit(broker, TEAM_A, other_group, (mine, 4)), other_group)  # not its group
    assert _forbidden(_commit(broker, TEAM_A, own_group, (theirs, 2)), theirs)  # its group, not its topic
    assert _forbidden(_commit(broker, TEAM_A, own_group, (mine, 5), (theirs, 2)), theirs)  # nothing of it lands
    # What the refused commits would have written is not there.
    assert _committed(broker, OPS, own_group) == {mine: 3}
    assert _committed(broker, OPS, other_group) == {}

    # Offsets others committed: of its group on another's topic, of another's group on its topic.
    assert _commit(broker, OPS, own_group, (theirs, 2)).status_code == 200
    assert _commit(broker, OPS, other_group, (mine, 1)).status_code == 200
    assert _committed(broker, OPS, own_group) == {mine: 3, theirs: 2}
    assert _committed(broker, TEAM_A, own_group) == {mine: 3}  # its group, its topics only
    assert _forbidden(httpx.get(f"{broker}/groups/{other_group}", headers=TEAM_A), other_group)


def test_a_refused_produce_naming_an_allowed_and_a_forbidden_topic_writes_nothing(broker):
    mine, theirs = _names()
    assert _produce(broker, OPS, (mine, ["before"]), (theirs, ["before"])).status_code == 200

    refused = _produce(broker, TEAM_A, (mine, ["mixed"]), (theirs, ["mixed"]))
    assert _forbidden(refused, theirs)
    assert _read(broker, mine) == ["before"] and _read(broker, theirs) == ["before"]

    # A forbidden topic that does not exist is not created by the refused request either.
    _, absent = _names()
    assert _forbidden(_produce(broker, TEAM_A, (mine, ["mixed"]), (absent, ["mixed"])), absent)
    assert httpx.get(f"{broker}/topics/{absent}", headers=OPS).status_code == 404
    assert _read(broker, mine) == ["before"]


def test_the_broker_refuses_to_start_a_kafka_listener_beside_auth(module_config):
    """The listener serves Kafka clients without keys (SASL is not served): beside auth it would
    let any client past every permission, so the process refuses to start, saying why."""
    http_port, kafka_port = free_port(), free_port()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO),
           "LLOG_SETTINGS_FILE": "/nonexistent", **module_config.to_options(), "LLOG_BROKER_AUTH": json.dumps(KEYS)}
    done = subprocess.run([sys.executable, "-m", "broker_lite", "--port", str(http_port), "--kafka-port",
                           str(kafka_port), "--log-level", "warning"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.startswith(f"broker_lite: the Kafka listener (--kafka-port {kafka_port}) has no "
                                  "authentication"), done.stderr[-3000:]
    assert "LLOG_BROKER_AUTH" in done.stderr and "key-of" not in done.stderr  # names the setting, never a key
    for port in (http_port, kafka_port):
        with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
