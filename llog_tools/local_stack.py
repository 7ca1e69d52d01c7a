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

The S3 server is versitygw (:data:`S3_SERVER_VERSION`) with its POSIX backend: each object is a
file under ``<stack_dir>/s3/<bucket>/``, written to an unnamed temporary file and linked into
place when whole, so a reader sees an object whole or not at all. It was chosen over SeaweedFS
(which the stack ran before) by numbers: for the same 104 MB of 8 MB PUTs it spends 0.18 CPU
seconds against SeaweedFS's 1.3-1.5, CPU the S3 server takes from Spark on a laptop
(docs/architecture.md, "The local S3 server").

Files: binaries in ``<llog_home>/bin``, both built from source with ``go`` and patched (see
:data:`OXIA_PATCH` and :data:`S3_SERVER_PATCH`); state in ``<stack_dir>``: ``oxia/`` and ``s3/``
(data), ``logs/``, ``stack.json`` (pids, ports, binaries) and ``settings.json``.

Oxia as a replicated cluster (``up(..., oxia_cluster=True)``, ``llog stack up --oxia-cluster``):
instead of ``oxia standalone``, an ``oxia coordinator`` and 3 ``oxia server`` processes (services
``oxia-coordinator``, ``oxia-0`` .. ``oxia-2``), the namespace in :data:`OXIA_CLUSTER_SHARDS` shards
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
port (``--broker-port``, else ``LLOG_STACK_BROKER_PORT``, else :data:`DEFAULT_BROKER_PORT`); with
``--brokers N`` the brokers get free ports and HAProxy (:data:`HAPROXY`, config written to
``<stack_dir>/haproxy.cfg``) listens on the broker port, sending each request to the broker the
consistent hash of its ``X-Llog-Partition: topic/partition`` header picks (docs/brokers.md).
``--kafka-port K`` also starts Kafka listeners (docs/kafka.md): the one broker's on K; with
``--brokers N``, broker ``i``'s on ``K + i``, with no balancer in front (Kafka clients connect to
the brokers Metadata names), and the balancer's entry lists them all as the bootstrap servers.
``stack.json`` keeps ``broker``, the address clients use (the balancer when there is one), and
``brokers``, every broker process (``name``, ``pid``, ``port``, ``url``, ``role``, ``log``).
:func:`kill_broker` and :func:`start_broker` act on one broker, :func:`haproxy_stats` reads the
balancer's statistics.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import boto3
import grpc
from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError

from llog import config
from llog import oxia_client_pb2 as oxia_wire
from llog.coordination import CHANNEL_OPTIONS
from llog.errors import ConfigError, LlogError

#: Oxia server version built by :func:`install`. The project pins v0.14.4, but the Go module
#: proxy reachable here answers 403 for the zips of v0.14.1..v0.14.5, and ``go install ...@v0.14.0``
#: fails too because the proxy refuses the ``@v/list`` lookup it makes. ``go mod download`` of an
#: exact version followed by ``go build ./cmd`` in a copy of the downloaded module works, so that is
#: how v0.14.0 is built.
OXIA_VERSION = "v0.14.0"
OXIA_MODULE = "github.com/oxia-db/oxia"
#: v0.14.0 takes a write's WAL offset under one lock and appends the entry under another, so two
#: concurrent writes can reach the WAL out of order; the WAL then rejects every later write of the
#: shard ("N can not immediately follow M") until a restart. :func:`install` builds it with this
#: patch, which makes taking the offset and appending one step.
OXIA_PATCH = {
    "file": "server/leader_controller.go",
    "find": "\ttimer := lc.writeLatencyHisto.Timer()\n",
    "insert_before": "\twalAppendOrder.Lock() // llog: offsets reach the WAL in the order they are taken\n"
                     "\tdefer walAppendOrder.Unlock()\n",
    "append": "\n// llog: see walAppendOrder.Lock() in write.\nvar walAppendOrder sync.Mutex\n",
}
#: What :func:`install` writes next to the binary; another value there means rebuild.
OXIA_BUILD = f"{OXIA_VERSION}+llog-wal-order"
#: The S3 server built by :func:`install`, from the Go module proxy, with :data:`S3_SERVER_PATCH`.
S3_SERVER_MODULE = "github.com/versity/versitygw"
S3_SERVER_VERSION = "v1.8.0"
#: versitygw sends a whole object with sendfile but copies a range through a buffer in user
#: space: 3 times the CPU per byte (0.7-0.8 CPU-s per GB against 0.22-0.31 here), and nearly
#: every read of llog's is a range (a body inside a shared WAL blob, after its header). On the
#: same cores as Spark that is CPU taken from the read. The patch sends a range the way a whole
#: object is sent: the file, at the range's start, limited to its length; fasthttp copies an
#: ``io.WriterTo`` body with ``WriteTo``, which flushes the response's headers and hands the
#: limited file to the connection's ``ReadFrom`` (sendfile).
S3_SERVER_PATCH = {
    "file": "backend/posix/data_io_linux.go",
    "replace": {
        "\t\"syscall\"\n\n\t\"github.com/versity/versitygw/backend\"\n": "\t\"syscall\"\n",
        "\t\trdr := io.NewSectionReader(f, startOffset, length)\n"
        "\t\treturn withReadBufferSize(&backend.FileSectionReadCloser{R: rdr, F: f}, readBufferSize), nil\n":
            "\t\tif _, err := f.Seek(startOffset, io.SeekStart); err != nil { // llog: see llogFileRange\n"
            "\t\t\treturn nil, fmt.Errorf(\"seek range start: %w\", err)\n"
            "\t\t}\n"
            "\t\treturn &llogFileRange{f: f, r: &io.LimitedReader{R: f, N: length}}, nil\n",
    },
    "append": """
// llogFileRange is a range of a file sent with sendfile, as a whole file is (llog's patch).
type llogFileRange struct {
	f *os.File
	r *io.LimitedReader
}

func (b *llogFileRange) Read(p []byte) (int, error) { return b.r.Read(p) }

func (b *llogFileRange) WriteTo(w io.Writer) (int64, error) {
	if f, ok := w.(interface{ Flush() error }); ok { // with nothing buffered, bufio passes ReadFrom on
		if err := f.Flush(); err != nil {
			return 0, err
		}
	}
	return io.Copy(w, b.r)
}

func (b *llogFileRange) Close() error { return b.f.Close() }
""",
}
#: What :func:`install` writes next to the S3 server's binary; another value there means rebuild.
S3_SERVER_BUILD = f"{S3_SERVER_VERSION}+llog-range-sendfile"

S3_ACCESS_KEY_ID = "llog-local"
S3_SECRET_ACCESS_KEY = "llog-local-secret"
S3_REGION = "us-east-1"
OXIA_NAMESPACE = "default"

HOST = "127.0.0.1"


@dataclass(frozen=True)
class StackPorts:
    """The TCP ports of the stack, all on 127.0.0.1."""

    oxia: int
    oxia_metrics: int
    s3: int

    @classmethod
    def from_record(cls, ports: Mapping[str, int]) -> "StackPorts":
        """From ``stack.json``; a record of an older stack may name ports it no longer has."""
        return cls(**{field.name: ports[field.name] for field in dataclasses.fields(cls)})


DEFAULT_PORTS = StackPorts(oxia=16648, oxia_metrics=16649, s3=18333)

_PORT_LABELS = {
    "oxia": "Oxia",
    "oxia_metrics": "Oxia metrics",
    "s3": "S3",
}

#: Where ``llog stack up --broker`` serves the HTTP broker unless told otherwise (with
#: ``--brokers N``, where the balancer listens).
DEFAULT_BROKER_PORT = 18090
BROKER_PORT_ENV = "LLOG_STACK_BROKER_PORT"
#: The load balancer in front of ``--brokers N``: Debian's HAProxy (``apt-get install haproxy``).
HAPROXY = "/usr/sbin/haproxy"
#: The request header whose value (``topic/partition``) the balancer hashes to pick a broker, so
#: that one broker produces a partition and serves its consumes from its tail cache.
PARTITION_HEADER = "X-Llog-Partition"
#: The response header the balancer adds: the name of the broker that answered (``broker-0``..).
BROKER_HEADER = "X-Llog-Broker"
#: Seconds the balancer waits for a broker's answer: more than a long poll's longest wait
#: (``LLOG_BROKER_MAX_WAIT_MS``, 30 s by default).
_BALANCER_SERVER_TIMEOUT_S = 65

_INSTALL_TIMEOUT_S = 30 * 60
_STOP_TIMEOUT_S = 10
_PROBE_TIMEOUT_S = 2
#: Where the S3 server answers health checks (GET, no credentials).
_S3_HEALTH_PATH = "/healthz"

