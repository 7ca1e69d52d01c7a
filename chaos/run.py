"""The chaos controller (see :mod:`chaos`): start the actors, disturb them from a seed, then check."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple
from uuid import uuid4

import httpx

from chaos.actors import BETWEEN_COMPACTION_STEPS, ROLES, record_value
from llog_tools import local_stack
from llog_tools.stack import build, network
from llog_tools.stack.haproxy import HAPROXY, haproxy_config, read_haproxy_stats
from llog_tools.stack.oxia_server import oxia_problem
from llog.clock import ShiftedClock
from llog.compactor import Compactor
from llog.config import Config
from llog.consumer_groups import committed_offsets
from llog.coordination import Coordination
from llog.discovery import topic_records
from llog.gc import all_partitions, gc_pass, referenced_blobs
from llog.keys import KAFKA_PARTITION_KEY, PartitionKeys, TopicPartition, kafka_group_key
from llog.reader import LogReader, ReadRequest
from llog.records import DELETING, CompactionRecord, ControlRecord
from llog.topics import TopicSettings, create_topic, delete_topic, read_topic
from tests.helpers.invariants import check_partition

REPO = Path(__file__).resolve().parents[1]
#: The main topic: writers, producers through the broker, consumers committing group offsets, and
#: retention (``retention.ms``) on it.
TOPIC = "chaos"
#: The topic the admin actor deletes and creates again while writers append to it.
RECREATED = "chaos-re"
#: The topic no one creates: writers create it on first use and grow it, to twice ``--partitions``
#: partitions, by writing to ever higher partitions (docs/protocol.md section 10.2).
GROWN = "chaos-grow"
#: Oxia's shards in a run (its own server; the local stack's has one).
_OXIA_SHARDS = 3
#: How long actors get to stop after SIGTERM, and the bound on every other wait here.
_STOP_S = 10
#: How long a kill waits for its actor to be mid-operation (its activity file shows a ``begin``
#: last; a compactor's, a step between its record's create and its cursor's move) before it kills
#: the actor anyway: a kill between operations tests little. Compactors get longer: they are
#: between steps for tens of milliseconds per compaction, and compact nothing in the first ``G``.
_AIM_S = {"compactor": 6}
_AIM_DEFAULT_S = 2
#: The roles a run must have killed mid-operation (:func:`not_exercised`); the first kills go to them.
_MUST_KILL = ("writer", "compactor")
#: How far past the grace period ``G`` the final GC's clock runs ahead of the real one.
_FINAL_GC_MARGIN_S = 30
#: The processes of a run beyond the writers, compactors and readers: one each.
_ONE_EACH = (("gc", "gc"), ("admin", "admin"), ("consumer", "cg"), ("producer", "pi"), ("producer", "pp"),
             ("broker_consumer", "bc"), ("kafka_producer", "kp"), ("kafka_consumer", "kc0"), ("kafka_consumer", "kc1"),
             ("broker", "b0"), ("broker", "b1"))
#: The names of the actors that go through the broker: its producers (idempotent, plain) and consumer.
_BROKER_PRODUCERS, _BROKER_CONSUMER = ("pi", "pp"), "bc"
#: The producer that goes through the brokers' Kafka listeners.
_KAFKA_PRODUCER = "kp"
#: The Kafka consumer group's members (``kafka_consumer`` actors) share this group.
KAFKA_GROUP = "chaos-kafka"


@dataclass
class Actor:
    role: str
    name: str
    incarnation: int = 0
    proc: subprocess.Popen | None = None
    paused_until: float | None = None

    @property
    def label(self) -> str:
        return f"{self.name}.{self.incarnation}"


@dataclass
class Run:
    args: argparse.Namespace
    config: Config
    stack_dir: Path | None
    dir: Path
    rng: random.Random
    actors: list[Actor] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)
    #: By role: SIGKILLs that killed the actor (not one that had exited), and of those the ones
    #: that landed mid-operation by the actor's own activity file.
    kills: Counter = field(default_factory=Counter)
    killed_mid_operation: Counter = field(default_factory=Counter)
    oxia: "OxiaServer | None" = None
    #: The balancer's port (what producers and consumers use), and each broker's own by name.
    broker_port: int = 0
    broker_ports: dict[str, int] = field(default_factory=dict)
    #: Each broker's Kafka listener port, by name.
    kafka_ports: dict[str, int] = field(default_factory=dict)
    #: When (``time.time()``) a broker was SIGKILLed or SIGSTOPped while it coordinated the Kafka
    #: group (its claim in Oxia named its listener), by ``"kill"``/``"pause"``.
    coordinator_hits: dict[str, list[float]] = field(default_factory=lambda: {"kill": [], "pause": []})
    #: The controller's own Oxia client (opened lazily), to find the Kafka group's coordinator.
    coordination: Coordination | None = None
    #: Each actor that exited by itself: its label, exit status, the last line of its log, and
    #: when (``time.time()``) the controller saw it.
    exits: list[dict] = field(default_factory=list)
    #: When (``time.time()``) each server restart began and ended (healthy again).
    outages: list[tuple[float, float]] = field(default_factory=list)
    #: When (``time.time()``) every actor had stopped: no retention pass ran after it.
    stopped_at: float = 0.0
    #: ``(topic, topic_id)`` of each incarnation whose delete the end of the run finished (the
    #: admin was killed in it).
    deleted_at_rest: set[tuple[str, str]] = field(default_factory=set)

    @property
    def broker_url(self) -> str:
        return f"http://127.0.0.1:{self.broker_port}"

    def activity(self, actor: Actor) -> Path:
        return self.dir / "activity" / f"{actor.label}.jsonl"

    def env(self) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LLOG_SETTINGS_FILE": "/nonexistent",
                "PYTHONPATH": str(REPO), **self.config.to_options()}

    def command(self, actor: Actor) -> list[str]:
        if actor.role == "broker":  # its early ack and tail cache on, as by default
            return [sys.executable, "-m", "broker_lite", "--port", str(self.broker_ports[actor.name]),
                    "--kafka-port", str(self.kafka_ports[actor.name]), "--log-level", "warning"]
        command = [sys.executable, "-m", "chaos.actors", actor.role, "--dir", str(self.dir), "--name", actor.label,
                   "--topic", TOPIC, "--recreated", RECREATED, "--grown", GROWN, "--partitions", str(self.args.partitions),
                   "--seed", str(self.rng.randrange(2**32)), "--broker", self.broker_url,
                   "--topic-settings", json.dumps(topic_settings(self.args)),
                   "--group", KAFKA_GROUP if actor.role == "kafka_consumer" else f"group-{actor.name}",
                   "--kafka", ",".join(f"127.0.0.1:{port}" for port in self.kafka_ports.values())]
        if actor.role in ("writer", "compactor"):
            command += ["--lose-replies", str(self.args.lose_replies)]
        if actor.name == _BROKER_PRODUCERS[0]:
            command.append("--idempotent")
        return command

    def start(self, actor: Actor) -> None:
        actor.incarnation += 1
        log = open(self.dir / "logs" / f"{actor.label}.log", "ab")
        actor.proc = subprocess.Popen(
            self.command(actor), cwd=REPO, env=self.env(), stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        actor.paused_until = None

    def pause(self, actor: Actor, seconds: float) -> None:
        self._note_coordinator(actor, "pause")
        actor.proc.send_signal(signal.SIGSTOP)
        actor.paused_until = time.monotonic() + seconds
        self.counts["pauses"] += 1

    def resume_due(self, everyone: bool = False) -> None:
        for actor in self.actors:
            if actor.paused_until is not None and (everyone or time.monotonic() >= actor.paused_until):
                actor.proc.send_signal(signal.SIGCONT)
                actor.paused_until = None

    def kafka_coordinator(self) -> str | None:
        """The name of the broker process whose listener coordinates the Kafka group (its claim,
        docs/protocol.md section 9.5, names its port and its broker id, which holds its pid), or
        None (no claim, a process gone, or Oxia cannot say now)."""
        try:
            if self.coordination is None:
                self.coordination = Coordination(self.config)
            found = self.coordination.get(kafka_group_key(self.config.root_prefix, KAFKA_GROUP), KAFKA_PARTITION_KEY)
        except Exception as e:  # noqa: BLE001 - Oxia restarting: not known now
            _progress(f"finding the Kafka group's coordinator: {type(e).__name__}: {e}")
            return None
        if found is None:
            return None
        holder = json.loads(found.value)
        return next((a.name for a in self.actors if a.role == "broker" and a.proc is not None
                     and self.kafka_ports[a.name] == holder["port"]
                     and f"-{a.proc.pid}-" in holder["broker_id"]), None)

    def _note_coordinator(self, actor: Actor, what: str) -> None:
        if actor.role == "broker" and self.kafka_coordinator() == actor.name:
            _progress(f"{actor.label} coordinates the Kafka group {KAFKA_GROUP}")
            self.coordinator_hits[what].append(time.time())

    def kill_and_restart(self, actor: Actor) -> None:
        self._note_coordinator(actor, "kill")
        actor.proc.kill()
        actor.proc.wait(_STOP_S)
        if actor.proc.returncode == -signal.SIGKILL:
            self.kills[actor.role] += 1
            self.killed_mid_operation[actor.role] += _mid_operation(self.activity(actor), actor.role)
        self.start(actor)

    def stop_all(self) -> None:
        self.resume_due(everyone=True)
        for actor in self.actors:
            actor.proc.terminate()
        deadline = time.monotonic() + _STOP_S
        for actor in self.actors:
            try:
                actor.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                actor.proc.kill()
                actor.proc.wait(_STOP_S)


def topic_settings(args: argparse.Namespace) -> dict:
    """Both topics' settings: ``retention.ms`` :data:`RETENTION_SHARE` of the run (at least a little
    above ``G``, as retention never takes an entry younger than ``G`` anyway), so that retention
    passes drop what the first part of the run wrote, and leave at least
    :data:`MIN_VERIFIED_FRACTION` of what it acknowledged to read back and check."""
    share = RETENTION_SHARE if args.seconds <= SHORT_RUN_S else LONG_RUN_RETENTION_SHARE
    return {"retention.ms": max(args.grace_ms * 5 // 4, int(args.seconds * 1000 * share))}


#: ``retention.ms`` as a share of the run's ``--seconds`` (:func:`topic_settings`): what the last
#: 80% of the run acknowledged stays, and retention takes from what the first 20% (and the start
#: before the chaos) wrote. Writers may ack more early on, before kills and pauses pile up: a 150 s
#: run with 60% checked 0.525 of what it acknowledged, a 40 s run with 70% 0.547.
RETENTION_SHARE = 0.8
#: Runs longer than this keep :data:`LONG_RUN_RETENTION_SHARE` instead: at 80% a 120 s run left
#: retention so short a window (its first entries are older than ``retention.ms`` only in the
#: last seconds, compacted into runs as new as their newest entry) that no pass dropped anything
#: (seed 1: 32 retention passes, none dropped; verified 0.974), and a 60 s run one pass (0.935).
SHORT_RUN_S = 60
LONG_RUN_RETENTION_SHARE = 0.65
#: How long the chaos goes on past ``--seconds`` at most, while no retention pass has dropped
#: records yet (:func:`_disturb`). The soak stage's 40 s run ran none twice on 2026-12-02 (its
#: first records were written seconds after the chaos began, on a loaded machine).
RETENTION_OVERTIME_S = 20


class OxiaServer:
    """The run's own Oxia standalone with several shards (as tests/integration/test_coordination.py
    starts one), restarted in place (same ports and data) by the chaos."""

    def __init__(self, directory: Path, shards: int):
        self.ports = network.free_ports()
        self.address = f"127.0.0.1:{self.ports.oxia}"
        self.command = [str(build.install()["oxia"]), "standalone", "--shards", str(shards),
                        "-p", self.address, "-m", f"127.0.0.1:{self.ports.oxia_metrics}",
                        "--data-dir", str(directory / "data"), "--wal-dir", str(directory / "wal")]
        self.log = directory / "oxia.log"
        directory.mkdir(parents=True)
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + 60
        while (problem := oxia_problem(self.ports)) is not None:  # the stack's own health probe
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"oxia did not start: {problem}; see {self.log}")
            time.sleep(0.1)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(_STOP_S * 3)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(_STOP_S)

    def restart(self) -> None:
        self.stop()
        self.start()


class Balancer:
    """HAProxy in front of the run's brokers, configured as ``llog stack up --brokers N`` does
    (:func:`llog_tools.stack.haproxy.haproxy_config`: a partition's requests go to one broker, by the
    consistent hash of ``X-Llog-Partition``, and to another while that one is down)."""

    def __init__(self, directory: Path, port: int, stats_port: int, brokers: dict[str, int]):
        directory.mkdir(parents=True)
        self.config = directory / "haproxy.cfg"
        self.config.write_text(haproxy_config(port, stats_port, [
            {"name": name, "port": p, "role": "both"} for name, p in brokers.items()], split_roles=False))
        self.log = directory / "haproxy.log"
        self.stats_url = f"http://127.0.0.1:{stats_port}/stats"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([HAPROXY, "-db", "-f", str(self.config)], stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def requests(self) -> dict[str, int]:
        """The requests it sent each broker (HAProxy's statistics)."""
        return {row["svname"]: int(row["stot"] or 0) for row in read_haproxy_stats(self.stats_url)
                if row.get("svname") not in ("FRONTEND", "BACKEND") and row.get("pxname") == "brokers"}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(_STOP_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(_STOP_S)


def _free_ports(count: int) -> list[int]:
    """``count`` distinct ports free now, chosen by the system."""
    with contextlib.ExitStack() as held:
        socks = [held.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]


def _wait_for_broker(run: Run, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{run.broker_url}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"no broker answered /health through the balancer within {timeout_s:g} s")
        time.sleep(0.1)


def _progress(message: str) -> None:
    print(f"chaos: {message}", file=sys.stderr, flush=True)


def _mid_operation(activity: Path, role: str) -> bool:
    """Whether the last line of an actor's activity file (:mod:`chaos.actors`) begins an
    operation that has not ended; for a compactor, whether it is a step between its
    ``meta/compaction`` record's create and its cursor's move
    (:data:`chaos.actors.BETWEEN_COMPACTION_STEPS`): a pass with nothing to compact tests no
    recovery."""
    try:
        with open(activity, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            tail = f.read().splitlines()
    except FileNotFoundError:
        return False
    for line in reversed(tail):
        try:
            last = json.loads(line)
        except ValueError:
            continue  # cut by the SIGKILL, or by the seek
        if role == "compactor":
            return last.get("step") in BETWEEN_COMPACTION_STEPS
        return "begin" in last
    return False


def _disturb(run: Run) -> None:
    """The chaos: until the time is up, at random moments pause or kill a random actor;
    restart Oxia and the S3 server once each, between 15% and 85% of the run."""
    args, rng = run.args, run.rng
    began = time.monotonic()
    restarts = {} if args.no_server_restarts else {
        service: began + args.seconds * rng.uniform(0.15, 0.85) for service in ("oxia", "s3")}
    budget_s = run.config.gc_grace_ms / 4 / 1000
    longest_pause = max(budget_s, run.config.oxia_session_timeout_ms / 1000) + 3
    next_event = began + rng.uniform(0.5, 2)
    aim: tuple[Actor, float] | None = None  # an actor to kill once it is mid-operation, until when
    ends, overtime = began + args.seconds, False
    while True:
        now = time.monotonic()
        if now >= ends:
            # Time is up. The verdict needs a retention pass that dropped records, and the first
            # records are old enough for one only in the run's last seconds (retention.ms is
            # most of the run): on a slow machine that window can pass without one. The chaos
            # goes on, a second at a time, until one has (at most RETENTION_OVERTIME_S more).
            if now >= began + args.seconds + RETENTION_OVERTIME_S or _activity_totals(run.dir)["retention_passes"]:
                break
            if not overtime:
                _progress("time is up, but no retention pass has dropped records yet: going on until one has")
                overtime = True
            ends = now + 1.0
        time.sleep(0.05)
        run.resume_due()
        now = time.monotonic()
        for service, at in list(restarts.items()):
            if now >= at:
                _progress(f"restarting {service}")
                outage_began = time.time()
                if service == "oxia" and run.oxia is not None:
                    run.oxia.restart()
                elif service == "oxia":  # the cluster: SIGKILL the server leading the most shards, under load
                    restarted = local_stack.restart_service(run.stack_dir, service, kill=True,
                                                            down_s=rng.uniform(0.5, 3))
                    _progress(f"killed and restarted {restarted['service']}: healthy again after "
                              f"{restarted['healthy_after_s']:.1f} s")
                    run.counts["oxia_server_kills"] += 1
                else:
                    local_stack.restart_service(run.stack_dir, service)
                run.counts["server_restarts"] += 1
                run.outages.append((outage_began, time.time()))
                del restarts[service]
        for actor in run.actors:
            if actor.proc.poll() is not None and actor.paused_until is None:
                last = (run.dir / "logs" / f"{actor.label}.log").read_text(errors="replace").strip().splitlines()[-1:]
                _progress(f"{actor.label} exited by itself ({actor.proc.returncode}: {' '.join(last)[-300:]}); "
                          "starting it again")
                run.counts["exits"] += 1
                run.exits.append({"actor": actor.label, "status": actor.proc.returncode, "at": time.time(),
                                  "last": " ".join(last)[-200:]})
                run.start(actor)
        if aim is not None:
            actor, until = aim
            busy = _mid_operation(run.activity(actor), actor.role)
            if busy or now >= until:
                _progress(f"killing {actor.label}" + ("" if busy else " (not mid-operation)"))
                run.kill_and_restart(actor)
                aim = None
            continue
        if now < next_event:
            continue
        next_event = now + rng.uniform(0.3, 1.5)
        actor = rng.choice([a for a in run.actors if a.paused_until is None])
        if rng.random() < 0.7:
            pause = rng.uniform(0.1, longest_pause)
            _progress(f"pausing {actor.label} for {pause:.1f} s")
            run.pause(actor, pause)
        else:
            # Until a writer and a compactor were killed mid-operation, kill one of them: a short
            # run picking at random among all actors may well kill no compactor.
            # The broker too, until it was killed once (it keeps no activity file: never "mid-operation").
            # The Kafka group's coordinator first, once the group has one, until one was killed
            # while it coordinated: the group must get assignments again before the run ends.
            coordinator = None if run.coordinator_hits["kill"] else run.kafka_coordinator()
            needed = [a for a in run.actors if a.paused_until is None and a.name == coordinator] or [
                a for a in run.actors if a.paused_until is None and (
                    (a.role in _MUST_KILL and not run.killed_mid_operation[a.role])
                    or (a.role == "broker" and not run.kills["broker"]))]
            target = rng.choice(needed) if needed else actor
            aim = (target, now + _AIM_S.get(target.role, _AIM_DEFAULT_S))


#: An incarnation's partition: ``(topic, topic_id, partition)``.
Incarnation = tuple[str, str, int]


class AckedRecord(NamedTuple):
    """One acknowledged record: its value and when its append was first sent (``sent_at``,
    ``time.time()``: its index entry's ``created_at_ms`` is no earlier, :func:`chaos.actors._ack`)."""

    value: bytes
    sent_at: float


@dataclass
class AckLines:
    """The acknowledgement lines of a run's ack files (:func:`read_ack_lines`)."""

    lines: list[dict] = field(default_factory=list)
    #: A file's last line cut short (its actor killed while writing it): that acknowledgement
    #: cannot be judged, and is counted, not a crash of the check.
    cut: list[str] = field(default_factory=list)
    #: A line that does not parse and is not its file's last: no kill explains it.
    damaged: list[str] = field(default_factory=list)


def read_ack_lines(acks_dir: Path, names: Iterable[str] | None = None) -> AckLines:
    """The acknowledgement lines of the ack files (:mod:`chaos.actors`), of every actor or of the
    ones named ``names`` (any of their incarnations)."""
    out = AckLines()
    paths = sorted(acks_dir.glob("*.jsonl")) if names is None else sorted(
        path for name in names for path in acks_dir.glob(f"{name}.*.jsonl"))
    for path in paths:
        text = path.read_text()
        lines = text.splitlines()
        for number, line in enumerate(lines, 1):
            try:
                out.lines.append(json.loads(line))
            except ValueError:
                last = number == len(lines) and not text.endswith("\n")
                (out.cut if last else out.damaged).append(f"{path.name} line {number}: {line[:80]!r}")
    return out


def read_acks(acks_dir: Path) -> dict[Incarnation, dict[int, list[AckedRecord]]]:
    """Per incarnation's partition (the ``topic_id`` its acknowledgement says the records landed
    in), offset -> every acknowledgement of that offset, in the ack files (:mod:`chaos.actors`).
    More than one means the offset was acknowledged to two appends: each one is kept, so that the
    check sees it. A cut last line is left out (:func:`read_ack_lines`)."""
    out: dict[Incarnation, dict[int, list[AckedRecord]]] = {}
    for ack in read_ack_lines(acks_dir).lines:
        acks = out.setdefault((ack["topic"], ack["topic_id"], ack["partition"]), {})
        for i in range(ack["count"]):
            acks.setdefault(ack["start"] + i, []).append(AckedRecord(
                record_value(ack["name"], ack["seq"], ack["topic"], ack["partition"], i), ack["sent_at"]))
    return out


def read_reads(reads_dir: Path) -> list[tuple[str, bytes]]:
    """``(topic_id, value)`` of every record the readers read of the re-created topic during the
    run (:mod:`chaos.actors`), with the incarnation they read it in."""
    out = []
    for path in sorted(reads_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                read = json.loads(line)
            except ValueError:
                continue  # cut by a SIGKILL
            out += [(read["topic_id"], v.encode()) for v in read["values"]]
    return out


def judge_acks(acked: dict[Incarnation, dict[int, list[AckedRecord]]], logs: dict[Incarnation, dict[int, bytes]],
               log_starts: dict[Incarnation, int], reads: Iterable[tuple[str, bytes]] = (),
               deleted: Iterable[Incarnation] = (), kept_from: Mapping[Incarnation, float] | None = None) -> dict:
    """For acknowledgements ``acked``, the live incarnations' logs read back (``logs``, from their
    log starts ``log_starts``), what was read during the run (``reads``), the partitions of
    incarnations the run deleted (``deleted``: named by the admin and tombstones at the end) and,
    per live partition, the time from which an append retention cannot have taken
    (``kept_from``; None: retention's times unknown, anything below the log start may be gone):

    - ``lost``: acknowledgements whose record is not at its offset with its bytes, at or above the
      log start; below it, when sent at or after ``kept_from`` (retention takes an entry only once
      ``created_at_ms`` is older than ``retention.ms`` and ``G``, docs/protocol.md section 10.3,
      and an entry is created after its append was sent); and every acknowledgement of a
      partition not read back that is not in ``deleted`` (a live incarnation's partition
      unreadable or past its count, an incarnation no one deleted);
    - ``verified``: acknowledgements checked against the log read back (at or above its start);
    - ``double_acked``: offsets acknowledged more than once;
    - ``duplicated``: values in the logs more than once;
    - ``mixed_incarnations``: records read (during the run or now) in an incarnation other than
      the one their acknowledgement says they landed in, or, not acknowledged, read in two;
    - ``gone_by_retention``, ``gone_with_deleted_topic``: acknowledged records gone as they may be
      (below the log start and sent before ``kept_from``; in ``deleted``).
    """
    result = {"lost": 0, "verified": 0, "double_acked": 0, "duplicated": 0, "mixed_incarnations": 0,
              "gone_by_retention": 0, "gone_with_deleted_topic": 0, "problems": []}
    deleted = set(deleted)
    seen: Counter[bytes] = Counter()
    for got in logs.values():
        seen.update(got.values())
    for key, acks in sorted(acked.items()):
        name = f"{key[0]}[{key[2]}] of {key[1]}"
        count = sum(map(len, acks.values()))
        twice = sorted(o for o, ones in acks.items() if len(ones) > 1)
        result["double_acked"] += len(twice)
        if twice:
            result["problems"].append(f"{name}: {len(twice)} offset(s) acknowledged more than once, first "
                                      f"{twice[0]} to {[a.value.decode() for a in acks[twice[0]]]}")
        if key not in logs:
            if key in deleted:
                result["gone_with_deleted_topic"] += count
            else:
                result["lost"] += count
                result["problems"].append(f"{name}: {count} acknowledged record(s) not read back: the partition "
                                          "is not in a live incarnation and its incarnation was not deleted")
            continue
        got, start = logs[key], log_starts.get(key, 1)
        kept = float("-inf") if kept_from is None else kept_from.get(key, float("-inf"))
        below = [(o, a) for o, ones in acks.items() if o < start for a in ones]
        young = sorted(o for o, a in below if kept_from is not None and a.sent_at >= kept)
        result["gone_by_retention"] += len(below) - len(young)
        wrong = sorted(o for o, ones in acks.items() for a in ones if o >= start and got.get(o) != a.value)
        result["verified"] += count - len(below)
        result["lost"] += len(wrong) + len(young)
        if wrong:
            result["problems"].append(f"{name}: {len(wrong)} acknowledged record(s) lost or wrong, "
                                      f"first at offsets {wrong[:5]}")
        if young:
            result["problems"].append(f"{name}: {len(young)} acknowledged record(s) below the log start {start} "
                                      f"though sent after {kept:.3f}, too young for retention to take, first at "
                                      f"offsets {young[:5]}")
    result["duplicated"] = sum(n - 1 for n in seen.values() if n > 1)
    acked_in: dict[bytes, set[str]] = {}
    for (_, topic_id, _), acks in acked.items():
        for ones in acks.values():
            for a in ones:
                acked_in.setdefault(a.value, set()).add(topic_id)
    read_in: dict[bytes, set[str]] = {}
    for (_, topic_id, _), got in logs.items():
        for v in got.values():
            read_in.setdefault(v, set()).add(topic_id)
    for topic_id, v in reads:
        read_in.setdefault(v, set()).add(topic_id)
    for v, ids in read_in.items():
        wrong = len(ids - acked_in[v]) if v in acked_in else len(ids) - 1
        if wrong:
            result["mixed_incarnations"] += wrong
            result["problems"].append(f"{v.decode()} read in incarnation(s) {sorted(ids)}, acknowledged in "
                                      f"{sorted(acked_in.get(v, ()))}")
    return result


def retention_safe_from(stopped_at: float, settings: TopicSettings, grace_ms: int) -> float:
    """The time from which an append to a topic with ``settings`` cannot have been taken by
    retention in a run whose actors all stopped at ``stopped_at``: a retention pass at ``now``
    takes an entry only if ``created_at_ms < now - max(retention.ms, G)`` (docs/protocol.md
    section 10.3, the retention floor ``G``), and its ``now`` is before ``stopped_at``. A second's
    margin for the milliseconds ``created_at_ms`` keeps. With ``retention.bytes`` set, size takes
    entries of any age (+inf: no time protects); with neither set, nothing is taken (-inf)."""
    if settings.retention_bytes >= 0:
        return float("inf")
    if settings.retention_ms < 0:
        return float("-inf")
    return stopped_at - max(settings.retention_ms, grace_ms) / 1000 + _ROUNDING_MARGIN_S


#: The margin :func:`retention_safe_from` leaves for ``created_at_ms``'s milliseconds and the ack's rounding.
_ROUNDING_MARGIN_S = 1.0


def read_kafka_group(group_dir: Path) -> list[dict]:
    """The events of the Kafka group's members (:func:`chaos.actors.kafka_consumer`), each
    member's in the order it wrote them."""
    events = []
    for path in sorted(group_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue  # cut by a SIGKILL
    return events


def judge_kafka_group(events: list[dict], topic: str, topic_id: str, logs: dict[Incarnation, dict[int, bytes]],
                      log_starts: dict[Incarnation, int], acked: dict[Incarnation, dict[int, list[AckedRecord]]],
                      committed: dict[int, int], coordinator_kills: list[float],
                      retention_s: float | None = None) -> dict:
    """The Kafka consumer group's run (``events``: :func:`read_kafka_group`) against the log read
    back (``logs``, ``log_starts``), the acknowledgements (``acked``, :func:`read_acks`), the
    group's committed offsets at the end (``committed``: partition -> offset, from llog's records),
    when its coordinator was killed, and how old an entry must be before retention may take it
    (``retention_s``: ``max(retention.ms, G)``; None: any age):

    - ``kafka_wrong_records``: a record a member consumed that is not the log's at its offset:
      at or above the log start, the bytes read back there; below it (retention took it), an
      acknowledged value of that offset, else a value written to that topic and partition;
    - ``kafka_out_of_order``: within one assignment of a member, a partition's offsets not strictly
      increasing; ``kafka_skipped``: offsets it jumped over that are at or above the log start
      (records it should have been given: the log start only moves up, so they were there);
    - ``kafka_lost_commits``: a partition whose committed offset ends below the highest commit
      acknowledged for it (``H``), unless a member committed that lower offset in an assignment of
      the partition that began after ``H`` was sent. That is Kafka's rule: a commit is fenced by
      its generation, so once ``H`` passed the check only a newer generation moves the offset, and
      a newer generation's member may start below ``H`` (it read the offset before ``H`` was
      written) and commit its position (``kafka_commits_moved_back``). A member whose assignment
      began before ``H`` was sent cannot hold the partition in a generation newer than ``H``'s
      (``H``'s member held it then), so its lower commit landing after ``H`` is a stale one
      the coordinator let through;
    - ``kafka_started_past_commit``: a member's first offset of a partition in an assignment above
      every offset a commit of that partition sent before the assignment began could have written
      (the group's committed offset then, which the member resumes from; none: the log start; a
      commit answered with an error counts too, as the client sends it again after a timeout and an
      earlier attempt may have landed), when
      the record just below it was still in the log then: in the log at the end, or acknowledged
      as sent less than ``retention_s`` before the member consumed its first record of the
      assignment (retention cannot have taken it before the member looked up where to start, which
      it does after the assignment begins). The records in between were never given to the group;
    - the counts: records consumed (also per partition, and after the first coordinator kill),
      commits (per partition) acknowledged and refused, assignments, and assignments after the
      first coordinator kill.
    """
    result = {"kafka_consumed": 0, "kafka_commits_acked": 0, "kafka_commits_refused": 0, "kafka_assignments": 0,
              "kafka_assignments_after_coordinator_kill": 0, "kafka_wrong_records": 0, "kafka_out_of_order": 0,
              "kafka_skipped": 0, "kafka_lost_commits": 0, "kafka_commits_moved_back": 0,
              "kafka_started_past_commit": 0, "kafka_consumed_after_coordinator_kill": 0,
              "kafka_consumed_by_partition": {}, "problems": []}
    began: dict[tuple[str, int], float] = {}
    last: dict[tuple[str, int, int], int] = {}
    sent: dict[str, dict] = {}  # member -> its commit waiting for an answer
    commits: list[dict] = []
    firsts: dict[tuple[str, int, int], int] = {}  # (member, assignment, partition) -> first offset consumed
    first_kill = min(coordinator_kills, default=None)
    for event in events:
        kind, member = event["event"], event["member"]
        if kind == "assign":
            began[(member, event["n"])] = event["at"]
            if event["partitions"]:
                result["kafka_assignments"] += 1
                result["kafka_assignments_after_coordinator_kill"] += first_kill is not None and event["at"] > first_kill
        elif kind == "consumed":
            p = event["partition"]
            key = (topic, topic_id, p)
            got, start, acks = logs.get(key, {}), log_starts.get(key, 1), acked.get(key, {})
            result["kafka_consumed"] += len(event["offsets"])
            if first_kill is not None and event.get("at", 0.0) > first_kill:
                result["kafka_consumed_after_coordinator_kill"] += len(event["offsets"])
            if event["offsets"]:
                firsts.setdefault((member, event["n"], p), (event["offsets"][0], event.get("at", 0.0)))
            by_partition = result["kafka_consumed_by_partition"]
            by_partition[p] = by_partition.get(p, 0) + len(event["offsets"])
            for offset, value in zip(event["offsets"], event["values"]):
                raw = value.encode()
                if offset >= start:
                    wrong, expected = got.get(offset) != raw, f"the log has {got.get(offset)!r}"
                elif offset in acks:
                    values = [a.value for a in acks[offset]]
                    wrong, expected = raw not in values, f"below the log start {start}, acknowledged {values}"
                else:
                    fields = value.split(":")
                    wrong = len(fields) != 5 or fields[2] != topic or fields[3] != str(p)
                    expected = f"below the log start {start}, not acknowledged: a value of {topic}[{p}]"
                if wrong:
                    result["kafka_wrong_records"] += 1
                    result["problems"].append(f"Kafka member {member} consumed {value[:60]!r} at {topic}[{p}] offset "
                                              f"{offset}; {expected}")
                previous = last.get((member, event["n"], p))
                if previous is not None and offset <= previous:
                    result["kafka_out_of_order"] += 1
                    result["problems"].append(f"Kafka member {member} consumed {topic}[{p}] offset {offset} after "
                                              f"{previous} in one assignment")
                elif previous is not None and offset > previous + 1 and offset - 1 >= start:
                    result["kafka_skipped"] += offset - 1 - max(previous, start - 1)
                    result["problems"].append(f"Kafka member {member} skipped {topic}[{p}] offsets "
                                              f"{max(previous + 1, start)}..{offset - 1} (log start {start})")
                last[(member, event["n"], p)] = offset
        elif kind == "commit":
            sent[member] = event
        elif kind == "committed" and member in sent:
            commit = sent.pop(member)
            commits.append({**commit, "errors": {int(p): e for p, e in event["errors"].items()}})
            result["kafka_commits_acked"] += sum(e is None for e in event["errors"].values())
            result["kafka_commits_refused"] += sum(e is not None for e in event["errors"].values())
    commits += [{**commit, "errors": None} for commit in sent.values()]  # never answered: maybe written
    for (member, n, p), (first, first_at) in sorted(firsts.items()):
        began_at = began.get((member, n), 0.0)
        # Answered with an error or not: librdkafka sends a commit again after a timeout, and an
        # earlier attempt may have landed before the answer to a later one named an error.
        could = [c["offsets"][str(p)] for c in commits if str(p) in c["offsets"] and c["sent"] < began_at]
        bound = max(could, default=1)
        key = (topic, topic_id, p)
        below = first - 1
        if first <= bound or below < 1:
            continue
        in_log = below >= log_starts.get(key, 1)
        # The member looked its start up (the group's offset, else the log start) after the
        # assignment began and before it consumed its first record: retention may have moved the
        # log start until then, which on a loaded machine is seconds later.
        kept = retention_s is not None and any(
            a.sent_at > max(began_at, first_at) - retention_s + _ROUNDING_MARGIN_S
            for a in acked.get(key, {}).get(below, ()))
        if in_log or kept:
            result["kafka_started_past_commit"] += 1
            result["problems"].append(
                f"Kafka member {member} began assignment {n} of {topic}[{p}] at offset {first}, past {bound} (the "
                f"highest commit sent before it), though offset {below} was still in the log then "
                f"({'it is now' if in_log else 'acknowledged too recently for retention to take it'})")
    partitions = {int(p) for c in commits for p in c["offsets"]}
    for p in sorted(partitions):
        acked_commits = [c for c in commits if c["errors"] is not None and str(p) in c["offsets"]
                         and c["errors"].get(p, "missing") is None]
        if not acked_commits:
            continue
        high = max(c["offsets"][str(p)] for c in acked_commits)
        high_sent = min(c["sent"] for c in acked_commits if c["offsets"][str(p)] == high)
        final = committed.get(p)
        if final is not None and final >= high:
            continue
        newer = [c for c in commits if c["offsets"].get(str(p)) == final
                 and began.get((c["member"], c["n"]), 0.0) > high_sent]
        if newer:
            result["kafka_commits_moved_back"] += 1
            continue
        result["kafka_lost_commits"] += 1
        result["problems"].append(f"Kafka group: {topic}[{p}] committed offset {final} at the end, below {high} "
                                  "acknowledged, and no member committed it in an assignment newer than that commit")
    return result


def finish_interrupted(config: Config, topic: str, partitions: Iterable[int], timeout_s: float) -> tuple[int, int]:
    """Once every actor has stopped, do what the next one would, so that the log is judged at
    rest: per partition, a compactor's recovery step (docs/protocol.md section 6 step 0), which
    materializes and clears a pending append and resumes a ``meta/compaction`` record to
    completion (or deletes it if stale), and starts no new compaction. A compactor killed between
    steps 4 and 5 leaves index entries that overlap, legal until its record is resumed. Waits up
    to ``timeout_s`` for a killed compactor's claim to expire with its session (TimeoutError
    after). Returns the pending appends and compaction records it finished, and of those the
    compaction records."""
    finished = resumed = 0
    with Compactor(config) as compactor:
        for p in partitions:
            until = time.monotonic() + timeout_s
            while True:
                # A deadline already passed: the recovery step, then no compaction.
                done = compactor.compact_partition(topic, p, deadline=time.monotonic())
                if not done.skipped_claimed:
                    break
                if time.monotonic() >= until:
                    raise TimeoutError(f"{topic}[{p}]: meta/compactor-claim still held after {timeout_s:g} s")
                time.sleep(0.2)
            finished += done.recoveries
            resumed += done.resumed_compactions
    return finished, resumed


def check_at_rest(coordination: Coordination, root: str, topic: str, partitions: Iterable[int]) -> list[str]:
    """What breaks the section 8 invariants of a partition at rest (:func:`check_partition`), or
    leaves work unfinished (a pending append, a ``meta/compaction`` record), one line each with
    the partition's compaction record as evidence. A partition with a ``meta/compaction``
    record is not at rest: it is reported as such, and its invariants are not checked."""
    problems = []
    topic_id = topic_records(coordination, root, [topic])[0].topic_id
    for p in partitions:
        keys = PartitionKeys(root, TopicPartition(topic, p), topic_id)
        found = coordination.get(keys.compaction, keys.partition_key)
        record = CompactionRecord.from_json(found.value, found.key) if found is not None else None
        evidence = (f"meta/compaction {record.state} {record.start_offset}..{record.end_offset}" if record
                    else "no meta/compaction record")
        if record is not None:
            problems.append(f"{topic}[{p}]: not at rest, work left unfinished: {evidence}")
            continue
        try:
            snapshot = check_partition(coordination, root, topic, p, topic_id)
        except Exception as e:  # noqa: BLE001 - every failure counts
            problems.append(f"{topic}[{p}] invariants: {type(e).__name__}: {e} ({evidence})")
            continue
        if snapshot.pending is not None:
            problems.append(f"{topic}[{p}]: work left unfinished at rest: {evidence}, pending {snapshot.pending}")
    return problems


def _read_log(reader: LogReader, topic: str, topic_id: str, partitions: Iterable[int], problems: list[str]
              ) -> tuple[dict[Incarnation, dict[int, bytes]], dict[Incarnation, int]]:
    """Per partition of incarnation ``topic_id`` of ``topic``, offset -> value of every record in
    the log from its log start, and the log starts; one problem per partition that does not read
    back (or reads back from another incarnation)."""
    logs, starts = {}, {}
    for p in partitions:
        key = (topic, topic_id, p)
        try:
            start, hw = reader.offsets(topic, p)
            starts[key] = start
            if start > hw:  # nothing readable (a read would be OffsetOutOfRange): new, or all past retention
                logs[key] = {}
                continue
            got = reader.read_batches([ReadRequest(topic, p, start)])[0]
            if got.topic_id != topic_id:
                raise AssertionError(f"read from incarnation {got.topic_id}")
            table = got.table()
            logs[key] = dict(zip(table.column("offset").to_pylist(), table.column("value").to_pylist()))
        except Exception as e:  # noqa: BLE001 - every failure counts
            problems.append(f"{topic}[{p}] of {topic_id} unreadable: {type(e).__name__}: {e}")
    return logs, starts


def final_gc(reader: LogReader, config: Config) -> tuple[list[str], list[str]]:
    """A GC pass with its clock ``G`` plus a margin ahead (every actor has stopped, so no blob is
    about to be referenced): it may delete every unreferenced blob, the run's last ones too, not
    only those older than ``G``. Returns the blobs it deleted, and those of them referenced
    afterwards (must be none)."""
    clock = ShiftedClock(config.gc_grace_ms / 1000 + _FINAL_GC_MARGIN_S)
    report = gc_pass(reader.coordination, reader.objects, config.root_prefix, config.gc_grace_ms, clock=clock)
    referenced = referenced_blobs(reader.coordination, config.root_prefix,
                                  all_partitions(reader.coordination, config.root_prefix))
    return report.deleted_uris, sorted(referenced.intersection(report.deleted_uris))


def _activity_totals(run_dir: Path) -> Counter:
    """From the actors' activity files (:mod:`chaos.actors`): the compactions they completed,
    the retention passes that dropped records, the blobs GC deleted, the topic re-creations, the
    group commits and the replies lost."""
    totals: Counter = Counter()
    for path in (run_dir / "activity").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # cut by a SIGKILL
            totals["lost_responses"] += event.get("lost_response", 0)
            if event.get("end") == "compact":
                totals["compactions_completed"] += event.get("compactions", 0)
                totals["compactions_resumed"] += event.get("resumed", 0)
                totals["retention_passes"] += event.get("retained_records", 0) > 0
            elif event.get("end") == "gc":
                totals["gc_deleted_blobs"] += event.get("deleted", 0)
            elif event.get("end") == "recreate":
                totals["topic_recreations"] += event.get("recreated", 0)
            elif event.get("end") == "consume":
                totals["group_commits"] += event.get("commits", 0)
                if path.name.startswith(f"{_BROKER_CONSUMER}."):
                    totals["group_commits_via_broker"] += event.get("commits", 0)
    return totals


def _acked_by(acks_dir: Path, names: Iterable[str]) -> int:
    """The records acknowledged to the actors named ``names`` (any of their incarnations)."""
    return sum(ack["count"] for ack in read_ack_lines(acks_dir, names).lines)


def admin_deletes(deletes_dir: Path) -> set[tuple[str, str]]:
    """``(topic, topic_id)`` of every incarnation the admin actor set out to delete
    (:func:`chaos.actors.admin` writes it before the delete)."""
    out = set()
    for path in sorted(deletes_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                named = json.loads(line)
            except ValueError:
                continue  # cut by a SIGKILL: that delete had not begun
            out.add((named["topic"], named["topic_id"]))
    return out


def deleted_partitions(coordination: Coordination, root: str, unread: Iterable[Incarnation],
                       deletes: set[tuple[str, str]], problems: list[str]) -> set[Incarnation]:
    """Of the partitions ``unread`` (acknowledged, not in a live incarnation read back), those the
    run deleted: their incarnation is one of ``deletes`` (named by the admin, or finished at the
    end) and their ``meta/control`` is its tombstone (docs/protocol.md section 12.4). A partition of
    a named incarnation that is not a tombstone is a problem (its acknowledgements count as lost)."""
    out = set()
    for topic, topic_id, p in sorted(unread):
        if (topic, topic_id) not in deletes:
            continue
        keys = PartitionKeys(root, TopicPartition(topic, p), topic_id)
        found = coordination.get(keys.control, keys.partition_key)
        control = None if found is None else ControlRecord.from_json(found.value, found.key)
        if control is not None and control.deleted and control.topic_id == topic_id:
            out.add((topic, topic_id, p))
        else:
            problems.append(f"{topic}[{p}] of {topic_id}: deleted by the admin, but its meta/control is "
                            f"{'missing' if control is None else control.log_state}, not its tombstone")
    return out


#: How long after a server restart ended an actor may still exit of it: its client's retries
#: (Oxia requests are retried for 30 s at most) or a session that expired in the outage.
_OUTAGE_AFTERMATH_S = 35


def exits_outside(exits: list[dict], outages: list[tuple[float, float]]) -> int:
    """The exits (:attr:`Run.exits`) that no server restart explains: none began within
    :data:`_OUTAGE_AFTERMATH_S` before it."""
    return sum(not any(began <= e["at"] <= ended + _OUTAGE_AFTERMATH_S for began, ended in outages) for e in exits)


def _at_rest(run: Run, reader: LogReader, topic: str, problems: list[str]) -> str | None:
    """Finish what the actors left of ``topic`` (a delete the admin was killed in; per partition
    a compactor's recovery step) and check its invariants at rest; its live incarnation's id, or
    None when the run ended with it deleted."""
    root = run.config.root_prefix
    found = read_topic(reader.coordination, root, topic)
    if found is not None and found.record.state == DELETING:
        run.deleted_at_rest.add((topic, found.record.topic_id))
        delete_topic(reader.coordination, reader.objects, root, topic, config=run.config)
        found = None
    if found is None:
        return None
    partitions = range(found.record.partitions)
    try:
        recoveries, resumed = finish_interrupted(
            run.config, topic, partitions, run.config.oxia_session_timeout_ms / 1000 + _STOP_S)
        run.counts["final_recoveries"] += recoveries
        run.counts["final_resumed"] += resumed
    except Exception as e:  # noqa: BLE001 - reported
        problems.append(f"finishing what the actors left of {topic}: {type(e).__name__}: {e}")
    problems += check_at_rest(reader.coordination, root, topic, partitions)
    return found.record.topic_id


def _check_grown(run: Run, reader: LogReader, result: dict) -> list[str]:
    """The topic writers created on first use: marked so, and grown to no more partitions than a
    write named (``result["grown_partitions"]``: its count). A write acknowledged in a partition
    past the count reads back as lost."""
    found = read_topic(reader.coordination, run.config.root_prefix, GROWN)
    if found is None:
        return [f"{GROWN}: no topic record, though writers wrote to it"]
    record = found.record
    result["grown_partitions"] = record.partitions
    problems = [] if record.auto_created else [f"{GROWN}: created on first use but not marked so: {record}"]
    if record.partitions > 2 * run.args.partitions:
        problems.append(f"{GROWN}: {record.partitions} partitions, more than any write named "
                        f"({2 * run.args.partitions})")
    return problems


def _verify(run: Run) -> dict:
    """Finish what the actors left unfinished, check the invariants at rest, a last GC pass dated
    ``G`` ahead, then read everything back against the acknowledgements."""
    result = {"invariant_violations": 0, "final_gc": "ok", "final_gc_deleted_blobs": 0, "grown_partitions": 0}
    problems: list[str] = []
    with LogReader(run.config) as reader:
        live = {}
        for topic in (TOPIC, RECREATED, GROWN):
            try:
                topic_id = _at_rest(run, reader, topic, problems)
            except Exception as e:  # noqa: BLE001 - reported
                problems.append(f"{topic} at rest: {type(e).__name__}: {e}")
                continue
            if topic_id is not None:
                live[topic] = topic_id
        problems += _check_grown(run, reader, result)

        def read_all() -> tuple[dict, dict]:
            logs, starts = {}, {}
            for topic, topic_id in live.items():
                partitions = range(topic_records(reader.coordination, run.config.root_prefix, [topic])[0].partitions)
                got, at = _read_log(reader, topic, topic_id, partitions, problems)
                logs.update(got)
                starts.update(at)
            return logs, starts

        before, _ = read_all()
        try:
            deleted, referenced = final_gc(reader, run.config)
        except Exception as e:  # noqa: BLE001 - reported
            result["final_gc"] = f"{type(e).__name__}: {e}"
        else:
            result["final_gc_deleted_blobs"] = len(deleted)
            if referenced:
                problems.append(f"the final GC deleted {len(referenced)} blob(s) still referenced: {referenced[:3]}")
        logs, starts = read_all()
        for key in before.keys() | logs.keys():
            changed = sorted(o for o in before.get(key, {}).keys() | logs.get(key, {}).keys()
                             if before.get(key, {}).get(o) != logs.get(key, {}).get(o))
            if changed:
                problems.append(f"{key}: the final GC changed what {len(changed)} offset(s) read back, first "
                                f"{changed[:5]}")
        try:
            group_offsets = {tp.partition: found.offset for tp, found in committed_offsets(
                reader.coordination, run.config.root_prefix, KAFKA_GROUP,
                [TopicPartition(TOPIC, p) for p in range(run.args.partitions)]).items()}
        except Exception as e:  # noqa: BLE001 - reported
            problems.append(f"the Kafka group's committed offsets: {type(e).__name__}: {e}")
            group_offsets = {}
        acked = read_acks(run.dir / "acks")
        deleted = deleted_partitions(reader.coordination, run.config.root_prefix, acked.keys() - logs.keys(),
                                     admin_deletes(run.dir / "deletes") | run.deleted_at_rest, problems)
        settings = {topic: TopicSettings.of(topic, topic_records(reader.coordination, run.config.root_prefix,
                                                                 [topic])[0], run.config) for topic in live}
    ack_lines = read_ack_lines(run.dir / "acks")
    problems += [f"an acknowledgement line that does not parse: {line}" for line in ack_lines.damaged]
    result["invariant_violations"] = len(problems)
    safe_from = {key: retention_safe_from(run.stopped_at, settings[key[0]], run.config.gc_grace_ms) for key in logs}
    judged = judge_acks(acked, logs, starts, read_reads(run.dir / "reads"), deleted, safe_from)
    totals = _activity_totals(run.dir)
    result.update({what: judged[what] for what in ("lost", "verified", "double_acked", "duplicated",
                                                   "mixed_incarnations", "gone_by_retention",
                                                   "gone_with_deleted_topic")})
    main_settings = settings.get(TOPIC)
    retention_s = None if main_settings is None or main_settings.retention_bytes >= 0 else (
        max(main_settings.retention_ms, run.config.gc_grace_ms) / 1000 if main_settings.retention_ms >= 0
        else float("inf"))
    kafka = judge_kafka_group(read_kafka_group(run.dir / "kafka_group"), TOPIC, live.get(TOPIC, ""), logs, starts,
                              acked, group_offsets, run.coordinator_hits["kill"], retention_s)
    judged["problems"] += kafka.pop("problems")
    result.update(kafka, kafka_group_committed=group_offsets, kafka_coordinator_kills=len(run.coordinator_hits["kill"]),
                  kafka_coordinator_pauses=len(run.coordinator_hits["pause"]))
    records_acked = sum(len(values) for acks in acked.values() for values in acks.values())
    result.update(records_acked=records_acked, acks_cut=len(ack_lines.cut), acks_damaged=len(ack_lines.damaged),
                  verified_fraction=round(judged["verified"] / records_acked, 3) if records_acked else 0.0,
                  incarnations_acked=len({key[1] for key in acked if key[0] == RECREATED}),
                  records_acked_via_broker=_acked_by(run.dir / "acks", _BROKER_PRODUCERS),
                  records_acked_idempotent=_acked_by(run.dir / "acks", _BROKER_PRODUCERS[:1]),
                  records_acked_plain=_acked_by(run.dir / "acks", _BROKER_PRODUCERS[1:]),
                  records_acked_via_kafka=_acked_by(run.dir / "acks", [_KAFKA_PRODUCER]),
                  group_commits_via_broker=totals["group_commits_via_broker"],
                  final_recoveries=run.counts["final_recoveries"],
                  compactions_resumed=totals["compactions_resumed"] + run.counts["final_resumed"],
                  kills={role: run.kills[role] for role in (*ROLES, "broker")},
                  killed_mid_operation={role: run.killed_mid_operation[role] for role in ROLES},
                  exits=len(run.exits), exits_outside_outages=exits_outside(run.exits, run.outages),
                  exit_list=[f"{e['actor']} ({e['status']}): {e['last'][-120:]}" for e in run.exits],
                  server_restarts=run.counts["server_restarts"],
                  **{what: totals[what] for what in _EXERCISED})
    for path in sorted((run.dir / "violations").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            result["invariant_violations"] += 1
            problems.append(f"seen during the run: {line}")
    result["problems"] = problems + judged["problems"]
    return result


#: What the actors' activity files must show the run did (:func:`not_exercised`), by counter.
_EXERCISED = ("compactions_completed", "gc_deleted_blobs", "topic_recreations", "retention_passes", "group_commits",
              "lost_responses")


#: What the Kafka consumer group must have done (:func:`judge_kafka_group`): consumed, had commits
#: acknowledged, had its coordinator killed, got assignments again after that and consumed.
_KAFKA_EXERCISED = ("kafka_consumed", "kafka_commits_acked", "kafka_coordinator_kills",
                    "kafka_assignments_after_coordinator_kill", "kafka_consumed_after_coordinator_kill")
#: The Kafka consumer group's invariants (:func:`judge_kafka_group`): each must be 0.
KAFKA_INVARIANTS = ("kafka_wrong_records", "kafka_out_of_order", "kafka_skipped", "kafka_lost_commits",
                    "kafka_started_past_commit")
#: The share of what it acknowledged that a run must read back and check (``verified_fraction``):
#: retention may take the rest, no more (:func:`topic_settings` keeps enough).
MIN_VERIFIED_FRACTION = 0.5
#: Incarnations of the re-created topic a run must have acknowledged records in: a delete under load.
MIN_INCARNATIONS_ACKED = 2


def not_exercised(result: dict, partitions: int) -> list[str]:
    """What a run (``--partitions``: ``partitions``) must have done for its checks to mean
    something, and did not: records acknowledged, each counter of :data:`_EXERCISED` (by the
    actors' own accounts), the Kafka group's counts, a writer killed mid-operation and a compactor
    killed between compaction steps (its ``meta/compaction`` record left: a pass with nothing to
    compact tests no recovery), a compaction record resumed (``compactions_resumed``, by a
    compactor's step 0 or the end of the run), the broker killed, :data:`MIN_INCARNATIONS_ACKED`."""
    missing = ["nothing acknowledged"] if not result["records_acked"] else []
    missing += [f"{what} is 0" for what in (*_EXERCISED, "records_acked_idempotent", "records_acked_plain",
                                            "records_acked_via_kafka", "group_commits_via_broker", *_KAFKA_EXERCISED,
                                            "compactions_resumed")
                if not result[what]]
    if result["grown_partitions"] <= partitions:
        missing.append(f"{GROWN} did not grow past {partitions} partitions")
    if result["incarnations_acked"] < MIN_INCARNATIONS_ACKED:
        missing.append(f"records acknowledged in {result['incarnations_acked']} incarnation(s) of {RECREATED}, "
                       f"fewer than {MIN_INCARNATIONS_ACKED}")
    if not result["killed_mid_operation"]["writer"]:
        missing.append("no writer killed mid-operation")
    if not result["killed_mid_operation"]["compactor"]:
        missing.append("no compactor killed between compaction steps")
    if not result["kills"]["broker"]:
        missing.append("broker_kills is 0")
    return missing


def out_of_bounds(result: dict, actors: int) -> list[str]:
    """The run's bounds it broke: it checked less than :data:`MIN_VERIFIED_FRACTION` of what it
    acknowledged against the log; an actor exited by itself outside a server restart's aftermath,
    or more than ``actors`` (the run's actors) times ``server_restarts`` exits in all (see
    :func:`exits_outside`)."""
    broken = []
    if result["verified_fraction"] < MIN_VERIFIED_FRACTION:
        broken.append(f"verified_fraction {result['verified_fraction']}: {result['verified']} of "
                      f"{result['records_acked']} acknowledged records read back and checked, fewer than "
                      f"{MIN_VERIFIED_FRACTION:.0%}")
    if result["exits_outside_outages"]:
        broken.append(f"{result['exits_outside_outages']} actor exit(s) with no server restart in the "
                      f"{_OUTAGE_AFTERMATH_S} s before: {result['exit_list']}")
    if result["exits"] > actors * result["server_restarts"]:
        broken.append(f"{result['exits']} actor exits, more than one per actor ({actors}) per server restart "
                      f"({result['server_restarts']})")
    return broken


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    parser.add_argument("--seconds", type=float, default=120, help="how long the chaos lasts (default 120)")
    parser.add_argument("--seed", type=int, default=None, help="replay a run (default: a new seed, printed)")
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--compactors", type=int, default=2)
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--grace-ms", type=int, default=12_000,
                        help="LLOG_GC_GRACE_MS G (default 12000: budget G/4 = 3 s, blobs refused past G/2 = 6 s)")
    parser.add_argument("--lose-replies", type=float, default=0.01,
                        help="the probability that a writer or compactor loses the reply of an Oxia Write the "
                             "server applied (default 0.01)")
    parser.add_argument("--no-server-restarts", action="store_true", help="do not restart Oxia and the S3 server")
    parser.add_argument("--oxia-standalone", action="store_true",
                        help=f"Oxia as one standalone server with {_OXIA_SHARDS} shards (lighter), restarted in place; "
                             "default: a replicated cluster (a coordinator and 3 servers, replication factor 3, "
                             f"{_OXIA_SHARDS} shards), whose restart SIGKILLs the server leading the most shards")
    parser.add_argument("--settings", type=Path, default=None,
                        help="a running stack's settings.json, for its S3 server (default: start a private stack; "
                             "server restarts need a stack this run started). Oxia is always the run's own")
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR",
                        help="copy the run's directory (the actors' logs, acknowledgements, activity, Kafka group "
                             "events) to DIR at the end, for a look at a failure")
    args = parser.parse_args(argv)
    for name in ("writers", "compactors", "readers", "partitions"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    if args.seconds <= 0 or args.grace_ms < 4000:
        parser.error("--seconds must be > 0 and --grace-ms >= 4000")
    if args.settings is not None:
        args.oxia_standalone = True  # another stack's Oxia is not the run's to restart
        args.no_server_restarts = True
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    _progress(f"seed {seed} (replay: python -m chaos --seed {seed} --seconds {args.seconds:g})")
    with tempfile.TemporaryDirectory(prefix="llog-chaos-") as tmp:
        stack_dir, oxia, run = None, None, None
        if args.settings is None:
            stack_dir = Path(tmp) / "stack"
            local_stack.up(stack_dir=stack_dir, ports=network.free_ports(), oxia_cluster=not args.oxia_standalone,
                           oxia_shards=_OXIA_SHARDS)
        try:
            config = Config.load(env={}, settings_path=args.settings or stack_dir / "settings.json").replace(
                root_prefix=f"chaos-{uuid4().hex[:8]}", gc_grace_ms=args.grace_ms, oxia_request_timeout_ms=2000,
                oxia_session_timeout_ms=2000, default_partitions=args.partitions)
            if args.oxia_standalone:  # the stack's standalone has one shard: the run's own has several
                oxia = OxiaServer(Path(tmp) / "oxia", _OXIA_SHARDS)
                config = config.replace(oxia_service_address=oxia.address)
            with Coordination(config) as coordination:  # the actors write to every partition of them
                for topic in (TOPIC, RECREATED):
                    create_topic(coordination, config.root_prefix, topic, args.partitions, settings=topic_settings(args))
            balancer_port, stats_port, *broker_ports = _free_ports(6)
            run = Run(args, config, stack_dir, Path(tmp) / "run", random.Random(seed), oxia=oxia,
                      broker_port=balancer_port, broker_ports={"b0": broker_ports[0], "b1": broker_ports[1]},
                      kafka_ports={"b0": broker_ports[2], "b1": broker_ports[3]})
            (run.dir / "logs").mkdir(parents=True)
            balancer = Balancer(Path(tmp) / "balancer", balancer_port, stats_port, run.broker_ports)
            balancer.start()
            roles = ([("writer", f"w{i}") for i in range(args.writers)]
                     + [("compactor", f"c{i}") for i in range(args.compactors)]
                     + [("reader", f"r{i}") for i in range(args.readers)] + list(_ONE_EACH))
            run.actors = [Actor(role, name) for role, name in roles]
            for actor in run.actors:
                run.start(actor)
            _wait_for_broker(run)
            started = time.monotonic()
            try:
                _disturb(run)
            finally:
                run.stop_all()
                run.stopped_at = time.time()
                run.counts.update({f"balancer_requests_{name}": n for name, n in balancer.requests().items()})
                balancer.stop()
            seconds = round(time.monotonic() - started, 1)
            _progress(f"chaos over after {seconds} s; checking")
            result = _verify(run)
            appends = len({(a["name"], a["seq"]) for a in read_ack_lines(run.dir / "acks").lines})
            missing = not_exercised(result, args.partitions)
            broken = out_of_bounds(result, len(run.actors))
            ok = result["lost"] == result["duplicated"] == result["double_acked"] == result["mixed_incarnations"] \
                == result["invariant_violations"] == 0 and result["final_gc"] == "ok" and not missing \
                and not broken and not any(result[what] for what in KAFKA_INVARIANTS)
            if not ok:
                for problem in missing + broken + result["problems"][:20]:
                    _progress(problem)
                for path in sorted((run.dir / "logs").glob("*.log")):
                    tail = path.read_text(errors="replace").splitlines()[-15:]
                    _progress(f"--- {path.name}\n" + "\n".join(tail))
            if args.keep is not None:
                shutil.copytree(run.dir, args.keep, dirs_exist_ok=True)
            print(json.dumps({
                "chaos": "ok" if ok else "failed", "seed": seed, "seconds": seconds, "appends_acked": appends,
                "records_acked": result["records_acked"], "compactions_completed": result["compactions_completed"],
                "gc_deleted_blobs": result["gc_deleted_blobs"], "topic_recreations": result["topic_recreations"],
                "incarnations_acked": result["incarnations_acked"], "grown_partitions": result["grown_partitions"],
                "retention_passes": result["retention_passes"],
                "group_commits": result["group_commits"], "group_commits_via_broker": result["group_commits_via_broker"],
                "records_acked_via_broker": result["records_acked_via_broker"],
                "records_acked_idempotent": result["records_acked_idempotent"],
                "records_acked_plain": result["records_acked_plain"],
                "records_acked_via_kafka": result["records_acked_via_kafka"], "brokers": len(run.broker_ports),
                "balancer_requests": {name: run.counts[f"balancer_requests_{name}"] for name in run.broker_ports},
                "broker_kills": run.kills["broker"],
                "lost_responses": result["lost_responses"], "pauses": run.counts["pauses"],
                "kills": result["kills"], "killed_mid_operation": result["killed_mid_operation"],
                "compactions_resumed": result["compactions_resumed"],
                "exits": result["exits"], "exits_outside_outages": result["exits_outside_outages"],
                "exit_list": result["exit_list"], "server_restarts": result["server_restarts"],
                "oxia_shards": _OXIA_SHARDS, "oxia": "standalone" if args.oxia_standalone else "cluster",
                "oxia_server_kills": run.counts["oxia_server_kills"], "lost": result["lost"], "duplicated": result["duplicated"],
                "double_acked": result["double_acked"], "mixed_incarnations": result["mixed_incarnations"],
                "verified": result["verified"], "verified_fraction": result["verified_fraction"],
                "acks_cut": result["acks_cut"], "gone_by_retention": result["gone_by_retention"],
                "gone_with_deleted_topic": result["gone_with_deleted_topic"],
                "invariant_violations": result["invariant_violations"], "final_recoveries": result["final_recoveries"],
                "final_gc": result["final_gc"], "final_gc_deleted_blobs": result["final_gc_deleted_blobs"],
                **{what: result[what] for what in (
                    "kafka_consumed", "kafka_commits_acked", "kafka_commits_refused", "kafka_assignments",
                    "kafka_assignments_after_coordinator_kill", "kafka_coordinator_kills", "kafka_coordinator_pauses",
                    "kafka_commits_moved_back", "kafka_consumed_after_coordinator_kill", *KAFKA_INVARIANTS,
                    "kafka_consumed_by_partition",
                    "kafka_group_committed")},
                "not_exercised": missing, "out_of_bounds": broken,
            }), flush=True)
            return 0 if ok else 1
        finally:
            if run is not None and run.coordination is not None:
                run.coordination.close()
            if oxia is not None:
                oxia.stop()
            if stack_dir is not None:
                local_stack.down(stack_dir, purge=True)
