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
from dataclasses import dataclass, field
from pathlib import Path
from uuid import uuid4

from chaos.actors import record_value
from llog import local_stack
from llog.config import Config
from llog.coordination import Coordination
from llog.gc import gc_pass
from llog.reader import LogReader
from llog.topics import create_topic
from llog.writer import AppendGroup, LogWriter
from tests.helpers.invariants import check_partition

REPO = Path(__file__).resolve().parents[1]
TOPIC = "chaos"
#: How long actors get to stop after SIGTERM, and the bound on every other wait here.
_STOP_S = 10


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
        self.counts["kills"] += 1
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
        if now < next_event:
            continue
        next_event = now + rng.uniform(0.3, 1.5)
        actor = rng.choice([a for a in run.actors if a.paused_until is None])
        if rng.random() < 0.7:
            pause = rng.uniform(0.1, longest_pause)
            _progress(f"pausing {actor.label} for {pause:.1f} s")
            run.pause(actor, pause)
        else:
            _progress(f"killing {actor.label}")
            run.kill_and_restart(actor)


def _acked(run: Run) -> dict[int, dict[int, bytes]]:
    """Per partition, offset -> value of every acknowledged record."""
    out: dict[int, dict[int, bytes]] = {p: {} for p in range(run.args.partitions)}
    for path in sorted((run.dir / "acks").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            ack = json.loads(line)
            for i in range(ack["count"]):
                out[ack["partition"]][ack["start"] + i] = record_value(ack["name"], ack["seq"], ack["partition"], i)
    return out


def _verify(run: Run) -> dict:
    """Finish what killed writers left pending, a last GC pass, then read everything back."""
    result = {"lost": 0, "duplicated": 0, "invariant_violations": 0, "final_gc": "ok", "problems": []}
    partitions = range(run.args.partitions)
    with LogWriter(run.config, auto_initialize=True) as writer:
        writer.append_shared([AppendGroup(TOPIC, p, [record_value("final", 0, p, 0)]) for p in partitions])
    with LogReader(run.config) as reader:
        try:
            gc_pass(reader.coordination, reader.objects, run.config.root_prefix, run.config.gc_grace_ms)
        except Exception as e:  # noqa: BLE001 - reported
            result["final_gc"] = f"{type(e).__name__}: {e}"
        acked = _acked(run)
        seen: Counter[bytes] = Counter()
        for p in partitions:
            try:
                check_partition(reader.coordination, run.config.root_prefix, TOPIC, p)
            except (AssertionError, Exception) as e:  # noqa: BLE001 - every failure counts
                result["invariant_violations"] += 1
                result["problems"].append(f"{TOPIC}[{p}] invariants: {e}")
            try:
                log = {r.offset: r.value for r in reader.read_range(TOPIC, p, 1)}
            except Exception as e:  # noqa: BLE001 - every failure counts
                result["invariant_violations"] += 1
                result["problems"].append(f"{TOPIC}[{p}] unreadable: {type(e).__name__}: {e}")
                log = {}
            seen.update(log.values())
            wrong = [o for o, v in acked[p].items() if log.get(o) != v]
            result["lost"] += len(wrong)
            if wrong:
                result["problems"].append(f"{TOPIC}[{p}]: {len(wrong)} acknowledged record(s) lost or wrong, "
                                          f"first at offsets {sorted(wrong)[:5]}")
        result["duplicated"] = sum(n - 1 for n in seen.values() if n > 1)
        result["records_acked"] = sum(len(a) for a in acked.values())
    for path in sorted((run.dir / "violations").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            result["invariant_violations"] += 1
            result["problems"].append(f"seen during the run: {line}")
    return result


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
            ok = result["lost"] == result["duplicated"] == result["invariant_violations"] == 0 \
                and result["final_gc"] == "ok"
            if not ok:
                for problem in result["problems"][:20]:
                    _progress(problem)
                for path in sorted((run.dir / "logs").glob("*.log")):
                    tail = path.read_text(errors="replace").splitlines()[-15:]
                    _progress(f"--- {path.name}\n" + "\n".join(tail))
            print(json.dumps({
                "chaos": "ok" if ok else "failed", "seed": seed, "seconds": seconds, "appends_acked": appends,
                "records_acked": result["records_acked"], "pauses": run.counts["pauses"],
                "kills": run.counts["kills"], "exits": run.counts["exits"],
                "server_restarts": run.counts["server_restarts"], "lost": result["lost"],
                "duplicated": result["duplicated"], "invariant_violations": result["invariant_violations"],
                "final_gc": result["final_gc"],
            }), flush=True)
            return 0 if ok else 1
        finally:
            if stack_dir is not None:
                local_stack.down(stack_dir, purge=True)
