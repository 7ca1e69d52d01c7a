"""Where a command's CPU goes, by the kind of process that spent it and the test that started it:
``python -m tests.cpu_census [--every S] [--processes FILE] -- make test``.

While the command runs, every process on the machine is read twice a second (psutil): its CPU
time since the census began, what it is (:func:`kind`, from its command line) and the test that
started it (``PYTEST_CURRENT_TEST`` in its environment, which pytest sets while a test runs and
the processes a test starts inherit). At the end, one JSON line on stdout: the wall time, the
machine's CPU-seconds (every core, from ``/proc/stat``), the CPU-seconds of the processes seen,
and those by kind and by test module (the processes no test started under ``""``: the pytest
workers themselves, the servers of the session). A process that lives less than a sample's
interval may be missed; the machine's total counts it.

It answers "what would make ``make test`` faster" with numbers (docs/development.md), as
``--durations`` cannot: a test's duration on a loaded machine says little of its CPU.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import defaultdict

import psutil

#: (what the command line holds, the kind), first match wins; java is matched on its main class.
_JAVA_KINDS = (("org.apache.spark.launcher.Main", "spark launcher JVM"),
               ("CoarseGrainedExecutorBackend", "spark executor JVM"),
               ("org.apache.spark.deploy.SparkSubmit", "spark driver JVM"),
               ("org.apache.spark.deploy", "spark master/worker JVM"),
               ("kafka", "kafka JVM"))
_PYTHON_KINDS = (("pyspark.daemon", "spark python worker"),
                 ("pyspark.sql.worker", "spark python planner"),
                 ("pyspark.sql.streaming", "spark python planner"),
                 ("import sys;exec(eval(sys.stdin.readline()))", "pytest worker"),
                 ("-m broker_lite", "broker"),
                 ("-m pytest", "pytest"))


#: Programs that may exec another (spark-class's bash becomes the JVM): what they are is read again
#: at every sample; any other process's once.
_SHELLS = ("sh", "bash", "dash", "env")


def kind(cmdline: list[str]) -> str:
    """What a process is, from its command line."""
    if not cmdline:
        return "other"
    program, line = cmdline[0].rsplit("/", 1)[-1], " ".join(cmdline)
    if program == "java":
        return next((k for needle, k in _JAVA_KINDS if needle in line), "other JVM")
    if program.startswith("python"):
        return next((k for needle, k in _PYTHON_KINDS if needle in line), "python (other)")
    if program in ("oxia", "versitygw", "haproxy", "prometheus", "chromium"):
        return program
    return "other"


def module_of(test: str) -> str:
    """``tests/x.py`` of a ``PYTEST_CURRENT_TEST`` value (``tests/x.py::name (call)``)."""
    return test.split("::", 1)[0]


def _machine_cpu_s() -> float:
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0) + getattr(t, "steal", 0)


def census(command: list[str], every_s: float = 0.5) -> tuple[int, dict, list[dict]]:
    """Run ``command``; its exit status, the summary and one row per process seen."""
    seen: dict[tuple[int, float], dict] = {}
    began, machine_began = time.monotonic(), _machine_cpu_s()
    proc = subprocess.Popen(command)
    first = True
    while True:
        done = proc.poll() is not None
        for p in psutil.process_iter():
            try:
                with p.oneshot():
                    key = (p.pid, p.create_time())
                    times = p.cpu_times()
                    cpu = times.user + times.system
                    row = seen.get(key)
                    if row is None:
                        row = seen[key] = {"pid": p.pid, "kind": "", "test": "", "base": cpu if first else 0.0}
                    if not row["kind"] or row.pop("shell", False):  # new, or a shell that may exec since
                        cmdline = p.cmdline()
                        row["kind"] = kind(cmdline)
                        row["shell"] = bool(cmdline) and cmdline[0].rsplit("/", 1)[-1] in _SHELLS
                        row["test"] = p.environ().get("PYTEST_CURRENT_TEST", "")
                    row["cpu"] = cpu - row["base"]
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        first = False
        if done:
            break
        time.sleep(every_s)
    rows = [{k: v for k, v in r.items() if k != "shell"} for r in seen.values() if r.get("cpu", 0) > 0]
    by_kind: dict[str, float] = defaultdict(float)
    by_module: dict[str, float] = defaultdict(float)
    for r in rows:
        by_kind[r["kind"]] += r["cpu"]
        by_module[module_of(r["test"])] += r["cpu"]
    summary = {"command": command, "pid": proc.pid, "status": proc.returncode, "wall_s": round(time.monotonic() - began, 1),
               "machine_cpu_s": round(_machine_cpu_s() - machine_began, 1),
               "processes_cpu_s": round(sum(r["cpu"] for r in rows), 1), "processes": len(rows),
               "by_kind": {k: round(v, 1) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
               "by_module": {k: round(v, 1) for k, v in sorted(by_module.items(), key=lambda kv: -kv[1])[:40]}}
    return proc.returncode, summary, rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cpu_census", description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=float, default=0.5, help="seconds between samples (default 0.5)")
    parser.add_argument("--processes", help="also write every process's row (JSON) to this file")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --, e.g. -- make test")
    status, summary, rows = census(command, args.every)
    if args.processes:
        with open(args.processes, "w") as f:
            json.dump(rows, f)
    print(json.dumps(summary), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
