"""JSON lines on stdout: one per measurement, a summary per case; and what every case uses
(timing, sizes from the environment, random record values). Timing shows a progress bar over its
rounds on stderr while that is a terminal (:mod:`llog_tools.progress`); the bar moves between calls,
outside the timed spans."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa

from llog.config import Config
from llog.coordination import Coordination
from llog.describe import describe_topic
from llog_tools import progress as llog_progress


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def timed(fn: Callable[[], object], rounds: int, warmup: int = 1, name: str = "calls") -> list[float]:
    """Seconds per call of ``fn`` over ``rounds`` calls, after ``warmup`` untimed calls
    (``name``: what the progress bar says is timed)."""
    with llog_progress.task(f"timing {name}", total=warmup + rounds, unit="rounds") as advance:
        for _ in range(warmup):
            fn()
            advance()
        out = []
        for _ in range(rounds):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
            advance()
    return out


def timed_together(fns: dict[str, Callable[[], object]], rounds: int, warmup: int = 1) -> dict[str, list[float]]:
    """Like :func:`timed` for several cases, their calls taken in turn (a, b, a, b, ...), so a
    machine that speeds up or slows down during the run moves every case alike."""
    with llog_progress.task(f"timing {' vs '.join(fns)}", total=warmup + rounds, unit="rounds") as advance:
        for _ in range(warmup):
            for fn in fns.values():
                fn()
            advance()
        out: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(rounds):
            for name, fn in fns.items():
                start = time.perf_counter()
                fn()
                out[name].append(time.perf_counter() - start)
            advance()
    return out


def mb_s(nbytes: int, seconds: list[float]) -> float:
    """Throughput at the median call time (robust to one slow round on a shared machine)."""
    return nbytes / statistics.median(seconds) / 1e6


def progress(message: str) -> None:
    """A line on stderr (above the progress bars while they show)."""
    print(f"bench: {message}", file=sys.stderr, flush=True)


def env_int(name: str, default: int, minimum: int = 1) -> int:
    """A size from the environment variable ``name`` (a quick run shrinks a case), at least
    ``minimum``."""
    value = int(os.environ.get(name, default))
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def random_values(rows: int, size: int, seed: int) -> pa.BinaryArray:
    """``rows`` random ``size``-byte values as an Arrow binary array (what the Spark sink hands
    over), built without a per-record loop."""
    data = np.random.default_rng(seed).integers(0, 256, size * rows, dtype=np.uint8)
    offsets = np.arange(0, size * (rows + 1), size, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), rows, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


class CpuMeter:
    """CPU seconds used between :meth:`start` and :meth:`stop` by the whole machine and by the
    process listening with ``marker`` in its command line (say the local S3 server), from
    ``/proc``. Shows how much of a run's CPU went to a server sharing the machine; readings
    are None where ``/proc`` or the process is missing."""

    def __init__(self, marker: str):
        self.pid = next((pid for pid, argv in _processes() if marker in argv), None)
        self.machine_s: float | None = None
        self.process_s: float | None = None

    def start(self) -> "CpuMeter":
        self._begin = (_machine_cpu_s(), _process_cpu_s(self.pid))
        return self

    def stop(self) -> "CpuMeter":
        end = (_machine_cpu_s(), _process_cpu_s(self.pid))
        self.machine_s, self.process_s = (None if a is None or b is None else b - a
                                          for a, b in zip(self._begin, end))
        return self


class SparkCpuMeter:
    """CPU seconds between :meth:`start` and :meth:`stop` of the Spark JVM ``jvm_pid`` itself and
    of the Python processes it starts (the stream planners, the worker daemon and its workers),
    from ``/proc``: what the processes running at the end spent since the start (all of it for
    those started since), and what the processes that ended since spent after the start (their
    parent collects their time when it reaps them). Approximate: a process that leaves the tree
    without a parent in it collecting its time (re-parented when its parent ended first) takes
    what it had spent before the start away from the reading, which can then be low, even below
    zero. Readings are None where ``/proc`` is missing."""

    def __init__(self, jvm_pid: int):
        self.pid = jvm_pid
        self.jvm_s: float | None = None
        self.python_s: float | None = None

    def _read(self) -> dict[int, tuple[float, float]] | None:
        """CPU seconds of the JVM and each of its descendants, and of their children that ended."""
        stats = _process_stats()
        if self.pid not in stats:
            return None
        children: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in stats.items():
            children.setdefault(ppid, []).append(pid)
        tree, todo = {}, [self.pid]
        while todo:
            pid = todo.pop()
            tree[pid] = stats[pid][1:]
            todo += children.get(pid, [])
        return tree

    def start(self) -> "SparkCpuMeter":
        self._begin = self._read()
        return self

    def stop(self) -> "SparkCpuMeter":
        begin, end = self._begin, self._read()
        if begin is None or end is None:
            return self
        self.jvm_s = end[self.pid][0] - begin[self.pid][0]
        ran = sum(own - begin.get(pid, (0.0, 0.0))[0] for pid, (own, _) in end.items() if pid != self.pid)
        reaped = sum(ended - begin[pid][1] for pid, (_, ended) in end.items() if pid in begin)
        before = sum(own for pid, (own, _) in begin.items() if pid not in end)  # in ``reaped`` whole
        self.python_s = ran + reaped - before
        return self


def _process_stats() -> dict[int, tuple[int, float, float]]:
    """Every process's parent, CPU seconds, and CPU seconds of its children that ended."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for pid, _ in _processes():
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[pid] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick,
                    (int(fields[13]) + int(fields[14])) / tick)
    return out


def llog_records(config: Config, topic: str) -> int:
    """The records readable in the llog topic ``topic`` (0 while it has no partitions): over its
    partitions, the offsets from the log start to the high watermark."""
    with Coordination(config) as coordination:
        return sum(p.records for p in describe_topic(coordination, config.root_prefix, topic))


def check_landed(what: str, landed: int, sent: int, cut: int = 0, whole: bool = True) -> None:
    """Raise unless ``landed`` records are what was sent: ``sent``, plus, of ``cut`` records
    whose write was cut short (a query stopped in a micro-batch), all or none (``whole``: an
    exactly-once sink, which commits a batch at once) or any number (a sink that writes as its
    tasks go)."""
    extra = landed - sent
    if extra == 0 or (whole and extra == cut) or (not whole and 0 <= extra <= cut):
        return
    expected = f"{sent:,}"
    if cut and whole:
        expected += f", or {sent + cut:,} if the micro-batch the stop cut committed whole"
    elif cut:
        expected += f" to {sent + cut:,} (the micro-batch the stop cut may have written part of its {cut:,})"
    raise RuntimeError(f"{what}: {landed:,} records landed, expected {expected}")


def s3_server_marker(endpoint_url: str) -> str:
    """What the local stack's S3 server (versitygw) has in its command line when it serves
    ``endpoint_url``: its listen address (``llog_tools.stack.s3_server``)."""
    parts = urlsplit(endpoint_url)
    return f"--port {parts.hostname}:{parts.port} "


def _processes():
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    for entry in entries:
        if entry.isdigit():
            try:
                yield int(entry), open(f"/proc/{entry}/cmdline", "rb").read().replace(b"\0", b" ").decode()
            except OSError:
                continue


def _machine_cpu_s() -> float | None:
    try:
        fields = open("/proc/stat").readline().split()[1:]
    except OSError:
        return None
    busy = sum(int(f) for i, f in enumerate(fields[:8]) if i not in (3, 4))  # all but idle and iowait
    return busy / os.sysconf("SC_CLK_TCK")


def _process_cpu_s(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
