"""Spark server processes for tests, from the installed pyspark (its ``bin`` and ``jars``): a
Spark Connect server (local mode) and a standalone cluster (a master and its workers).

Each is a session leader, so stopping it (or a failpoint with ``LLOG_FAILPOINT_SCOPE=session``)
takes its JVM and every Python process it started. Their logs go to files a test can read.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from llog.config import Config
from llog.coordination import Coordination
from llog.discovery import topic_partitions
from llog.reader import ReadRequest
from tests.helpers.invariants import check_partition
from tests.helpers.jvm_startup import quick_start_env
from jobs.local_spark import CHECKOUT, spark_home_without_zip

LOOPBACK = "127.0.0.1"
#: Spark's logging config for the servers: warnings and errors only.
LOG4J = CHECKOUT / "conf" / "log4j2.properties"
#: How long a server may take to start on a loaded machine.
START_TIMEOUT_S = 180


def spark_home() -> Path:
    """The installed pyspark as a ``SPARK_HOME`` (jobs.local_spark.spark_home_without_zip)."""
    import pyspark

    return spark_home_without_zip() or Path(pyspark.__file__).resolve().parent


def _one_free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def spark_env(config: Config | None = None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a Spark JVM and its Python processes: this Python, the checkout
    importable, loopback only, ``config``'s LLOG_* settings (no settings file)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLOG_", "SPARK_", "PYSPARK_"))}
    env.update(quick_start_env())
    env.update(SPARK_HOME=str(spark_home()), PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP=LOOPBACK, LLOG_SETTINGS_FILE="/nonexistent",
               PYTHONPATH=os.pathsep.join(p for p in (str(CHECKOUT), os.environ.get("PYTHONPATH")) if p))
    if config is not None:
        env.update(config.to_options())
    env.update(extra or {})
    return env


def wait_for_port(port: int, proc: subprocess.Popen, log: Path, timeout_s: float = START_TIMEOUT_S) -> None:
    """Until something accepts connections on ``port``; fails if ``proc`` exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode} before listening on {port}:\n{_tail(log)}")
        with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, port), timeout=1):
            return
        time.sleep(0.3)
    raise TimeoutError(f"nothing listens on {port} after {timeout_s} s:\n{_tail(log)}")


