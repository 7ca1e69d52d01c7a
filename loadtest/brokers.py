"""The brokers under test: ``python -m broker_lite`` processes (their output in the run
directory), HAProxy in front of them when asked (:class:`Balancer`, the config ``llog stack up
--brokers N`` writes), and a background thread sampling their ``GET /metrics`` into
``metrics.jsonl``.

The counters the summary needs are read from ``/metrics`` by dotted path (:data:`COUNTERS`);
a broker that did not answer yields ``None``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from llog_tools.stack.haproxy import HAPROXY, haproxy_config, read_haproxy_stats
from llog.config import Config
from llog.errors import LlogError

REPO = Path(__file__).resolve().parents[1]
_START_TIMEOUT_S = 60
_STOP_TIMEOUT_S = 40

#: Counters the summary needs: their paths in ``GET /metrics`` (``a+b``: the sum).
COUNTERS = {
    "s3_put": "s3.put_requests",
    "s3_get": "s3.operations.get+s3.operations.range_get",
    "s3_cost_usd": "s3.billing.estimated_request_cost_usd",
    "consume_records": "http.consume_records_returned_total",
    "tail_cache_hits": "http.consume_blob_cache_hits_total",
    "tail_cache_misses": "http.consume_blob_cache_misses_total",
    "long_poll_hits": "http.consume_long_poll_hits_total",
    "long_poll_timeouts": "http.consume_long_poll_timeouts_total",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Broker:
    """One broker process for ``config`` plus ``LLOG_*`` ``settings``."""

    name: str
    config: Config
    log_dir: Path
    settings: dict[str, str] = field(default_factory=dict)
    port: int = 0
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"broker-{self.name}.log"

    def start(self) -> "Broker":
        self.port = self.port or free_port()
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO),
               "LLOG_SETTINGS_FILE": "/nonexistent", **self.config.to_options(),
               **{k: str(v) for k, v in self.settings.items()}}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "broker_lite", "--port", str(self.port), "--log-level", "warning"],
                cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise LlogError(f"broker {self.name} exited with {self.proc.returncode} during start-up:\n"
                                + self.log_path.read_text(errors="replace")[-3000:])
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise LlogError(f"broker {self.name} did not answer /health within {_START_TIMEOUT_S} s")
            time.sleep(0.1)

    def stop(self) -> int | None:
        """SIGTERM (the broker answers what it accepted), SIGKILL if it does not stop; the exit
        status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def metrics(self) -> dict | None:
        """``GET /metrics`` as JSON, or None (no such endpoint, or no answer)."""
        try:
            response = httpx.get(f"{self.url}/metrics", timeout=5)
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        try:
            return response.json()
        except ValueError:
            return None


