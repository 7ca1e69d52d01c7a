"""Processes on this machine, as ``/proc`` shows them."""

from __future__ import annotations

from pathlib import Path


def processes_using(path: Path) -> list[int]:
    """Pids whose command line mentions ``path``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(path).encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found
