"""The local stack with Oxia as a replicated cluster (a coordinator, 3 servers, replication
factor 3), real processes: its shards and replicas, llog writing and reading through it, one
server SIGKILLed under load and started again (twice, a different server each time), one paused,
and ``down`` leaving no process behind.

The tests share one cluster and run in the order written: each leaves it healthy for the next.
They print what a run should be judged by: how long the first call after a kill took, how long a
restarted server took to rejoin, the slowest call of the load meanwhile (``pytest -s``)."""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from uuid import uuid4

import pytest
import xxhash

from llog.config import Config
from llog.coordination import Coordination
from llog.errors import LlogError
from llog_tools.local_stack import (
    down,
    kill_service,
    pause_service,
    resume_service,
    start_service,
    status,
    up,
)
from llog_tools.stack.build import install
from llog_tools.stack.network import free_ports
from llog_tools.stack.oxia_server import OXIA_COORDINATOR, OXIA_SERVERS
from llog.reader import LogReader
from llog.writer import LogWriter
from tests.helpers.processes import processes_using

SHARDS = 3
PARTITIONS = 8
TOPIC = "cluster"
#: llog's own retry deadline with a 2 s request timeout (``Coordination``): max(30 s, 3 x 2 s).
CALL_BOUND_S = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stack whose Oxia is a cluster of :data:`SHARDS` shards; its directory."""
    install()
    stack_dir = tmp_path_factory.mktemp("oxia-cluster")
    started = time.monotonic()
    up(stack_dir=stack_dir, ports=free_ports(), oxia_cluster=True, oxia_shards=SHARDS)
    print(f"\ncluster up in {time.monotonic() - started:.1f} s")
    try:
        yield stack_dir
    finally:
        down(stack_dir, purge=True)


@pytest.fixture(scope="module")
def root_prefix() -> str:
    return f"t{uuid4().hex[:12]}"


def _config(stack_dir: Path, root_prefix: str, first: str | None = None) -> Config:
    """The stack's config; with ``first``, its service address lists that server's first, so a
    client follows its shard assignments from that server (gRPC's pick-first)."""
    config = Config.load(env={}, settings_path=stack_dir / "settings.json").replace(
        root_prefix=root_prefix, default_partitions=PARTITIONS, oxia_request_timeout_ms=2000)
    if first is not None:
        addresses = config.oxia_service_address.removeprefix("ipv4:").split(",")
        addresses.sort(key=lambda address: address != first)
        config = config.replace(oxia_service_address="ipv4:" + ",".join(addresses))
    return config


def _servers(stack_dir: Path) -> dict[str, dict]:
    return {server["name"]: server for server in status(stack_dir)["oxia"]["cluster"]["servers"]}


def _shard_of(partition_key: str, shard_status: dict[int, dict]) -> int:
    """The shard whose hash range holds ``partition_key``, by the coordinator's ranges."""
    h = xxhash.xxh64(partition_key).intdigest() & 0xFFFFFFFF
    [shard] = [shard for shard, s in shard_status.items() if s["hash_range"][0] <= h <= s["hash_range"][1]]
    return shard


def _exe(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/exe")


def test_the_cluster_has_replicated_shards_and_records_every_process(cluster):
    info = status(cluster)
    assert info["running"] and info["oxia"]["healthy"], info
    oxia = info["oxia"]["cluster"]
    assert (oxia["shards"], oxia["replication_factor"]) == (SHARDS, 3)

    # Every process is recorded (pid and binary) and runs the Oxia binary in its role.
    record = json.loads((cluster / "stack.json").read_text())
    processes = [oxia["coordinator"], *oxia["servers"]]
    assert [p["name"] for p in processes] == [OXIA_COORDINATOR, *OXIA_SERVERS]
    assert len({p["pid"] for p in processes}) == 4
    for p in processes:
        assert record[p["name"]]["pid"] == p["pid"] and not p["paused"]
        assert _exe(p["pid"]) == os.path.realpath(record[p["name"]]["binary"])
        role = b"coordinator" if p["name"] == OXIA_COORDINATOR else b"server"
        assert Path(f"/proc/{p['pid']}/cmdline").read_bytes().split(b"\0")[1] == role

    # Replication factor 3: every shard's ensemble is all three servers, and each server holds a
    # replica of every shard, leading some; the coordinator's hash ranges cover all 2^32 hashes.
    publics = [server["public"] for server in oxia["servers"]]
    shard_status = oxia["shard_status"]
    assert sorted(shard_status) == list(range(SHARDS))
    for shard, s in shard_status.items():
        assert s["status"] == "SteadyState" and sorted(s["ensemble"]) == sorted(publics), (shard, s)
        assert s["leader"] in publics
    ranges = sorted(s["hash_range"] for s in shard_status.values())
    assert ranges[0][0] == 0 and ranges[-1][1] == 2**32 - 1
    assert all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:]))
    assert all(server["leads"] + server["follows"] == SHARDS for server in oxia["servers"])
    assert sum(server["leads"] for server in oxia["servers"]) == SHARDS

    # Clients get every server's address, so that losing one loses neither data nor routing.
    settings = json.loads((cluster / "settings.json").read_text())
    assert settings["LLOG_OXIA_SERVICE_ADDRESS"] == "ipv4:" + ",".join(publics)

    # llog's client writes and reads on every shard: llog partitions' keys spread over them.
    shards = {p: _shard_of(f"{TOPIC}:{p}", shard_status) for p in range(PARTITIONS)}
    assert set(shards.values()) == set(range(SHARDS)), shards
    with Coordination(_config(cluster, "probe")) as coordination:
        for p in range(PARTITIONS):
            coordination.put(f"probe/{p}", f"v{p}".encode(), partition_key=f"{TOPIC}:{p}")
        assert [coordination.get(f"probe/{p}", f"{TOPIC}:{p}").value for p in range(PARTITIONS)] == [
            f"v{p}".encode() for p in range(PARTITIONS)]


