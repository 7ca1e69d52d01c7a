"""Oxia in the stack: ``oxia standalone``, or a replicated cluster of a coordinator and
:data:`OXIA_CLUSTER_SERVERS` servers (``llog stack up --oxia-cluster``, :mod:`llog_tools.local_stack`):
their command lines, the cluster's layout (ports, shards) and its coordinator's config, and the
health checks ``up`` waits for and ``status`` reports."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from llog import oxia_client_pb2 as oxia_wire
from llog.coordination import CHANNEL_OPTIONS
from llog.errors import ConfigError, LlogError
from llog_tools.stack.network import HOST, PROBE_TIMEOUT_S, StackPorts, http_ok, http_text, system_ports
from llog_tools.stack.processes import paused, pid_alive

if TYPE_CHECKING:  # annotations only: llog_tools.stack.state imports this module
    from llog_tools.stack.state import StackPaths


OXIA_NAMESPACE = "default"

#: An Oxia cluster's servers; its replication factor is their number, so every server holds a
#: replica of every shard.
OXIA_CLUSTER_SERVERS = 3

#: Shards of the namespace of a new Oxia cluster unless ``up`` is told otherwise.
OXIA_CLUSTER_SHARDS = 2

OXIA_COORDINATOR = "oxia-coordinator"

OXIA_SERVERS = tuple(f"oxia-{i}" for i in range(OXIA_CLUSTER_SERVERS))


@dataclass(frozen=True)
class OxiaServerPorts:
    """One Oxia server's ports on 127.0.0.1: clients, other servers and the coordinator, metrics."""

    public: int
    internal: int
    metrics: int