#: An Oxia cluster's servers; its replication factor is their number, so every server holds a
#: replica of every shard.
OXIA_CLUSTER_SERVERS = 3
#: Shards of the namespace of a new Oxia cluster unless ``up`` is told otherwise.
OXIA_CLUSTER_SHARDS = 2
OXIA_COORDINATOR = "oxia-coordinator"
OXIA_SERVERS = tuple(f"oxia-{i}" for i in range(OXIA_CLUSTER_SERVERS))
#: Services ``stack.json`` may name, stopped in this order: the broker clients use (the balancer,
#: when there is one) before the broker processes (``brokers``, a list) so that no request is
#: sent to a stopped broker; an Oxia cluster's coordinator before its servers, so that it does
#: not elect leaders among servers being stopped. ``seaweedfs``: the
#: S3 server of stacks started before versitygw replaced it, stopped so that its ports are freed.
_RECORDED_SERVICES = ("broker", "brokers", "s3", "seaweedfs", "oxia", OXIA_COORDINATOR, *OXIA_SERVERS)


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


# --- ports ------------------------------------------------------------------------------------


def _port_env(name: str) -> str:
    return f"LLOG_STACK_{name.upper()}_PORT"


def resolve_ports(overrides: Mapping[str, int | None] | None = None,
                  env: Mapping[str, str] | None = None) -> StackPorts:
    """Ports from ``overrides`` (field name to port, None = unset), else ``LLOG_STACK_<NAME>_PORT``,
    else :data:`DEFAULT_PORTS`."""
    env = os.environ if env is None else env
    overrides = overrides or {}
    values = {}
    for name in _PORT_LABELS:
        if overrides.get(name) is not None:
            values[name] = overrides[name]
        elif env.get(_port_env(name)):
            try:
                values[name] = int(env[_port_env(name)])
            except ValueError:
                raise ConfigError(f"{_port_env(name)}={env[_port_env(name)]!r} is not a port number") from None
        else:
            values[name] = getattr(DEFAULT_PORTS, name)
    return StackPorts(**values)


def free_ports() -> StackPorts:
    """Free ports chosen by the system, distinct. For tests."""
    return StackPorts(*_system_ports(len(_PORT_LABELS)))


def _system_ports(count: int, avoid: frozenset[int] = frozenset()) -> list[int]:
    """``count`` distinct free ports chosen by the system, none in ``avoid``."""
    held: list[socket.socket] = []
    chosen: list[int] = []
    try:
        while len(chosen) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(sock)  # held open until all are chosen, so none is chosen twice
            sock.bind((HOST, 0))
            if sock.getsockname()[1] not in avoid:
                chosen.append(sock.getsockname()[1])
        return chosen
    finally:
        for sock in held:
            sock.close()


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers do
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def _check_ports(ports: StackPorts, cluster: OxiaCluster | None = None) -> None:
    wanted = [(getattr(ports, name), label) for name, label in _PORT_LABELS.items()]
    if cluster is not None:  # its first server has the oxia ports
        wanted = [(ports.s3, _PORT_LABELS["s3"]), *cluster.labelled_ports()]
    seen: dict[int, str] = {}
    for port, label in wanted:
        if not 1 <= port <= 65535:
            raise ConfigError(f"port {port} ({label}) is not a valid TCP port")
        if port in seen:
            raise ConfigError(f"port {port} is configured for both {seen[port]} and {label}")
        seen[port] = label
    for port, label in wanted:
        if not _port_free(port):
            raise LlogError(
                f"port {port} ({label}) on {HOST} is already in use; stop what uses it or choose other "
                "ports (llog stack up --help, or LLOG_STACK_<NAME>_PORT)"
            )


# --- install ----------------------------------------------------------------------------------


def install(home: Path | None = None) -> dict[str, Path]:
    """Install the Oxia and S3 server binaries unless present; return their paths."""
    home = Path(home) if home else config.llog_home()
    bin_dir = home / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    with _locked(bin_dir / ".install.lock", _INSTALL_TIMEOUT_S, "an install"):
        oxia, stamp = bin_dir / "oxia", bin_dir / "oxia.build"
        if not (stamp.is_file() and stamp.read_text().strip() == OXIA_BUILD and _runs([str(oxia), "--help"])):
            _build_oxia(oxia)
            stamp.write_text(OXIA_BUILD + "\n")
        s3, stamp = bin_dir / "versitygw", bin_dir / "versitygw.build"
        if not (stamp.is_file() and stamp.read_text().strip() == S3_SERVER_BUILD and _runs([str(s3), "--version"])):
            _build_s3_server(s3)
            stamp.write_text(S3_SERVER_BUILD + "\n")
    return {"oxia": oxia, "s3": s3}


def _go_env(target: Path, what: str) -> dict[str, str]:
    """The environment for ``go`` builds: the user's, with the module cache left writable."""
    if not shutil.which("go"):
        raise ConfigError(
            f"{what} is built from source into {target} and needs Go: install Go "
            "(https://go.dev/dl/) and put `go` on PATH"
        )
    goflags = _run(["go", "env", "GOFLAGS"], timeout=60).strip()  # keep the user's, add ours
    return {**os.environ, "GOFLAGS": f"{goflags} -modcacherw".strip()}


def _build_s3_server(target: Path) -> None:
    _build_patched("versitygw", S3_SERVER_MODULE, S3_SERVER_VERSION, "./cmd/versitygw", _patch_s3_server, target,
                   "about 3 minutes")


def _build_oxia(target: Path) -> None:
    _build_patched("oxia", OXIA_MODULE, OXIA_VERSION, "./cmd", _patch_oxia, target, "about 2 minutes")


def _build_patched(name: str, module: str, version: str, package: str, patch: Callable[[Path], None],
                   target: Path, takes: str) -> None:
    """``go mod download`` of ``module@version``, ``patch`` on a copy of its source, and ``go
    build`` of ``package`` there into ``target`` (replaced only by a finished build)."""
    env = _go_env(target, f"the {name} server")
    started = time.monotonic()
    _progress(f"building {name} {version} into {target} (the first build takes {takes})")
    with tempfile.TemporaryDirectory(prefix=f"llog-{name}-") as tmp:
        out = _run(["go", "mod", "download", "-json", f"{module}@{version}"], cwd=tmp, env=env, timeout=600)
        info = json.loads(out)
        if info.get("Error") or not info.get("Dir"):
            raise LlogError(f"go mod download {module}@{version} failed: {info.get('Error', out)}")
        source = Path(tmp) / name
        shutil.copytree(info["Dir"], source, copy_function=shutil.copyfile)  # the cache is read-only
        patch(source)
        _progress(f"downloaded and patched {module}@{version}; compiling")
        partial = target.with_name(f".{name}.{os.getpid()}.tmp")
        try:
            _run(["go", "build", "-o", str(partial), package], cwd=source, env=env, timeout=1800)
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
    _progress(f"built {target} in {time.monotonic() - started:.0f} s")


def _patch_oxia(source: Path) -> None:
    path = source / OXIA_PATCH["file"]
    text = path.read_text()
    if text.count(OXIA_PATCH["find"]) != 1:
        raise LlogError(f"cannot patch {path}: it does not look like oxia {OXIA_VERSION}")
    text = text.replace(OXIA_PATCH["find"], OXIA_PATCH["insert_before"] + OXIA_PATCH["find"])
    path.write_text(text + OXIA_PATCH["append"])


def _patch_s3_server(source: Path) -> None:
    path = source / S3_SERVER_PATCH["file"]
    text = path.read_text()
    for find, replace in S3_SERVER_PATCH["replace"].items():
        if text.count(find) != 1:
            raise LlogError(f"cannot patch {path}: it does not look like versitygw {S3_SERVER_VERSION}")
        text = text.replace(find, replace)
    path.write_text(text + S3_SERVER_PATCH["append"])


def _run(cmd: list[str], timeout: float, **kwargs) -> str:
    """Run ``cmd``; return its stdout, or raise LlogError with the tail of its output."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired:
        raise LlogError(f"`{' '.join(cmd)}` did not finish within {timeout:.0f} s") from None
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
        raise LlogError(f"`{' '.join(cmd)}` failed with exit code {done.returncode}:\n{tail}")
    return done.stdout


def _runs(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _progress(message: str) -> None:
    print(f"llog: {message}", file=sys.stderr, flush=True)


@contextmanager
def _locked(path: Path, timeout_s: float, what: str) -> Iterator[None]:
    """Hold an exclusive flock on ``path``, waiting at most ``timeout_s`` for it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LlogError(f"gave up after {timeout_s:.0f} s waiting for {what} in another process "
                                    f"(lock {path})") from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# --- state ------------------------------------------------------------------------------------


class _Paths:
    def __init__(self, root: Path | None):
        self.root = Path(root) if root else config.stack_dir()
        self.record = self.root / "stack.json"
        self.settings = self.root / "settings.json"
        self.lock = self.root / ".stack.lock"
        self.logs = self.root / "logs"
        self.oxia_data = self.root / "oxia"
        self.s3_data = self.root / "s3"
        # An Oxia cluster's layout, config and coordinator state, kept with the servers' data.
        self.oxia_cluster = self.oxia_data / "cluster.json"
        self.oxia_cluster_config = self.oxia_data / "cluster.yaml"
        self.oxia_cluster_status = self.oxia_data / OXIA_COORDINATOR / "cluster-status.json"

    def log(self, service: str) -> Path:
        return self.logs / f"{service}.log"


