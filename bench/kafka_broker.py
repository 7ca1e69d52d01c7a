"""A real Apache Kafka broker for ``bench.kafka``: one node in KRaft mode (broker and controller
in one process), on loopback ports that were free, in a directory of the caller's.

Its jars (``kafka_2.13`` and its dependencies, plus the SLF4J binding the Kafka distribution
ships so the broker's log has its lines) come from Maven Central only: the first run resolves them
with the Ivy jar pyspark ships, run on its own with ``conf/ivysettings.xml``, into the git-ignored
``.cache/kafka/<version>/``; later runs start from there with no network and no Ivy.

It runs as ``kafka-server-start.sh`` would run it: ``kafka.Kafka server.properties`` in a JVM
with the script's heap (1 GB) and GC settings, storage formatted first by Kafka's
``StorageTool`` with a random cluster id. Its log goes to a file in that directory, never to the
console. Every wait is bounded: the resolution, the format, the start (until the broker accepts
connections) and the stop (SIGTERM to its own pid, then SIGKILL).
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyspark

from bench.report import progress
from jobs.local_spark import CHECKOUT
from llog.errors import LlogError

KAFKA_VERSION = "4.4.0"
#: The SLF4J 1.x binding of log4j 2 at the log4j version Kafka's own dependencies bring: the
#: Kafka distribution ships it; Maven's dependencies of ``kafka_2.13`` leave it out, and without
#: it the broker would log nothing.
LOG4J_VERSION = "2.25.5"
KAFKA_CACHE = CHECKOUT / ".cache" / "kafka"
IVY_SETTINGS = CHECKOUT / "conf" / "ivysettings.xml"
HOST = "127.0.0.1"
#: kafka-server-start.sh's KAFKA_HEAP_OPTS and kafka-run-class.sh's KAFKA_JVM_PERFORMANCE_OPTS.
JVM_OPTIONS = ("-Xmx1g", "-Xms1g", "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
               "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
               "-Djava.awt.headless=true")
RESOLVE_TIMEOUT_S = 900
FORMAT_TIMEOUT_S = 120
START_TIMEOUT_S = 120
STOP_TIMEOUT_S = 30
#: The module Ivy resolves: the broker and the logging binding, in one resolution (one conflict
#: resolution over both).
_IVY_MODULE = """<ivy-module version="2.0">
  <info organisation="llog" module="bench-kafka-broker"/>
  <dependencies>
    <dependency org="org.apache.kafka" name="kafka_2.13" rev="{kafka}" conf="default->default"/>
    <dependency org="org.apache.kafka" name="kafka-tools" rev="{kafka}" conf="default->default"/>
    <dependency org="org.apache.logging.log4j" name="log4j-slf4j-impl" rev="{log4j}" conf="default->default"/>
  </dependencies>
