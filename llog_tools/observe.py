"""``llog observe up|down|status`` (``make observe``): Prometheus scraping the local stack's
brokers and the one-shot jobs' metrics, for the Grafana dashboard in ``conf/grafana/``.

Two processes of Debian's packages, started beside the stack (``<stack dir>/observe/``):

- ``/usr/bin/prometheus-node-exporter`` with only its textfile collector, serving the ``*.prom``
  files of ``<stack dir>/observe/textfile`` (``LLOG_METRICS_TEXTFILE_DIR``), where the compaction
  job and ``llog gc`` write their runs' figures (:mod:`llog.metrics`). Prometheus reads no files
  itself; node_exporter's textfile collector is the standard way for cron jobs, and it also
  reports a file it cannot parse (``node_textfile_scrape_error``).
- ``/usr/bin/prometheus`` with a generated config (JSON, which is YAML): a ``llog_broker`` job
  over the brokers' ``/metrics/prometheus``, a ``llog_jobs`` job over the node_exporter. The
  brokers are a file-based service discovery (``brokers.json``), from the stack's state record
  (``stack.json``: ``brokers``, a list of ``{port, url, ...}``, and/or ``broker``), so ``up``
  again after the stack's brokers changed updates the targets without a restart.

Everything listens on 127.0.0.1. ``down`` stops both (by the pids recorded in
``observe.json``) and keeps Prometheus' data; ``down --purge`` deletes it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path

from llog import config as llog_config
from llog.errors import LlogError
from llog_tools.stack.processes import process_alive, start_process, stop_process, write_json

HOST = "127.0.0.1"
PROMETHEUS = "/usr/bin/prometheus"
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
DEFAULT_PROMETHEUS_PORT = 9090
DEFAULT_EXPORTER_PORT = 9100
DEFAULT_SCRAPE_INTERVAL_S = 15.0


class Paths:
    """The files of ``llog observe`` under ``<stack dir>/observe``."""

    def __init__(self, stack_dir: Path | None = None):
        self.stack = Path(stack_dir) if stack_dir else llog_config.stack_dir()
        self.root = self.stack / "observe"
        self.stack_record = self.stack / "stack.json"
        self.record = self.root / "observe.json"
        self.config = self.root / "prometheus.yml"
        self.brokers = self.root / "brokers.json"
        self.data = self.root / "prometheus-data"
        self.textfile = self.root / "textfile"
        self.logs = self.root / "logs"


def broker_targets(stack_record: Mapping) -> list[str]:
    """``host:port`` of every broker in a stack state record: the entries of ``brokers`` (each
    with a ``url`` or a ``port``) and the single ``broker``, without repeats. A ``broker`` that is
    the balancer in front of the others (``llog stack up --brokers N``) is not one: scraped
    through it, some broker's figures would come back a second time under another instance."""
    entries = list(stack_record.get("brokers") or [])
    if stack_record.get("broker") and not stack_record["broker"].get("balancer"):
        entries.append(stack_record["broker"])
    targets: list[str] = []
    for entry in entries:
        if entry.get("url"):
            target = entry["url"].split("://", 1)[-1].rstrip("/")
        elif entry.get("port"):
            target = f"{HOST}:{entry['port']}"
        else:
            raise LlogError(f"a broker in the stack's record has neither url nor port: {entry}")
        if target not in targets:
            targets.append(target)
    return targets


def prometheus_config(paths: Paths, exporter_port: int, scrape_interval_s: float) -> dict:
    """Prometheus' config (written as JSON, which its YAML reader takes)."""
    interval = f"{scrape_interval_s:g}s"
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [
            {"job_name": "llog_broker", "metrics_path": "/metrics/prometheus",
             "file_sd_configs": [{"files": [str(paths.brokers)], "refresh_interval": "10s"}]},
            {"job_name": "llog_jobs", "static_configs": [{"targets": [f"{HOST}:{exporter_port}"]}]},
        ],
    }


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as e:
        raise LlogError(f"cannot read {path}: {e}") from e


def _http_ok(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _spawn(paths: Paths, name: str, cmd: list[str]) -> dict:
    return {**start_process(cmd, paths.logs / f"{name}.log", paths.root, os.environ), "cmd": cmd}


def _wait_ready(paths: Paths, name: str, entry: Mapping, url: str, deadline: float) -> None:
    while not _http_ok(url):
        log = paths.logs / f"{name}.log"
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:]) if log.exists() else ""
        if not process_alive(entry):
            raise LlogError(f"{name} exited during startup; last lines of {log}:\n{tail}")
        if time.monotonic() > deadline:
            raise LlogError(f"{name} did not answer {url} in time; last lines of {log}:\n{tail}")
        time.sleep(0.2)


def refresh_targets(paths: Paths, extra_targets: Iterable[str] = ()) -> list[str]:
    """Write the brokers' targets from the stack's record (and ``extra_targets``); returns them."""
    record = _read_json(paths.stack_record) or {}
    targets = broker_targets(record)
    targets += [t for t in extra_targets if t not in targets]
    paths.root.mkdir(parents=True, exist_ok=True)
    write_json(paths.brokers, [{"targets": targets, "labels": {"stack": str(paths.stack)}}])
    return targets


