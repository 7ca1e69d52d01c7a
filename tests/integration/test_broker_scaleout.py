"""Several brokers behind HAProxy (``llog stack up --brokers N``), all real processes: produce
and consume through the balancer, a partition's requests on one broker, a broker killed under a
producing load and started again with every acknowledged record read back once and in order, and
write and read brokers apart (``--split-roles``)."""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections import Counter
from pathlib import Path
from uuid import uuid4

import httpx
import pytest

from llog_tools import local_stack
from llog.config import Config
from llog.coordination import Coordination
from llog_tools.local_stack import down, up
from llog_tools.stack.brokers import kill_broker, start_broker
from llog_tools.stack.build import install
from llog_tools.stack.command import add_stack_command
from llog_tools.stack.haproxy import BROKER_HEADER, PARTITION_HEADER, haproxy_stats
from llog_tools.stack.network import free_ports
from llog.topics import create_topic
from loadtest.run import make_run_dir, run
from loadtest.scenarios import SCENARIOS
from tests.helpers.broker_process import free_port

TIMEOUT = httpx.Timeout(30, connect=5)


@pytest.fixture(scope="module")
def stack_dir(tmp_path_factory: pytest.TempPathFactory):
    """A private stack with 3 brokers behind the balancer; its directory."""
    install()
    path = tmp_path_factory.mktemp("scaleout")
    try:
        up(stack_dir=path, ports=free_ports(), brokers=3, broker_port=free_port())
        yield path
    finally:
        down(path, purge=True)


def _create(stack_dir: Path, topic: str, partitions: int) -> None:
    config = Config.load(env={}, settings_path=stack_dir / "settings.json")
    with Coordination(config) as coordination:
        create_topic(coordination, config.root_prefix, topic, partitions)


def _route(topic: str, partition: int) -> dict[str, str]:
    return {PARTITION_HEADER: f"{topic}/{partition}"}


def _metric(url: str, name: str) -> int:
    return httpx.get(f"{url}/metrics", timeout=TIMEOUT).json()["http"][name]


def _metrics(brokers: list[dict], name: str) -> dict[str, int]:
    return {b["name"]: _metric(b["url"], name) for b in brokers}


def _read_all(client: httpx.Client, front: str, topic: str, partition: int, until: int) -> list[tuple[int, str]]:
    """``(offset, payload)`` of offsets 1..``until`` of a partition, consumed through ``front``."""
    out: list[tuple[int, str]] = []
    offset, deadline = 1, time.monotonic() + 60
    while offset <= until:
        assert time.monotonic() < deadline, f"{topic}/{partition}: read up to {offset - 1} of {until} in 60 s"
        answer = client.post(f"{front}/consume", headers=_route(topic, partition), json={"topic_partitions": [
            {"topic": topic, "partition": partition, "fetch_offset": offset}]})
        assert answer.status_code == 200, answer.text
        result = answer.json()["results"][0]
        assert result["ok"], result
        out += [(r["offset"], r["payload"]) for r in result["records"]]
        offset = result["next_fetch_offset"]
    return out


