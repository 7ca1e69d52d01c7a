"""The HTTP broker (``python -m broker_lite``) as a real process on a free port, for the tests
that talk to it over HTTP."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def run_broker(config, *, args: Sequence[str] = (), log: Path | None = None,
               **settings) -> Iterator[tuple[str, subprocess.Popen]]:
    """A broker process for ``config`` (plus ``LLOG_*`` ``settings`` and command-line ``args``);
    yields its base URL and the process once ``/health`` answers. Its stderr goes to ``log`` (a
    temporary file if not given; a pipe nobody reads would stall a broker that logs a lot).
    Stopped with SIGTERM at the end (SIGKILL if it does not stop)."""
    port = free_port()
    env = _env(config, settings)
    stderr = open(log, "w+b") if log is not None else tempfile.TemporaryFile()  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "broker_lite", "--port", str(port), "--log-level", "warning", *args],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, tail(stderr)
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the broker did not answer /health within 60 s"
            time.sleep(0.1)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        stderr.close()


def broker_exit(config, *, args: Sequence[str] = (), wait_s: float = 60.0, **settings) -> tuple[int | None, str]:
    """A broker process for ``config`` that should refuse to start: its exit status and stderr,
    or None and its stderr so far if it still runs after ``wait_s`` (it is then stopped)."""
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "broker_lite", "--port", str(free_port()), "--log-level",
                                 "warning", *args], cwd=REPO, env=_env(config, settings), stdout=subprocess.DEVNULL,
                                stderr=stderr)
        try:
            status = proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            status = None
            proc.kill()
            proc.wait(10)
        return status, tail(stderr)


def _env(config, settings) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO),
            "LLOG_SETTINGS_FILE": "/nonexistent", **config.to_options(), **{k: str(v) for k, v in settings.items()}}


def tail(file, limit: int = 3000) -> str:
    """The last ``limit`` characters written to ``file`` (an open binary file)."""
    file.flush()
    file.seek(0)
    return file.read().decode(errors="replace")[-limit:]