def _read_record(paths: _Paths) -> dict | None:
    try:
        return json.loads(paths.record.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as e:
        raise LlogError(f"cannot read {paths.record}: {e} (delete it if no stack is running)") from e


def _write_json(path: Path, value: dict) -> None:
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(json.dumps(value, indent=2) + "\n")
    os.replace(partial, path)


def _alive(pid: int | None, binary: str | None) -> bool:
    """True if ``pid`` runs ``binary`` (a recycled pid runs something else; a zombie, nothing).
    A running process this one started counts even before it has exec'ed.

    The binary is read from ``/proc/PID/exe``, not ``cmdline``: ``Popen`` returns once the child's
    close-on-exec pipe closes, which the kernel does before it fills in the new program's argument
    area, so for a moment a running process has an empty ``cmdline`` (seen in 1324 of 2000 spawns
    of ``sleep`` read at once). ``exe`` is set before that pipe closes, and a zombie has none."""
    if not pid or not binary:
        return False
    if _live_child(pid) is not None:
        return True
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False
    # A binary rebuilt (replaced) while its process runs reads as "PATH (deleted)".
    return exe.removesuffix(" (deleted)") == os.path.realpath(binary)


#: Processes this Python process started, kept so they can be reaped when stopped.
_children: dict[int, subprocess.Popen] = {}


def _live_child(pid: int | None) -> subprocess.Popen | None:
    """The process this one started as ``pid``, while it runs. Once it has exited (and been
    reaped) its pid is free: pids wrap (at 32768 on many machines), so in a long-lived process
    the number may by now name someone else's process, which only ``/proc`` can tell."""
    child = _children.get(pid)
    return child if child is not None and child.poll() is None else None


# --- health -----------------------------------------------------------------------------------


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=_PROBE_TIMEOUT_S) as response:
            return response.status == 200
    except (OSError, http.client.HTTPException):
        return False


def _oxia_problem(ports: StackPorts) -> str | None:
    """Why Oxia is not healthy, or None if it is."""
    if not _http_ok(f"http://{HOST}:{ports.oxia_metrics}/metrics"):
        return f"no HTTP 200 from http://{HOST}:{ports.oxia_metrics}/metrics"
    channel = grpc.insecure_channel(f"{HOST}:{ports.oxia}", options=CHANNEL_OPTIONS)
    try:
        grpc.channel_ready_future(channel).result(timeout=_PROBE_TIMEOUT_S)
    except grpc.FutureTimeoutError:
        return f"gRPC on {HOST}:{ports.oxia} is not ready"
    finally:
        channel.close()
    return None


def _http_text(url: str) -> str | None:
    """The body of a GET of ``url`` if it answers 200, else None."""
    try:
        with urllib.request.urlopen(url, timeout=_PROBE_TIMEOUT_S) as response:
            return response.read().decode(errors="replace") if response.status == 200 else None
    except (OSError, http.client.HTTPException):
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


def _oxia_server_roles(server: OxiaServerPorts) -> tuple[int, int] | None:
    """How many shards the server leads and follows, by its metrics; None if they do not answer."""
    text = _http_text(f"http://{HOST}:{server.metrics}/metrics")
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
        call = stream(oxia_wire.ShardAssignmentsRequest(namespace=OXIA_NAMESPACE), timeout=_PROBE_TIMEOUT_S)
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
                    timeout=_PROBE_TIMEOUT_S)
        if put.puts[0].status != oxia_wire.OK:
            return f"shard {shard}: a put at its leader {leader} answered status {put.puts[0].status}"
        gets = [g for response in read(oxia_wire.ReadRequest(shard=shard, gets=[
            oxia_wire.GetRequest(key=key, include_value=True)]), timeout=_PROBE_TIMEOUT_S) for g in response.gets]
        if [(g.status, g.value) for g in gets] != [(oxia_wire.OK, value)]:
            return f"shard {shard}: a get at its leader {leader} did not return the value just put"
        write(oxia_wire.WriteRequest(shard=shard, deletes=[oxia_wire.DeleteRequest(key=key)]), timeout=_PROBE_TIMEOUT_S)
    except grpc.RpcError as e:
        return f"shard {shard} at its leader {leader}: {e.code().name}: {e.details()}"
    finally:
        channel.close()
    return None


def _oxia_cluster_problem(cluster: OxiaCluster) -> str | None:
    """Why the Oxia cluster is not healthy, or None if it is: the coordinator sees every server
    running; every server answers on metrics, holds a replica (as leader or follower) of every
    shard and sends shard assignments naming a leader for each; each shard has one leader, and
    a put and a get on it succeed."""
    text = _http_text(f"http://{HOST}:{cluster.coordinator_metrics}/metrics")
    if text is None:
        return f"no HTTP 200 from the coordinator's http://{HOST}:{cluster.coordinator_metrics}/metrics"
    running = {labels for labels, value in _metric(text, "oxia_coordinator_node_running").items() if value == 1}
    for name in OXIA_SERVERS:
        if not any(f'node="{name}"' in labels for labels in running):
            return f"the coordinator does not see {name} running"
    leaders = 0
    for name, server in zip(OXIA_SERVERS, cluster.servers):
        roles = _oxia_server_roles(server)
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


def _oxia_shard_status(paths: "_Paths") -> dict[int, dict]:
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


def _s3_client(port: int):
    return boto3.client(
        "s3",
        endpoint_url=f"http://{HOST}:{port}",
        region_name=S3_REGION,
        aws_access_key_id=S3_ACCESS_KEY_ID,
        aws_secret_access_key=S3_SECRET_ACCESS_KEY,
        config=BotoConfig(
            connect_timeout=_PROBE_TIMEOUT_S, read_timeout=10, retries={"total_max_attempts": 1},
            s3={"addressing_style": "path"},
        ),
    )


def _s3_problem(ports: StackPorts, bucket: str, prepare: bool) -> str | None:
    """Why the S3 server is not healthy, or None if it is. ``prepare`` creates the bucket and
    round-trips a probe object; otherwise the bucket must exist."""
    if not _http_ok(f"http://{HOST}:{ports.s3}{_S3_HEALTH_PATH}"):
        return f"no HTTP 200 from http://{HOST}:{ports.s3}{_S3_HEALTH_PATH}"
    s3 = _s3_client(ports.s3)
    try:
        if not prepare:
            s3.head_bucket(Bucket=bucket)
            return None
        try:
            s3.create_bucket(Bucket=bucket)
        except ClientError as e:
            if e.response["Error"]["Code"] not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise
        key, body = f"_llog_stack_probe/{os.getpid()}", b"llog"
        s3.put_object(Bucket=bucket, Key=key, Body=body)
        if s3.get_object(Bucket=bucket, Key=key)["Body"].read() != body:
            return "the S3 probe object read back different bytes"
        s3.delete_object(Bucket=bucket, Key=key)
    except (BotoCoreError, ClientError) as e:
        return f"S3 on {HOST}:{ports.s3}: {e}"
    return None


# --- up, down, status -------------------------------------------------------------------------


def status(stack_dir: Path | None = None) -> dict:
    """What the stack record says and whether each recorded process is alive and healthy. With an
    Oxia cluster, ``oxia`` has ``pid`` None and a ``cluster`` entry with each of its processes,
    how many shards each server leads and follows, and each shard's leader and ensemble as the
    coordinator records them."""
    paths = _Paths(stack_dir)
    record = _read_record(paths) or {}
    ports = StackPorts.from_record(record["ports"]) if "ports" in record else None
    cluster = _record_cluster(record)
    s3 = record.get("s3", {})
    s3_alive = _alive(s3.get("pid"), s3.get("binary"))
    s3_healthy = s3_alive and _s3_problem(ports, record["bucket"], prepare=False) is None
    if cluster is None:
        oxia = record.get("oxia", {})
        oxia_alive = _alive(oxia.get("pid"), oxia.get("binary"))
        oxia_healthy = oxia_alive and _oxia_problem(ports) is None
        oxia_status = {
            "pid": oxia.get("pid") if oxia_alive else None,
            "port": ports.oxia if ports else None,
            "metrics_port": ports.oxia_metrics if ports else None,
            "service_address": f"{HOST}:{ports.oxia}" if ports else None,
            "healthy": oxia_healthy,
            "log": str(paths.log("oxia")),
        }
    else:
        processes = _oxia_cluster_processes(paths, record, cluster)
        oxia_healthy = (all(p["pid"] for p in (processes["coordinator"], *processes["servers"]))
                        and _oxia_cluster_problem(cluster) is None)
        oxia_status = {
            "pid": None,
            "port": ports.oxia,
            "metrics_port": ports.oxia_metrics,
            "service_address": cluster.service_address,
            "healthy": oxia_healthy,
            "log": str(paths.log(OXIA_COORDINATOR)),
            "cluster": {"shards": cluster.shards, "replication_factor": cluster.replication_factor,
                        "config": str(paths.oxia_cluster_config), **processes,
                        "shard_status": _oxia_shard_status(paths)},
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
        "broker": _broker_status(record.get("broker")),
        "brokers": _brokers_status(record.get("brokers", [])),
    }