def test_through_the_balancer_a_partition_stays_on_one_broker(stack_dir: Path) -> None:
    info = local_stack.status(stack_dir)
    front, brokers = info["broker"]["url"], info["brokers"]
    assert info["broker"]["healthy"] and info["broker"]["balancer"]["kind"] == "haproxy"
    assert [(b["name"], b["role"], b["healthy"]) for b in brokers] == [(f"broker-{i}", "both", True) for i in range(3)]
    assert len({b["port"] for b in brokers} | {info["broker"]["port"]}) == 4  # the balancer has the broker port
    # The stack record as other tools read it: "broker" is what clients use, "brokers" each process.
    record = json.loads((stack_dir / "stack.json").read_text())
    assert record["broker"]["url"] == front and record["broker"]["pid"] == info["broker"]["pid"]
    assert [{k: b[k] for k in ("name", "url", "port", "role", "log", "pid")} for b in record["brokers"]] == \
        [{k: b[k] for k in ("name", "url", "port", "role", "log", "pid")} for b in brokers]
    topic, partitions = "affinity", 6
    _create(stack_dir, topic, partitions)
    owners: dict[int, str] = {}
    with httpx.Client(timeout=TIMEOUT) as client:
        for p in range(partitions):
            accepted = _metrics(brokers, "records_accepted")
            for batch in range(3):
                answer = client.post(f"{front}/produce", headers=_route(topic, p), json={"topic_partitions": [
                    {"topic": topic, "partition": p, "records": [f"p{p}b{batch}r{i}" for i in range(10)]}]})
                assert answer.status_code == 200, answer.text
                owners.setdefault(p, answer.headers[BROKER_HEADER])
                assert answer.headers[BROKER_HEADER] == owners[p], f"partition {p}'s produces went to two brokers"
            moved = {name: n - accepted[name] for name, n in _metrics(brokers, "records_accepted").items()}
            assert moved == {b["name"]: 30 if b["name"] == owners[p] else 0 for b in brokers}, (p, moved)

        for p in range(partitions):
            consumes = _metrics(brokers, "consume_requests_total")
            hits = _metrics(brokers, "consume_blob_cache_hits_total")
            for _ in range(4):
                records = _read_all(client, front, topic, p, 30)
                assert [payload for _, payload in records] == [f"p{p}b{b}r{i}" for b in range(3) for i in range(10)]
                assert [offset for offset, _ in records] == list(range(1, 31))
            moved = {name: n - consumes[name] for name, n in _metrics(brokers, "consume_requests_total").items()}
            # Every consume of the partition on the broker that produced it, from its tail cache.
            assert moved == {b["name"]: 4 if b["name"] == owners[p] else 0 for b in brokers}, (p, moved)
            assert _metric(next(b["url"] for b in brokers if b["name"] == owners[p]),
                           "consume_blob_cache_hits_total") - hits[owners[p]] == 4
    assert len(set(owners.values())) > 1, f"6 partitions, all on one broker: {owners}"
    by_server = {r["svname"]: r for r in haproxy_stats(stack_dir) if r["pxname"] == "brokers"}
    assert all(by_server[b["name"]]["status"] == "UP" for b in brokers)