def up(stack_dir: Path | None = None, prometheus_port: int = DEFAULT_PROMETHEUS_PORT,
       exporter_port: int = DEFAULT_EXPORTER_PORT, scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S,
       extra_targets: Iterable[str] = (), timeout_s: float = 60.0) -> dict:
    """Start node_exporter and Prometheus (module doc) unless they run; either way, write the
    brokers' targets afresh. Returns :func:`status`."""
    for binary in (PROMETHEUS, NODE_EXPORTER):
        if not os.access(binary, os.X_OK):
            raise LlogError(f"{binary} is not installed (`make debian-packages` installs Debian's prometheus "
                            "and prometheus-node-exporter)")
    if scrape_interval_s <= 0:
        raise ValueError(f"the scrape interval must be > 0 s, got {scrape_interval_s}")
    paths = Paths(stack_dir)
    for directory in (paths.root, paths.data, paths.textfile, paths.logs):
        directory.mkdir(parents=True, exist_ok=True)
    refresh_targets(paths, extra_targets)
    record = _read_json(paths.record) or {}
    deadline = time.monotonic() + timeout_s
    if not process_alive(record.get("node_exporter")):
        cmd = [NODE_EXPORTER, f"--web.listen-address={HOST}:{exporter_port}", "--collector.disable-defaults",
               "--collector.textfile", f"--collector.textfile.directory={paths.textfile}"]
        record["node_exporter"] = {**_spawn(paths, "node_exporter", cmd), "port": exporter_port}
        write_json(paths.record, record)
        _wait_ready(paths, "node_exporter", record["node_exporter"], f"http://{HOST}:{exporter_port}/metrics",
                    deadline)
    if not process_alive(record.get("prometheus")):
        write_json(paths.config, prometheus_config(paths, record["node_exporter"]["port"], scrape_interval_s))
        cmd = [PROMETHEUS, f"--config.file={paths.config}", f"--storage.tsdb.path={paths.data}",
               f"--web.listen-address={HOST}:{prometheus_port}"]
        record["prometheus"] = {**_spawn(paths, "prometheus", cmd), "port": prometheus_port}
        write_json(paths.record, record)
        _wait_ready(paths, "prometheus", record["prometheus"], f"http://{HOST}:{prometheus_port}/-/ready", deadline)
    return status(paths.stack)


def down(stack_dir: Path | None = None, purge: bool = False) -> dict:
    """Stop Prometheus and node_exporter; ``purge`` also deletes ``<stack dir>/observe``."""
    paths = Paths(stack_dir)
    record = _read_json(paths.record) or {}
    for name in ("prometheus", "node_exporter"):
        if record.get(name):
            stop_process(record[name])
    if purge and paths.root.exists():
        shutil.rmtree(paths.root)
    elif paths.record.exists():
        paths.record.unlink()
    return status(paths.stack)


def status(stack_dir: Path | None = None) -> dict:
    paths = Paths(stack_dir)
    record = _read_json(paths.record) or {}
    out: dict = {"dir": str(paths.root), "textfile_dir": str(paths.textfile)}
    for name, health in (("prometheus", "/-/ready"), ("node_exporter", "/metrics")):
        entry = record.get(name)
        alive = process_alive(entry)
        out[name] = None if entry is None else {
            "pid": entry["pid"] if alive else None, "url": f"http://{HOST}:{entry['port']}",
            "healthy": alive and _http_ok(f"http://{HOST}:{entry['port']}{health}")}
    brokers = _read_json(paths.brokers) if paths.brokers.exists() else None
    out["broker_targets"] = brokers[0]["targets"] if brokers else []
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llog observe", description="Prometheus scraping the local stack's brokers, and node_exporter serving "
                                         "the jobs' textfile metrics (docs/observability.md).")
    parser.add_argument("--stack-dir", type=Path, default=None,
                        help="the stack's state directory (default: $LLOG_STACK_DIR or <llog home>/stack)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("up", help="start Prometheus and node_exporter (or update the brokers' targets)")
    p.add_argument("--prometheus-port", type=int, default=DEFAULT_PROMETHEUS_PORT)
    p.add_argument("--exporter-port", type=int, default=DEFAULT_EXPORTER_PORT,
                   help="node_exporter's port, serving the jobs' textfiles")
    p.add_argument("--scrape-interval", type=float, default=DEFAULT_SCRAPE_INTERVAL_S, metavar="SECONDS")
    p.add_argument("--target", action="append", default=[], metavar="HOST:PORT",
                   help="also scrape this broker (repeatable), beside the stack's")
    p = sub.add_parser("down", help="stop them")
    p.add_argument("--purge", action="store_true", help="also delete Prometheus' data and the textfiles")
    sub.add_parser("status", help="their state, as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "up":
            result = up(args.stack_dir, args.prometheus_port, args.exporter_port, args.scrape_interval, args.target)
        elif args.command == "down":
            result = down(args.stack_dir, args.purge)
        else:
            result = status(args.stack_dir)
    except (LlogError, ValueError) as e:
        print(f"llog observe: error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2))
    if args.command == "up":
        print(f"Prometheus: {result['prometheus']['url']}; dashboard: import conf/grafana/llog-dashboard.json in "
              f"Grafana with that Prometheus as its data source.\nFor the jobs' metrics: export "
              f"LLOG_METRICS_TEXTFILE_DIR={result['textfile_dir']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
