"""The load generator: vegeta (https://github.com/tsenart/vegeta), installed with ``go install``
into ``<llog_home>/bin``, fed JSON targets, run in rate or max mode, and its results read back.

Only this module runs vegeta or reads its files. :func:`attack` writes ``results.bin`` (gob);
:func:`analyse` writes ``report.json`` (vegeta's own report), ``hist.txt`` (vegeta's bucket
histogram) and ``hdrplot.txt`` (vegeta's HDR percentile table), then decodes every result
(``vegeta encode``, JSON lines) into an :class:`AttackStats`: exact p50/p99/p999 over the
answered requests, status counts, 503s with and without ``Retry-After``, transport errors
(timeouts), and the response bodies vegeta kept (``-max-body``), handed to a callback.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np

from llog import config
from llog.errors import ConfigError, LlogError
from llog_tools.stack.processes import locked  # the install lock the Oxia build takes, one implementation

VERSION = "v12.12.0"
MODULE = "github.com/tsenart/vegeta/v12"
#: Bucket edges of ``hist.txt`` (vegeta's ``hist[...]`` report).
HIST_BUCKETS = "[0,1ms,2ms,5ms,10ms,25ms,50ms,100ms,250ms,500ms,1s,2.5s,5s,10s]"
_INSTALL_TIMEOUT_S = 15 * 60
_TIMESTAMP = re.compile(r"([^.]+?)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)")


def install(home: Path | None = None) -> Path:
    """``<home>/bin/vegeta`` (``home`` defaults to :func:`llog.config.llog_home`), built with
    ``go install`` unless the stamp next to it names :data:`VERSION` (a ``go install`` build
    reports no version of its own). Safe to call from several processes at once."""
    bin_dir = (Path(home) if home else config.llog_home()) / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    binary, stamp = bin_dir / "vegeta", bin_dir / "vegeta.build"
    with locked(bin_dir / ".install.lock", _INSTALL_TIMEOUT_S, "an install"):
        if stamp.is_file() and stamp.read_text().strip() == VERSION and _runs([str(binary), "-version"]):
            return binary
        go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").is_file() else None)
        if go is None:
            raise ConfigError(f"the load generator (vegeta) is built with Go into {binary}: install Go "
                              "(https://go.dev/dl/) and put `go` on PATH")
        print(f"loadtest: go install {MODULE}@{VERSION} into {bin_dir}", file=sys.stderr, flush=True)
        goflags = subprocess.run([go, "env", "GOFLAGS"], capture_output=True, text=True, timeout=60).stdout.strip()
        env = {**os.environ, "GOBIN": str(bin_dir), "GOFLAGS": f"{goflags} -modcacherw".strip()}
        done = subprocess.run([go, "install", f"{MODULE}@{VERSION}"], capture_output=True, text=True, env=env,
                              timeout=_INSTALL_TIMEOUT_S)
        if done.returncode != 0 or not _runs([str(binary), "-version"]):
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
            raise LlogError(f"`go install {MODULE}@{VERSION}` failed (exit code {done.returncode}):\n{tail}")
        stamp.write_text(VERSION + "\n")
    return binary


def _runs(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


# --- targets ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One request vegeta sends (it cycles through its targets in order)."""

    url: str
    body: bytes
    method: str = "POST"
    #: Headers besides ``Content-Type`` (e.g. the balancer's route key).
    headers: tuple[tuple[str, str], ...] = ()

    def json_line(self) -> str:
        header = {"Content-Type": ["application/json"], **{k: [v] for k, v in self.headers}}
        return json.dumps({"method": self.method, "url": self.url, "body": base64.b64encode(self.body).decode(),
                           "header": header})


