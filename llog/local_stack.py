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
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import boto3
import grpc
from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError

from llog import config
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

#: Where ``llog stack up --broker`` serves the HTTP broker unless told otherwise.
DEFAULT_BROKER_PORT = 18090
BROKER_PORT_ENV = "LLOG_STACK_BROKER_PORT"

_INSTALL_TIMEOUT_S = 30 * 60
_STOP_TIMEOUT_S = 10
_PROBE_TIMEOUT_S = 2
#: Where the S3 server answers health checks (GET, no credentials).
_S3_HEALTH_PATH = "/healthz"
#: Services ``stack.json`` may name, stopped in this order. ``seaweedfs``: the S3 server of
#: stacks started before versitygw replaced it, stopped so that its ports are freed.
_RECORDED_SERVICES = ("broker", "s3", "seaweedfs", "oxia")


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
    held: list[socket.socket] = []
    try:
        for _ in _PORT_LABELS:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(sock)  # held open until all are chosen, so none is chosen twice
            sock.bind((HOST, 0))
        return StackPorts(*(sock.getsockname()[1] for sock in held))
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


def _check_ports(ports: StackPorts) -> None:
    wanted = [(getattr(ports, name), label) for name, label in _PORT_LABELS.items()]
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
    channel = grpc.insecure_channel(f"{HOST}:{ports.oxia}")
    try:
        grpc.channel_ready_future(channel).result(timeout=_PROBE_TIMEOUT_S)
    except grpc.FutureTimeoutError:
        return f"gRPC on {HOST}:{ports.oxia} is not ready"
    finally:
        channel.close()
    return None


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
    """What the stack record says and whether each recorded process is alive and healthy."""
    paths = _Paths(stack_dir)
    record = _read_record(paths) or {}
    ports = StackPorts.from_record(record["ports"]) if "ports" in record else None
    oxia = record.get("oxia", {})
    s3 = record.get("s3", {})
    oxia_alive = _alive(oxia.get("pid"), oxia.get("binary"))
    s3_alive = _alive(s3.get("pid"), s3.get("binary"))
    oxia_healthy = oxia_alive and _oxia_problem(ports) is None
    s3_healthy = s3_alive and _s3_problem(ports, record["bucket"], prepare=False) is None
    return {
        "running": oxia_healthy and s3_healthy,
        "stack_dir": str(paths.root),
        "started_at": record.get("started_at"),
        "oxia": {
            "pid": oxia.get("pid") if oxia_alive else None,
            "port": ports.oxia if ports else None,
            "metrics_port": ports.oxia_metrics if ports else None,
            "service_address": f"{HOST}:{ports.oxia}" if ports else None,
            "healthy": oxia_healthy,
            "log": str(paths.log("oxia")),
        },
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
    }


def _broker_status(entry: dict | None) -> dict | None:
    if entry is None:
        return None
    alive = _alive(entry.get("pid"), entry.get("binary"))
    url = f"http://{HOST}:{entry['port']}"
    return {"pid": entry["pid"] if alive else None, "url": url, "port": entry["port"],
            "healthy": alive and _http_ok(f"{url}/health"), "log": entry.get("log")}


def up(stack_dir: Path | None = None, ports: StackPorts | None = None, bucket: str = "llog",
       timeout_s: float = 90, broker_port: int | None = None) -> dict:
    """Install if needed, start Oxia and the S3 server, wait until healthy, write the settings file;
    with ``broker_port``, also an HTTP broker (``python -m broker_lite``) on that port.

    A stack already running and healthy in ``stack_dir`` is left as it is (whatever ``ports``
    asked for), a broker is added to it if asked for and not running. Data in ``stack_dir``
    survives restarts. Returns :func:`status`.
    """
    paths = _Paths(stack_dir)
    ports = ports or resolve_ports()
    binaries = install()
    with _locked(paths.lock, timeout_s + 30, "`llog stack up` or `down`"):
        current = status(paths.root)
        if not current["running"]:
            _stop_recorded(paths)  # a stale or half-dead stack
            _check_ports(ports)
            _start(paths, ports, bucket, binaries, timeout_s)
        if broker_port is not None and not (current["broker"] or {}).get("healthy"):
            _start_broker(paths, broker_port, timeout_s)
    return status(paths.root)