def stop(proc: subprocess.Popen, timeout_s: float = 30) -> None:
    """SIGTERM to the process group of ``proc`` (a session leader), SIGKILL if still there after
    ``timeout_s``."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pass
    # The group too: Python workers outlive a JVM killed by SIGTERM for a moment.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


def _tail(log: Path, chars: int = 4000) -> str:
    try:
        return log.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def _start(argv: list[str], env: Mapping[str, str], log: Path) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(argv, cwd=CHECKOUT, env=dict(env), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


@dataclass
class ConnectServer:
    """A Spark Connect server (``sc://127.0.0.1:port``) in local mode, which a test can stop
    and start again (on the same port unless it was taken meanwhile: :attr:`url` follows)."""

    config: Config
    log: Path
    cores: int = 2
    port: int = field(default_factory=_one_free_port)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"sc://{LOOPBACK}:{self.port}"

    def start(self, extra_env: Mapping[str, str] | None = None, pythonpath: str | None = None,
              attempts: int = 3) -> None:
        """Start it and wait until it serves. ``extra_env`` adds to :func:`spark_env` (a
        failpoint, say) for this start only; ``pythonpath`` replaces the checkout on the server's
        ``PYTHONPATH`` (where its Python processes find llog). A server whose port was taken
        meanwhile exits (no other port is tried) and is started again on another."""
        env = spark_env(self.config, extra_env)
        if pythonpath is not None:
            env["PYTHONPATH"] = pythonpath
        home = Path(env["SPARK_HOME"])
        for attempt in range(attempts):
            if attempt:
                self.port = _one_free_port()
            argv = [str(home / "bin" / "spark-submit"),
                    "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
                    "--master", f"local[{self.cores},1]", "--name", "llog-connect-test",
                    "--conf", f"spark.connect.grpc.binding.address={LOOPBACK}",
                    "--conf", f"spark.connect.grpc.binding.port={self.port}", "--conf", "spark.connect.grpc.port.maxRetries=0",
                    "--conf", "spark.ui.enabled=false", "--conf", f"spark.sql.shuffle.partitions={self.cores}",
                    "--conf", "spark.driver.memory=1g", "--conf", "spark.sql.streaming.stopTimeout=30s",
                    "--conf", f"spark.driver.extraJavaOptions=-Dlog4j2.configurationFile={LOG4J}",
                    "spark-internal"]
            self.proc = _start(argv, env, self.log)
            try:
                wait_for_port(self.port, self.proc, self.log)
                return
            except RuntimeError:  # it exited
                if attempt == attempts - 1:
                    raise
            except BaseException:
                self.stop()
                raise

    def wait_exit(self, timeout_s: float) -> int:
        """Its exit status once it has exited (a failpoint kills it), within ``timeout_s``."""
        return self.proc.wait(timeout_s)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def connect_server(config: Config, log: Path, **start) -> Iterator[ConnectServer]:
    server = ConnectServer(config, log)
    server.start(**start)
    try:
        yield server
    finally:
        server.stop()


@dataclass
class StandaloneCluster:
    """A standalone master and its workers (``spark://127.0.0.1:port``)."""

    master_url: str
    web_port: int
    procs: list[subprocess.Popen]
    logs: list[Path]

    def state(self) -> dict | None:
        """The master's JSON state, or None if what answers on its web port is not this master
        (yet)."""
        try:
            with urllib.request.urlopen(f"http://{LOOPBACK}:{self.web_port}/json/", timeout=5) as reply:
                found = json.load(reply)
        except (OSError, ValueError):
            return None
        return found if isinstance(found, dict) and found.get("url") == self.master_url else None

    def alive_workers(self) -> int:
        return sum(1 for w in (self.state() or {}).get("workers", ()) if w["state"] == "ALIVE")

    def logs_text(self) -> str:
        return "\n".join(f"--- {log.name}\n{_tail(log)}" for log in self.logs)


#: No port but the one given: a master or worker whose port was taken meanwhile exits, and is
#: started again on other ports, rather than listening on the next port where none looks.
_EXACT_PORTS = "-Dspark.port.maxRetries=0"


def _start_master(log_dir: Path, env: Mapping[str, str], spark_class: str, attempts: int = 3
                  ) -> StandaloneCluster:
    """A master on free ports, serving; started again on other ports if its ports were taken."""
    for attempt in range(attempts):
        port, web_port = _one_free_port(), _one_free_port()
        log = log_dir / f"master-{attempt}.log"
        proc = _start([spark_class, "org.apache.spark.deploy.master.Master", "--host", LOOPBACK, "--port", str(port),
                       "--webui-port", str(web_port)], {**env, "SPARK_MASTER_OPTS": _EXACT_PORTS}, log)
        cluster = StandaloneCluster(f"spark://{LOOPBACK}:{port}", web_port, [proc], [log])
        deadline = time.monotonic() + START_TIMEOUT_S
        while proc.poll() is None and cluster.state() is None and time.monotonic() < deadline:
            time.sleep(0.3)
        if proc.poll() is None and cluster.state() is not None:
            return cluster
        stop(proc)
    raise RuntimeError(f"no master started in {attempts} attempts:\n{cluster.logs_text()}")


@contextlib.contextmanager
def standalone_cluster(log_dir: Path, workers: int = 2, cores: int = 1, memory: str = "1g"
                       ) -> Iterator[StandaloneCluster]:
    """A master and ``workers`` workers (``cores`` cores, ``memory`` for executors each), each
    on free ports, running until the block ends. Executors run this Python with the checkout
    importable."""
    # The master's and workers' own JVMs, started as quickly as the tests' drivers.
    env = {**spark_env(), "SPARK_DAEMON_MEMORY": "256m"}
    env["SPARK_DAEMON_JAVA_OPTS"] = env.get("SPARK_SUBMIT_OPTS", "")
    spark_class = str(Path(env["SPARK_HOME"]) / "bin" / "spark-class")
    cluster = _start_master(log_dir, env, spark_class)
    try:
        for n in range(workers):
            log = log_dir / f"worker-{n}.log"
            cluster.logs.append(log)
            work_dir = log_dir / f"worker-{n}"
            work_dir.mkdir(parents=True, exist_ok=True)
            cluster.procs.append(_start([spark_class, "org.apache.spark.deploy.worker.Worker", "--host", LOOPBACK,
                                         "--port", str(_one_free_port()), "--webui-port", str(_one_free_port()),
                                         "--cores", str(cores), "--memory", memory, "--work-dir", str(work_dir),
                                         cluster.master_url], env, log))
        deadline = time.monotonic() + START_TIMEOUT_S
        while cluster.alive_workers() < workers:
            if time.monotonic() > deadline or any(p.poll() is not None for p in cluster.procs):
                raise RuntimeError(f"{cluster.alive_workers()} of {workers} workers registered:\n{cluster.logs_text()}")
            time.sleep(0.5)
        yield cluster
    finally:
        for proc in reversed(cluster.procs):
            stop(proc)


def driver_argv(where: list[str], steps: str, *args: str) -> list[str]:
    """``python -m tests.helpers.llog_driver`` with ``where`` (``--remote URL`` or ``--master
    URL``, ``--register``), its steps (space-separated) and their arguments."""
    return [sys.executable, "-m", "tests.helpers.llog_driver", *where, *steps.split(), *args]


def driver_env(config: Config, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "LLOG_SETTINGS_FILE": "/nonexistent", **config.to_options(), **(extra or {})}


def run_driver(config: Config, where: list[str], steps: str, *args: str, timeout_s: float = 300) -> dict:
    """Run steps of tests.helpers.llog_driver to their end; their results by step (the one
    step's result if one). Fails with its stderr."""
    done = subprocess.run(driver_argv(where, steps, *args), cwd=CHECKOUT, env=driver_env(config),
                          capture_output=True, text=True, timeout=timeout_s, start_new_session=True)
    assert done.returncode == 0, f"{steps} exited with {done.returncode}:\n{done.stderr[-4000:]}"
    results = json.loads(done.stdout.strip().splitlines()[-1])
    return results if len(results) > 1 else results[steps]


# --- What a sink query (tests.helpers.llog_driver's sink step) wrote ------------------------------

#: The sink's line for a batch whose commit found slices committed by an attempt before it.
REPLAYED = re.compile(r"llog sink: batch \d+ committed .* [1-9]\d* slice\(s\) were already committed")


def topic_values(config, reader, topic: str) -> list[int]:
    """The values of ``topic`` (as ints), every partition from offset 1."""
    values = []
    with Coordination(config) as coordination:
        for p in topic_partitions(coordination, config.root_prefix, topic):
            if check_partition(coordination, config.root_prefix, topic, p).high_watermark:
                batches = reader.read_batches([ReadRequest(topic, p, 1)])[0]
                values += [int(v) for v in batches.table().column("value").to_pylist()]
    return values


def assert_every_row_once(values: list[int], rows: int, batches: int) -> None:
    """``values`` hold ``0 .. n*rows-1`` once each, ``n >= batches`` (a sink query's input)."""
    twice = sorted(v for v, c in collections.Counter(values).items() if c > 1)
    assert not twice, f"{len(twice)} row(s) written twice, first {twice[:10]}"
    missing = sorted(set(range(max(values) + 1)) - set(values))
    assert not missing, f"{len(missing)} row(s) missing, first {missing[:10]}"
    assert len(values) % rows == 0 and len(values) >= batches * rows
