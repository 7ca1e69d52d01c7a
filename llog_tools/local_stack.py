"""The local development stack: a real Oxia server and a real S3 server (versitygw) on loopback.

``llog stack up`` installs both (once), starts them in the background, waits until they answer,
creates the bucket and writes the settings file that :meth:`llog.config.Config.load` reads, so
every llog component finds the stack with no further configuration. ``llog stack down`` stops
exactly the processes it started.

Defaults, all on 127.0.0.1 (override with ``--<name>-port`` or ``LLOG_STACK_<NAME>_PORT``, e.g.
``--s3-port`` / ``LLOG_STACK_S3_PORT``):

====================  =====  =====================================================
name                  port   what
====================  =====  =====================================================
``oxia``              16648  Oxia gRPC service (``LLOG_OXIA_SERVICE_ADDRESS``)
``oxia_metrics``      16649  Oxia metrics (``/metrics``, used as health check)
``s3``                18333  S3 API, versitygw (``LLOG_S3_ENDPOINT_URL``)
====================  =====  =====================================================

Bucket ``llog``, region ``us-east-1``, access key ``llog-local``, secret ``llog-local-secret``.

The S3 server is versitygw (``S3_SERVER_VERSION``, :mod:`llog_tools.stack.build`) with its POSIX
backend: each object is a file under ``<stack_dir>/s3/<bucket>/``, written to an unnamed temporary
file and linked into place when whole, so a reader sees an object whole or not at all. It was chosen over SeaweedFS
(which the stack ran before) by numbers: for the same 104 MB of 8 MB PUTs it spends 0.18 CPU
seconds against SeaweedFS's 1.3-1.5, CPU the S3 server takes from Spark on a laptop
(docs/architecture.md, "The local S3 server").

Files: binaries in ``<llog_home>/bin``, both built from source with ``go`` and patched (see
:mod:`llog_tools.stack.build`); state in ``<stack_dir>``: ``oxia/`` and ``s3/``
(data), ``logs/``, ``stack.json`` (pids, ports, binaries) and ``settings.json``.

Oxia as a replicated cluster (``up(..., oxia_cluster=True)``, ``llog stack up --oxia-cluster``):
instead of ``oxia standalone``, an ``oxia coordinator`` and 3 ``oxia server`` processes (services
``oxia-coordinator``, ``oxia-0`` .. ``oxia-2``), the namespace in ``OXIA_CLUSTER_SHARDS`` shards
(or ``oxia_shards``) with replication factor 3, as production runs Oxia. ``oxia-0`` serves its
public API on the ``oxia`` port and its metrics on ``oxia_metrics``; the other ports (the servers'
internal and the rest of their public and metrics ports, the coordinator's) are chosen free once
and kept in ``oxia/cluster.json`` with the data, whose shard ensembles name them. Clients get the
gRPC target ``ipv4:127.0.0.1:P0,127.0.0.1:P1,127.0.0.1:P2``, the local stand-in for the Kubernetes
Service in front of a production cluster: a client follows its shard assignments from one server,
and with a single address it would lose them, and so every new leader, while that server is down.
:func:`kill_service`, :func:`start_service`, :func:`restart_service`, :func:`pause_service` and
:func:`resume_service` act on one process, for failure tests.

Brokers (``llog stack up --broker``: one; ``--brokers N [--split-roles]``: N behind a balancer):
``python -m broker_lite`` processes on the stack's settings file. One broker listens on the broker
port (``--broker-port``, else ``LLOG_STACK_BROKER_PORT``, else ``DEFAULT_BROKER_PORT``); with
``--brokers N`` the brokers get free ports and HAProxy (``HAPROXY``, config written to
``<stack_dir>/haproxy.cfg``) listens on the broker port, sending each request to the broker the
consistent hash of its ``X-Llog-Partition: topic/partition`` header picks (docs/brokers.md).
``--kafka-port K`` also starts Kafka listeners (docs/kafka.md): the one broker's on K; with
``--brokers N``, broker ``i``'s on ``K + i``, with no balancer in front (Kafka clients connect to
the brokers Metadata names), and the balancer's entry lists them all as the bootstrap servers.
``stack.json`` keeps ``broker``, the address clients use (the balancer when there is one), and
``brokers``, every broker process (``name``, ``pid``, ``port``, ``url``, ``role``, ``log``).
``kill_broker`` and ``start_broker`` act on one broker, ``haproxy_stats`` reads the balancer's
statistics.

This module runs the stack: ``up``, ``down``, ``status`` and one service's kill, start, restart,
pause and resume. What it runs lives in :mod:`llog_tools.stack`, one module a room: ``build``
(the binaries), ``oxia_server`` (standalone and cluster), ``s3_server``, ``brokers`` (and their
Kafka listeners), ``haproxy`` (the balancer), ``network`` (address, ports, probes), ``state``
(the stack directory and ``stack.json``), ``processes`` (start, check, stop; the lock) and
``command`` (``llog stack``). Scripts that drive a stack import its entry points from here:
``up``, ``down``, ``status``, ``install``, ``free_ports``, ``StackPorts`` and the builds'
stamps ``OXIA_BUILD``, ``S3_SERVER_BUILD``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path

from llog.errors import ConfigError, LlogError
from llog_tools.stack.brokers import (
    broker_status,
    brokers_status,
    check_kafka_layout,
    start_balanced_brokers,
    start_single_broker,
    stop_brokers,
)
from llog_tools.stack.build import OXIA_BUILD, S3_SERVER_BUILD, S3_SERVER_VERSION, install  # noqa: F401 (API)
from llog_tools.stack.network import HOST, PORT_LABELS, StackPorts, free_ports, port_free, resolve_ports  # noqa: F401
from llog_tools.stack.oxia_server import (
    OXIA_CLUSTER_SHARDS,
    OXIA_COORDINATOR,
    OXIA_NAMESPACE,
    OXIA_SERVERS,
    OxiaCluster,
    oxia_cluster_config,
    oxia_cluster_layout,
    oxia_cluster_problem,
    oxia_cluster_processes,
    oxia_coordinator_command,
    oxia_problem,
    oxia_server_command,
    oxia_server_roles,
    oxia_servers_problem,
    oxia_shard_status,
    oxia_standalone_command,
    record_cluster,
)
from llog_tools.stack.processes import STOP_TIMEOUT_S, children, kill_process, locked, pid_alive, stop, tail, write_json
from llog_tools.stack.s3_server import S3_ACCESS_KEY_ID, S3_REGION, S3_SECRET_ACCESS_KEY, s3_problem, s3_server_command
from llog_tools.stack.state import StackPaths, read_record, spawn


#: Services ``stack.json`` may name, stopped in this order: the broker clients use (the balancer,
#: when there is one) before the broker processes (``brokers``, a list) so that no request is
#: sent to a stopped broker; an Oxia cluster's coordinator before its servers, so that it does
#: not elect leaders among servers being stopped. ``seaweedfs``: the
#: S3 server of stacks started before versitygw replaced it, stopped so that its ports are freed.
_RECORDED_SERVICES = ("broker", "brokers", "s3", "seaweedfs", "oxia", OXIA_COORDINATOR, *OXIA_SERVERS)


def status(stack_dir: Path | None = None) -> dict:
    """What the stack record says and whether each recorded process is alive and healthy. With an
    Oxia cluster, ``oxia`` has ``pid`` None and a ``cluster`` entry with each of its processes,
    how many shards each server leads and follows, and each shard's leader and ensemble as the
    coordinator records them."""
    paths = StackPaths(stack_dir)
    record = read_record(paths) or {}
    ports = StackPorts.from_record(record["ports"]) if "ports" in record else None
    cluster = record_cluster(record)
    s3 = record.get("s3", {})
    s3_alive = pid_alive(s3.get("pid"), s3.get("binary"))
    s3_healthy = s3_alive and s3_problem(ports, record["bucket"], prepare=False) is None
    if cluster is None:
        oxia = record.get("oxia", {})
        oxia_alive = pid_alive(oxia.get("pid"), oxia.get("binary"))
        oxia_healthy = oxia_alive and oxia_problem(ports) is None
        oxia_status = {
            "pid": oxia.get("pid") if oxia_alive else None,
            "port": ports.oxia if ports else None,
            "metrics_port": ports.oxia_metrics if ports else None,
            "service_address": f"{HOST}:{ports.oxia}" if ports else None,
            "healthy": oxia_healthy,
            "log": str(paths.log("oxia")),
        }
    else:
        processes = oxia_cluster_processes(paths, record, cluster)
        oxia_healthy = (all(p["pid"] for p in (processes["coordinator"], *processes["servers"]))
                        and oxia_cluster_problem(cluster) is None)
        oxia_status = {
            "pid": None,
            "port": ports.oxia,
            "metrics_port": ports.oxia_metrics,
            "service_address": cluster.service_address,
            "healthy": oxia_healthy,
            "log": str(paths.log(OXIA_COORDINATOR)),
            "cluster": {"shards": cluster.shards, "replication_factor": cluster.replication_factor,
                        "config": str(paths.oxia_cluster_config), **processes,
                        "shard_status": oxia_shard_status(paths)},
        }
    return {
        "running": oxia_healthy and s3_healthy,
        "stack_dir": str(paths.root),
        "started_at": record.get("started_at"),
        "oxia": oxia_status,
        "s3": {
            "pid": s3.get("pid") if s3_alive else None,
            "server": f"versitygw {S3_SERVER_VERSION}",
            "port": ports.s3 if ports else None,
            "endpoint_url": f"http://{HOST}:{ports.s3}" if ports else None,
            "bucket": record.get("bucket"),
            "data": str(paths.s3_data),
            "healthy": s3_healthy,
            "log": str(paths.log("s3")),
        },
        "settings_file": str(paths.settings),
        "broker": broker_status(record.get("broker")),
        "brokers": brokers_status(record.get("brokers", [])),
    }


def up(stack_dir: Path | None = None, ports: StackPorts | None = None, bucket: str = "llog",
       timeout_s: float = 90, broker_port: int | None = None, oxia_cluster: bool = False,
       oxia_shards: int = OXIA_CLUSTER_SHARDS, brokers: int | None = None, split_roles: bool = False,
       kafka_port: int | None = None) -> dict:
    """Install if needed, start Oxia and the S3 server, wait until healthy, write the settings file;
    with ``broker_port``, also an HTTP broker (``python -m broker_lite``) on that port (with
    ``kafka_port``, its Kafka listener on that one, docs/kafka.md); with
    ``brokers`` as well, that many brokers on ports of their own behind HAProxy on ``broker_port``
    (``split_roles``: write and read brokers; with ``kafka_port``, broker ``i``'s Kafka listener
    on ``kafka_port + i``; see :func:`~llog_tools.stack.brokers.start_balanced_brokers`). With
    ``oxia_cluster``, Oxia is a coordinator and 3 servers, ``oxia_shards`` shards with
    replication factor 3 (module docstring); an existing cluster keeps the ports and shard count
    it was made with (its data names them; asking for another count is an error).

    A stack already running and healthy in ``stack_dir`` is left as it is (whatever ``ports``
    asked for; asking for the other kind of Oxia is an error), a broker is added to it if asked
    for and not running. Data in ``stack_dir`` survives restarts; a cluster's Oxia data is apart
    from a standalone server's, so switching kinds starts from empty Oxia. Returns :func:`status`.
    """
    paths = StackPaths(stack_dir)
    ports = ports or resolve_ports()
    if oxia_cluster and oxia_shards < 1:
        raise ConfigError(f"oxia_shards={oxia_shards}: an Oxia namespace needs at least 1 shard")
    check_kafka_layout(split_roles, kafka_port)  # before anything starts
    binaries = install()
    with locked(paths.lock, timeout_s + 30, "`llog stack up` or `down`"):
        current = status(paths.root)
        if current["running"] and ("cluster" in current["oxia"]) != oxia_cluster:
            kind = "an Oxia cluster" if "cluster" in current["oxia"] else "a standalone Oxia"
            raise LlogError(f"the stack in {paths.root} runs with {kind}; stop it first (`llog stack down`)")
        if not current["running"]:
            _stop_recorded(paths)  # a stale or half-dead stack
            cluster = oxia_cluster_layout(paths, ports, oxia_shards) if oxia_cluster else None
            if cluster is not None:
                ports = dataclasses.replace(ports, oxia=cluster.servers[0].public,
                                            oxia_metrics=cluster.servers[0].metrics)
            _check_ports(ports, cluster)
            _start(paths, ports, bucket, binaries, timeout_s, cluster)
        if kafka_port is not None and broker_port is None:
            raise ConfigError("a Kafka listener runs in a broker: --kafka-port goes with --broker or --brokers N")
        if brokers is not None:
            if broker_port is None:
                raise ConfigError("brokers behind a balancer need the balancer's port (broker_port)")
            layout = {"brokers": brokers, "split_roles": split_roles, "port": broker_port, "kafka_port": kafka_port}
            running = status(paths.root)
            if not ((read_record(paths) or {}).get("broker_layout") == layout and running["broker"]["healthy"]
                    and all(b["healthy"] for b in running["brokers"])):
                start_balanced_brokers(paths, broker_port, brokers, split_roles, timeout_s, kafka_port)
        elif broker_port is not None and not ((current["broker"] or {}).get("healthy")
                                              and (current["broker"] or {}).get("kafka_port") == kafka_port):
            start_single_broker(paths, broker_port, timeout_s, kafka_port)
    return status(paths.root)


def _check_ports(ports: StackPorts, cluster: OxiaCluster | None = None) -> None:
    wanted = [(getattr(ports, name), label) for name, label in PORT_LABELS.items()]
    if cluster is not None:  # its first server has the oxia ports
        wanted = [(ports.s3, PORT_LABELS["s3"]), *cluster.labelled_ports()]
    seen: dict[int, str] = {}
    for port, label in wanted:
        if not 1 <= port <= 65535:
            raise ConfigError(f"port {port} ({label}) is not a valid TCP port")
        if port in seen:
            raise ConfigError(f"port {port} is configured for both {seen[port]} and {label}")
        seen[port] = label
    for port, label in wanted:
        if not port_free(port):
            raise LlogError(
                f"port {port} ({label}) on {HOST} is already in use; stop what uses it or choose other "
                "ports (llog stack up --help, or LLOG_STACK_<NAME>_PORT)"
            )


def _commands(paths: StackPaths, ports: StackPorts, binaries: dict[str, Path],
              cluster: OxiaCluster | None = None) -> dict[str, tuple[list[str], dict]]:
    """Each service's command line and environment, in the order they start."""
    s3_cmd, s3_env = s3_server_command(paths, ports, binaries["s3"])
    if cluster is None:
        return {"oxia": (oxia_standalone_command(paths, ports, binaries["oxia"]), dict(os.environ)),
                "s3": (s3_cmd, s3_env)}
    commands = {}
    for name, server in zip(OXIA_SERVERS, cluster.servers):
        commands[name] = (oxia_server_command(paths, name, server, binaries["oxia"]), dict(os.environ))
    commands["s3"] = (s3_cmd, s3_env)
    commands[OXIA_COORDINATOR] = (oxia_coordinator_command(paths, cluster, binaries["oxia"]), dict(os.environ))
    return commands