def _record_cluster(record: Mapping) -> OxiaCluster | None:
    return OxiaCluster.from_record(record["oxia_cluster"]) if "oxia_cluster" in record else None


def _oxia_cluster_processes(paths: _Paths, record: Mapping, cluster: OxiaCluster) -> dict:
    """The cluster's processes as :func:`status` reports them (``pid`` None: not running)."""
    def pid(service: str) -> int | None:
        entry = record.get(service, {})
        return entry.get("pid") if _alive(entry.get("pid"), entry.get("binary")) else None

    servers = []
    for name, server in zip(OXIA_SERVERS, cluster.servers):
        roles = _oxia_server_roles(server) if pid(name) else None
        servers.append({
            "name": name, "pid": pid(name), "paused": _paused(pid(name)),
            "public": f"{HOST}:{server.public}", "internal": f"{HOST}:{server.internal}",
            "metrics_port": server.metrics, "leads": roles[0] if roles else None,
            "follows": roles[1] if roles else None, "data": str(paths.oxia_data / name), "log": str(paths.log(name)),
        })
    return {
        "coordinator": {"name": OXIA_COORDINATOR, "pid": pid(OXIA_COORDINATOR), "paused": _paused(pid(OXIA_COORDINATOR)),
                        "internal": f"{HOST}:{cluster.coordinator_internal}",
                        "metrics_port": cluster.coordinator_metrics, "state": str(paths.oxia_cluster_status),
                        "log": str(paths.log(OXIA_COORDINATOR))},
        "servers": servers,
    }


def _paused(pid: int | None) -> bool:
    """True if ``pid`` is stopped (SIGSTOP, :func:`pause_service`)."""
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].startswith(("T", "t"))  # the state follows the parenthesized name


def _broker_status(entry: dict | None) -> dict | None:
    """The broker clients use (``record["broker"]``): one broker, or the balancer in front of
    several (``balancer`` then names its config and its statistics page)."""
    if entry is None:
        return None
    alive = _alive(entry.get("pid"), entry.get("binary"))
    url = f"http://{HOST}:{entry['port']}"
    out = {"pid": entry["pid"] if alive else None, "url": url, "port": entry["port"],
           "healthy": alive and _http_ok(f"{url}/health"), "log": entry.get("log")}
    if entry.get("kafka_port") is not None:
        out.update(kafka_port=entry["kafka_port"], kafka_bootstrap=f"{HOST}:{entry['kafka_port']}")
    if entry.get("kafka_ports"):  # the balancer's: every broker's listener, any of which bootstraps a client
        out.update(kafka_ports=entry["kafka_ports"],
                   kafka_bootstrap=",".join(f"{HOST}:{p}" for p in entry["kafka_ports"]))
    if "balancer" in entry:
        out["balancer"] = entry["balancer"]
    return out


def _brokers_status(entries: Sequence[Mapping]) -> list[dict]:
    """Each broker process (``record["brokers"]``): its name, role, address and health."""
    out = []
    for entry in entries:
        alive = _alive(entry.get("pid"), entry.get("binary"))
        out.append({"name": entry["name"], "role": entry["role"], "pid": entry["pid"] if alive else None,
                    "url": entry["url"], "port": entry["port"], "paused": _paused(entry["pid"] if alive else None),
                    "healthy": alive and _http_ok(f"{entry['url']}/health"), "log": entry["log"],
                    **({"kafka_port": entry["kafka_port"]} if entry.get("kafka_port") is not None else {})})
    return out


def up(stack_dir: Path | None = None, ports: StackPorts | None = None, bucket: str = "llog",
       timeout_s: float = 90, broker_port: int | None = None, oxia_cluster: bool = False,
       oxia_shards: int = OXIA_CLUSTER_SHARDS, brokers: int | None = None, split_roles: bool = False,
       kafka_port: int | None = None) -> dict:
    """Install if needed, start Oxia and the S3 server, wait until healthy, write the settings file;
    with ``broker_port``, also an HTTP broker (``python -m broker_lite``) on that port (with
    ``kafka_port``, its Kafka listener on that one, docs/kafka.md); with
    ``brokers`` as well, that many brokers on ports of their own behind HAProxy on ``broker_port``
    (``split_roles``: write and read brokers; with ``kafka_port``, broker ``i``'s Kafka listener
    on ``kafka_port + i``; see :func:`_start_brokers`). With
    ``oxia_cluster``, Oxia is a coordinator and 3 servers, ``oxia_shards`` shards with
    replication factor 3 (module docstring); an existing cluster keeps the ports and shard count
    it was made with (its data names them; asking for another count is an error).

    A stack already running and healthy in ``stack_dir`` is left as it is (whatever ``ports``
    asked for; asking for the other kind of Oxia is an error), a broker is added to it if asked
    for and not running. Data in ``stack_dir`` survives restarts; a cluster's Oxia data is apart
    from a standalone server's, so switching kinds starts from empty Oxia. Returns :func:`status`.
    """
    paths = _Paths(stack_dir)
    ports = ports or resolve_ports()
    if oxia_cluster and oxia_shards < 1:
        raise ConfigError(f"oxia_shards={oxia_shards}: an Oxia namespace needs at least 1 shard")
    _check_kafka_layout(split_roles, kafka_port)  # before anything starts
    binaries = install()
    with _locked(paths.lock, timeout_s + 30, "`llog stack up` or `down`"):
        current = status(paths.root)
        if current["running"] and ("cluster" in current["oxia"]) != oxia_cluster:
            kind = "an Oxia cluster" if "cluster" in current["oxia"] else "a standalone Oxia"
            raise LlogError(f"the stack in {paths.root} runs with {kind}; stop it first (`llog stack down`)")
        if not current["running"]:
            _stop_recorded(paths)  # a stale or half-dead stack
            cluster = _oxia_cluster_layout(paths, ports, oxia_shards) if oxia_cluster else None
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
            if not ((_read_record(paths) or {}).get("broker_layout") == layout and running["broker"]["healthy"]
                    and all(b["healthy"] for b in running["brokers"])):
                _start_brokers(paths, broker_port, brokers, split_roles, timeout_s, kafka_port)
        elif broker_port is not None and not ((current["broker"] or {}).get("healthy")
                                              and (current["broker"] or {}).get("kafka_port") == kafka_port):
            _start_broker(paths, broker_port, timeout_s, kafka_port)
    return status(paths.root)


def _oxia_cluster_layout(paths: _Paths, ports: StackPorts, shards: int) -> OxiaCluster:
    """The cluster whose data is in ``paths``, else a new one: ``oxia-0`` on the ``oxia`` and
    ``oxia_metrics`` ports, the other ports chosen free by the system. :func:`_start` keeps it."""
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
    free = _system_ports(3 * OXIA_CLUSTER_SERVERS, avoid=frozenset(dataclasses.astuple(ports)))
    servers = [OxiaServerPorts(ports.oxia, free.pop(), ports.oxia_metrics)]
    servers += [OxiaServerPorts(free.pop(), free.pop(), free.pop()) for _ in OXIA_SERVERS[1:]]
    return OxiaCluster(shards=shards, replication_factor=OXIA_CLUSTER_SERVERS, coordinator_internal=free.pop(),
                       coordinator_metrics=free.pop(), servers=tuple(servers))


def _oxia_cluster_config(cluster: OxiaCluster) -> str:
    """The coordinator's cluster config (YAML): the namespace, and the servers by name."""
    lines = ["namespaces:", f"  - name: {OXIA_NAMESPACE}", f"    initialShardCount: {cluster.shards}",
             f"    replicationFactor: {cluster.replication_factor}", "servers:"]
    for name, server in zip(OXIA_SERVERS, cluster.servers):
        lines += [f"  - name: {name}", f"    public: {HOST}:{server.public}", f"    internal: {HOST}:{server.internal}"]
    return "\n".join(lines) + "\n"


def _start_broker(paths: _Paths, port: int, timeout_s: float, kafka_port: int | None = None) -> None:
    """The HTTP broker as a process of the stack: started by module name (the core does not
    import it), with the stack's settings file, stopped by ``down``. ``record["broker"]`` and
    ``record["brokers"][0]`` both name it."""
    record = _read_record(paths) or {}
    _stop_recorded_brokers(record)
    if not _port_free(port):
        raise LlogError(f"the broker's port {port} is in use (--broker-port picks another)")
    if kafka_port is not None and not _port_free(kafka_port):
        raise LlogError(f"the Kafka listener's port {kafka_port} is in use (--kafka-port picks another)")
    entry = _spawn_broker(paths, "broker", port, "both", kafka_port=kafka_port)
    record.update(broker={k: entry[k] for k in ("pid", "binary", "port", "url", "log", "kafka_port") if k in entry},
                  brokers=[entry],
                  broker_layout=None)
    _write_json(paths.record, record)
    _wait_broker(paths, entry, time.monotonic() + timeout_s, timeout_s)


