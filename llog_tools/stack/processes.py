"""The stack's processes: start one in its own session with its output in a log, tell whether a
recorded pid still runs its binary, pause, stop and kill it; write a state file at once; and the
lock that keeps two ``llog stack`` commands (or two installs) from acting at once.

A process is recorded as ``{"pid", "binary"}`` (:func:`start_process`); every check reads that
entry, not a name, so a recycled pid is never taken for the stack's process."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from llog.errors import LlogError


STOP_TIMEOUT_S = 10

#: Processes this Python process started, kept so they can be reaped when stopped.
children: dict[int, subprocess.Popen] = {}


def start_process(cmd: list[str], log_path: Path, cwd: Path, env: Mapping[str, str]) -> dict:
    """``cmd`` as a process of its own session, its output appended to ``log_path``; its record
    entry ``{"pid", "binary"}``, for :func:`process_alive` and :func:`stop_process` (also from
    another process later: ``llog observe`` keeps its servers so)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(f"--- llog {datetime.now(timezone.utc).isoformat()}: {' '.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
    children[proc.pid] = proc
    return {"pid": proc.pid, "binary": cmd[0]}


def process_alive(entry: Mapping | None) -> bool:
    """Whether the process of a :func:`start_process` entry still runs its binary (a recycled
    pid does not count)."""
    return bool(entry) and pid_alive(entry.get("pid"), entry.get("binary"))


def stop_process(entry: Mapping | None) -> None:
    """Stop the process of a :func:`start_process` entry if it runs: SIGTERM, then SIGKILL."""
    if process_alive(entry):
        stop(entry["pid"], entry["binary"])


def write_json(path: Path, value: object) -> None:
    """``value`` as ``path``, replaced at once (a reader sees the old file or the new one)."""
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(json.dumps(value, indent=2) + "\n")
    os.replace(partial, path)


def pid_alive(pid: int | None, binary: str | None) -> bool:
    """True if ``pid`` runs ``binary`` (a recycled pid runs something else; a zombie, nothing).
    A running process this one started counts even before it has exec'ed.

    The binary is read from ``/proc/PID/exe``, not ``cmdline``: ``Popen`` returns once the child's
    close-on-exec pipe closes, which the kernel does before it fills in the new program's argument
    area, so for a moment a running process has an empty ``cmdline`` (seen in 1324 of 2000 spawns
    of ``sleep`` read at once). ``exe`` is set before that pipe closes, and a zombie has none."""
    if not pid or not binary:
        return False
    if live_child(pid) is not None:
        return True
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False
    # A binary rebuilt (replaced) while its process runs reads as "PATH (deleted)".
    return exe.removesuffix(" (deleted)") == os.path.realpath(binary)


def live_child(pid: int | None) -> subprocess.Popen | None:
    """The process this one started as ``pid``, while it runs. Once it has exited (and been
    reaped) its pid is free: pids wrap (at 32768 on many machines), so in a long-lived process
    the number may by now name someone else's process, which only ``/proc`` can tell."""
    child = children.get(pid)
    return child if child is not None and child.poll() is None else None


def paused(pid: int | None) -> bool:
    """True if ``pid`` is stopped (SIGSTOP, :func:`llog_tools.local_stack.pause_service`)."""
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].startswith(("T", "t"))  # the state follows the parenthesized name


def kill_process(service: str, entry: Mapping) -> None:
    os.kill(entry["pid"], signal.SIGKILL)
    if not wait_exit(entry["pid"], entry["binary"], 10):
        raise LlogError(f"{service} (pid {entry['pid']}) is still running 10 s after SIGKILL")
    children.pop(entry["pid"], None)


def stop(pid: int, binary: str) -> None:
    """SIGTERM, wait up to STOP_TIMEOUT_S, then SIGKILL. A paused process (SIGSTOP) is continued
    after the SIGTERM, so that it handles it."""
    for sig, wait_s in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, 5)):
        try:
            os.kill(pid, sig)
            if sig == signal.SIGTERM:
                os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            break
        if wait_exit(pid, binary, wait_s):
            break
    else:
        raise LlogError(f"{binary} (pid {pid}) is still running after SIGKILL")
    children.pop(pid, None)


def wait_exit(pid: int, binary: str, timeout_s: float) -> bool:
    child = live_child(pid)
    if child is not None:
        try:
            child.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            return False
    deadline = time.monotonic() + timeout_s
    while pid_alive(pid, binary):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(cannot read log: {e})"


@contextmanager
def locked(path: Path, timeout_s: float, what: str) -> Iterator[None]:
    """Hold an exclusive flock on ``path``, waiting at most ``timeout_s`` for it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LlogError(f"gave up after {timeout_s:.0f} s waiting for {what} in another process "
                                    f"(lock {path})") from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