@dataclass(frozen=True)
class OxiaCluster:
    """A local Oxia cluster's layout: its shard count, replication factor and ports."""

    shards: int
    replication_factor: int
    coordinator_internal: int
    coordinator_metrics: int
    servers: tuple[OxiaServerPorts, ...]

    @property
    def service_address(self) -> str:
        """The gRPC target that reaches whichever server answers (gRPC's ``ipv4:`` address list)."""
        return "ipv4:" + ",".join(f"{HOST}:{server.public}" for server in self.servers)

    def to_record(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_record(cls, record: Mapping) -> "OxiaCluster":
        return cls(**{**record, "servers": tuple(OxiaServerPorts(**server) for server in record["servers"])})

    def labelled_ports(self) -> list[tuple[int, str]]:
        ports = [(self.coordinator_internal, "Oxia coordinator internal"),
                 (self.coordinator_metrics, "Oxia coordinator metrics")]
        for name, server in zip(OXIA_SERVERS, self.servers):
            ports += [(server.public, f"{name} public"), (server.internal, f"{name} internal"),
                      (server.metrics, f"{name} metrics")]
        return ports


def record_cluster(record: Mapping) -> OxiaCluster | None:
    return OxiaCluster.from_record(record["oxia_cluster"]) if "oxia_cluster" in record else None


def oxia_cluster_layout(paths: StackPaths, ports: StackPorts, shards: int) -> OxiaCluster:
    """The cluster whose data is in ``paths``, else a new one: ``oxia-0`` on the ``oxia`` and
    ``oxia_metrics`` ports, the other ports chosen free by the system. ``up`` keeps it."""
    if paths.oxia_cluster.is_file():
        try:
            cluster = OxiaCluster.from_record(json.loads(paths.oxia_cluster.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise LlogError(f"cannot read {paths.oxia_cluster}: {e} (`llog stack down --purge` deletes the "
                            "stack's data)") from e
        if cluster.shards != shards:
            raise ConfigError(f"the Oxia cluster in {paths.oxia_data} has {cluster.shards} shards, not {shards}: "
                              "its data keeps them (`llog stack down --purge` deletes it)")
        return cluster
    # oxia-0 has two of its ports already, the coordinator needs two
    free = system_ports(3 * OXIA_CLUSTER_SERVERS, avoid=frozenset(dataclasses.astuple(ports)))
    servers = [OxiaServerPorts(ports.oxia, free.pop(), ports.oxia_metrics)]
    servers += [OxiaServerPorts(free.pop(), free.pop(), free.pop()) for _ in OXIA_SERVERS[1:]]
    return OxiaCluster(shards=shards, replication_factor=OXIA_CLUSTER_SERVERS, coordinator_internal=free.pop(),
                       coordinator_metrics=free.pop(), servers=tuple(servers))


def oxia_cluster_config(cluster: OxiaCluster) -> str:
    """The coordinator's cluster config (YAML): the namespace, and the servers by name."""
    lines = ["namespaces:", f"  - name: {OXIA_NAMESPACE}", f"    initialShardCount: {cluster.shards}",
             f"    replicationFactor: {cluster.replication_factor}", "servers:"]
    for name, server in zip(OXIA_SERVERS, cluster.servers):
        lines += [f"  - name: {name}", f"    public: {HOST}:{server.public}", f"    internal: {HOST}:{server.internal}"]
    return "\n".join(lines) + "\n"


def oxia_standalone_command(paths: StackPaths, ports: StackPorts, binary: Path) -> list[str]:
    """``oxia standalone`` on the ``oxia`` and ``oxia_metrics`` ports, its data in ``<stack_dir>/oxia``."""
    return [
        str(binary), "standalone",
        "-p", f"{HOST}:{ports.oxia}", "-m", f"{HOST}:{ports.oxia_metrics}",
        "--data-dir", str(paths.oxia_data / "data"), "--wal-dir", str(paths.oxia_data / "wal"),
    ]


def oxia_server_command(paths: StackPaths, name: str, server: OxiaServerPorts, binary: Path) -> list[str]:
    """``oxia server`` ``name`` of a cluster on its ports, its data in ``<stack_dir>/oxia/<name>``."""
    return [
        str(binary), "server",
        "-p", f"{HOST}:{server.public}", "-i", f"{HOST}:{server.internal}", "-m", f"{HOST}:{server.metrics}",
        "--data-dir", str(paths.oxia_data / name / "data"), "--wal-dir", str(paths.oxia_data / name / "wal"),
    ]


def oxia_coordinator_command(paths: StackPaths, cluster: OxiaCluster, binary: Path) -> list[str]:
    """``oxia coordinator`` of a cluster, its config and its state file under ``<stack_dir>/oxia``."""
    return [
        str(binary), "coordinator", "--conf", str(paths.oxia_cluster_config),
        "--metadata", "file", "--file-clusters-status-path", str(paths.oxia_cluster_status),
        "-i", f"{HOST}:{cluster.coordinator_internal}", "-m", f"{HOST}:{cluster.coordinator_metrics}",
    ]


def oxia_problem(ports: StackPorts) -> str | None:
    """Why Oxia is not healthy, or None if it is."""
    if not http_ok(f"http://{HOST}:{ports.oxia_metrics}/metrics"):
        return f"no HTTP 200 from http://{HOST}:{ports.oxia_metrics}/metrics"
    channel = grpc.insecure_channel(f"{HOST}:{ports.oxia}", options=CHANNEL_OPTIONS)
    try:
        grpc.channel_ready_future(channel).result(timeout=PROBE_TIMEOUT_S)
    except grpc.FutureTimeoutError:
        return f"gRPC on {HOST}:{ports.oxia} is not ready"
    finally:
        channel.close()
    return None


def oxia_servers_problem(cluster: OxiaCluster) -> str | None:
    """Why not every server of the cluster answers on metrics yet, or None."""
    for name, server in zip(OXIA_SERVERS, cluster.servers):
        if not http_ok(f"http://{HOST}:{server.metrics}/metrics"):
            return f"no HTTP 200 from {name}'s http://{HOST}:{server.metrics}/metrics"
    return None


def _metric(text: str, name: str) -> dict[str, float]:
    """The samples of metric ``name`` in a Prometheus text exposition: labels (as written) to value."""
    samples = {}
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
            labels, _, value = line[len(name):].rpartition(" ")
            samples[labels] = float(value)
    return samples


_OXIA_SERVICE = "/io.streamnative.oxia.proto.OxiaClient/"


def oxia_server_roles(server: OxiaServerPorts) -> tuple[int, int] | None:
    """How many shards the server leads and follows, by its metrics; None if they do not answer."""
    text = http_text(f"http://{HOST}:{server.metrics}/metrics")
    if text is None:
        return None
    return (int(sum(_metric(text, "oxia_server_leaders_count").values())),
            int(sum(_metric(text, "oxia_server_followers_count").values())))


def _oxia_assignments(address: str) -> dict[int, str]:
    """The first shard assignments of the namespace that the server at ``address`` sends: shard
    to leader's address. A server sends none until the coordinator has sent it its own; raises
    grpc.RpcError."""
    channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    try:
        stream = channel.unary_stream(
            _OXIA_SERVICE + "GetShardAssignments",
            request_serializer=oxia_wire.ShardAssignmentsRequest.SerializeToString,
            response_deserializer=oxia_wire.ShardAssignments.FromString)
        call = stream(oxia_wire.ShardAssignmentsRequest(namespace=OXIA_NAMESPACE), timeout=PROBE_TIMEOUT_S)
        try:
            first = next(call, None)
        finally:
            call.cancel()
    finally:
        channel.close()
    if first is None or OXIA_NAMESPACE not in first.namespaces:
        return {}
    return {a.shard: a.leader for a in first.namespaces[OXIA_NAMESPACE].assignments}


def _oxia_shard_problem(shard: int, leader: str) -> str | None:
    """Why a put, a get and a delete of a probe key on ``shard`` at its ``leader`` did not all
    succeed, or None. A put commits only once a majority of the shard's replicas has it."""
    key, value = f"_llog_stack_probe/{os.getpid()}", b"llog"
    channel = grpc.insecure_channel(leader, options=CHANNEL_OPTIONS)
    try:
        write = channel.unary_unary(_OXIA_SERVICE + "Write",
                                    request_serializer=oxia_wire.WriteRequest.SerializeToString,
                                    response_deserializer=oxia_wire.WriteResponse.FromString)
        read = channel.unary_stream(_OXIA_SERVICE + "Read", request_serializer=oxia_wire.ReadRequest.SerializeToString,
                                    response_deserializer=oxia_wire.ReadResponse.FromString)
        put = write(oxia_wire.WriteRequest(shard=shard, puts=[oxia_wire.PutRequest(key=key, value=value)]),
                    timeout=PROBE_TIMEOUT_S)
        if put.puts[0].status != oxia_wire.OK:
            return f"shard {shard}: a put at its leader {leader} answered status {put.puts[0].status}"
        gets = [g for response in read(oxia_wire.ReadRequest(shard=shard, gets=[
            oxia_wire.GetRequest(key=key, include_value=True)]), timeout=PROBE_TIMEOUT_S) for g in response.gets]
        if [(g.status, g.value) for g in gets] != [(oxia_wire.OK, value)]:
            return f"shard {shard}: a get at its leader {leader} did not return the value just put"
        write(oxia_wire.WriteRequest(shard=shard, deletes=[oxia_wire.DeleteRequest(key=key)]), timeout=PROBE_TIMEOUT_S)
    except grpc.RpcError as e:
        return f"shard {shard} at its leader {leader}: {e.code().name}: {e.details()}"
    finally:
        channel.close()
    return None


def oxia_cluster_problem(cluster: OxiaCluster) -> str | None:
    """Why the Oxia cluster is not healthy, or None if it is: the coordinator sees every server
    running; every server answers on metrics, holds a replica (as leader or follower) of every
    shard and sends shard assignments naming a leader for each; each shard has one leader, and
    a put and a get on it succeed."""
    text = http_text(f"http://{HOST}:{cluster.coordinator_metrics}/metrics")
    if text is None:
        return f"no HTTP 200 from the coordinator's http://{HOST}:{cluster.coordinator_metrics}/metrics"
    running = {labels for labels, value in _metric(text, "oxia_coordinator_node_running").items() if value == 1}
    for name in OXIA_SERVERS:
        if not any(f'node="{name}"' in labels for labels in running):
            return f"the coordinator does not see {name} running"
    leaders = 0
    for name, server in zip(OXIA_SERVERS, cluster.servers):
        roles = oxia_server_roles(server)
        if roles is None:
            return f"no HTTP 200 from {name}'s http://{HOST}:{server.metrics}/metrics"
        if sum(roles) != cluster.shards:
            return (f"{name} holds replicas of {sum(roles)} of the {cluster.shards} shards (leads {roles[0]}, "
                    f"follows {roles[1]})")
        leaders += roles[0]
    if leaders != cluster.shards:
        return f"the servers lead {leaders} shards, not {cluster.shards}"
    for name, server in zip(OXIA_SERVERS, cluster.servers):
        try:
            assignments = _oxia_assignments(f"{HOST}:{server.public}")
        except grpc.RpcError as e:
            return f"{name} sends no shard assignments: {e.code().name}: {e.details()}"
        if len(assignments) != cluster.shards or not all(assignments.values()):
            return (f"{name}'s shard assignments name leaders for {sum(map(bool, assignments.values()))} of "
                    f"{cluster.shards} shards")
    for shard, leader in sorted(assignments.items()):  # the last server's: a client may follow any
        if (problem := _oxia_shard_problem(shard, leader)) is not None:
            return problem
    return None


def oxia_shard_status(paths: "StackPaths") -> dict[int, dict]:
    """Each shard's leader, ensemble, term, status and hash range (the low 32 bits of the XXH64
    hash of a key's partition key, both ends inclusive), as the coordinator's state file has them."""
    try:
        state = json.loads(paths.oxia_cluster_status.read_text())
        shards = state["clusterStatus"]["namespaces"][OXIA_NAMESPACE]["shards"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return {int(shard): {"status": s.get("status"), "term": s.get("term"),
                         "leader": (s.get("leader") or {}).get("public"),
                         "ensemble": [member.get("public") for member in s.get("ensemble") or []],
                         "hash_range": [(s.get("int32HashRange") or {}).get(end) for end in ("min", "max")]}
            for shard, s in shards.items()}


def oxia_cluster_processes(paths: StackPaths, record: Mapping, cluster: OxiaCluster) -> dict:
    """The cluster's processes as :func:`llog_tools.local_stack.status` reports them (``pid`` None: not running)."""
    def pid(service: str) -> int | None:
        entry = record.get(service, {})
        return entry.get("pid") if pid_alive(entry.get("pid"), entry.get("binary")) else None

    servers = []
    for name, server in zip(OXIA_SERVERS, cluster.servers):
        roles = oxia_server_roles(server) if pid(name) else None
        servers.append({
            "name": name, "pid": pid(name), "paused": paused(pid(name)),
            "public": f"{HOST}:{server.public}", "internal": f"{HOST}:{server.internal}",
            "metrics_port": server.metrics, "leads": roles[0] if roles else None,
            "follows": roles[1] if roles else None, "data": str(paths.oxia_data / name), "log": str(paths.log(name)),
        })
    return {
        "coordinator": {"name": OXIA_COORDINATOR, "pid": pid(OXIA_COORDINATOR), "paused": paused(pid(OXIA_COORDINATOR)),
                        "internal": f"{HOST}:{cluster.coordinator_internal}",
                        "metrics_port": cluster.coordinator_metrics, "state": str(paths.oxia_cluster_status),
                        "log": str(paths.log(OXIA_COORDINATOR))},
        "servers": servers,
    }