def _stop_recorded_brokers(record: dict) -> None:
    """Stop the brokers (and balancer) ``record`` names, and drop them from it."""
    old = record.pop("broker", None)
    if old and _alive(old.get("pid"), old.get("binary")):
        _stop(old["pid"], old["binary"])
    _stop_brokers(record.pop("brokers", []))
    record.pop("broker_layout", None)


def _broker_command(port: int, role: str, kafka_port: int | None = None) -> list[str]:
    return [sys.executable, "-m", "broker_lite", "--host", HOST, "--port", str(port), "--role", role,
            "--log-level", "warning", *(["--kafka-port", str(kafka_port)] if kafka_port is not None else [])]


def _spawn_broker(paths: _Paths, name: str, port: int, role: str, tail_cache_dir: Path | None = None,
                  kafka_port: int | None = None) -> dict:
    """Start one broker process; its ``record["brokers"]`` entry."""
    env = {**os.environ, "LLOG_SETTINGS_FILE": str(paths.settings)}
    if tail_cache_dir is not None:
        env["LLOG_TAIL_CACHE_DIR"] = str(tail_cache_dir)
    entry = _spawn(paths, name, _broker_command(port, role, kafka_port), env)
    return {"name": name, **entry, "port": port, "url": f"http://{HOST}:{port}", "role": role,
            "log": str(paths.log(name)), **({"kafka_port": kafka_port} if kafka_port is not None else {}),
            **({"tail_cache_dir": str(tail_cache_dir)} if tail_cache_dir is not None else {})}


def _wait_broker(paths: _Paths, entry: Mapping, deadline: float, timeout_s: float) -> None:
    """Until ``deadline`` (``time.monotonic()``), wait for one broker's ``/health`` to answer 200."""
    name = entry["name"]
    while not _http_ok(f"{entry['url']}/health"):
        if not _alive(entry["pid"], entry["binary"]):
            raise LlogError(f"{name} exited during startup; last lines of {paths.log(name)}:\n"
                            + _tail(paths.log(name)))
        if time.monotonic() > deadline:
            raise LlogError(f"{name} did not answer /health within {timeout_s:.0f} s; last lines of "
                            f"{paths.log(name)}:\n" + _tail(paths.log(name)))
        time.sleep(0.25)