</ivy-module>
"""
#: The broker's log4j 2 settings: the stock ``config/log4j2.yaml``'s INFO level, to one file.
_LOG4J2 = """status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
"""


@dataclass(frozen=True)
class KafkaBroker:
    """A running broker: where clients connect, its process, and its log."""

    bootstrap_servers: str
    pid: int
    #: A string only this broker's command line holds (its properties file), for
    #: :class:`bench.report.CpuMeter`.
    marker: str
    log: Path


def kafka_jars(version: str = KAFKA_VERSION) -> list[Path]:
    """The broker's jars and Kafka's CLI tools (``kafka-tools``: ``kafka-topics``, the console
    producer and consumer, ``kafka-consumer-groups``) in ``.cache/kafka/<version>/``, resolved
    from Maven Central the first time. The directory appears whole or not at all (Ivy retrieves into a directory beside it,
    renamed when complete), so an interrupted resolution is simply done again."""
    target = KAFKA_CACHE / version
    if target.is_dir() and not (target / f"org.apache.kafka_kafka-tools-{version}.jar").is_file():
        # Resolved before the CLI tools were wanted: resolve again, whole, beside it.
        stale = target.with_name(f"{version}.stale-{os.getpid()}")
        try:
            target.rename(stale)
            shutil.rmtree(stale, ignore_errors=True)
        except OSError:
            pass  # another process moved it first
    if not target.is_dir():
        _resolve(version, target)
    jars = sorted(target.glob("*.jar"))
    if not jars:
        raise LlogError(f"{target} holds no jars: delete it to resolve Kafka {version} again")
    return jars


def _resolve(version: str, target: Path) -> None:
    ivy_jar = next(iter(sorted((Path(pyspark.__file__).parent / "jars").glob("ivy-*.jar"))), None)
    if ivy_jar is None:
        raise LlogError("pyspark ships no Ivy jar (pyspark/jars/ivy-*.jar) to resolve Kafka with")
    progress(f"kafka: resolving Kafka {version} from Maven Central into {target} (once)")
    KAFKA_CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{version}.", suffix=".partial", dir=KAFKA_CACHE) as work:
        module = Path(work) / "ivy.xml"
        module.write_text(_IVY_MODULE.format(kafka=version, log4j=LOG4J_VERSION))
        retrieved = Path(work) / "jars"
        cmd = [_java(), "-jar", str(ivy_jar), "-settings", str(IVY_SETTINGS), "-cache", str(Path(work) / "cache"),
               "-ivy", str(module), "-confs", "default",
               "-retrieve", f"{retrieved}/[organisation]_[artifact]-[revision](-[classifier]).[ext]"]
        try:
            done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=RESOLVE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise LlogError(f"resolving Kafka {version} with Ivy took over {RESOLVE_TIMEOUT_S} s") from None
        if done.returncode != 0 or not any(retrieved.glob("*.jar")):
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-30:])
            raise LlogError(f"Ivy could not resolve Kafka {version} (exit code {done.returncode}):\n{tail}")
        try:
            retrieved.rename(target)
        except OSError:
            if not target.is_dir():  # else another process resolved it meanwhile: take theirs
                raise


@contextmanager
def kafka_broker(workdir: Path) -> Iterator[KafkaBroker]:
    """A broker whose data, settings and log are in ``workdir``, running until the block ends
    (then stopped, whatever happened in it)."""
    classpath = os.pathsep.join(map(str, kafka_jars()))
    broker_port, controller_port = _free_ports(2)
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "kafka.log"
    properties = workdir / "server.properties"
    properties.write_text(_server_properties(workdir / "data", broker_port, controller_port))
    log4j2 = workdir / "log4j2.properties"
    log4j2.write_text(_LOG4J2.format(log=log))
    java = [_java(), *JVM_OPTIONS, f"-Dlog4j2.configurationFile={log4j2}", "-cp", classpath]
    _format_storage(java, properties, log)
    with open(log, "ab") as output:  # what the JVM prints outside log4j (a crash) goes there too
        proc = subprocess.Popen([*java, "kafka.Kafka", str(properties)], cwd=workdir, stdin=subprocess.DEVNULL,
                                stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_accepting(proc, broker_port, log)
        yield KafkaBroker(f"{HOST}:{broker_port}", proc.pid, str(properties), log)
    finally:
        _stop(proc)


def _server_properties(data: Path, broker_port: int, controller_port: int) -> str:
    """One node, broker and controller, replication factor 1 everywhere (also Kafka's internal
    topics, whose default of 3 one node cannot hold), the stock defaults otherwise: no fsync
    per write (``log.flush.*`` unset: the page cache and replication make a write durable)."""
    return "\n".join([
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@{HOST}:{controller_port}",
        f"listeners=PLAINTEXT://{HOST}:{broker_port},CONTROLLER://{HOST}:{controller_port}",
        f"advertised.listeners=PLAINTEXT://{HOST}:{broker_port}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        f"log.dirs={data}",
        "offsets.topic.replication.factor=1",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        "",
    ])


def _format_storage(java: list[str], properties: Path, log: Path) -> None:
    cmd = [*java, "kafka.tools.StorageTool", "format", "--cluster-id", _cluster_id(), "--config", str(properties)]
    try:
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=FORMAT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise LlogError(f"Kafka's StorageTool did not format within {FORMAT_TIMEOUT_S} s") from None
    with open(log, "a") as out:
        out.write(done.stdout + done.stderr)
    if done.returncode != 0:
        raise LlogError(f"Kafka's StorageTool failed (exit code {done.returncode}):\n{done.stdout}{done.stderr}")


def _cluster_id() -> str:
    """A random cluster id as Kafka's ``Uuid.randomUuid`` makes them: 16 bytes in URL-safe
    base64 without padding, never starting with '-' (which a command line would take for an
    option)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


def _free_ports(count: int) -> list[int]:
    """``count`` distinct ports on loopback that nothing listens on, held together while chosen."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _wait_accepting(proc: subprocess.Popen, port: int, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise LlogError(f"the Kafka broker exited during startup (exit code {proc.returncode}); "
                            f"last lines of {log}:\n{_tail(log)}")
        try:
            socket.create_connection((HOST, port), timeout=1).close()
            return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise LlogError(f"the Kafka broker did not accept connections on {HOST}:{port} within "
                            f"{START_TIMEOUT_S} s; last lines of {log}:\n{_tail(log)}")
        time.sleep(0.2)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM (Kafka shuts down cleanly on it), then SIGKILL after :data:`STOP_TIMEOUT_S`."""
    for sig, wait_s in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
    raise LlogError(f"the Kafka broker (pid {proc.pid}) is still running after SIGKILL")


def _java() -> str:
    """The ``java`` Spark would use: ``$JAVA_HOME/bin/java``, else the one on the PATH."""
    java = Path(os.environ["JAVA_HOME"]) / "bin" / "java" if os.environ.get("JAVA_HOME") else shutil.which("java")
    if java is None:
        raise LlogError("no java: set JAVA_HOME or put java on the PATH")
    return str(java)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(cannot read the log: {e})"
