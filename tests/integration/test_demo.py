"""``make demo``'s job (``python -m jobs.demo``) end to end on the test stack, smaller: it prints
our own lines and no Ivy resolver noise, every event lands in the Delta table or the quarantine,
the quarantine holds the bad events, and its report renders in headless Chromium."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from uuid import uuid4

from jobs.demo import BAD_EVENTS
from jobs.demo_report import LAG_COLOR, SINK_COLOR, SOURCE_COLOR
from tests.helpers.chromium import color_pixels, is_blank, screenshot

REPO = Path(__file__).resolve().parents[2]
#: Lines the JVM or Ivy print that must not reach a demo's output (conf/ivysettings.xml,
#: conf/log4j2.properties, jobs/local_spark.py and the demo's filter keep them out).
NOISE = re.compile(r"repos\.spark-packages\.org|:: resolving dependencies|Ivy Default Cache|log4j2-defaults"
                   r"|Setting default log level|NativeCodeLoader|incubator modules")


def test_demo_runs_gates_and_draws_its_report(stack, tmp_path):
    env = {**os.environ, "LLOG_SETTINGS_FILE": "/nonexistent", "LLOG_HOME": str(tmp_path),
           **stack.replace(root_prefix=f"demo{uuid4().hex[:8]}").to_options()}
    env.pop("LLOG_FAILPOINT", None)
    run = subprocess.run([sys.executable, "-m", "jobs.demo", "--batches", "2", "--records", "100", "--events", "2000",
                          "--micro-batches", "2", "--max-per-batch", "2500"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = run.stdout
    assert not NOISE.search(out) and not NOISE.search(run.stderr), run.stderr[-3000:]
    assert out.startswith("batch 0: 1 blob, 6 partitions"), out[:500]
    assert "every record matches" in out
    delta_line = next((line for line in out.splitlines() if line.startswith("Delta table")), out[-3000:])
    assert "4,000 rows in" in delta_line, delta_line  # the stream stops after --micro-batches, not one later
    assert f"{len(BAD_EVENTS)} quarantined (every event streamed above, once)" in delta_line, delta_line
    for name in ("value_is_json", "seq_is_an_integer", "ts_is_a_timestamp", "ts_not_in_the_future"):
        assert re.search(rf"\d+ row\(s\) failed {name}", out)
    assert "total lag 0" in out

    report = tmp_path / "demo" / "report.html"
    assert f"report: {report}" in out
    png = screenshot(report, tmp_path / "report.png")
    assert not is_blank(png)
    for color in (SINK_COLOR, SOURCE_COLOR, LAG_COLOR):
        assert color_pixels(png, color) > 500, color
