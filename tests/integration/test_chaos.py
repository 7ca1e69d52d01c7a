"""A short chaos run (``python -m chaos``, see :mod:`chaos`): writers, compactors, GC and readers
paused, killed and restarted, Oxia and the S3 server restarted, on a private stack; every
acknowledged record reads back exactly once and the invariants hold."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_short_chaos_run_loses_and_duplicates_nothing():
    run = subprocess.run([sys.executable, "-m", "chaos", "--seconds", "40", "--seed", "11"], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-6000:]
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert (summary["lost"], summary["duplicated"], summary["invariant_violations"]) == (0, 0, 0), summary
    assert summary["appends_acked"] > 50 and summary["pauses"] > 5 and summary["kills"] > 0, summary
    assert summary["server_restarts"] == 2 and summary["final_gc"] == "ok", summary
