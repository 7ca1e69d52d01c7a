"""``llog compact`` and ``llog gc`` as a script runs them: with pipes, no progress at all (stdout
is the JSON alone, stderr has no escape sequences); forced on (``LLOG_PROGRESS=1``), the bars go
to stderr and stdout is still the JSON alone. Real Oxia and the S3 server, the commands as processes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from llog.clock import ShiftedClock
from llog.writer import LogWriter

REPO = Path(__file__).resolve().parents[2]
ESC = "\x1b["
APPENDS, PER_APPEND = 3, 5


def _llog(config, *args: str, progress: str | None = None) -> subprocess.CompletedProcess:
    """``python -m llog_tools ARGS`` with stdout and stderr on pipes, settings exactly ``config``'s."""
    env = {"PATH": "/usr/bin:/bin", "LLOG_SETTINGS_FILE": "/nonexistent", "TERM": "xterm", **config.to_options()}
    if progress is not None:
        env["LLOG_PROGRESS"] = progress
    return subprocess.run([sys.executable, "-m", "llog_tools", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def old_entries(config):
    """Topic ``t``, partition 0: ``APPENDS`` WAL entries written by a writer whose clock is an
    hour behind, so they are past the compaction lag for a compactor on the real clock."""
    with LogWriter(config, auto_initialize=True, clock=ShiftedClock(-3600)) as writer:
        for i in range(APPENDS):
            writer.append("t", 0, [f"r{i}-{j}".encode() for j in range(PER_APPEND)])
    return "t", 0


def test_through_pipes_no_progress_is_printed(config, old_entries):
    compact = _llog(config, "compact", "t", "0", "--json")
    assert compact.returncode == 0, compact.stderr
    done = json.loads(compact.stdout)
    assert (done["compactions"], done["records"]) == (1, APPENDS * PER_APPEND)
    gc = _llog(config, "gc", "--json")
    assert gc.returncode == 0, gc.stderr
    report = json.loads(gc.stdout)
    assert report["listed"] >= APPENDS + 1  # the WAL blobs (young, kept) and the compacted one
    for run in (compact, gc):
        assert ESC not in run.stdout and ESC not in run.stderr
        assert "compacting" not in run.stderr and "gc:" not in run.stderr


def test_forced_on_the_bars_go_to_stderr_and_stdout_stays_json(config, old_entries):
    compact = _llog(config, "compact", "t", "0", "--json", progress="1")
    assert compact.returncode == 0, compact.stderr
    assert json.loads(compact.stdout)["records"] == APPENDS * PER_APPEND
    assert ESC in compact.stderr and "compacting t[0]" in compact.stderr
    assert f"{APPENDS * PER_APPEND} records" in compact.stderr

    gc = _llog(config, "gc", "--json", progress="1")
    assert gc.returncode == 0, gc.stderr
    report = json.loads(gc.stdout)
    assert ESC in gc.stderr
    assert re.search(r"gc: reading references.*\d+/\d+ partitions", gc.stderr)
    assert re.search(rf"gc: examining blobs.*{report['listed']} blobs", gc.stderr)
    for run in (compact, gc):
        assert ESC not in run.stdout


def test_a_bad_progress_setting_is_a_clear_error(config):
    gc = _llog(config, "gc", progress="sometimes")
    assert gc.returncode == 1
    assert "llog: error: LLOG_PROGRESS='sometimes' must be one of auto" in gc.stderr
    assert gc.stdout == ""