def _start_brokers(paths: _Paths, port: int, count: int, split_roles: bool, timeout_s: float,
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
    _check_kafka_layout(split_roles, kafka_port)
    kafka_ports = [kafka_port + i for i in range(count)] if kafka_port is not None else [None] * count
    if kafka_port is not None and not 0 < kafka_port <= 65536 - count:
        raise ConfigError(f"--kafka-port {kafka_port}: the {count} brokers' listeners take {kafka_port}.."
                          f"{kafka_port + count - 1}, which must be ports (1..65535)")
    if not os.access(HAPROXY, os.X_OK):
        raise ConfigError(f"the balancer in front of several brokers is HAProxy, not found at {HAPROXY}: "
                          "install it (apt-get install haproxy)")
    record = _read_record(paths) or {}
    _stop_recorded_brokers(record)
    _write_json(paths.record, record)
    if not _port_free(port):
        raise LlogError(f"the balancer's port {port} is in use (--broker-port picks another)")
    for i, p in enumerate(kafka_ports):
        if p is not None and (p == port or not _port_free(p)):
            raise LlogError(f"broker-{i}'s Kafka listener port {p} (--kafka-port {kafka_port} + {i}) is in use "
                            "(--kafka-port picks another first port)")
    writers = (count + 1) // 2 if split_roles else count
    roles = ["write" if i < writers else "read" for i in range(count)] if split_roles else ["both"] * count
    tail_cache_dir = paths.root / "tail-cache" if split_roles else None
    *broker_ports, stats_port = _system_ports(count + 1, avoid=frozenset({port, *filter(None, kafka_ports)}))
    deadline = time.monotonic() + timeout_s
    try:
        record["brokers"] = []
        for i, (role, broker_port, listener_port) in enumerate(zip(roles, broker_ports, kafka_ports)):
            record["brokers"].append(_spawn_broker(paths, f"broker-{i}", broker_port, role, tail_cache_dir,
                                                   kafka_port=listener_port))
            _write_json(paths.record, record)
        for entry in record["brokers"]:
            _wait_broker(paths, entry, deadline, timeout_s)
        config_path = paths.root / "haproxy.cfg"
        config_path.write_text(haproxy_config(port, stats_port, record["brokers"], split_roles))
        checked = subprocess.run([HAPROXY, "-c", "-q", "-f", str(config_path)], capture_output=True, text=True,
                                 timeout=30)
        if checked.returncode != 0:
            raise LlogError(f"HAProxy refuses its config {config_path}: {(checked.stdout + checked.stderr).strip()}")
        entry = _spawn(paths, "balancer", [HAPROXY, "-db", "-f", str(config_path)], dict(os.environ))
        record["broker"] = {
            **entry, "port": port, "url": f"http://{HOST}:{port}", "log": str(paths.log("balancer")),
            "balancer": {"kind": "haproxy", "config": str(config_path), "stats_url": f"http://{HOST}:{stats_port}/stats",
                         "route_header": PARTITION_HEADER, "split_roles": split_roles},
            **({"kafka_ports": kafka_ports} if kafka_port is not None else {})}
        record["broker_layout"] = {"brokers": count, "split_roles": split_roles, "port": port, "kafka_port": kafka_port}
        _write_json(paths.record, record)
        balancer = {**record["broker"], "name": "balancer"}
        _wait_broker(paths, balancer, deadline, timeout_s)
        # Every broker up in HAProxy's eyes too, so that the first requests are spread as later ones.
        _wait_balanced(paths, deadline, timeout_s)
    except BaseException:
        _stop_recorded_brokers(record)
        _write_json(paths.record, record)
        raise


def _check_kafka_layout(split_roles: bool, kafka_port: int | None) -> None:
    if split_roles and kafka_port is not None:
        raise ConfigError("--kafka-port does not go with --split-roles: a Kafka listener answers Metadata as the "
                          "leader of every partition, so clients would fetch from write brokers and produce to read "
                          "brokers, each answering NOT_LEADER_OR_FOLLOWER (docs/kafka.md section 3)")


def _wait_balanced(paths: _Paths, deadline: float, timeout_s: float) -> None:
    """Until ``deadline``, wait for the balancer to see every broker up (its health checks)."""
    while True:
        rows = haproxy_stats(paths.root)
        down = sorted({r["svname"] for r in rows if r["svname"] not in ("FRONTEND", "BACKEND")
                       and r["status"] not in ("UP", "no check")})
        if rows and not down:
            return
        if time.monotonic() > deadline:
            raise LlogError(f"HAProxy does not see {', '.join(down) or 'its brokers'} up within {timeout_s:.0f} s")
        time.sleep(0.1)


def haproxy_config(port: int, stats_port: int, brokers: Sequence[Mapping], split_roles: bool) -> str:
    """HAProxy's config for the balancer on ``port`` (statistics on ``stats_port``, ``/stats``;
    ``/stats;csv`` as CSV) in front of ``brokers`` (their ``record["brokers"]`` entries).

    ``balance hdr(X-Llog-Partition)`` with ``hash-type consistent``: a key maps to one broker,
    and a broker going down moves only its own keys (each to the next broker on the ring), back
    once it is up; a request without the header goes round robin. ``retries`` with
    ``option redispatch``: a connection refused (a broker just killed, not yet marked down) is
    tried again on another broker; a request a broker accepted is never sent twice. One thread:
    on a machine of 2 cores the brokers need the CPU more than HAProxy does."""
    def servers(role: str | None) -> list[str]:
        return [f"    server {b['name']} {HOST}:{b['port']} check" for b in brokers if role in (None, b["role"])]

    def backend(name: str, role: str | None) -> list[str]:
        return [f"backend {name}", f"    balance hdr({PARTITION_HEADER})", "    hash-type consistent",
                "    option httpchk GET /health", "    http-check expect status 200",
                "    default-server inter 500ms fall 2 rise 2", *servers(role), ""]

    lines = [
        f"# written by llog stack up: {len(brokers)} brokers{' (split roles)' if split_roles else ''}",
        "global", "    nbthread 1", "    maxconn 4096", "    log stderr format raw local0 notice", "",
        "defaults", "    mode http", "    log global", "    option httplog", "    option dontlog-normal",
        "    option redispatch", "    retries 3", "    timeout connect 2s", "    timeout queue 10s",
        "    timeout client 70s", f"    timeout server {_BALANCER_SERVER_TIMEOUT_S}s",
        "    timeout http-keep-alive 30s", "",
        "frontend brokers", f"    bind {HOST}:{port}", f"    http-response set-header {BROKER_HEADER} %s",
    ]
    if split_roles:
        lines += ["    acl writes path /produce /producers", "    acl reads path /consume",
                  "    acl reads path_beg /groups/", "    use_backend writers if writes",
                  "    use_backend readers if reads"]
    lines += ["    default_backend brokers", "", *backend("brokers", None)]
    if split_roles:
        lines += [*backend("writers", "write"), *backend("readers", "read")]
    lines += ["listen stats", f"    bind {HOST}:{stats_port}", "    stats enable", "    stats uri /stats", ""]
    return "\n".join(lines)


def haproxy_stats(stack_dir: Path | None = None) -> list[dict[str, str]]:
    """The balancer's statistics (HAProxy's ``/stats;csv``): one row per frontend, backend and
    server, each a dict of its columns (``pxname``, ``svname``, ``status``, ``stot`` requests,
    ``hrsp_5xx``, ``qtime``/``rtime`` ms, ...); empty without a balancer or an answer."""
    record = _read_record(_Paths(stack_dir)) or {}
    balancer = (record.get("broker") or {}).get("balancer")
    return [] if balancer is None else read_haproxy_stats(balancer["stats_url"])


def read_haproxy_stats(stats_url: str) -> list[dict[str, str]]:
    """HAProxy's statistics at ``stats_url`` (its ``stats uri``) as :func:`haproxy_stats` gives them."""
    text = _http_text(stats_url + ";csv")
    if not text:
        return []
    header, *rows = text.lstrip("# ").splitlines()
    names = header.split(",")
    return [dict(zip(names, row.split(","))) for row in rows if row]


def kill_broker(stack_dir: Path | None, name: str) -> dict:
    """SIGKILL one broker process of the stack (``broker-0``.., or ``broker``) and wait until it
    has exited; the record keeps it, for :func:`start_broker`. Returns ``name`` and ``pid``."""
    paths = _Paths(stack_dir)
    with _locked(paths.lock, 30, "`llog stack up` or `down`"):
        record, entry = _broker_entry(paths, name)
        if not _alive(entry["pid"], entry["binary"]):
            raise LlogError(f"{name} of the stack in {paths.root} is not running")
        _kill(name, entry)
        return {"name": name, "pid": entry["pid"]}


def start_broker(stack_dir: Path | None, name: str, timeout_s: float = 60) -> dict:
    """Start a stopped broker of the stack again, on its port with its role; return once it
    answers ``/health`` and the balancer, if any, sends it requests again (its health check
    passes twice, 0.5 s apart). Returns ``name``, ``pid`` and ``healthy_after_s``."""
    paths = _Paths(stack_dir)
    with _locked(paths.lock, timeout_s + 30, "`llog stack up` or `down`"):
        record, entry = _broker_entry(paths, name)
        if _alive(entry["pid"], entry["binary"]):
            raise LlogError(f"{name} of the stack in {paths.root} is running (pid {entry['pid']})")
        started = time.monotonic()
        tail_cache_dir = entry.get("tail_cache_dir")
        new = _spawn_broker(paths, name, entry["port"], entry["role"], tail_cache_dir and Path(tail_cache_dir),
                            kafka_port=entry.get("kafka_port"))
        entry.update(new)
        if record.get("broker", {}).get("port") == entry["port"]:  # the one broker clients use
            record["broker"].update(pid=new["pid"], binary=new["binary"])
        _write_json(paths.record, record)
        _wait_broker(paths, entry, started + timeout_s, timeout_s)
        if (record.get("broker") or {}).get("balancer"):
            _wait_balanced(paths, started + timeout_s, timeout_s)
        return {"name": name, "pid": entry["pid"], "healthy_after_s": time.monotonic() - started}


def _broker_entry(paths: _Paths, name: str) -> tuple[dict, dict]:
    record = _read_record(paths)
    if record is None:
        raise LlogError(f"no running stack in {paths.root} (`llog stack up` starts one)")
    names = {b["name"]: b for b in record.get("brokers", [])}
    if name not in names:
        raise LlogError(f"the stack in {paths.root} has no broker {name!r}: it has {', '.join(names) or 'none'}")
    return record, names[name]


def _commands(paths: _Paths, ports: StackPorts, binaries: dict[str, Path],
              cluster: OxiaCluster | None = None) -> dict[str, tuple[list[str], dict]]:
    """Each service's command line and environment, in the order they start."""
    oxia_cmd = [
        str(binaries["oxia"]), "standalone",
        "-p", f"{HOST}:{ports.oxia}", "-m", f"{HOST}:{ports.oxia_metrics}",
        "--data-dir", str(paths.oxia_data / "data"), "--wal-dir", str(paths.oxia_data / "wal"),
    ]
    # --keep-alive: clients keep their connections (the server closes each after one request
    # otherwise). --data-integrity-etag: ETags from the checksum computed anyway, not a second
    # pass of MD5 over every byte (llog reads no ETag).
    s3_cmd = [
        str(binaries["s3"]), "--port", f"{HOST}:{ports.s3}", "--region", S3_REGION,
        "--health", _S3_HEALTH_PATH, "--keep-alive", "--quiet",
        "posix", "--data-integrity-etag", str(paths.s3_data),
    ]
    s3_env = {**os.environ, "ROOT_ACCESS_KEY_ID": S3_ACCESS_KEY_ID, "ROOT_SECRET_ACCESS_KEY": S3_SECRET_ACCESS_KEY}
    if cluster is None:
        return {"oxia": (oxia_cmd, dict(os.environ)), "s3": (s3_cmd, s3_env)}
    commands = {}
    for name, server in zip(OXIA_SERVERS, cluster.servers):
        commands[name] = ([
            str(binaries["oxia"]), "server",
            "-p", f"{HOST}:{server.public}", "-i", f"{HOST}:{server.internal}", "-m", f"{HOST}:{server.metrics}",
            "--data-dir", str(paths.oxia_data / name / "data"), "--wal-dir", str(paths.oxia_data / name / "wal"),
        ], dict(os.environ))
    commands["s3"] = (s3_cmd, s3_env)
    commands[OXIA_COORDINATOR] = ([
        str(binaries["oxia"]), "coordinator", "--conf", str(paths.oxia_cluster_config),
        "--metadata", "file", "--file-clusters-status-path", str(paths.oxia_cluster_status),
        "-i", f"{HOST}:{cluster.coordinator_internal}", "-m", f"{HOST}:{cluster.coordinator_metrics}",
    ], dict(os.environ))
    return commands


def _start(paths: _Paths, ports: StackPorts, bucket: str, binaries: dict[str, Path], timeout_s: float,
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
        _write_json(paths.oxia_cluster, cluster.to_record())
        paths.oxia_cluster_config.write_text(_oxia_cluster_config(cluster))
        paths.oxia_cluster_status.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    try:
        for service, (cmd, env) in commands.items():
            if service == OXIA_COORDINATOR:
                # After a failed probe of a server the coordinator waits 5-15 s before the next:
                # it starts once the servers answer.
                _wait_until(paths, record, OXIA_SERVERS, lambda: _oxia_servers_problem(cluster), deadline,
                            "the Oxia servers", timeout_s)
            record[service] = _spawn(paths, service, cmd, env)
            _write_json(paths.record, record)
        _wait_healthy(paths, record, ports, bucket, deadline, timeout_s)
    except BaseException:
        _stop_recorded(paths)
        raise
    _write_json(paths.settings, {
        "LLOG_OXIA_SERVICE_ADDRESS": cluster.service_address if cluster else f"{HOST}:{ports.oxia}",
        "LLOG_OXIA_NAMESPACE": OXIA_NAMESPACE,
        "LLOG_S3_ENDPOINT_URL": f"http://{HOST}:{ports.s3}",
        "LLOG_S3_BUCKET": bucket,
        "LLOG_S3_REGION_NAME": S3_REGION,
        "LLOG_S3_ACCESS_KEY_ID": S3_ACCESS_KEY_ID,
        "LLOG_S3_SECRET_ACCESS_KEY": S3_SECRET_ACCESS_KEY,
    })


def _oxia_servers_problem(cluster: OxiaCluster) -> str | None:
    """Why not every server of the cluster answers on metrics yet, or None."""
    for name, server in zip(OXIA_SERVERS, cluster.servers):
        if not _http_ok(f"http://{HOST}:{server.metrics}/metrics"):
            return f"no HTTP 200 from {name}'s http://{HOST}:{server.metrics}/metrics"
    return None


# --- one service: kill, start, restart, pause, resume (failure tests) -------------------------

#: Every service name one of the functions below may be given.
_SERVICES = ("oxia", "s3", OXIA_COORDINATOR, *OXIA_SERVERS)


def _service(paths: _Paths, service: str) -> tuple[dict, str]:
    """The record of a stack and ``service`` in it: ``oxia`` of a cluster is the server that leads
    the most shards (the first of those), the one whose loss moves the most leaders."""
    if service not in _SERVICES:
        raise LlogError(f"unknown service {service!r}: {', '.join(_SERVICES)}")
    record = _read_record(paths)
    if record is None:
        raise LlogError(f"no running stack in {paths.root} (`llog stack up` starts one)")
    cluster = _record_cluster(record)
    if service == "oxia" and cluster is not None:
        leads = [(roles or (0, 0))[0] for roles in map(_oxia_server_roles, cluster.servers)]
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
    paths = _Paths(stack_dir)
    with _locked(paths.lock, 30, "`llog stack up` or `down`"):
        service, entry = _running(paths, service)
        _kill(service, entry)
        return {"service": service, "pid": entry["pid"], "killed_at": time.monotonic()}


def _kill(service: str, entry: Mapping) -> None:
    os.kill(entry["pid"], signal.SIGKILL)
    if not _wait_exit(entry["pid"], entry["binary"], 10):
        raise LlogError(f"{service} (pid {entry['pid']}) is still running 10 s after SIGKILL")
    _children.pop(entry["pid"], None)


def start_service(stack_dir: Path | None, service: str, timeout_s: float = 60) -> dict:
    """Start a stopped process of the stack again (one :func:`kill_service` killed, or one that
    exited), with the same binary, ports and data; update ``stack.json`` and return once the
    whole stack is healthy: for an Oxia server, once it holds its replica of every shard again.
    Returns ``service``, ``pid`` and ``healthy_after_s`` (from the start)."""
    paths = _Paths(stack_dir)
    with _locked(paths.lock, timeout_s + 30, "`llog stack up` or `down`"):
        record, service = _service(paths, service)
        entry = record[service]
        if _alive(entry["pid"], entry["binary"]):
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
    paths = _Paths(stack_dir)
    with _locked(paths.lock, timeout_s + down_s + 30, "`llog stack up` or `down`"):
        record, service = _service(paths, service)
        if not status(paths.root)["running"]:
            raise LlogError(f"no running stack in {paths.root} (`llog stack up` starts one)")
        entry = record[service]
        if kill:
            _kill(service, entry)
        else:
            _stop(entry["pid"], entry["binary"])
        down_from = time.monotonic()
        time.sleep(down_s)
        down_until = time.monotonic()
        return {**_start_again(paths, record, service, timeout_s), "down_from": down_from, "down_until": down_until}


def _start_again(paths: _Paths, record: dict, service: str, timeout_s: float) -> dict:
    ports = StackPorts.from_record(record["ports"])
    cluster = _record_cluster(record)
    oxia = OXIA_SERVERS[0] if cluster is not None else "oxia"
    binaries = {"oxia": Path(record[oxia]["binary"]), "s3": Path(record["s3"]["binary"])}
    cmd, env = _commands(paths, ports, binaries, cluster)[service]
    record[service] = _spawn(paths, service, cmd, env)
    _write_json(paths.record, record)
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
    paths = _Paths(stack_dir)
    with _locked(paths.lock, 30, "`llog stack up` or `down`"):
        service, entry = _running(paths, service)
        os.kill(entry["pid"], sig)
        return {"service": service, "pid": entry["pid"]}


def _running(paths: _Paths, service: str) -> tuple[str, dict]:
    """The resolved name and record of a running process of the stack (under its lock)."""
    record, service = _service(paths, service)
    entry = record[service]
    if not _alive(entry["pid"], entry["binary"]):
        raise LlogError(f"{service} of the stack in {paths.root} is not running")
    return service, entry


def _spawn(paths: _Paths, service: str, cmd: list[str], env: Mapping[str, str]) -> dict:
    return start_process(cmd, paths.log(service), paths.root, env)


def start_process(cmd: list[str], log_path: Path, cwd: Path, env: Mapping[str, str]) -> dict:
    """``cmd`` as a process of its own session, its output appended to ``log_path``; its record
    entry ``{"pid", "binary"}``, for :func:`process_alive` and :func:`stop_process` (also from
    another process later: ``llog observe`` keeps its servers so)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(f"--- llog {datetime.now(timezone.utc).isoformat()}: {' '.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
    _children[proc.pid] = proc
    return {"pid": proc.pid, "binary": cmd[0]}


def process_alive(entry: Mapping | None) -> bool:
    """Whether the process of a :func:`start_process` entry still runs its binary (a recycled
    pid does not count)."""
    return bool(entry) and _alive(entry.get("pid"), entry.get("binary"))


def stop_process(entry: Mapping | None) -> None:
    """Stop the process of a :func:`start_process` entry if it runs: SIGTERM, then SIGKILL."""
    if process_alive(entry):
        _stop(entry["pid"], entry["binary"])


def write_json(path: Path, value: object) -> None:
    """``value`` as ``path``, replaced at once (a reader sees the old file or the new one)."""
    _write_json(path, value)


def _wait_healthy(paths: _Paths, record: dict, ports: StackPorts, bucket: str, deadline: float,
                  timeout_s: float) -> None:
    """Until ``deadline`` (``time.monotonic()``), wait for Oxia and then S3 to be healthy."""
    cluster = _record_cluster(record)
    if cluster is None:
        oxia = (("oxia",), lambda: _oxia_problem(ports))
    else:
        oxia = ((*OXIA_SERVERS, OXIA_COORDINATOR), lambda: _oxia_cluster_problem(cluster))
    checks = {"oxia": oxia, "s3": (("s3",), lambda: _s3_problem(ports, bucket, prepare=True))}
    for what, (services, check) in checks.items():
        _wait_until(paths, record, services, check, deadline, what, timeout_s)


def _wait_until(paths: _Paths, record: dict, services: Sequence[str], check: Callable[[], str | None],
                deadline: float, what: str, timeout_s: float) -> None:
    """Until ``check`` finds no problem, as long as ``services`` run, until ``deadline``."""
    while True:
        for service in services:
            if not _alive(record[service]["pid"], record[service]["binary"]):
                child = _children.get(record[service]["pid"])
                exit_status = "" if child is None else f" (exit status {child.returncode})"
                raise LlogError(f"{service} exited during startup{exit_status}; last lines of {paths.log(service)}:\n"
                                + _tail(paths.log(service)))
        problem = check()
        if problem is None:
            return
        if time.monotonic() > deadline:
            logs = "\n".join(f"last lines of {paths.log(service)}:\n" + _tail(paths.log(service), 20 // len(services))
                             for service in services)
            raise LlogError(f"{what} did not become healthy within {timeout_s:.0f} s ({problem}); {logs}")
        time.sleep(0.25)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(cannot read log: {e})"


def down(stack_dir: Path | None = None, purge: bool = False) -> list[str]:
    """Stop the processes ``up`` started and remove the record and settings file; ``purge``
    also deletes the data. Returns what was stopped (nothing, if nothing was running)."""
    paths = _Paths(stack_dir)
    with _locked(paths.lock, 3 * _STOP_TIMEOUT_S, "`llog stack up` or `down`"):
        stopped = _stop_recorded(paths)
        paths.settings.unlink(missing_ok=True)
        if purge:
            shutil.rmtree(paths.oxia_data, ignore_errors=True)
            shutil.rmtree(paths.s3_data, ignore_errors=True)
            shutil.rmtree(paths.root / "tail-cache", ignore_errors=True)  # split-role brokers' shared tail cache
            shutil.rmtree(paths.root / "seaweedfs", ignore_errors=True)  # of a stack from before versitygw
    return stopped


def _stop_recorded(paths: _Paths) -> list[str]:
    """Stop every live process of the record, then delete the record."""
    record = _read_record(paths) or {}
    stopped = []
    for service in _RECORDED_SERVICES:
        if service == "brokers":
            stopped += _stop_brokers(record.get("brokers", []))
            continue
        entry = record.get(service, {})
        if _alive(entry.get("pid"), entry.get("binary")):
            _stop(entry["pid"], entry["binary"])
            stopped.append(f"{'balancer' if 'balancer' in entry else service} (pid {entry['pid']})")
    paths.record.unlink(missing_ok=True)
    for pid, child in list(_children.items()):  # reap children that exited on their own
        if child.poll() is not None:
            del _children[pid]
    return stopped


def _stop_brokers(entries: Sequence[Mapping]) -> list[str]:
    """Stop the live broker processes of ``entries`` (``record["brokers"]``) at once: SIGTERM to
    each first, so that they drain their requests together, then :func:`_stop` each."""
    live = [e for e in entries if _alive(e.get("pid"), e.get("binary"))]
    for entry in live:
        try:
            os.kill(entry["pid"], signal.SIGTERM)
        except ProcessLookupError:
            pass
    for entry in live:
        _stop(entry["pid"], entry["binary"])
    return [f"{entry['name']} (pid {entry['pid']})" for entry in live]


def _stop(pid: int, binary: str) -> None:
    """SIGTERM, wait up to _STOP_TIMEOUT_S, then SIGKILL. A paused process (SIGSTOP) is continued
    after the SIGTERM, so that it handles it."""
    for sig, wait_s in ((signal.SIGTERM, _STOP_TIMEOUT_S), (signal.SIGKILL, 5)):
        try:
            os.kill(pid, sig)
            if sig == signal.SIGTERM:
                os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            break
        if _wait_exit(pid, binary, wait_s):
            break
    else:
        raise LlogError(f"{binary} (pid {pid}) is still running after SIGKILL")
    _children.pop(pid, None)


def _wait_exit(pid: int, binary: str, timeout_s: float) -> bool:
    child = _live_child(pid)
    if child is not None:
        try:
            child.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            return False
    deadline = time.monotonic() + timeout_s
    while _alive(pid, binary):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


# --- command line -----------------------------------------------------------------------------


def add_stack_command(subparsers) -> None:
    """Add ``stack install|up|down|status`` to an argparse subparsers object."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--stack-dir", type=Path, default=None,
                        help="state directory (default: $LLOG_STACK_DIR or <llog home>/stack)")
    stack = subparsers.add_parser(
        "stack", help="run a local Oxia + S3 (versitygw) stack",
        description="Run a local Oxia + S3 (versitygw) stack on 127.0.0.1 for development and tests.",
    )
    actions = stack.add_subparsers(dest="stack_action", metavar="{install,up,down,status}", required=True)

    install_parser = actions.add_parser("install", help="build the Oxia and versitygw binaries (idempotent)")
    install_parser.set_defaults(func=_cmd_install)

    up_parser = actions.add_parser("up", parents=[common], help="install, start and wait until healthy")
    for name, label in _PORT_LABELS.items():
        up_parser.add_argument(
            f"--{name.replace('_', '-')}-port", dest=f"{name}_port", type=int, metavar="PORT",
            help=f"{label} port (default: ${_port_env(name)} or {getattr(DEFAULT_PORTS, name)})",
        )
    up_parser.add_argument("--bucket", default="llog", help="S3 bucket to create (default: llog)")
    up_parser.add_argument("--oxia-cluster", action="store_true",
                           help="run Oxia as a replicated cluster: a coordinator and 3 servers, replication factor 3 "
                                "(the --oxia-port and --oxia-metrics-port are the first server's)")
    up_parser.add_argument("--oxia-shards", type=int, default=OXIA_CLUSTER_SHARDS, metavar="N",
                           help=f"shards of a new Oxia cluster's namespace (default: {OXIA_CLUSTER_SHARDS})")
    up_parser.add_argument("--broker", action="store_true",
                           help=f"also start an HTTP broker (python -m broker_lite) on 127.0.0.1 "
                                f"(port: --broker-port, else ${BROKER_PORT_ENV} or {DEFAULT_BROKER_PORT})")
    up_parser.add_argument("--broker-port", type=int, metavar="PORT", default=None)
    up_parser.add_argument("--kafka-port", type=int, metavar="PORT", default=None,
                           help="with --broker: its Kafka listener on this port, for Kafka clients (docs/kafka.md); "
                                "with --brokers N: broker i's listener on PORT+i (not with --split-roles)")
    up_parser.add_argument("--brokers", type=int, metavar="N", default=None,
                           help="start N brokers on ports of their own behind HAProxy, which listens on the broker "
                                f"port and sends each topic-partition (header {PARTITION_HEADER}: topic/partition) "
                                "to one broker (docs/brokers.md)")
    up_parser.add_argument("--split-roles", action="store_true",
                           help="with --brokers N: half (rounded up) write brokers, which get /produce, the rest read "
                                "brokers, which get /consume, sharing one tail cache directory")
    up_parser.add_argument("--timeout", type=float, default=90, help="seconds to wait for health (default: 90)")
    up_parser.set_defaults(func=_cmd_up)

    down_parser = actions.add_parser("down", parents=[common], help="stop the stack")
    down_parser.add_argument("--purge", action="store_true", help="also delete the stack's data")
    down_parser.set_defaults(func=_cmd_down)

    status_parser = actions.add_parser("status", parents=[common], help="show whether the stack runs")
    status_parser.add_argument("--json", action="store_true", help="print the status as JSON")
    status_parser.set_defaults(func=_cmd_status)


def _cmd_install(args: argparse.Namespace) -> int:
    try:
        binaries = install()
    except LlogError as e:
        print(f"llog stack install: {e}", file=sys.stderr)
        return 1
    for name, path in binaries.items():
        print(f"{name}: {path}")
    return 0


def _cmd_up(args: argparse.Namespace) -> int:
    try:
        ports = resolve_ports({name: getattr(args, f"{name}_port") for name in _PORT_LABELS})
        if args.brokers is not None and args.brokers < 1:
            raise ConfigError(f"--brokers {args.brokers}: at least 1")
        if args.split_roles and args.brokers is None:
            raise ConfigError("--split-roles goes with --brokers N")
        if args.broker and args.brokers is not None:
            raise ConfigError("--broker is one broker without a balancer; --brokers N is N behind one: choose one")
        broker_port = None
        if args.broker or args.broker_port or args.brokers is not None or args.kafka_port is not None:
            broker_port = args.broker_port or _broker_port_from_env()
        info = up(args.stack_dir, ports=ports, bucket=args.bucket, timeout_s=args.timeout, broker_port=broker_port,
                  oxia_cluster=args.oxia_cluster, oxia_shards=args.oxia_shards, brokers=args.brokers,
                  split_roles=args.split_roles, kafka_port=args.kafka_port)
    except LlogError as e:
        print(f"llog stack up: {e}", file=sys.stderr)
        return 1
    _print_status(info)
    print("stop it with: llog stack down")
    return 0


def _broker_port_from_env() -> int:
    value = os.environ.get(BROKER_PORT_ENV)
    if not value:
        return DEFAULT_BROKER_PORT
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{BROKER_PORT_ENV}={value!r} is not a port number") from None


def _cmd_down(args: argparse.Namespace) -> int:
    try:
        stopped = down(args.stack_dir, purge=args.purge)
    except LlogError as e:
        print(f"llog stack down: {e}", file=sys.stderr)
        return 1
    print("stopped " + ", ".join(stopped) if stopped else "nothing was running")
    if args.purge:
        print(f"deleted the stack's data in {args.stack_dir or config.stack_dir()}")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    try:
        info = status(args.stack_dir)
    except LlogError as e:
        print(f"llog stack status: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        _print_status(info)
    return 0


def _print_status(info: dict) -> None:
    oxia, s3 = info["oxia"], info["s3"]
    cluster = oxia.get("cluster")
    oxia_processes = [cluster["coordinator"], *cluster["servers"]] if cluster else [oxia]
    if not (any(p["pid"] for p in oxia_processes) or s3["pid"]):
        print(f"local stack is not running (stack dir {info['stack_dir']})")
        return
    print(f"local stack is {'running' if info['running'] else 'NOT healthy'} (stack dir {info['stack_dir']})")
    if cluster is None:
        print(f"  oxia       {_health(oxia)}  pid {oxia['pid'] or '-'}  {oxia['service_address']}"
              f"  (metrics port {oxia['metrics_port']})")
    else:
        print(f"  oxia       {'healthy' if oxia['healthy'] else 'unhealthy'}  cluster of {len(cluster['servers'])} "
              f"servers, {cluster['shards']} shards, replication factor {cluster['replication_factor']}  "
              f"{oxia['service_address']}")
        coordinator = cluster["coordinator"]
        print(f"    {coordinator['name']:<17} pid {_pid(coordinator)}  {coordinator['internal']}"
              f"  (metrics port {coordinator['metrics_port']})")
        for server in cluster["servers"]:
            print(f"    {server['name']:<17} pid {_pid(server)}  {server['public']}  leads {server['leads']}, follows "
                  f"{server['follows']}  (internal {server['internal']}, metrics port {server['metrics_port']})")
    print(f"  s3         {_health(s3)}  pid {s3['pid'] or '-'}  {s3['endpoint_url']}  bucket {s3['bucket']}"
          f"  ({s3['server']}, data in {s3['data']})")
    broker = info.get("broker")
    if broker and "balancer" in broker:
        balancer = broker["balancer"]
        print(f"  balancer   {_health(broker)}  pid {broker['pid'] or '-'}  {broker['url']}  (HAProxy, route by "
              f"{balancer['route_header']}{', split roles' if balancer['split_roles'] else ''}; stats "
              f"{balancer['stats_url']}, config {balancer['config']})")
        if broker.get("kafka_bootstrap"):
            print(f"  Kafka bootstrap {broker['kafka_bootstrap']}  (every broker's listener, no balancer)")
        for b in info.get("brokers", []):
            print(f"    {b['name']:<17} {_health(b)}  pid {_pid(b)}  {b['url']}  role {b['role']}"
                  + (f"  Kafka {HOST}:{b['kafka_port']}" if b.get("kafka_port") is not None else ""))
    elif broker:
        print(f"  broker     {_health(broker)}  pid {broker['pid'] or '-'}  {broker['url']}"
              + (f"  Kafka bootstrap {broker['kafka_bootstrap']}" if broker.get("kafka_bootstrap") else ""))
    print(f"  settings   {info['settings_file']}")


def _pid(process: dict) -> str:
    if not process["pid"]:
        return "- (stopped)"
    return f"{process['pid']} (paused)" if process["paused"] else str(process["pid"])


def _health(service: dict) -> str:
    if not service["pid"]:
        return "stopped"
    return "healthy" if service["healthy"] else "unhealthy"