def _start_broker(paths: _Paths, port: int, timeout_s: float) -> None:
    """The HTTP broker as a process of the stack: started by module name (the core does not
    import it), with the stack's settings file, stopped by ``down``."""
    record = _read_record(paths) or {}
    old = record.get("broker")
    if old and _alive(old.get("pid"), old.get("binary")):
        _stop(old["pid"], old["binary"])
    if not _port_free(port):
        raise LlogError(f"the broker's port {port} is in use (--broker-port picks another)")
    cmd = [sys.executable, "-m", "broker_lite", "--host", HOST, "--port", str(port), "--log-level", "warning"]
    entry = _spawn(paths, "broker", cmd, {**os.environ, "LLOG_SETTINGS_FILE": str(paths.settings)})
    record["broker"] = {**entry, "port": port, "log": str(paths.log("broker"))}
    _write_json(paths.record, record)
    deadline = time.monotonic() + timeout_s
    while not _http_ok(f"http://{HOST}:{port}/health"):
        if not _alive(entry["pid"], entry["binary"]):
            raise LlogError(f"the broker exited during startup; last lines of {paths.log('broker')}:\n"
                            + _tail(paths.log("broker")))
        if time.monotonic() > deadline:
            raise LlogError(f"the broker did not answer /health within {timeout_s:.0f} s; last lines of "
                            f"{paths.log('broker')}:\n" + _tail(paths.log("broker")))
        time.sleep(0.25)


def _commands(paths: _Paths, ports: StackPorts, binaries: dict[str, Path]) -> dict[str, tuple[list[str], dict]]:
    """Each service's command line and environment."""
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
    return {"oxia": (oxia_cmd, dict(os.environ)), "s3": (s3_cmd, s3_env)}


def _start(paths: _Paths, ports: StackPorts, bucket: str, binaries: dict[str, Path], timeout_s: float) -> None:
    for d in (paths.logs, paths.oxia_data, paths.s3_data):
        d.mkdir(parents=True, exist_ok=True)
    commands = _commands(paths, ports, binaries)
    record = {
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "bucket": bucket,
        "ports": dataclasses.asdict(ports),
    }
    try:
        for service, (cmd, env) in commands.items():
            record[service] = _spawn(paths, service, cmd, env)
            _write_json(paths.record, record)
        _wait_healthy(paths, record, ports, bucket, timeout_s)
    except BaseException:
        _stop_recorded(paths)
        raise
    _write_json(paths.settings, {
        "LLOG_OXIA_SERVICE_ADDRESS": f"{HOST}:{ports.oxia}",
        "LLOG_OXIA_NAMESPACE": OXIA_NAMESPACE,
        "LLOG_S3_ENDPOINT_URL": f"http://{HOST}:{ports.s3}",
        "LLOG_S3_BUCKET": bucket,
        "LLOG_S3_REGION_NAME": S3_REGION,
        "LLOG_S3_ACCESS_KEY_ID": S3_ACCESS_KEY_ID,
        "LLOG_S3_SECRET_ACCESS_KEY": S3_SECRET_ACCESS_KEY,
    })


def restart_service(stack_dir: Path | None, service: str, timeout_s: float = 60) -> None:
    """Stop one service of a running stack (exactly its recorded process: SIGTERM, then SIGKILL)
    and start it again with the same binary, ports and data; update ``stack.json`` and return
    once the stack is healthy again. For failure tests (``python -m chaos``): clients must ride
    through it."""
    if service not in ("oxia", "s3"):
        raise LlogError(f"unknown service {service!r}: oxia or s3")
    paths = _Paths(stack_dir)
    with _locked(paths.lock, timeout_s + 30, "`llog stack up` or `down`"):
        record = _read_record(paths)
        if record is None or service not in record or not status(paths.root)["running"]:
            raise LlogError(f"no running stack in {paths.root} (`llog stack up` starts one)")
        ports = StackPorts.from_record(record["ports"])
        _stop(record[service]["pid"], record[service]["binary"])
        binaries = {name: Path(record[name]["binary"]) for name in ("oxia", "s3")}
        cmd, env = _commands(paths, ports, binaries)[service]
        record[service] = _spawn(paths, service, cmd, env)
        _write_json(paths.record, record)
        _wait_healthy(paths, record, ports, record["bucket"], timeout_s)