def test_llog_writes_and_reads_through_the_cluster(cluster, root_prefix):
    config = _config(cluster, root_prefix)
    expected: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    with LogWriter(config, auto_initialize=True) as writer, LogReader(config) as reader:
        for batch in range(5):
            for p in range(PARTITIONS):
                records = [f"{p}-{batch}-{i}".encode() for i in range(8)]
                result = writer.append(TOPIC, p, records)
                assert result.start_offset == len(expected[p]) + 1
                expected[p] += records
        for p in range(PARTITIONS):
            assert [r.value for r in reader.read_range(TOPIC, p, 1)] == expected[p]
    assert sum(map(len, expected.values())) == 320


@dataclass
class _Load:
    """Appends from a thread of its own, round-robin over the partitions, until stopped."""

    config: Config
    acked: list[tuple[int, int, bytes, float]] = field(default_factory=list)  # (partition, offset, value, acked at)
    calls: list[tuple[float, float]] = field(default_factory=list)  # (started, seconds)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._run, name="cluster-load", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            with LogWriter(self.config, auto_initialize=True) as writer:
                n = 0
                while not self.stop.is_set():
                    p, value = n % PARTITIONS, f"load-{uuid4().hex[:8]}-{n}".encode()
                    started = time.monotonic()
                    try:
                        result = writer.append(TOPIC, p, [value])
                        self.acked.append((p, result.start_offset, value, time.monotonic()))
                    except Exception as e:  # noqa: BLE001 - every failure is a finding, reported by the test
                        self.errors.append(f"append to {p}: {type(e).__name__}: {e}")
                    self.calls.append((started, time.monotonic() - started))
                    n += 1
        except Exception as e:  # noqa: BLE001 - a writer that could not start (or stop) is a finding too
            self.errors.append(f"the load's writer: {type(e).__name__}: {e}")

    def acked_between(self, start: float, end: float) -> int:
        """Appends acknowledged between the monotonic times ``start`` and ``end``."""
        return sum(1 for *_, at in self.acked if start < at <= end)

    def wait_for_acks(self, count: int, timeout_s: float = CALL_BOUND_S) -> None:
        """Until ``count`` appends are acknowledged in all (the load is under way)."""
        deadline = time.monotonic() + timeout_s
        while len(self.acked) < count and not self.errors and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(self.acked) >= count, f"the load acknowledged {len(self.acked)} appends, errors {self.errors[:5]}"

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(CALL_BOUND_S + 10)
        assert not self.thread.is_alive(), "the load's last append did not return"


