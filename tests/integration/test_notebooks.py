"""notebooks/*.ipynb executed headless, as a reader would run them: nbclient starts this venv's
python3 kernel (ipykernel) in notebooks/, with the test stack's settings as ``LLOG_*`` environment
variables and a root prefix of the notebook's own; a cell that raises fails the test. The
committed notebooks are not touched: a copy is executed, and written to the test's tmp_path for a
look after a failure. Then what each notebook reports is checked against its outputs and against
Oxia and the Delta table it left behind."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from uuid import uuid4

import nbformat
from jupyter_client import KernelManager
from nbclient import NotebookClient

from llog.config import Config
from llog.consumer_groups import describe_group
from llog.coordination import Coordination
from llog_tools.describe import describe_topics

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
#: The longest one cell may take: the first Spark start may download the Delta jar.
CELL_TIMEOUT_S = 600


def _execute(name: str, stack: Config, tmp_path: Path) -> tuple[nbformat.NotebookNode, Config]:
    """Execute a copy of ``notebooks/{name}.ipynb``; the executed notebook and the config it ran
    with. The kernel sees only the test's llog settings: no settings file, no LLOG_* of the caller."""
    config = stack.replace(root_prefix=f"nb{uuid4().hex[:12]}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLOG_")}
    env.update(config.to_options())
    env.update(LLOG_SETTINGS_FILE=str(tmp_path / "no-settings.json"), LLOG_NOTEBOOK_DIR=str(tmp_path / "work"),
               GX_ANALYTICS_ENABLED="False")  # should the Delta job's quality gate import great-expectations
    kernel = KernelManager(kernel_name="python3")
    assert kernel.format_kernel_cmd()[0] == sys.executable, "the kernel must be this venv's python"
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    client = NotebookClient(nb, km=kernel, timeout=CELL_TIMEOUT_S, resources={"metadata": {"path": str(NOTEBOOKS)}})
    started = time.perf_counter()
    try:
        client.execute(env=env)
    finally:
        nbformat.write(nb, tmp_path / f"{name}.executed.ipynb")
        print(f"{name}.ipynb executed in {time.perf_counter() - started:.1f}s "
              f"(copy with outputs: {tmp_path / f'{name}.executed.ipynb'})")
    return nb, config


def _text(nb: nbformat.NotebookNode) -> str:
    """Everything the cells printed or displayed as text, in order."""
    parts = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output.output_type == "stream":
                parts.append(output.text)
            elif "text/plain" in output.get("data", {}):
                parts.append(output.data["text/plain"])
    return "\n".join(parts)


def _images(nb: nbformat.NotebookNode) -> int:
    return sum("image/png" in output.get("data", {}) for cell in nb.cells for output in cell.get("outputs", []))


def test_quickstart_writes_reads_and_streams_into_delta_exactly_once(stack, tmp_path):
    nb, config = _execute("quickstart", stack, tmp_path)
    text = _text(nb)
    assert f"root prefix '{config.root_prefix}'" in text
    assert "created topic quickstart-orders with 3 partitions" in text
    assert "read 1,000 records from 3 partitions" in text
    assert re.search(r"Delta table \S+: 1,000 rows", text) and re.search(r"Delta table \S+: 1,500 rows", text)
    # The group's lag: 0 after the first run, 500 once more orders arrived, 0 after the second run.
    assert re.findall(r"group quickstart-to-delta: 3 partition\(s\), total lag (\d+)", text) == ["0", "500", "0"]
    # The Delta table: two idempotent appends by the job (txnAppId, txnVersion 0 and 1).
    [table] = (tmp_path / "work").glob("quickstart-*/orders")
    txns = [action["txn"] for commit in sorted((table / "_delta_log").glob("*.json"))
            for action in map(json.loads, commit.read_text().splitlines()) if "txn" in action]
    assert [t["version"] for t in txns] == [0, 1] and len({t["appId"] for t in txns}) == 1
    with Coordination(config) as coordination:
        lags = describe_group(coordination, config.root_prefix, "quickstart-to-delta")
    assert sorted(r.partition for r in lags) == [0, 1, 2]
    assert all(r.lag == 0 for r in lags) and sum(r.high_watermark for r in lags) == 1_500


def test_operations_shows_lag_compaction_objects_and_cost(stack, tmp_path):
    nb, config = _execute("operations", stack, tmp_path)
    text = _text(nb)
    assert _images(nb) >= 4  # lag over time, bytes before/after compaction, S3 objects, cost
    final = dict(re.findall(r"group (ops-\w+): 6 partition\(s\), total lag (\d+)", text))
    assert final == {"ops-dashboard": "0", "ops-enricher": "960", "ops-archiver": "0"}
    assert re.search(r"ops-clicks: index entries 24 -> 4, WAL bytes [\d,]+ -> 0, compacted bytes 0 -> [\d,]+", text)
    assert re.search(rf"s3://{config.s3_bucket}/{config.root_prefix}/: 10 objects", text)  # 6 WAL blobs, 4 compacted
    assert "S3 Standard list prices of" in text
    with Coordination(config) as coordination:
        enricher = describe_group(coordination, config.root_prefix, "ops-enricher")
        clicks, payments = describe_topics(coordination, None, config.root_prefix, ["ops-clicks", "ops-payments"])
    assert {(r.topic, r.lag) for r in enricher} == {("ops-clicks", 240), ("ops-payments", 0)}
    assert [(p.records, p.wal_entries, p.compacted_entries) for p in clicks.partitions] == [(600, 0, 1)] * 4
    assert [(p.records, p.wal_entries, p.compacted_entries) for p in payments.partitions] == [(300, 6, 0)] * 2