def test_a_broker_killed_under_load_loses_no_acknowledged_record(stack_dir: Path) -> None:
    """Producers post through the balancer as a client does, retrying a 5xx or a lost connection
    with the same idempotent producer id and sequence; a broker is killed (-9) among them and
    started again. Each partition then reads back exactly the acknowledged batches, in order,
    at the offsets their acks named."""
    info = local_stack.status(stack_dir)
    front = info["broker"]["url"]
    topic, partitions = "killed", 6
    _create(stack_dir, topic, partitions)
    #: Per partition, its acks: ``(start offset, end offset, records, the broker that answered)``.
    acked: dict[int, list[tuple[int, int, list[str], str]]] = {p: [] for p in range(partitions)}
    retried: Counter[str] = Counter()
    stop, failures = threading.Event(), []

    def produce(p: int) -> None:
        with httpx.Client(timeout=httpx.Timeout(10, connect=2)) as client:
            producer = client.post(f"{front}/producers", timeout=10).json()["producer_id"]
            sequence, batch = 0, 0
            while not stop.is_set():
                records = [f"p{p}b{batch}r{i}" for i in range(5)]
                body = {"producer_id": producer, "topic_partitions": [
                    {"topic": topic, "partition": p, "records": records, "sequence": sequence}]}
                deadline = time.monotonic() + 60
                while True:
                    if time.monotonic() > deadline:
                        failures.append(f"partition {p}: batch {batch} not acknowledged within 60 s")
                        return
                    try:
                        answer = client.post(f"{front}/produce", headers=_route(topic, p), json=body)
                    except httpx.TransportError as e:
                        retried[type(e).__name__] += 1
                        time.sleep(0.05)
                        continue
                    if answer.status_code >= 500:
                        retried[str(answer.status_code)] += 1
                        time.sleep(0.05)
                        continue
                    if answer.status_code != 200:
                        failures.append(f"partition {p}: {answer.status_code} {answer.text}")
                        return
                    result = answer.json()["results"][0]
                    acked[p].append((result["start_offset"], result["end_offset"], records,
                                     answer.headers[BROKER_HEADER]))
                    break
                sequence += len(records)
                batch += 1

    threads = [threading.Thread(target=produce, args=(p,), daemon=True) for p in range(partitions)]
    for t in threads:
        t.start()
    try:
        _wait_for(lambda: all(len(a) >= 5 for a in acked.values()), 60, "5 acks per partition before the kill")
        victim = acked[0][-1][3]  # the broker partition 0 is routed to
        before, at_kill = sum(map(len, acked.values())), len(acked[0])
        killed = kill_broker(stack_dir, victim)
        _wait_for(lambda: sum(map(len, acked.values())) >= before + 60 and len(acked[0]) >= at_kill + 10, 60,
                  f"60 acks, 10 of partition 0, with {victim} down")
        assert next(b for b in local_stack.status(stack_dir)["brokers"] if b["name"] == victim)["pid"] is None
        during = len(acked[0])
        restarted = start_broker(stack_dir, victim)
        assert restarted["pid"] != killed["pid"]
        after = sum(map(len, acked.values()))
        _wait_for(lambda: sum(map(len, acked.values())) >= after + 60, 60, "60 acks after the restart")
    finally:
        stop.set()
        for t in threads:
            t.join(90)
    assert not failures, failures
    assert not any(t.is_alive() for t in threads)
    # Partition 0 moved to another broker while its own was down, and back once it was up again.
    # (The first ack after the kill may be one the victim sent just before it.)
    answered = [broker for *_, broker in acked[0]]
    assert during > at_kill + 1 and victim not in answered[at_kill + 1:during], answered
    assert answered[-1] == victim, answered

    with httpx.Client(timeout=TIMEOUT) as client:
        for p in range(partitions):
            expected, offset = [], 1
            for start, end, records, _ in acked[p]:
                assert (start, end) == (offset, offset + len(records) - 1), f"partition {p}: acks not consecutive"
                expected += records
                offset = end + 1
            read = _read_all(client, front, topic, p, offset - 1)
            assert [payload for _, payload in read] == expected, f"partition {p}"
            answer = client.post(f"{front}/consume", json={"topic_partitions": [
                {"topic": topic, "partition": p, "fetch_offset": offset}]}).json()["results"][0]
            assert answer["high_watermark"] == offset - 1, f"partition {p}: records past the acknowledged ones"
    print(f"acks {sum(map(len, acked.values()))}, retries {dict(retried)}")


def test_an_idempotent_producer_whose_partition_moves_between_brokers_keeps_its_sequence(stack_dir: Path) -> None:
    """Routing moves a partition (a broker down and up again, brokers added): a producer's next
    batch reaches a broker that last wrote the partition before another broker wrote this
    producer's latest batches. That broker's remembered control is stale; its verdict on the
    sequence must come from the control as it is now."""
    brokers = local_stack.status(stack_dir)["brokers"]
    topic = "moved"
    _create(stack_dir, topic, 1)
    with httpx.Client(timeout=TIMEOUT) as client:
        producer = client.post(f"{brokers[0]['url']}/producers").json()["producer_id"]
        offsets = []
        for batch in range(6):
            url = brokers[batch // 2 % 2]["url"]  # two batches on broker-0, two on broker-1, two on broker-0
            answer = client.post(f"{url}/produce", json={"producer_id": producer, "topic_partitions": [
                {"topic": topic, "partition": 0, "records": [f"b{batch}r{i}" for i in range(3)],
                 "sequence": 3 * batch}]})
            assert answer.status_code == 200, answer.text
            result = answer.json()["results"][0]
            offsets.append((result["start_offset"], result["end_offset"], result.get("duplicate", False)))
        assert offsets == [(1 + 3 * b, 3 + 3 * b, False) for b in range(6)]
        read = _read_all(client, brokers[2]["url"], topic, 0, 18)
        assert [payload for _, payload in read] == [f"b{b}r{i}" for b in range(6) for i in range(3)]


def test_split_roles_write_through_writers_and_read_through_readers(stack_dir: Path) -> None:
    port = local_stack.status(stack_dir)["broker"]["port"]
    info = up(stack_dir=stack_dir, brokers=3, broker_port=port, split_roles=True)
    front, brokers = info["broker"]["url"], info["brokers"]
    assert [b["role"] for b in brokers] == ["write", "write", "read"] and all(b["healthy"] for b in brokers)
    writers = {b["name"] for b in brokers if b["role"] == "write"}
    reader = next(b for b in brokers if b["role"] == "read")
    topic = "split"
    _create(stack_dir, topic, 4)
    with httpx.Client(timeout=TIMEOUT) as client:
        for p in range(4):
            answer = client.post(f"{front}/produce", headers=_route(topic, p), json={"topic_partitions": [
                {"topic": topic, "partition": p, "records": [f"p{p}r{i}" for i in range(20)]}]})
            assert answer.status_code == 200, answer.text
            assert answer.headers[BROKER_HEADER] in writers
        hits = _metric(reader["url"], "consume_blob_cache_hits_total")
        for p in range(4):
            answer = client.post(f"{front}/consume", headers=_route(topic, p), json={"topic_partitions": [
                {"topic": topic, "partition": p, "fetch_offset": 1}]})
            assert answer.status_code == 200 and answer.headers[BROKER_HEADER] == reader["name"], answer.text
            assert [r["payload"] for r in answer.json()["results"][0]["records"]] == [f"p{p}r{i}" for i in range(20)]
        # The reader answered from the directory the writers share with it.
        assert _metric(reader["url"], "consume_blob_cache_hits_total") - hits == 4
        commit = client.post(f"{front}/groups/g/commit", json={"offsets": [{"topic": topic, "partition": 0,
                                                                             "offset": 5}]})
        assert commit.status_code == 200 and commit.headers[BROKER_HEADER] == reader["name"], commit.text


def _wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:.0f} s"
        time.sleep(0.05)


