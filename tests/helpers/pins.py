"""Pinned sink batches staged without Spark (docs/protocol.md section 9.1): the clients a test of
pins needs, and a batch's cut as a driver would pin it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from llog.config import Config
from llog.coordination import Coordination
from llog.objects import ObjectStore
from llog.writer import AppendGroup, LogWriter, StagedSlice, stage


@contextmanager
def pin_clients(config: Config) -> Iterator[tuple[Config, LogWriter, Coordination, ObjectStore]]:
    """``(config, writer, coordination, objects)`` with partition ``t[0]`` initialized."""
    objects = ObjectStore(config)
    try:
        with LogWriter(config, auto_initialize=True) as writer, Coordination(config) as coordination:
            writer.initialize_partition("t", 0)
            yield config, writer, coordination, objects
    finally:
        objects.close()


def cli_reaches(config: Config, monkeypatch) -> None:
    """The ``llog`` command run in this process reaches ``config``'s stack and root prefix."""
    monkeypatch.setenv("LLOG_SETTINGS_FILE", "/nonexistent")
    for name, value in config.to_options().items():
        monkeypatch.setenv(name, value)


def cut(config: Config, objects: ObjectStore, values: list[bytes], pieces: int) -> list[StagedSlice]:
    """``values`` staged as ``pieces`` slices of ``t[0]`` (one blob each): one cut of a batch."""
    size = -(-len(values) // pieces)
    return [s for i in range(0, len(values), size) for s in stage(objects, config, [AppendGroup("t", 0, values[i:i + size])])]