def _start(paths: StackPaths, ports: StackPorts, bucket: str, binaries: dict[str, Path], timeout_s: float,
           cluster: OxiaCluster | None = None) -> None:
    for d in (paths.logs, paths.oxia_data, paths.s3_data):
        d.mkdir(parents=True, exist_ok=True)
    commands = _commands(paths, ports, binaries, cluster)
    record = {
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "bucket": bucket,
        "ports": dataclasses.asdict(ports),
    }
    if cluster is not None:
        record["oxia_cluster"] = cluster.to_record()
        write_json(paths.oxia_cluster, cluster.to_record())
        paths.oxia_cluster_config.write_text(oxia_cluster_config(cluster))
        paths.oxia_cluster_status.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    try:
        for service, (cmd, env) in commands.items():
            if service == OXIA_COORDINATOR:
                # After a failed probe of a server the coordinator waits 5-15 s before the next:
                # it starts once the servers answer.
                _wait_until(paths, record, OXIA_SERVERS, lambda: oxia_servers_problem(cluster), deadline,
                            "the Oxia servers", timeout_s)
            record[service] = spawn(paths, service, cmd, env)
            write_json(paths.record, record)
        _wait_healthy(paths, record, ports, bucket, deadline, timeout_s)
    except BaseException:
        _stop_recorded(paths)
        raise
    write_json(paths.settings, {
        "LLOG_OXIA_SERVICE_ADDRESS": cluster.service_address if cluster else f"{HOST}:{ports.oxia}",
        "LLOG_OXIA_NAMESPACE": OXIA_NAMESPACE,
        "LLOG_S3_ENDPOINT_URL": f"http://{HOST}:{ports.s3}",
        "LLOG_S3_BUCKET": bucket,
        "LLOG_S3_REGION_NAME": S3_REGION,
        "LLOG_S3_ACCESS_KEY_ID": S3_ACCESS_KEY_ID,
        "LLOG_S3_SECRET_ACCESS_KEY": S3_SECRET_ACCESS_KEY,
    })