def write_targets(path: Path, targets: Iterable[Target]) -> Path:
    """Targets in vegeta's JSON format (``-format=json``), one per line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(t.json_line() + "\n" for t in targets))
    return path


# --- attack -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attack:
    """How to run vegeta. ``rate`` 0 is max mode: ``workers`` clients, each sending its next
    request as soon as the last one is answered (``max_workers`` = ``workers``); otherwise a
    fixed ``rate`` per second with as many workers as it takes, up to ``max_workers``."""

    duration_s: float
    rate: int = 0
    workers: int = 64
    max_workers: int | None = None
    timeout_s: float = 30.0
    #: Bytes of each response body kept in the results (-1: all).
    max_body: int = -1
    keepalive: bool = True

    def args(self) -> list[str]:
        max_workers = self.max_workers if self.max_workers is not None else (self.workers if self.rate == 0 else 4096)
        return [f"-rate={self.rate}/s" if self.rate else "-rate=0", f"-workers={self.workers}",
                f"-max-workers={max_workers}", f"-duration={self.duration_s:g}s", f"-timeout={self.timeout_s:g}s",
                f"-max-body={self.max_body}", f"-keepalive={str(self.keepalive).lower()}"]


def attack(binary: Path, targets: Path, results: Path, spec: Attack, name: str = "") -> list[str]:
    """Run one attack; its results go to ``results`` (gob). Returns the command line."""
    cmd = [str(binary), "attack", "-format=json", f"-targets={targets}", f"-output={results}",
           f"-name={name}", *spec.args()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=spec.duration_s + spec.timeout_s + 120)
    if done.returncode != 0:
        raise LlogError(f"`{' '.join(cmd)}` failed (exit code {done.returncode}): {done.stderr.strip()[-2000:]}")
    return cmd


# --- results ----------------------------------------------------------------------------------


@dataclass
class AttackStats:
    """What one attack's results say. Latencies are of the answered requests with status
    ``ok_status`` (an ack), exact percentiles (numpy's ``higher``: a real observed latency, never
    an interpolation below it)."""

    requests: int = 0
    ok: int = 0
    status: Counter = field(default_factory=Counter)
    #: 503s that carried a Retry-After header, and those that did not.
    retry_after_503: int = 0
    bare_503: int = 0
    #: Requests with no HTTP answer (code 0), by vegeta's error text (timeouts, resets).
    transport_errors: Counter = field(default_factory=Counter)
    first_sent_s: float | None = None
    last_done_s: float | None = None
    latencies_ms: list[float] = field(default_factory=list)

    @property
    def span_s(self) -> float:
        """First request sent to last answer received."""
        if self.first_sent_s is None:
            return 0.0
        return max(self.last_done_s - self.first_sent_s, 1e-9)

    def percentile_ms(self, q: float) -> float | None:
        if not self.latencies_ms:
            return None
        return round(float(np.percentile(self.latencies_ms, q, method="higher")), 3)

    def summary(self) -> dict:
        return {
            "requests": self.requests, "ok_requests": self.ok, "seconds": round(self.span_s, 3),
            "requests_per_s": round(self.requests / self.span_s, 1) if self.requests else 0.0,
            "ok_requests_per_s": round(self.ok / self.span_s, 1) if self.ok else 0.0,
            "p50_ms": self.percentile_ms(50), "p99_ms": self.percentile_ms(99), "p999_ms": self.percentile_ms(99.9),
            "max_ms": round(max(self.latencies_ms), 3) if self.latencies_ms else None,
            "status_counts": {str(k): v for k, v in sorted(self.status.items())},
            "non_200": self.requests - self.status.get(200, 0),
            "retry_after_503": self.retry_after_503, "bare_503": self.bare_503,
            "transport_errors": dict(self.transport_errors.most_common(5)),
        }


def analyse(binary: Path, results: Path, out_dir: Path, on_body: Callable[[int, bytes], None] | None = None,
            ok_status: int = 200) -> AttackStats:
    """Write vegeta's reports of ``results`` into ``out_dir`` and decode every result."""
    for kind, name in (("json", "report.json"), (f"hist{HIST_BUCKETS}", "hist.txt"), ("hdrplot", "hdrplot.txt")):
        subprocess.run([str(binary), "report", f"-type={kind}", f"-output={out_dir / name}", str(results)],
                       check=True, capture_output=True, timeout=300)
    stats = AttackStats()
    proc = subprocess.Popen([str(binary), "encode", "-to=json", str(results)], stdout=subprocess.PIPE)
    try:
        for line in proc.stdout:
            _add(stats, json.loads(line), on_body, ok_status)
    finally:
        proc.stdout.close()
        if proc.wait(300) != 0:
            raise LlogError(f"`vegeta encode {results}` failed (exit code {proc.returncode})")
    return stats


def _add(stats: AttackStats, result: dict, on_body, ok_status: int) -> None:
    code, latency_s = result["code"], result["latency"] / 1e9
    sent_s = _unix_s(result["timestamp"])
    stats.requests += 1
    stats.status[code] += 1
    stats.first_sent_s = sent_s if stats.first_sent_s is None else min(stats.first_sent_s, sent_s)
    stats.last_done_s = sent_s + latency_s if stats.last_done_s is None else max(stats.last_done_s, sent_s + latency_s)
    if code == 0:
        stats.transport_errors[result.get("error") or "unknown"] += 1
        return
    if code == 503:
        headers = {k.lower() for k in (result.get("headers") or {})}
        if "retry-after" in headers:
            stats.retry_after_503 += 1
        else:
            stats.bare_503 += 1
    if code == ok_status:
        stats.ok += 1
        stats.latencies_ms.append(latency_s * 1000)
    if on_body is not None and result.get("body"):
        on_body(code, base64.b64decode(result["body"]))


def _unix_s(timestamp: str) -> float:
    """Seconds since the epoch of an RFC 3339 timestamp with up to nanoseconds (vegeta's)."""
    whole, fraction, zone = _TIMESTAMP.fullmatch(timestamp).groups()
    seconds = datetime.fromisoformat(whole + ("+00:00" if zone == "Z" else zone)).timestamp()
    return seconds + (int(fraction) / 10 ** len(fraction) if fraction else 0.0)