@pytest.mark.parametrize("argv, problem", [
    (["--split-roles"], "--split-roles goes with --brokers N"),
    (["--brokers", "0"], "--brokers 0: at least 1"),
    (["--broker", "--brokers", "2"], "--broker is one broker without a balancer"),
])
def test_stack_up_refuses_broker_options_that_do_not_go_together(argv, problem, tmp_path, capsys) -> None:
    parser = argparse.ArgumentParser(prog="llog")
    add_stack_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["stack", "up", "--stack-dir", str(tmp_path), *argv])
    assert args.func(args) == 1
    assert problem in capsys.readouterr().err
    assert not (tmp_path / "stack.json").exists()


def test_the_load_test_through_the_balancer_keeps_partitions_on_their_brokers(stack, tmp_path) -> None:
    """``python -m loadtest --brokers 2 --balancer`` in miniature: every request through HAProxy,
    each consume from the tail cache of the broker that produced its partition, the counts
    reconciled, and each phase's CPU and per-broker requests reported."""
    config = stack.replace(root_prefix=f"t{uuid4().hex[:12]}")
    scenarios = [SCENARIOS["produce-max"].replace(duration_s=1.5, warmup_s=0.5, workers=4, partitions=6),
                 SCENARIOS["consume-hit"].replace(duration_s=1.5, workers=4, records_per_request=100,
                                                  preload_records=500, partitions=6)]
    summary = run(config, scenarios, make_run_dir(tmp_path, "balanced"), brokers=2, balanced=True)
    assert summary["balancer"] == "haproxy" and summary["route_key"] == PARTITION_HEADER
    assert summary["reconciled"] and summary["unexpected_non_200"] == {}
    for name, phase in summary["phases"].items():
        routed = phase["balancer_requests_per_broker"]
        assert sum(n for k, n in routed.items() if not k.endswith("_5xx")) == phase["requests"], name
        assert {"broker-0", "broker-1", "balancer", "vegeta"} <= phase["cpu_cores"].keys(), name
    consume = summary["phases"]["consume-hit"]
    # Each consume reaches the broker that produced its partition, so its tail cache answers;
    # but a broker answers from the cache only with the partition's log start read within
    # LOG_START_MAX_AGE_S (1 s), and on a loaded machine one consume of a run found it older and
    # read the log. A partition routed to the wrong broker would miss on a sixth of them.
    allowed = max(3, consume["requests"] // 50)
    assert consume["requests"] > 0 and consume["tail_cache_misses"] <= allowed, consume
    assert consume["tail_cache_hits"] >= consume["requests"] - allowed, consume
