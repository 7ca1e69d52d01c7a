"""The stack's state in its directory: where each file is (:class:`StackPaths`), the record of
what runs (``stack.json``: pids, binaries, ports) and starting a service as a process of the stack,
its output in ``logs/<service>.log``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from llog import config
from llog.errors import LlogError
from llog_tools.stack.oxia_server import OXIA_COORDINATOR
from llog_tools.stack.processes import start_process


class StackPaths:
    """The files of a stack in its directory (``stack_dir``, default ``<llog_home>/stack``)."""

    def __init__(self, root: Path | None):
        self.root = Path(root) if root else config.stack_dir()
        self.record = self.root / "stack.json"
        self.settings = self.root / "settings.json"
        self.lock = self.root / ".stack.lock"
        self.logs = self.root / "logs"
        self.oxia_data = self.root / "oxia"
        self.s3_data = self.root / "s3"
        # An Oxia cluster's layout, config and coordinator state, kept with the servers' data.
        self.oxia_cluster = self.oxia_data / "cluster.json"
        self.oxia_cluster_config = self.oxia_data / "cluster.yaml"
        self.oxia_cluster_status = self.oxia_data / OXIA_COORDINATOR / "cluster-status.json"

    def log(self, service: str) -> Path:
        return self.logs / f"{service}.log"


def read_record(paths: StackPaths) -> dict | None:
    """The stack's record (``stack.json``), or None if there is none."""
    try:
        return json.loads(paths.record.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as e:
        raise LlogError(f"cannot read {paths.record}: {e} (delete it if no stack is running)") from e


def spawn(paths: StackPaths, service: str, cmd: list[str], env: Mapping[str, str]) -> dict:
    """``service`` started as a process of the stack (in its directory, its output appended to
    ``logs/<service>.log``); its record entry (:func:`~llog_tools.stack.processes.start_process`)."""
    return start_process(cmd, paths.log(service), paths.root, env)