@dataclass
class Balancer:
    """HAProxy (``llog_tools.stack.haproxy.HAPROXY``) in front of ``brokers``, configured as ``llog stack
    up --brokers N`` does (:func:`llog_tools.stack.haproxy.haproxy_config`): a request with the header
    ``X-Llog-Partition`` goes to the broker its consistent hash picks, one without it round robin."""

    name: str
    brokers: list[Broker]
    log_dir: Path
    port: int = 0
    stats_port: int = 0
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def stats_url(self) -> str:
        return f"http://127.0.0.1:{self.stats_port}/stats"

    def start(self) -> "Balancer":
        self.port, self.stats_port = free_port(), free_port()
        config = self.log_dir / f"{self.name}.cfg"
        config.write_text(haproxy_config(self.port, self.stats_port, [
            {"name": f"broker-{b.name}", "port": b.port, "role": "both"} for b in self.brokers], split_roles=False))
        with open(self.log_dir / f"{self.name}.log", "ab") as log:
            self.proc = subprocess.Popen([HAPROXY, "-db", "-f", str(config)], stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise LlogError(f"{self.name} (HAProxy) exited with {self.proc.returncode}; see "
                                f"{self.log_dir / f'{self.name}.log'}")
            servers = [r for r in self.stats() if r["svname"] not in ("FRONTEND", "BACKEND") and r["pxname"] == "brokers"]
            if len(servers) == len(self.brokers) and all(r["status"] == "UP" for r in servers):
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise LlogError(f"{self.name} does not see its brokers up within {_START_TIMEOUT_S} s")
            time.sleep(0.1)

    def stats(self) -> list[dict[str, str]]:
        return read_haproxy_stats(self.stats_url)

    def server_requests(self) -> dict[str, int]:
        """Requests sent to each broker so far (``stot``), and 5xx answers (``hrsp_5xx``) as ``<name>_5xx``."""
        out = {}
        for r in self.stats():
            if r["pxname"] == "brokers" and r["svname"] not in ("FRONTEND", "BACKEND"):
                out[r["svname"]] = int(r["stot"] or 0)
                out[r["svname"] + "_5xx"] = int(r["hrsp_5xx"] or 0)
        return out

    def server_response_ms(self) -> dict[str, int]:
        """Each broker's average response time (``rtime``, ms, over its last 1,024 requests),
        as HAProxy measures it: time spent in the broker, not in the balancer's queue."""
        return {r["svname"]: int(r["rtime"] or 0) for r in self.stats()
                if r["pxname"] == "brokers" and r["svname"] not in ("FRONTEND", "BACKEND")}

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of process ``pid`` (all its threads), from ``/proc``; None if gone."""
    if not pid:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime (fields 14 and 15)


#: Where a missing counter means 0: ``s3.operations`` lists only the operations S3 has seen.
_ZERO_WHEN_ABSENT = "s3.operations."


def counter(metrics: dict | None, name: str) -> float | None:
    """The :data:`COUNTERS` entry ``name`` in one ``/metrics`` answer, or None (no answer, or a
    counter it does not report; an operation S3 has not seen yet counts 0)."""
    if metrics is None:
        return None
    total = 0
    for path in COUNTERS[name].split("+"):
        *parents, last = path.split(".")
        node = metrics
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            return None  # not this broker's /metrics
        value = node.get(last, 0 if path.startswith(_ZERO_WHEN_ABSENT) else None)
        if not isinstance(value, (int, float)):
            return None
        total += value
    return total


def counter_delta(before: list[dict | None], after: list[dict | None], name: str) -> float | None:
    """The counter's increase summed over brokers (each broker's before and after, in order);
    None unless every broker reports it."""
    total = 0.0
    for b, a in zip(before, after):
        x, y = counter(b, name), counter(a, name)
        if x is None or y is None:
            return None
        total += y - x
    return total


class MetricsSampler(threading.Thread):
    """Every ``interval_s``, each running broker's ``/metrics`` as one line of ``path``:
    ``{"t", "phase", "broker", "metrics"}`` (``metrics`` null when the broker has none)."""

    def __init__(self, path: Path, interval_s: float = 1.0):
        super().__init__(name="metrics-sampler", daemon=True)
        self.path, self.interval_s = path, interval_s
        self.brokers: list[Broker] = []
        self.phase = "setup"
        self.samples = 0
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def watch(self, phase: str, brokers: list[Broker]) -> None:
        with self._lock:
            self.phase, self.brokers = phase, list(brokers)

    def run(self) -> None:
        with open(self.path, "a") as out:
            while not self._halt.wait(self.interval_s):
                with self._lock:
                    phase, brokers = self.phase, list(self.brokers)
                for broker in brokers:
                    if broker.proc is None or broker.proc.poll() is not None:
                        continue
                    out.write(json.dumps({"t": round(time.time(), 3), "phase": phase, "broker": broker.name,
                                          "metrics": broker.metrics()}) + "\n")
                    self.samples += 1
                out.flush()

    def stop(self) -> None:
        self._halt.set()
        self.join(10)
