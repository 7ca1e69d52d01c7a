"""The local stack with real processes: up, idempotence, down, port conflicts, the CLI."""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import time
from dataclasses import asdict, replace
from pathlib import Path

import boto3
import httpx
import oxia
import pytest

from llog.config import Config
from llog.errors import LlogError
from llog_tools.local_stack import down, status, up
from llog_tools.stack import processes
from llog_tools.stack.build import S3_SERVER_VERSION, install
from llog_tools.stack.command import add_stack_command, print_status
from llog_tools.stack.network import DEFAULT_PORTS, free_ports, resolve_ports
from llog_tools.stack.s3_server import S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY
from tests.helpers.broker_process import free_port
from tests.helpers.processes import processes_using


def _pid_exists(pid: int) -> bool:
    return Path(f"/proc/{pid}/cmdline").exists() and Path(f"/proc/{pid}/cmdline").read_bytes() != b""




def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llog")
    add_stack_command(parser.add_subparsers(dest="command", required=True))
    return parser


@pytest.fixture(scope="module", autouse=True)
def _installed() -> None:
    install()


def test_up_status_use_idempotent_down(tmp_path: Path) -> None:
    ports = free_ports()
    try:
        info = up(stack_dir=tmp_path, ports=ports, bucket="llog-test")
        assert info["running"]
        assert info["oxia"]["healthy"] and info["s3"]["healthy"]
        assert info["oxia"]["port"] == ports.oxia and info["oxia"]["metrics_port"] == ports.oxia_metrics
        assert info["s3"]["port"] == ports.s3 and info["s3"]["server"] == f"versitygw {S3_SERVER_VERSION}"
        pids = info["oxia"]["pid"], info["s3"]["pid"]
        assert all(_pid_exists(pid) for pid in pids)
        assert status(tmp_path) == info

        config = Config.load(env={}, settings_path=tmp_path / "settings.json")
        assert config.oxia_service_address == f"127.0.0.1:{ports.oxia}"
        assert config.s3_endpoint_url == f"http://127.0.0.1:{ports.s3}"
        assert (config.s3_bucket, config.s3_access_key_id) == ("llog-test", S3_ACCESS_KEY_ID)

        s3 = boto3.client(
            "s3", endpoint_url=config.s3_endpoint_url, region_name="us-east-1",
            aws_access_key_id=S3_ACCESS_KEY_ID, aws_secret_access_key=S3_SECRET_ACCESS_KEY,
        )
        s3.put_object(Bucket="llog-test", Key="a/b", Body=b"hello")
        assert s3.get_object(Bucket="llog-test", Key="a/b")["Body"].read() == b"hello"
        assert (tmp_path / "s3" / "llog-test" / "a" / "b").read_bytes() == b"hello"  # POSIX backend

        client = oxia.Client(config.oxia_service_address)
        try:
            client.put("k", b"v", partition_key="k")
            key, value, _ = client.get("k", partition_key="k")
            assert (key, value) == ("k", b"v")
        finally:
            client.close()

        again = up(stack_dir=tmp_path, ports=ports, bucket="llog-test")
        assert (again["oxia"]["pid"], again["s3"]["pid"]) == pids and again["broker"] is None

        # `llog stack up --broker` on a running stack adds the HTTP broker, on the stack's settings.
        with_broker = up(stack_dir=tmp_path, ports=ports, bucket="llog-test", broker_port=free_port())
        broker = with_broker["broker"]
        assert broker["healthy"] and (with_broker["oxia"]["pid"], with_broker["s3"]["pid"]) == pids
        produced = httpx.post(f"{broker['url']}/produce", json={"topic_partitions": [
            {"topic": "stack", "partition": 0, "records": ["via the broker"]}]}, timeout=30)
        assert produced.status_code == 200, produced.text

        # With --kafka-port the broker is started again with its Kafka listener (docs/kafka.md).
        kafka_port = free_port()
        with_kafka = up(stack_dir=tmp_path, ports=ports, bucket="llog-test", broker_port=broker["port"],
                        kafka_port=kafka_port)
        broker = with_kafka["broker"]
        assert broker["healthy"] and broker["kafka_bootstrap"] == f"127.0.0.1:{kafka_port}"
        from confluent_kafka import Consumer, Producer, TopicPartition

        kafka = Producer({"bootstrap.servers": broker["kafka_bootstrap"]})
        kafka.produce("stack", b"via Kafka", partition=0)
        assert kafka.flush(30) == 0
        consumer = Consumer({"bootstrap.servers": broker["kafka_bootstrap"], "group.id": "stack"})
        consumer.assign([TopicPartition("stack", 0, 1)])
        got = [consumer.poll(10) for _ in range(2)]
        consumer.close()
        assert [m.value() for m in got if m is not None and m.error() is None] == [b"via the broker", b"via Kafka"]
        pids = (*pids, broker["pid"])

        stopped = down(tmp_path)
        assert len(stopped) == 3 and all(str(pid) in " ".join(stopped) for pid in pids)
        assert not any(_pid_exists(pid) for pid in pids)
        after = status(tmp_path)
        assert not after["running"] and after["oxia"]["pid"] is None and after["s3"]["pid"] is None
        assert not (tmp_path / "settings.json").exists() and not (tmp_path / "stack.json").exists()
        assert down(tmp_path) == []
    finally:
        down(tmp_path, purge=True)
    assert not (tmp_path / "oxia").exists() and not (tmp_path / "s3").exists()