def _spawn(paths: _Paths, service: str, cmd: list[str], env: Mapping[str, str]) -> dict:
    with open(paths.log(service), "ab") as log:
        log.write(f"--- llog stack up {datetime.now(timezone.utc).isoformat()}: {' '.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            cmd, cwd=paths.root, env=dict(env), stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
    _children[proc.pid] = proc
    return {"pid": proc.pid, "binary": cmd[0]}


def _wait_healthy(paths: _Paths, record: dict, ports: StackPorts, bucket: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    checks = {
        "oxia": lambda: _oxia_problem(ports),
        "s3": lambda: _s3_problem(ports, bucket, prepare=True),
    }
    for service, check in checks.items():
        while True:
            if not _alive(record[service]["pid"], record[service]["binary"]):
                child = _children.get(record[service]["pid"])
                status = "" if child is None else f" (exit status {child.returncode})"
                raise LlogError(f"{service} exited during startup{status}; last lines of {paths.log(service)}:\n"
                                + _tail(paths.log(service)))
            problem = check()
            if problem is None:
                break
            if time.monotonic() > deadline:
                raise LlogError(f"{service} did not become healthy within {timeout_s:.0f} s ({problem}); "
                                f"last lines of {paths.log(service)}:\n" + _tail(paths.log(service)))
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
            shutil.rmtree(paths.root / "seaweedfs", ignore_errors=True)  # of a stack from before versitygw
    return stopped


def _stop_recorded(paths: _Paths) -> list[str]:
    """Stop every live process of the record, then delete the record."""
    record = _read_record(paths) or {}
    stopped = []
    for service in _RECORDED_SERVICES:
        entry = record.get(service, {})
        if _alive(entry.get("pid"), entry.get("binary")):
            _stop(entry["pid"], entry["binary"])
            stopped.append(f"{service} (pid {entry['pid']})")
    paths.record.unlink(missing_ok=True)
    for pid, child in list(_children.items()):  # reap children that exited on their own
        if child.poll() is not None:
            del _children[pid]
    return stopped


def _stop(pid: int, binary: str) -> None:
    """SIGTERM, wait up to _STOP_TIMEOUT_S, then SIGKILL."""
    for sig, wait_s in ((signal.SIGTERM, _STOP_TIMEOUT_S), (signal.SIGKILL, 5)):
        try:
            os.kill(pid, sig)
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
    up_parser.add_argument("--broker", action="store_true",
                           help=f"also start an HTTP broker (python -m broker_lite) on 127.0.0.1 "
                                f"(port: --broker-port, else ${BROKER_PORT_ENV} or {DEFAULT_BROKER_PORT})")
    up_parser.add_argument("--broker-port", type=int, metavar="PORT", default=None)
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
        broker_port = None
        if args.broker or args.broker_port:
            broker_port = args.broker_port or int(os.environ.get(BROKER_PORT_ENV, DEFAULT_BROKER_PORT))
        info = up(args.stack_dir, ports=ports, bucket=args.bucket, timeout_s=args.timeout, broker_port=broker_port)
    except LlogError as e:
        print(f"llog stack up: {e}", file=sys.stderr)
        return 1
    _print_status(info)
    print("stop it with: llog stack down")
    return 0


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
    if not (oxia["pid"] or s3["pid"]):
        print(f"local stack is not running (stack dir {info['stack_dir']})")
        return
    print(f"local stack is {'running' if info['running'] else 'NOT healthy'} (stack dir {info['stack_dir']})")
    print(f"  oxia       {_health(oxia)}  pid {oxia['pid'] or '-'}  {oxia['service_address']}"
          f"  (metrics port {oxia['metrics_port']})")
    print(f"  s3         {_health(s3)}  pid {s3['pid'] or '-'}  {s3['endpoint_url']}  bucket {s3['bucket']}"
          f"  ({s3['server']}, data in {s3['data']})")
    broker = info.get("broker")
    if broker:
        print(f"  broker     {_health(broker)}  pid {broker['pid'] or '-'}  {broker['url']}")
    print(f"  settings   {info['settings_file']}")


def _health(service: dict) -> str:
    if not service["pid"]:
        return "stopped"
    return "healthy" if service["healthy"] else "unhealthy"