def _kill_under_load(stack_dir: Path, root_prefix: str, victim: str) -> dict:
    """SIGKILL ``victim`` while a thread appends, call at once through a client that follows its
    shard assignments from the victim, keep it down a second, start it again; check that no call
    failed and every acknowledged record reads back. Returns the timings."""
    before = status(stack_dir)["oxia"]["cluster"]
    victim_public = _servers(stack_dir)[victim]["public"]
    led = [shard for shard, s in before["shard_status"].items() if s["leader"] == victim_public]
    # A partition the victim leads the shard of: its next append must wait for a new leader.
    partition = next((p for p in range(PARTITIONS) if _shard_of(f"{TOPIC}:{p}", before["shard_status"]) in led), 0)
    config = _config(stack_dir, root_prefix, first=victim_public)
    with LogWriter(config, auto_initialize=True) as writer, LogReader(config) as reader:
        load = _Load(config)
        try:
            time.sleep(1)
            load.wait_for_acks(1)  # the load is under way
            killed = kill_service(stack_dir, victim)
            offset = writer.append(TOPIC, partition, [b"first after the kill"]).start_offset
            appended_at = time.monotonic()
            assert reader.read_offset(TOPIC, partition, offset).value == b"first after the kill"
            first_append_s, first_read_s = appended_at - killed["killed_at"], time.monotonic() - appended_at
            servers = _servers(stack_dir)
            assert servers[victim]["pid"] is None and not status(stack_dir)["running"]
            time.sleep(1)
            restarting_at = time.monotonic()
            started = start_service(stack_dir, victim)
            started_at = time.monotonic()
            time.sleep(1)  # the load goes on with the server back
            load.wait_for_acks(len(load.acked) + 1)
        finally:
            load.finish()
        assert load.errors == [], load.errors[:5]
        # The load ran through it all: appends were acknowledged with the victim down, and after
        # it was back (a load of none would pass everything below).
        down_acks = load.acked_between(killed["killed_at"], restarting_at)
        assert down_acks > 0, f"no append of the load was acknowledged while {victim} was down"
        assert load.acked_between(started_at, time.monotonic()) > 0, f"no append after {victim} was back"
        during = [seconds for at, seconds in load.calls if at + seconds >= killed["killed_at"]]  # ended after it
        by_partition: dict[int, dict[int, bytes]] = {}
        for p, offset, value, _ in load.acked:
            by_partition.setdefault(p, {})[offset] = value
        for p, expected in by_partition.items():
            got = {r.offset: r.value for r in reader.read_range(TOPIC, p, min(expected), max(expected))}
            assert all(got.get(offset) == value for offset, value in expected.items()), f"partition {p} lost records"
    after = _servers(stack_dir)
    assert after[victim]["pid"] == started["pid"] and after[victim]["pid"] != killed["pid"]
    assert after[victim]["leads"] + after[victim]["follows"] == SHARDS, after[victim]  # it rejoined every shard
    timings = {
        "victim": victim, "led_shards": led, "first_append_s": first_append_s, "first_read_s": first_read_s,
        "rejoined_after_start_s": started["healthy_after_s"], "load_appends": len(load.acked),
        "load_appends_after_kill": len(during), "load_acks_while_down": down_acks,
        "slowest_load_append_s": max(during, default=0.0),
    }
    print(f"\nkill {victim}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                         for k, v in timings.items()))
    assert first_append_s < CALL_BOUND_S and timings["slowest_load_append_s"] < CALL_BOUND_S
    return timings


def test_a_killed_server_is_ridden_through_and_rejoins_twice(cluster, root_prefix):
    servers = _servers(cluster)
    first = max(OXIA_SERVERS, key=lambda name: servers[name]["leads"])  # the most leaders to move
    assert servers[first]["leads"] >= 1
    _kill_under_load(cluster, root_prefix, first)
    assert status(cluster)["running"]

    servers = _servers(cluster)
    second = max((name for name in OXIA_SERVERS if name != first), key=lambda name: servers[name]["leads"])
    assert servers[second]["leads"] >= 1  # the restarted first one leads nothing yet
    _kill_under_load(cluster, root_prefix, second)
    assert status(cluster)["running"]


def test_a_paused_server_is_ridden_through(cluster, root_prefix):
    """A paused leader holds its connections open and answers nothing; the coordinator finds it
    unresponsive and elects other leaders. The client follows its shard assignments from
    another server: from the paused one none would come, and nothing breaks the stream."""
    servers = _servers(cluster)
    victim = max(OXIA_SERVERS, key=lambda name: servers[name]["leads"])
    config = _config(cluster, root_prefix, first=next(s["public"] for name, s in servers.items() if name != victim))
    with LogWriter(config, auto_initialize=True) as writer, LogReader(config) as reader:
        before = writer.append(TOPIC, 0, [b"before the pause"])
        pause_service(cluster, victim)
        try:
            started = time.monotonic()
            for p in range(PARTITIONS):
                writer.append(TOPIC, p, [b"while paused"])
            paused_appends_s = time.monotonic() - started
            assert _servers(cluster)[victim]["paused"]
            assert [r.value for r in reader.read_range(TOPIC, 0, before.start_offset)][:2] == [
                b"before the pause", b"while paused"]
        finally:
            resume_service(cluster, victim)
    started = time.monotonic()
    while not status(cluster)["running"]:
        assert time.monotonic() - started < 60, "the cluster is not healthy 60 s after the resume"
        time.sleep(0.5)
    print(f"\npause {victim}: appends to every partition {paused_appends_s:.3f} s; healthy "
          f"{time.monotonic() - started:.1f} s after the resume")
    assert paused_appends_s < CALL_BOUND_S


def test_down_stops_every_process_and_up_brings_the_cluster_back_with_its_data(cluster, root_prefix):
    oxia = status(cluster)["oxia"]
    pids = [p["pid"] for p in (oxia["cluster"]["coordinator"], *oxia["cluster"]["servers"])]
    stopped = down(cluster)
    assert len(stopped) == 5 and all(str(pid) in " ".join(stopped) for pid in pids)
    assert processes_using(cluster) == []
    assert not (cluster / "stack.json").exists() and not (cluster / "settings.json").exists()

    again = up(stack_dir=cluster, ports=free_ports(), oxia_cluster=True, oxia_shards=SHARDS)
    assert again["running"] and again["oxia"]["service_address"] == oxia["service_address"]  # its ports kept
    with LogReader(_config(cluster, root_prefix)) as reader:
        assert [r.value for r in reader.read_range(TOPIC, 0, 1, 8)] == [f"0-0-{i}".encode() for i in range(8)]
    with pytest.raises(LlogError, match="runs with an Oxia cluster"):
        up(stack_dir=cluster, ports=free_ports())

    down(cluster, purge=True)
    assert processes_using(cluster) == []
    assert not (cluster / "oxia").exists()