def _two_free_ports() -> int:
    """A port ``K`` with ``K + 1`` free too (``--brokers 2 --kafka-port K`` takes both)."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two adjacent free ports in 50 tries")


def test_brokers_behind_the_balancer_each_run_a_kafka_listener(tmp_path: Path, capsys) -> None:
    """``llog stack up --brokers 2 --kafka-port K``: broker ``i``'s listener on ``K + i``, the
    status lists both as the bootstrap, Metadata names both, and a record produced through one
    listener is consumed by a group through the other."""
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient

    kafka_port = _two_free_ports()
    try:
        info = up(stack_dir=tmp_path, ports=free_ports(), brokers=2, broker_port=free_port(), kafka_port=kafka_port)
        listeners = [f"127.0.0.1:{kafka_port}", f"127.0.0.1:{kafka_port + 1}"]
        assert info["broker"]["kafka_bootstrap"] == ",".join(listeners), info["broker"]
        assert [(b["name"], b["kafka_port"]) for b in info["brokers"]] == [
            ("broker-0", kafka_port), ("broker-1", kafka_port + 1)]
        print_status(status(tmp_path))
        assert f"Kafka bootstrap {','.join(listeners)}" in capsys.readouterr().out

        for bootstrap in listeners:  # each names both brokers, once it scanned the registry (every 2 s)
            admin, named = AdminClient({"bootstrap.servers": bootstrap}), []
            for _ in range(30):
                named = sorted(b.port for b in admin.list_topics(timeout=30).brokers.values())
                if named == [kafka_port, kafka_port + 1]:
                    break
                time.sleep(0.5)
            assert named == [kafka_port, kafka_port + 1], bootstrap
        producer = Producer({"bootstrap.servers": listeners[0]})
        producer.produce("stack2", b"through broker-0", partition=0)
        assert producer.flush(30) == 0
        consumer = Consumer({"bootstrap.servers": listeners[1], "group.id": "stack2", "group.protocol": "classic",
                             "auto.offset.reset": "earliest", "enable.auto.commit": False})
        consumer.subscribe(["stack2"])
        got = []
        try:
            for _ in range(30):  # the group's first rebalance waits 3 s for more members
                message = consumer.poll(1)
                if message is not None and message.error() is None:
                    got.append(message.value())
                    consumer.commit(message, asynchronous=False)
                    break
        finally:
            consumer.close()
        assert got == [b"through broker-0"]
        # The stack again with the same layout leaves the brokers as they are.
        pids = [b["pid"] for b in info["brokers"]]
        again = up(stack_dir=tmp_path, brokers=2, broker_port=info["broker"]["port"], kafka_port=kafka_port)
        assert [b["pid"] for b in again["brokers"]] == pids
    finally:
        down(tmp_path, purge=True)


def test_kafka_listeners_do_not_go_with_split_roles(tmp_path: Path, capsys) -> None:
    args = _parser().parse_args(["stack", "up", "--stack-dir", str(tmp_path), "--brokers", "2", "--split-roles",
                                 "--kafka-port", "9092"])
    assert args.func(args) == 1
    assert "--kafka-port does not go with --split-roles" in capsys.readouterr().err
    assert not (tmp_path / "stack.json").exists()


def test_record_of_a_stack_from_before_versitygw_reads_as_not_running(tmp_path: Path) -> None:
    """A stack.json written when SeaweedFS was the S3 server (its ports, a ``seaweedfs`` entry)
    is read, not refused: the stack is not running, and what is left of it is stopped (by
    ``down``, and by ``up`` before it starts afresh), so its ports are freed."""
    ports = free_ports()
    leftover = subprocess.Popen(["/bin/sleep", "300"])  # stands in for the old `weed mini`
    try:
        (tmp_path / "stack.json").write_text(json.dumps({
            "bucket": "llog", "ports": {**asdict(ports), "master": 1, "volume": 2, "filer": 3, "admin": 4},
            "oxia": {"pid": 2 ** 22 + 1, "binary": "/nonexistent/oxia"},
            "seaweedfs": {"pid": leftover.pid, "binary": "/bin/sleep"},
        }))
        info = status(tmp_path)
        assert not info["running"] and info["s3"]["pid"] is None and info["s3"]["port"] == ports.s3
        assert down(tmp_path) == [f"seaweedfs (pid {leftover.pid})"]
        assert leftover.wait(timeout=10) is not None and not (tmp_path / "stack.json").exists()
    finally:
        leftover.kill()
        leftover.wait()


def test_a_pid_once_used_by_a_child_of_this_process_is_checked_in_proc(tmp_path: Path) -> None:
    """A stack process this Python process started, which has since exited, leaves its pid free;
    pids wrap, so in a long run (a test suite) another process may get it. A record naming that
    pid with that process's binary is then alive, and ``down`` stops it (CI saw `down` miss such a
    process, trusting the old child's exit status instead)."""
    ports = free_ports()
    exited = subprocess.Popen(["/bin/true"])
    exited.wait()
    other = subprocess.Popen(["/bin/sleep", "300"])  # has the number the exited child had
    processes.children[other.pid] = exited
    try:
        (tmp_path / "stack.json").write_text(json.dumps({
            "bucket": "llog", "ports": asdict(ports),
            "oxia": {"pid": other.pid, "binary": "/bin/sleep"},
            "s3": {"pid": 2 ** 22 + 1, "binary": "/nonexistent/versitygw"},
        }))
        assert status(tmp_path)["oxia"]["pid"] == other.pid
        assert down(tmp_path) == [f"oxia (pid {other.pid})"]
        assert other.wait(timeout=10) is not None
    finally:
        processes.children.pop(other.pid, None)
        other.kill()
        other.wait()


