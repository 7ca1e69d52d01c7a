"""The chaos controller (see :mod:`chaos`): start the actors, disturb them from a seed, then check."""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from uuid import uuid4

from chaos.actors import ROLES, record_value
from llog import local_stack
from llog.clock import ShiftedClock
from llog.compactor import Compactor
from llog.config import Config
from llog.coordination import Coordination
from llog.discovery import topic_records
from llog.gc import all_partitions, gc_pass, referenced_blobs
from llog.keys import PartitionKeys, TopicPartition
from llog.reader import LogReader
from llog.records import CompactionRecord
from llog.topics import create_topic
from tests.helpers.invariants import check_partition

REPO = Path(__file__).resolve().parents[1]
TOPIC = "chaos"
#: How long actors get to stop after SIGTERM, and the bound on every other wait here.
_STOP_S = 10
#: How long a kill waits for its actor to be mid-operation (its activity file shows a ``begin``
#: last) before it kills the actor anyway: a kill between operations tests little.
_AIM_S = 2
#: The roles a run must have killed mid-operation (:func:`not_exercised`); the first kills go to them.
_MUST_KILL = ("writer", "compactor")
#: How far past the grace period ``G`` the final GC's clock runs ahead of the real one.
_FINAL_GC_MARGIN_S = 30


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

    def activity(self, actor: Actor) -> Path:
        return self.dir / "activity" / f"{actor.label}.jsonl"

    def env(self) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LLOG_SETTINGS_FILE": "/nonexistent",
                "PYTHONPATH": str(REPO), **self.config.to_options()}

    def start(self, actor: Actor) -> None:
        actor.incarnation += 1
        log = open(self.dir / "logs" / f"{actor.label}.log", "ab")
        actor.proc = subprocess.Popen(
            [sys.executable, "-m", "chaos.actors", actor.role, "--dir", str(self.dir), "--name", actor.label,
             "--topic", TOPIC, "--partitions", str(self.args.partitions), "--seed", str(self.rng.randrange(2**32))],
            cwd=REPO, env=self.env(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        log.close()
        actor.paused_until = None

    def pause(self, actor: Actor, seconds: float) -> None:
        actor.proc.send_signal(signal.SIGSTOP)
        actor.paused_until = time.monotonic() + seconds
        self.counts["pauses"] += 1

    def resume_due(self, everyone: bool = False) -> None:
        for actor in self.actors:
            if actor.paused_until is not None and (everyone or time.monotonic() >= actor.paused_until):
                actor.proc.send_signal(signal.SIGCONT)
                actor.paused_until = None

    def kill_and_restart(self, actor: Actor) -> None:
        actor.proc.kill()
        actor.proc.wait(_STOP_S)
        if actor.proc.returncode == -signal.SIGKILL:
            self.kills[actor.role] += 1
            self.killed_mid_operation[actor.role] += _mid_operation(self.activity(actor))
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


def _progress(message: str) -> None:
    print(f"chaos: {message}", file=sys.stderr, flush=True)


def _mid_operation(activity: Path) -> bool:
    """Whether the last line of an actor's activity file (:mod:`chaos.actors`) begins an
    operation that has not ended."""
    try:
        with open(activity, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            tail = f.read().splitlines()
    except FileNotFoundError:
        return False
    for line in reversed(tail):
        try:
            return "begin" in json.loads(line)
        except ValueError:
            continue  # cut by the SIGKILL, or by the seek
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
    while time.monotonic() < began + args.seconds:
        time.sleep(0.05)
        run.resume_due()
        now = time.monotonic()
        for service, at in list(restarts.items()):
            if now >= at:
                _progress(f"restarting {service}")
                local_stack.restart_service(run.stack_dir, service)
                run.counts["server_restarts"] += 1
                del restarts[service]
        for actor in run.actors:
            if actor.proc.poll() is not None and actor.paused_until is None:
                last = (run.dir / "logs" / f"{actor.label}.log").read_text(errors="replace").strip().splitlines()[-1:]
                _progress(f"{actor.label} exited by itself ({actor.proc.returncode}: {' '.join(last)[-300:]}); "
                          "starting it again")
                run.counts["exits"] += 1
                run.start(actor)
        if aim is not None:
            actor, until = aim
            busy = _mid_operation(run.activity(actor))
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
            needed = [a for a in run.actors if a.paused_until is None and a.role in _MUST_KILL
                      and not run.killed_mid_operation[a.role]]
            aim = (rng.choice(needed) if needed else actor, now + _AIM_S)


def read_acks(acks_dir: Path, partitions: int) -> dict[int, dict[int, list[bytes]]]:
    """Per partition, offset -> the value of every acknowledgement of that offset, in the writers'
    ack files (:mod:`chaos.actors`). More than one means the offset was acknowledged to two
    appends: each one is kept, so that the check sees it."""
    out: dict[int, dict[int, list[bytes]]] = {p: {} for p in range(partitions)}
    for path in sorted(acks_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            ack = json.loads(line)
            for i in range(ack["count"]):
                out[ack["partition"]].setdefault(ack["start"] + i, []).append(
                    record_value(ack["name"], ack["seq"], ack["partition"], i))
    return out


def judge_acks(acked: dict[int, dict[int, list[bytes]]], log: dict[int, dict[int, bytes]]) -> dict:
    """``lost`` (acknowledgements whose record is not at its offset with its bytes),
    ``double_acked`` (offsets acknowledged more than once), ``duplicated`` (values in the log
    more than once) and what they were, for acknowledgements ``acked`` and the log read back."""
    result = {"lost": 0, "double_acked": 0, "duplicated": 0, "problems": []}
    seen: Counter[bytes] = Counter()
    for p, acks in acked.items():
        got = log.get(p, {})
        seen.update(got.values())
        wrong = [o for o, values in acks.items() for v in values if got.get(o) != v]
        twice = sorted(o for o, values in acks.items() if len(values) > 1)
        result["lost"] += len(wrong)
        result["double_acked"] += len(twice)
        if wrong:
            result["problems"].append(f"{TOPIC}[{p}]: {len(wrong)} acknowledged record(s) lost or wrong, "
                                      f"first at offsets {sorted(wrong)[:5]}")
        if twice:
            result["problems"].append(f"{TOPIC}[{p}]: {len(twice)} offset(s) acknowledged more than once, first "
                                      f"{twice[0]} to {[v.decode() for v in acks[twice[0]]]}")
    result["duplicated"] = sum(n - 1 for n in seen.values() if n > 1)
    return result


def finish_interrupted(config: Config, topic: str, partitions: Iterable[int], timeout_s: float) -> int:
    """Once every actor has stopped, do what the next one would, so that the log is judged at
    rest: per partition, a compactor's recovery step (docs/protocol.md section 6 step 0), which
    materializes and clears a pending append and resumes a ``meta/compaction`` record to
    completion (or deletes it if stale), and starts no new compaction. A compactor killed between
    steps 4 and 5 leaves index entries that overlap, legal until its record is resumed. Waits up
    to ``timeout_s`` for a killed compactor's claim to expire with its session (TimeoutError
    after). Returns the pending appends and compaction records it finished."""
    finished = 0
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
    return finished


def check_at_rest(coordination: Coordination, root: str, topic: str, partitions: Iterable[int]) -> list[str]:
    """What breaks the section 8 invariants of a partition at rest (:func:`check_partition`), or
    leaves work unfinished (a pending append, a ``meta/compaction`` record), one line each with
    the partition's compaction record as evidence."""
    problems = []
    topic_id = topic_records(coordination, root, [topic])[0].topic_id
    for p in partitions:
        keys = PartitionKeys(root, TopicPartition(topic, p), topic_id)
        found = coordination.get(keys.compaction, keys.partition_key)
        record = CompactionRecord.from_json(found.value, found.key) if found is not None else None
        evidence = (f"meta/compaction {record.state} {record.start_offset}..{record.end_offset}" if record
                    else "no meta/compaction record")
        try:
            snapshot = check_partition(coordination, root, topic, p, topic_id)
        except Exception as e:  # noqa: BLE001 - every failure counts
            problems.append(f"{topic}[{p}] invariants: {type(e).__name__}: {e} ({evidence})")
            continue
        if record is not None or snapshot.pending is not None:
            problems.append(f"{topic}[{p}]: work left unfinished at rest: {evidence}, pending {snapshot.pending}")
    return problems


def _read_log(reader: LogReader, partitions: Iterable[int], problems: list[str]) -> dict[int, dict[int, bytes]]:
    """Per partition, offset -> value of every record in the log; one problem per partition
    that does not read back."""
    log = {}
    for p in partitions:
        try:
            log[p] = {r.offset: r.value for r in reader.read_range(TOPIC, p, 1)}
        except Exception as e:  # noqa: BLE001 - every failure counts
            problems.append(f"{TOPIC}[{p}] unreadable: {type(e).__name__}: {e}")
    return log


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
    """From the actors' ``end`` lines (:mod:`chaos.actors`): the compactions they completed and
    the blobs GC deleted."""
    totals: Counter = Counter()
    for path in (run_dir / "activity").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # cut by a SIGKILL
            if event.get("end") == "compact":
                totals["compactions_completed"] += event.get("compactions", 0)
            elif event.get("end") == "gc":
                totals["gc_deleted_blobs"] += event.get("deleted", 0)
    return totals


def _verify(run: Run) -> dict:
    """Finish what the actors left unfinished, check the invariants at rest, a last GC pass dated
    ``G`` ahead, then read everything back against the acknowledgements."""
    result = {"invariant_violations": 0, "final_gc": "ok", "final_recoveries": 0, "final_gc_deleted_blobs": 0}
    problems: list[str] = []
    partitions = range(run.args.partitions)
    try:
        result["final_recoveries"] = finish_interrupted(
            run.config, TOPIC, partitions, run.config.oxia_session_timeout_ms / 1000 + _STOP_S)
    except Exception as e:  # noqa: BLE001 - reported
        problems.append(f"finishing what the actors left: {type(e).__name__}: {e}")
    with LogReader(run.config) as reader:
        problems += check_at_rest(reader.coordination, run.config.root_prefix, TOPIC, partitions)
        before = _read_log(reader, partitions, problems)
        try:
            deleted, referenced = final_gc(reader, run.config)
        except Exception as e:  # noqa: BLE001 - reported
            result["final_gc"] = f"{type(e).__name__}: {e}"
        else:
            result["final_gc_deleted_blobs"] = len(deleted)
            if referenced:
                problems.append(f"the final GC deleted {len(referenced)} blob(s) still referenced: {referenced[:3]}")
        log = _read_log(reader, partitions, problems)
        for p in partitions:
            changed = sorted(o for o in before.get(p, {}).keys() | log.get(p, {}).keys()
                             if before.get(p, {}).get(o) != log.get(p, {}).get(o))
            if changed:
                problems.append(f"{TOPIC}[{p}]: the final GC changed what {len(changed)} offset(s) read back, first "
                                f"{changed[:5]}")
    result["invariant_violations"] = len(problems)
    acked = read_acks(run.dir / "acks", run.args.partitions)
    judged = judge_acks(acked, log)
    totals = _activity_totals(run.dir)
    result.update(lost=judged["lost"], double_acked=judged["double_acked"], duplicated=judged["duplicated"],
                  records_acked=sum(len(values) for acks in acked.values() for values in acks.values()),
                  compactions_completed=totals["compactions_completed"], gc_deleted_blobs=totals["gc_deleted_blobs"])
    for path in sorted((run.dir / "violations").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            result["invariant_violations"] += 1
            problems.append(f"seen during the run: {line}")
    result["problems"] = problems + judged["problems"]
    return result


def not_exercised(run: Run, result: dict) -> list[str]:
    """What a run must have done for its checks to mean something, and did not: records
    acknowledged, compactions completed, blobs deleted by GC (by the actors' own accounts), a
    writer and a compactor killed mid-operation."""
    missing = [what for what, done in (("nothing acknowledged", result["records_acked"]),
                                       ("no compaction completed", result["compactions_completed"]),
                                       ("GC deleted nothing", result["gc_deleted_blobs"])) if not done]
    missing += [f"no {role} killed mid-operation" for role in _MUST_KILL if not run.killed_mid_operation[role]]
    return missing


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
    parser.add_argument("--no-server-restarts", action="store_true", help="do not restart Oxia and the S3 server")
    parser.add_argument("--settings", type=Path, default=None,
                        help="a running stack's settings.json (default: start a private stack; server restarts "
                             "need a stack this run started)")
    args = parser.parse_args(argv)
    for name in ("writers", "compactors", "readers", "partitions"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    if args.seconds <= 0 or args.grace_ms < 4000:
        parser.error("--seconds must be > 0 and --grace-ms >= 4000")
    if args.settings is not None:
        args.no_server_restarts = True
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    _progress(f"seed {seed} (replay: python -m chaos --seed {seed} --seconds {args.seconds:g})")
    with tempfile.TemporaryDirectory(prefix="llog-chaos-") as tmp:
        stack_dir = None
        if args.settings is None:
            stack_dir = Path(tmp) / "stack"
            local_stack.up(stack_dir=stack_dir, ports=local_stack.free_ports())
        try:
            config = Config.load(env={}, settings_path=args.settings or stack_dir / "settings.json").replace(
                root_prefix=f"chaos-{uuid4().hex[:8]}", gc_grace_ms=args.grace_ms, oxia_request_timeout_ms=2000,
                oxia_session_timeout_ms=2000)
            with Coordination(config) as coordination:  # the actors write to every partition of it
                create_topic(coordination, config.root_prefix, TOPIC, args.partitions)
            run = Run(args, config, stack_dir, Path(tmp) / "run", random.Random(seed))
            (run.dir / "logs").mkdir(parents=True)
            roles = ([("writer", f"w{i}") for i in range(args.writers)]
                     + [("compactor", f"c{i}") for i in range(args.compactors)]
                     + [("gc", "gc")] + [("reader", f"r{i}") for i in range(args.readers)])
            run.actors = [Actor(role, name) for role, name in roles]
            for actor in run.actors:
                run.start(actor)
            started = time.monotonic()
            try:
                _disturb(run)
            finally:
                run.stop_all()
            seconds = round(time.monotonic() - started, 1)
            _progress(f"chaos over after {seconds} s; checking")
            result = _verify(run)
            appends = sum(len({(a["name"], a["seq"]) for a in map(json.loads, p.read_text().splitlines())})
                          for p in (run.dir / "acks").glob("*.jsonl"))
            missing = not_exercised(run, result)
            ok = result["lost"] == result["duplicated"] == result["double_acked"] \
                == result["invariant_violations"] == 0 and result["final_gc"] == "ok" and not missing
            if not ok:
                for problem in missing + result["problems"][:20]:
                    _progress(problem)
                for path in sorted((run.dir / "logs").glob("*.log")):
                    tail = path.read_text(errors="replace").splitlines()[-15:]
                    _progress(f"--- {path.name}\n" + "\n".join(tail))
            print(json.dumps({
                "chaos": "ok" if ok else "failed", "seed": seed, "seconds": seconds, "appends_acked": appends,
                "records_acked": result["records_acked"], "compactions_completed": result["compactions_completed"],
                "gc_deleted_blobs": result["gc_deleted_blobs"], "pauses": run.counts["pauses"],
                "kills": {role: run.kills[role] for role in ROLES},
                "killed_mid_operation": {role: run.killed_mid_operation[role] for role in ROLES},
                "exits": run.counts["exits"], "server_restarts": run.counts["server_restarts"],
                "lost": result["lost"], "duplicated": result["duplicated"], "double_acked": result["double_acked"],
                "invariant_violations": result["invariant_violations"], "final_recoveries": result["final_recoveries"],
                "final_gc": result["final_gc"], "final_gc_deleted_blobs": result["final_gc_deleted_blobs"],
                "not_exercised": missing,
            }), flush=True)
            return 0 if ok else 1
        finally:
            if stack_dir is not None:
                local_stack.down(stack_dir, purge=True)