def _wait_healthy(paths: StackPaths, record: dict, ports: StackPorts, bucket: str, deadline: float,
                  timeout_s: float) -> None:
    """Until ``deadline`` (``time.monotonic()``), wait for Oxia and then S3 to be healthy."""
    cluster = record_cluster(record)
    if cluster is None:
        oxia = (("oxia",), lambda: oxia_problem(ports))
    else:
        oxia = ((*OXIA_SERVERS, OXIA_COORDINATOR), lambda: oxia_cluster_problem(cluster))
    checks = {"oxia": oxia, "s3": (("s3",), lambda: s3_problem(ports, bucket, prepare=True))}
    for what, (services, check) in checks.items():
        _wait_until(paths, record, services, check, deadline, what, timeout_s)


def _wait_until(paths: StackPaths, record: dict, services: Sequence[str], check: Callable[[], str | None],
                deadline: float, what: str, timeout_s: float) -> None:
    """Until ``check`` finds no problem, as long as ``services`` run, until ``deadline``."""
    while True:
        for service in services:
            if not pid_alive(record[service]["pid"], record[service]["binary"]):
                child = children.get(record[service]["pid"])
                exit_status = "" if child is None else f" (exit status {child.returncode})"
                raise LlogError(f"{service} exited during startup{exit_status}; last lines of {paths.log(service)}:\n"
                                + tail(paths.log(service)))
        problem = check()
        if problem is None:
            return
        if time.monotonic() > deadline:
            logs = "\n".join(f"last lines of {paths.log(service)}:\n" + tail(paths.log(service), 20 // len(services))
                             for service in services)
            raise LlogError(f"{what} did not become healthy within {timeout_s:.0f} s ({problem}); {logs}")
        time.sleep(0.25)


#: Every service name one of the functions below may be given.
_SERVICES = ("oxia", "s3", OXIA_COORDINATOR, *OXIA_SERVERS)


def _service(paths: StackPaths, service: str) -> tuple[dict, str]:
    """The record of a stack and ``service`` in it: ``oxia`` of a cluster is the server that leads
    the most shards (the first of those), the one whose loss moves the most leaders."""
    if service not in _SERVICES:
        raise LlogError(f"unknown service {service!r}: {', '.join(_SERVICES)}")
    record = read_record(paths)
    if record is None:
        raise LlogError(f"no running stack in {paths.root} (`llog stack up` starts one)")
    cluster = record_cluster(record)
    if service == "oxia" and cluster is not None:
        leads = [(roles or (0, 0))[0] for roles in map(oxia_server_roles, cluster.servers)]
        service = OXIA_SERVERS[leads.index(max(leads))]
    names = ("oxia", "s3") if cluster is None else (*OXIA_SERVERS, OXIA_COORDINATOR, "s3")
    if service not in names:
        raise LlogError(f"the stack in {paths.root} has no service {service!r}: it has {', '.join(names)}")
    return record, service


def kill_service(stack_dir: Path | None, service: str) -> dict:
    """SIGKILL one process of the stack (``oxia``, ``s3``; with an Oxia cluster, ``oxia-0`` ..
    ``oxia-2`` or ``oxia-coordinator``, ``oxia`` meaning the server that leads the most shards)
    and wait until it has exited. The record keeps it, for :func:`start_service`. Returns
    ``service`` (the name resolved), ``pid`` and ``killed_at`` (``time.monotonic()`` once it
    was gone)."""
    paths = StackPaths(stack_dir)
    with locked(paths.lock, 30, "`llog stack up` or `down`"):
        service, entry = _running(paths, service)
        kill_process(service, entry)
        return {"service": service, "pid": entry["pid"], "killed_at": time.monotonic()}


def start_service(stack_dir: Path | None, service: str, timeout_s: float = 60) -> dict:
    """Start a stopped process of the stack again (one :func:`kill_service` killed, or one that
    exited), with the same binary, ports and data; update ``stack.json`` and return once the
    whole stack is healthy: for an Oxia server, once it holds its replica of every shard again.
    Returns ``service``, ``pid`` and ``healthy_after_s`` (from the start)."""
    paths = StackPaths(stack_dir)
    with locked(paths.lock, timeout_s + 30, "`llog stack up` or `down`"):
        record, service = _service(paths, service)
        entry = record[service]
        if pid_alive(entry["pid"], entry["binary"]):
            raise LlogError(f"{service} of the stack in {paths.root} is running (pid {entry['pid']})")
        return _start_again(paths, record, service, timeout_s)


def restart_service(stack_dir: Path | None, service: str, timeout_s: float = 60, kill: bool = False,
                    down_s: float = 0.0) -> dict:
    """Stop one service of a running stack (exactly its recorded process: SIGTERM, then SIGKILL;
    with ``kill``, SIGKILL at once), wait ``down_s``, and start it again with the same binary,
    ports and data; update ``stack.json`` and return once the stack is healthy again. For failure
    tests (``python -m chaos``): clients must ride through it. Services as :func:`kill_service`
    names them. Returns ``service``, ``pid`` (the new one), ``healthy_after_s``, and ``down_from``
    and ``down_until``: the ``time.monotonic()`` span in which no process of it ran (from the old
    one's exit to just before the new one is started)."""
    paths = StackPaths(stack_dir)
    with locked(paths.lock, timeout_s + down_s + 30, "`llog stack up` or `down`"):
        record, service = _service(paths, service)
        # A health check can miss on a loaded machine, or just after another service restarted:
        # the stack gets up to timeout_s to answer before it counts as not running.
        deadline = time.monotonic() + timeout_s
        while not status(paths.root)["running"]:
            if time.monotonic() >= deadline:
                raise LlogError(f"no running stack in {paths.root} (`llog stack up` starts one)")
            time.sleep(0.5)
        entry = record[service]
        if kill:
            kill_process(service, entry)
        else:
            stop(entry["pid"], entry["binary"])
        down_from = time.monotonic()
        time.sleep(down_s)
        down_until = time.monotonic()
        return {**_start_again(paths, record, service, timeout_s), "down_from": down_from, "down_until": down_until}


def _start_again(paths: StackPaths, record: dict, service: str, timeout_s: float) -> dict:
    ports = StackPorts.from_record(record["ports"])
    cluster = record_cluster(record)
    oxia = OXIA_SERVERS[0] if cluster is not None else "oxia"
    binaries = {"oxia": Path(record[oxia]["binary"]), "s3": Path(record["s3"]["binary"])}
    cmd, env = _commands(paths, ports, binaries, cluster)[service]
    record[service] = spawn(paths, service, cmd, env)
    write_json(paths.record, record)
    started = time.monotonic()
    _wait_healthy(paths, record, ports, record["bucket"], started + timeout_s, timeout_s)
    return {"service": service, "pid": record[service]["pid"], "healthy_after_s": time.monotonic() - started}


def pause_service(stack_dir: Path | None, service: str) -> dict:
    """SIGSTOP one process of the stack (names as :func:`kill_service`): it holds its ports and
    connections and answers nothing, as a hung or partitioned server, until :func:`resume_service`
    (``down`` stops it too). Returns ``service`` and ``pid``."""
    return _signal_service(stack_dir, service, signal.SIGSTOP)


def resume_service(stack_dir: Path | None, service: str) -> dict:
    """SIGCONT a process :func:`pause_service` paused. Returns ``service`` and ``pid``."""
    return _signal_service(stack_dir, service, signal.SIGCONT)


def _signal_service(stack_dir: Path | None, service: str, sig: signal.Signals) -> dict:
    paths = StackPaths(stack_dir)
    with locked(paths.lock, 30, "`llog stack up` or `down`"):
        service, entry = _running(paths, service)
        os.kill(entry["pid"], sig)
        return {"service": service, "pid": entry["pid"]}


def _running(paths: StackPaths, service: str) -> tuple[str, dict]:
    """The resolved name and record of a running process of the stack (under its lock)."""
    record, service = _service(paths, service)
    entry = record[service]
    if not pid_alive(entry["pid"], entry["binary"]):
        raise LlogError(f"{service} of the stack in {paths.root} is not running")
    return service, entry


def down(stack_dir: Path | None = None, purge: bool = False) -> list[str]:
    """Stop the processes ``up`` started and remove the record and settings file; ``purge``
    also deletes the data. Returns what was stopped (nothing, if nothing was running)."""
    paths = StackPaths(stack_dir)
    with locked(paths.lock, 3 * STOP_TIMEOUT_S, "`llog stack up` or `down`"):
        stopped = _stop_recorded(paths)
        paths.settings.unlink(missing_ok=True)
        if purge:
            shutil.rmtree(paths.oxia_data, ignore_errors=True)
            shutil.rmtree(paths.s3_data, ignore_errors=True)
            shutil.rmtree(paths.root / "tail-cache", ignore_errors=True)  # split-role brokers' shared tail cache
            shutil.rmtree(paths.root / "seaweedfs", ignore_errors=True)  # of a stack from before versitygw
    return stopped


def _stop_recorded(paths: StackPaths) -> list[str]:
    """Stop every live process of the record, then delete the record."""
    record = read_record(paths) or {}
    stopped = []
    for service in _RECORDED_SERVICES:
        if service == "brokers":
            stopped += stop_brokers(record.get("brokers", []))
            continue
        entry = record.get(service, {})
        if pid_alive(entry.get("pid"), entry.get("binary")):
            stop(entry["pid"], entry["binary"])
            stopped.append(f"{'balancer' if 'balancer' in entry else service} (pid {entry['pid']})")
    paths.record.unlink(missing_ok=True)
    for pid, child in list(children.items()):  # reap children that exited on their own
        if child.poll() is not None:
            del children[pid]
    return stopped