def test_port_in_use_is_named_and_nothing_starts(tmp_path: Path) -> None:
    ports = free_ports()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", ports.s3))
        squatter.listen()
        with pytest.raises(LlogError, match=rf"port {ports.s3} \(S3\) on 127.0.0.1 is already in use"):
            up(stack_dir=tmp_path, ports=ports)
    assert not status(tmp_path)["running"]
    assert not (tmp_path / "stack.json").exists()
    assert processes_using(tmp_path) == []



def test_not_healthy_in_time_stops_and_shows_the_log(tmp_path: Path) -> None:
    with pytest.raises(LlogError, match=r"oxia did not become healthy within 0 s(.|\n)*oxia\.log"):
        up(stack_dir=tmp_path, ports=free_ports(), timeout_s=0)
    assert not (tmp_path / "stack.json").exists() and not (tmp_path / "settings.json").exists()
    assert processes_using(tmp_path) == []

def test_cli_status_of_empty_stack_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = _parser().parse_args(["stack", "status", "--stack-dir", str(tmp_path)])
    assert args.func(args) == 0
    assert "not running" in capsys.readouterr().out


def test_port_flags_override_env_override_defaults() -> None:
    args = _parser().parse_args(["stack", "up", "--oxia-port", "21000", "--s3-port", "21001"])
    assert (args.oxia_port, args.s3_port, args.oxia_metrics_port) == (21000, 21001, None)
    env = {"LLOG_STACK_OXIA_PORT": "22000", "LLOG_STACK_OXIA_METRICS_PORT": "22001"}
    ports = resolve_ports({"oxia": args.oxia_port, "s3": args.s3_port, "oxia_metrics": args.oxia_metrics_port},
                          env=env)
    assert ports == replace(DEFAULT_PORTS, oxia=21000, s3=21001, oxia_metrics=22001)


def test_a_process_is_alive_from_the_moment_popen_returns() -> None:
    """``Popen`` returns before the kernel has filled in the new program's ``cmdline`` (it reads
    empty for a moment), so a check made at once must not take that process for dead: the two pid
    tests above failed on it when the machine was busy."""
    started, taken_for_dead = [], []
    try:
        for _ in range(50):
            started.append(subprocess.Popen(["/bin/sleep", "30"]))
            if not processes.pid_alive(started[-1].pid, "/bin/sleep"):
                taken_for_dead.append(started[-1].pid)
        assert taken_for_dead == []
    finally:
        for p in started:
            p.kill()
            p.wait()


def test_a_process_whose_binary_was_replaced_is_still_alive(tmp_path: Path) -> None:
    """A stack binary rebuilt while its process runs: the process still runs the old one."""
    binary = tmp_path / "sleep"
    shutil.copy("/bin/sleep", binary)
    proc = subprocess.Popen([str(binary), "30"])
    try:
        binary.unlink()
        shutil.copy("/bin/sleep", binary)
        assert processes.pid_alive(proc.pid, str(binary))
        proc.kill()
        proc.wait()
        assert not processes.pid_alive(proc.pid, str(binary))
    finally:
        proc.kill()
        proc.wait()
