"""Robust connections: Oxia and S3 calls, and a writer and reader built on them, ride through a
restart of their server with the same client (calls made while it is down wait for it); a
server that is not there fails within a bound with an error naming its address;
``restart_service`` restarts exactly one recorded process. Restarts use a stack of the test's
own, since restarting the session's stack would disturb other tests."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import dataclass

import pytest

from llog import process_clients
from llog.config import Config
from llog.coordination import Coordination
from llog.errors import CoordinationError, LlogError, StorageError
from llog_tools.local_stack import down, restart_service, status, up
from llog_tools.stack.network import HOST, free_ports
from llog.objects import ObjectStore
from llog.reader import LogReader
from llog.writer import LogWriter


@pytest.fixture
def own_stack(tmp_path):
    up(stack_dir=tmp_path, ports=free_ports())
    try:
        yield tmp_path, Config.load(env={}, settings_path=tmp_path / "settings.json")
    finally:
        down(tmp_path, purge=True)


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


@dataclass
class _Call:
    """One call ``_call_during`` made: when (``time.monotonic()``) and how it ended."""

    i: int
    started: float
    ended: float | None = None
    failure: str | None = None


def _call_during(call, restart, in_flight: int = 8) -> list[_Call]:
    """Start ``call(i)`` every 0.05 s while ``restart()`` runs, each in a thread of its own (at
    most ``in_flight`` at once), so that calls waiting out the server do not stop new ones from
    being made; then once more after it. Every call made during the restart, in order."""
    calls: list[_Call] = []
    slots = threading.BoundedSemaphore(in_flight)
    done = threading.Event()

    def one(made: _Call):
        try:
            call(made.i)
        except Exception as e:  # noqa: BLE001 - collected for the assertion
            made.failure = f"{type(e).__name__}: {e}"
        finally:
            made.ended = time.monotonic()
            slots.release()

    def loop():
        threads = []
        while not done.is_set():
            if slots.acquire(timeout=0.05):
                calls.append(_Call(len(calls), time.monotonic()))
                threads.append(threading.Thread(target=one, args=(calls[-1],)))
                threads[-1].start()
                time.sleep(0.05)
        deadline = time.monotonic() + 90
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    thread = threading.Thread(target=loop)
    thread.start()
    try:
        restart()
    finally:
        done.set()
        thread.join(120)
    assert not thread.is_alive() and all(c.ended is not None for c in calls)
    call(-1)
    return calls


def _restart_held_down(stack_dir, service: str, down: dict[str, float], hold_s: float = 1.0) -> None:
    """``restart_service`` with the server held down ``hold_s``; ``down`` gets the span in which
    no server ran (``from`` the old one's exit, ``until`` just before the new one started)."""
    restarted = restart_service(stack_dir, service, down_s=hold_s)
    down.update({"from": restarted["down_from"], "until": restarted["down_until"]})


def _check_made_while_down(calls: list[_Call], down: dict[str, float]) -> None:
    """Some calls were started while no server was there, and each of them waited for the new
    server and succeeded."""
    made = [c for c in calls if down["from"] < c.started < down["until"]]
    assert made, f"no call was made while the server was down ({len(calls)} calls, down {down})"
    assert [(c.i, c.failure) for c in made if c.failure or c.ended <= down["until"]] == []


def test_oxia_calls_ride_through_an_oxia_restart(own_stack):
    stack_dir, config = own_stack
    coordination = Coordination(config)
    try:
        claim = coordination.claim("/held", b"me", "pk")
        before = json.loads((stack_dir / "stack.json").read_text())["oxia"]["pid"]

        def call(i):
            version = coordination.put(f"/k{i}", b"v", "pk")
            assert coordination.get(f"/k{i}", "pk").version_id == version

        started, down = time.monotonic(), {}
        calls = _call_during(call, lambda: _restart_held_down(stack_dir, "oxia", down))
        assert [c.failure for c in calls if c.failure] == []
        _check_made_while_down(calls, down)
        assert time.monotonic() - started < 30
        after = json.loads((stack_dir / "stack.json").read_text())["oxia"]
        assert after["pid"] != before and after["pid"] == status(stack_dir)["oxia"]["pid"]
        assert status(stack_dir)["oxia"]["service_address"] == config.oxia_service_address
        assert status(stack_dir)["running"]
        assert coordination.get("/k0", "pk") is not None  # same data dir
        assert coordination.release("/held", "pk", claim)  # the session's claim survived
        assert coordination.claim("/held2", b"me", "pk") > 0
    finally:
        started = time.monotonic()
        coordination.close()
        assert time.monotonic() - started < 6


def test_s3_calls_ride_through_an_s3_server_restart(own_stack):
    stack_dir, config = own_stack
    store = ObjectStore(config)
    try:
        uri = store.put("before", b"x" * 1000)

        def call(i):
            assert store.get(store.put(f"during/{i}", b"y" * 100)) == b"y" * 100
            assert store.get(uri, 10, 5) == b"xxxxx"

        started, down = time.monotonic(), {}
        calls = _call_during(call, lambda: _restart_held_down(stack_dir, "s3", down))
        assert [c.failure for c in calls if c.failure] == []
        _check_made_while_down(calls, down)
        assert time.monotonic() - started < 60
        assert status(stack_dir)["running"]
        assert [o.key for o in store.list("before")] == ["before"]
        assert store.delete_many([uri]) == 1
    finally:
        store.close()


@pytest.mark.parametrize("service", ["oxia", "s3"])
def test_a_writer_and_reader_go_on_after_a_server_restart(own_stack, service):
    stack_dir, config = own_stack
    with LogWriter(config, auto_initialize=True) as writer, LogReader(config) as reader:
        writer.append("r", 0, [b"before"])
        pid = status(stack_dir)[service]["pid"]
        restart_service(stack_dir, service)
        assert status(stack_dir)[service]["pid"] != pid and status(stack_dir)["running"]
        started = time.monotonic()
        writer.append("r", 0, [b"after"])
        assert [r.value for r in reader.read_range("r", 0, 1)] == [b"before", b"after"]
        assert time.monotonic() - started < 60


def test_restart_service_names_what_is_wrong(tmp_path):
    with pytest.raises(LlogError, match="unknown service 'kafka'"):
        restart_service(tmp_path, "kafka")
    with pytest.raises(LlogError, match=f"no running stack in {tmp_path}"):
        restart_service(tmp_path, "oxia")


def test_oxia_that_is_not_there_fails_in_a_bound_naming_the_address():
    address = f"{HOST}:{_unused_port()}"
    config = Config(oxia_service_address=address, oxia_request_timeout_ms=500)
    started = time.monotonic()
    with pytest.raises(CoordinationError, match=f"cannot connect to Oxia at {address}: waited for a connection"):
        Coordination(config)
    assert time.monotonic() - started < 6  # 3 attempts of 0.5 s, 1.5 s of backoff


def test_a_process_keeps_no_client_whose_creation_failed(stack):
    config = stack.replace(oxia_service_address=f"{HOST}:{_unused_port()}", oxia_request_timeout_ms=300)
    for _ in range(2):  # each call tries again
        with pytest.raises(CoordinationError, match=f"cannot connect to Oxia at {config.oxia_service_address}"):
            process_clients.log_writer(config)
        assert config not in process_clients._writers._clients


def test_an_unknown_oxia_namespace_fails_at_once_by_name(stack):
    started = time.monotonic()
    with pytest.raises(CoordinationError, match=f"Oxia at {stack.oxia_service_address}: namespace 'nope' does not"):
        Coordination(stack.replace(oxia_namespace="nope"))
    assert time.monotonic() - started < 5


def test_s3_that_is_not_there_fails_in_a_bound_naming_endpoint_and_bucket(stack):
    endpoint = f"http://{HOST}:{_unused_port()}"
    store = ObjectStore(stack.replace(s3_endpoint_url=endpoint, s3_max_attempts=2))
    try:
        bucket = stack.s3_bucket
        # A put's first S3 request is the deployment gate's (the server's clock, from a HEAD of the bucket).
        for call, what in ((lambda: store.put("k", b"v"), f"head {bucket}"),
                           (lambda: store.get(f"s3://{bucket}/k"), f"get s3://{bucket}/.*"),
                           (lambda: list(store.list("p")), f"list s3://{bucket}/.*")):
            started = time.monotonic()
            with pytest.raises(StorageError, match=f"s3 {what} at {endpoint} failed after 2 attempt"):
                call()
            assert time.monotonic() - started < 5  # one backoff of about 1 s
    finally:
        store.close()


def test_a_session_the_server_dropped_is_replaced(stack):
    coordination = Coordination(stack.replace(oxia_session_timeout_ms=2000))
    try:
        root = f"/{stack.root_prefix}-session-{time.monotonic_ns()}"
        coordination.claim(f"{root}/a", b"me", "pk")
        session = coordination._sessions.sessions_by_shard[coordination._shard(f"{root}/a", "pk")]
        session._stop_event.set()  # no more keepalives: the server expires it, the client does not notice
        deadline = time.monotonic() + 15
        while coordination.get(f"{root}/a", "pk") is not None:
            assert time.monotonic() < deadline, "the server did not expire the session"
            time.sleep(0.2)
        assert not session.is_closed()
        started = time.monotonic()
        coordination.claim(f"{root}/b", b"me", "pk")  # SessionNotFound, then a new session
        assert time.monotonic() - started < 5 and session.is_closed()
        assert coordination.get(f"{root}/b", "pk").value == b"me"
    finally:
        coordination.close()


def test_a_process_talking_to_oxia_forks_and_execs_safely(stack):
    """Spark starts its JVM, and any Popen with a preexec_fn starts its child, by fork + exec.
    With gRPC's default fork handling a busy client made about 1 child in 100 abort before
    exec (grpc/grpc#43055); llog turns that handling off (``llog/__init__.py``)."""
    import subprocess

    assert os.environ["GRPC_ENABLE_FORK_SUPPORT"] == "0"
    coordination = Coordination(stack)
    stop = threading.Event()

    def busy():
        while not stop.is_set():
            coordination.put(f"/{stack.root_prefix}-fork", b"v", "pk")

    thread = threading.Thread(target=busy)
    thread.start()
    try:
        failed = [r.stderr[-300:] for r in (
            subprocess.run(["/bin/true"], preexec_fn=lambda: None, capture_output=True) for _ in range(400))
            if r.returncode != 0]
    finally:
        stop.set()
        thread.join(30)
        coordination.close()
    assert failed == []
