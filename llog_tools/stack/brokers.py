"""The stack's brokers (``python -m broker_lite``) and their Kafka listeners: one broker
(``llog stack up --broker``), or N behind the balancer (``--brokers N [--split-roles]``,
:mod:`llog_tools.stack.haproxy`); starting, stopping, killing one and starting it again, and their
status (docs/brokers.md, docs/kafka.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from llog.errors import ConfigError, LlogError
from llog_tools.stack.haproxy import HAPROXY, PARTITION_HEADER, haproxy_config, wait_balanced
from llog_tools.stack.network import HOST, http_ok, port_free, system_ports
from llog_tools.stack.processes import kill_process, locked, paused, pid_alive, stop, tail, write_json
from llog_tools.stack.state import StackPaths, read_record, spawn


#: Where ``llog stack up --broker`` serves the HTTP broker unless told otherwise (with
#: ``--brokers N``, where the balancer listens).
DEFAULT_BROKER_PORT = 18090

BROKER_PORT_ENV = "LLOG_STACK_BROKER_PORT"


def broker_port_from_env() -> int:
    value = os.environ.get(BROKER_PORT_ENV)
    if not value:
        return DEFAULT_BROKER_PORT
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{BROKER_PORT_ENV}={value!r} is not a port number") from None


def broker_status(entry: dict | None) -> dict | None:
    """The broker clients use (``record["broker"]``): one broker, or the balancer in front of
    several (``balancer`` then names its config and its statistics page)."""
    if entry is None:
        return None
    alive = pid_alive(entry.get("pid"), entry.get("binary"))
    url = f"http://{HOST}:{entry['port']}"
    out = {"pid": entry["pid"] if alive else None, "url": url, "port": entry["port"],
           "healthy": alive and http_ok(f"{url}/health"), "log": entry.get("log")}
    if entry.get("kafka_port") is not None:
        out.update(kafka_port=entry["kafka_port"], kafka_bootstrap=f"{HOST}:{entry['kafka_port']}")
    if entry.get("kafka_ports"):  # the balancer's: every broker's listener, any of which bootstraps a client
        out.update(kafka_ports=entry["kafka_ports"],
                   kafka_bootstrap=",".join(f"{HOST}:{p}" for p in entry["kafka_ports"]))
    if "balancer" in entry:
        out["balancer"] = entry["balancer"]
    return out


def brokers_status(entries: Sequence[Mapping]) -> list[dict]:
    """Each broker process (``record["brokers"]``): its name, role, address and health."""
    out = []
    for entry in entries:
        alive = pid_alive(entry.get("pid"), entry.get("binary"))
        out.append({"name": entry["name"], "role": entry["role"], "pid": entry["pid"] if alive else None,
                    "url": entry["url"], "port": entry["port"], "paused": paused(entry["pid"] if alive else None),
                    "healthy": alive and http_ok(f"{entry['url']}/health"), "log": entry["log"],
                    **({"kafka_port": entry["kafka_port"]} if entry.get("kafka_port") is not None else {})})
    return out


def start_single_broker(paths: StackPaths, port: int, timeout_s: float, kafka_port: int | None = None) -> None:
    """The HTTP broker as a process of the stack: started by module name (the core does not
    import it), with the stack's settings file, stopped by ``down``. ``record["broker"]`` and
    ``record["brokers"][0]`` both name it."""
    record = read_record(paths) or {}
    stop_recorded_brokers(record)
    if not port_free(port):
        raise LlogError(f"the broker's port {port} is in use (--broker-port picks another)")
    if kafka_port is not None and not port_free(kafka_port):
        raise LlogError(f"the Kafka listener's port {kafka_port} is in use (--kafka-port picks another)")
    entry = _spawn_broker(paths, "broker", port, "both", kafka_port=kafka_port)
    record.update(broker={k: entry[k] for k in ("pid", "binary", "port", "url", "log", "kafka_port") if k in entry},
                  brokers=[entry],
                  broker_layout=None)
    write_json(paths.record, record)
    _wait_broker(paths, entry, time.monotonic() + timeout_s, timeout_s)


def start_balanced_brokers(paths: StackPaths, port: int, count: int, split_roles: bool, timeout_s: float,
                   kafka_port: int | None = None) -> None:
    """``count`` brokers on free ports and HAProxy on ``port`` in front of them (the balancer,
    ``record["broker"]``; the brokers are ``record["brokers"]``), replacing any the record names.

    The balancer sends a request to the broker the consistent hash of its ``X-Llog-Partition``
    header picks (``topic/partition``; no header: round robin), so one broker produces a
    partition and answers its consumes from its tail cache; a broker that fails its health check
    (``GET /health``) loses its partitions to the others until it is back (docs/brokers.md).
    ``split_roles``: the first half (rounded up) are ``--role write`` brokers, which get
    ``/produce`` and ``/producers``, the rest ``--role read`` ones, which get ``/consume`` and
    ``/groups/...``; they share the tail cache directory ``<stack_dir>/tail-cache``
    (``LLOG_TAIL_CACHE_DIR``), where writers put what they commit and readers look first.

    ``kafka_port``: broker ``i`` also runs a Kafka listener on ``kafka_port + i`` (ports a
    client can be told in advance). Kafka clients connect to every broker Metadata names, so the
    listeners are not behind HAProxy; the balancer's entry lists them (``kafka_ports``), and any
    of them bootstraps a client. Not with ``split_roles``: a listener answers Metadata as the
    leader of every partition (docs/kafka.md section 3), so a client would send its fetches to a
    write broker and its produces to a read broker, each answered NOT_LEADER_OR_FOLLOWER."""
    if count < 1:
        raise ConfigError(f"brokers={count}: at least 1 broker")
    if split_roles and count < 2:
        raise ConfigError(f"brokers={count} with split roles: at least 1 write and 1 read broker, so 2")
    check_kafka_layout(split_roles, kafka_port)
    kafka_ports = [kafka_port + i for i in range(count)] if kafka_port is not None else [None] * count
    if kafka_port is not None and not 0 < kafka_port <= 65536 - count:
        raise ConfigError(f"--kafka-port {kafka_port}: the {count} brokers' listeners take {kafka_port}.."
                          f"{kafka_port + count - 1}, which must be ports (1..65535)")
    if not os.access(HAPROXY, os.X_OK):
        raise ConfigError(f"the balancer in front of several brokers is HAProxy, not found at {HAPROXY}: "
                          "install it (apt-get install haproxy)")
    record = read_record(paths) or {}
    stop_recorded_brokers(record)
    write_json(paths.record, record)
    if not port_free(port):
        raise LlogError(f"the balancer's port {port} is in use (--broker-port picks another)")
    for i, p in enumerate(kafka_ports):
        if p is not None and (p == port or not port_free(p)):
            raise LlogError(f"broker-{i}'s Kafka listener port {p} (--kafka-port {kafka_port} + {i}) is in use "
                            "(--kafka-port picks another first port)")
    writers = (count + 1) // 2 if split_roles else count
    roles = ["write" if i < writers else "read" for i in range(count)] if split_roles else ["both"] * count
    tail_cache_dir = paths.root / "tail-cache" if split_roles else None
    *broker_ports, stats_port = system_ports(count + 1, avoid=frozenset({port, *filter(None, kafka_ports)}))
    deadline = time.monotonic() + timeout_s
    try:
        record["brokers"] = []
        for i, (role, broker_port, listener_port) in enumerate(zip(roles, broker_ports, kafka_ports)):
            record["brokers"].append(_spawn_broker(paths, f"broker-{i}", broker_port, role, tail_cache_dir,
                                                   kafka_port=listener_port))
            write_json(paths.record, record)
        for entry in record["brokers"]:
            _wait_broker(paths, entry, deadline, timeout_s)
        config_path = paths.root / "haproxy.cfg"
        config_path.write_text(haproxy_config(port, stats_port, record["brokers"], split_roles))
        checked = subprocess.run([HAPROXY, "-c", "-q", "-f", str(config_path)], capture_output=True, text=True,
                                 timeout=30)
        if checked.returncode != 0:
            raise LlogError(f"HAProxy refuses its config {config_path}: {(checked.stdout + checked.stderr).strip()}")
        entry = spawn(paths, "balancer", [HAPROXY, "-db", "-f", str(config_path)], dict(os.environ))
        record["broker"] = {
            **entry, "port": port, "url": f"http://{HOST}:{port}", "log": str(paths.log("balancer")),
            "balancer": {"kind": "haproxy", "config": str(config_path), "stats_url": f"http://{HOST}:{stats_port}/stats",
                         "route_header": PARTITION_HEADER, "split_roles": split_roles},
            **({"kafka_ports": kafka_ports} if kafka_port is not None else {})}
        record["broker_layout"] = {"brokers": count, "split_roles": split_roles, "port": port, "kafka_port": kafka_port}
        write_json(paths.record, record)
        balancer = {**record["broker"], "name": "balancer"}
        _wait_broker(paths, balancer, deadline, timeout_s)
        # Every broker up in HAProxy's eyes too, so that the first requests are spread as later ones.
        wait_balanced(paths, deadline, timeout_s)
    except BaseException:
        stop_recorded_brokers(record)
        write_json(paths.record, record)
        raise


def check_kafka_layout(split_roles: bool, kafka_port: int | None) -> None:
    if split_roles and kafka_port is not None:
        raise ConfigError("--kafka-port does not go with --split-roles: a Kafka listener answers Metadata as the "
                          "leader of every partition, so clients would fetch from write brokers and produce to read "
                          "brokers, each answering NOT_LEADER_OR_FOLLOWER (docs/kafka.md section 3)")


def stop_recorded_brokers(record: dict) -> None:
    """Stop the brokers (and balancer) ``record`` names, and drop them from it."""
    old = record.pop("broker", None)
    if old and pid_alive(old.get("pid"), old.get("binary")):
        stop(old["pid"], old["binary"])
    stop_brokers(record.pop("brokers", []))
    record.pop("broker_layout", None)


def stop_brokers(entries: Sequence[Mapping]) -> list[str]:
    """Stop the live broker processes of ``entries`` (``record["brokers"]``) at once: SIGTERM to
    each first, so that they drain their requests together, then :func:`stop` each."""
    live = [e for e in entries if pid_alive(e.get("pid"), e.get("binary"))]
    for entry in live:
        try:
            os.kill(entry["pid"], signal.SIGTERM)
        except ProcessLookupError:
            pass
    for entry in live:
        stop(entry["pid"], entry["binary"])
    return [f"{entry['name']} (pid {entry['pid']})" for entry in live]


def _broker_command(port: int, role: str, kafka_port: int | None = None) -> list[str]:
    return [sys.executable, "-m", "broker_lite", "--host", HOST, "--port", str(port), "--role", role,
            "--log-level", "warning", *(["--kafka-port", str(kafka_port)] if kafka_port is not None else [])]


def _spawn_broker(paths: StackPaths, name: str, port: int, role: str, tail_cache_dir: Path | None = None,
                  kafka_port: int | None = None) -> dict:
    """Start one broker process; its ``record["brokers"]`` entry."""
    env = {**os.environ, "LLOG_SETTINGS_FILE": str(paths.settings)}
    if tail_cache_dir is not None:
        env["LLOG_TAIL_CACHE_DIR"] = str(tail_cache_dir)
    entry = spawn(paths, name, _broker_command(port, role, kafka_port), env)
    return {"name": name, **entry, "port": port, "url": f"http://{HOST}:{port}", "role": role,
            "log": str(paths.log(name)), **({"kafka_port": kafka_port} if kafka_port is not None else {}),
            **({"tail_cache_dir": str(tail_cache_dir)} if tail_cache_dir is not None else {})}


def _wait_broker(paths: StackPaths, entry: Mapping, deadline: float, timeout_s: float) -> None:
    """Until ``deadline`` (``time.monotonic()``), wait for one broker's ``/health`` to answer 200."""
    name = entry["name"]
    while not http_ok(f"{entry['url']}/health"):
        if not pid_alive(entry["pid"], entry["binary"]):
            raise LlogError(f"{name} exited during startup; last lines of {paths.log(name)}:\n"
                            + tail(paths.log(name)))
        if time.monotonic() > deadline:
            raise LlogError(f"{name} did not answer /health within {timeout_s:.0f} s; last lines of "
                            f"{paths.log(name)}:\n" + tail(paths.log(name)))
        time.sleep(0.25)


def kill_broker(stack_dir: Path | None, name: str) -> dict:
    """SIGKILL one broker process of the stack (``broker-0``.., or ``broker``) and wait until it
    has exited; the record keeps it, for :func:`start_broker`. Returns ``name`` and ``pid``."""
    paths = StackPaths(stack_dir)
    with locked(paths.lock, 30, "`llog stack up` or `down`"):
        record, entry = _broker_entry(paths, name)
        if not pid_alive(entry["pid"], entry["binary"]):
            raise LlogError(f"{name} of the stack in {paths.root} is not running")
        kill_process(name, entry)
        return {"name": name, "pid": entry["pid"]}


def start_broker(stack_dir: Path | None, name: str, timeout_s: float = 60) -> dict:
    """Start a stopped broker of the stack again, on its port with its role; return once it
    answers ``/health`` and the balancer, if any, sends it requests again (its health check
    passes twice, 0.5 s apart). Returns ``name``, ``pid`` and ``healthy_after_s``."""
    paths = StackPaths(stack_dir)
    with locked(paths.lock, timeout_s + 30, "`llog stack up` or `down`"):
        record, entry = _broker_entry(paths, name)
        if pid_alive(entry["pid"], entry["binary"]):
            raise LlogError(f"{name} of the stack in {paths.root} is running (pid {entry['pid']})")
        started = time.monotonic()
        tail_cache_dir = entry.get("tail_cache_dir")
        new = _spawn_broker(paths, name, entry["port"], entry["role"], tail_cache_dir and Path(tail_cache_dir),
                            kafka_port=entry.get("kafka_port"))
        entry.update(new)
        if record.get("broker", {}).get("port") == entry["port"]:  # the one broker clients use
            record["broker"].update(pid=new["pid"], binary=new["binary"])
        write_json(paths.record, record)
        _wait_broker(paths, entry, started + timeout_s, timeout_s)
        if (record.get("broker") or {}).get("balancer"):
            wait_balanced(paths, started + timeout_s, timeout_s)
        return {"name": name, "pid": entry["pid"], "healthy_after_s": time.monotonic() - started}


def _broker_entry(paths: StackPaths, name: str) -> tuple[dict, dict]:
    record = read_record(paths)
    if record is None:
        raise LlogError(f"no running stack in {paths.root} (`llog stack up` starts one)")
    names = {b["name"]: b for b in record.get("brokers", [])}
    if name not in names:
        raise LlogError(f"the stack in {paths.root} has no broker {name!r}: it has {', '.join(names) or 'none'}")
    return record, names[name]
