"""Shared fixtures: one local stack (real Oxia + versitygw) per test session."""

from __future__ import annotations

from pathlib import Path
from uuid import uuid4

import pytest

from llog import failpoints
from llog.config import Config
from llog_tools.local_stack import down, up
from llog_tools.stack.build import install
from llog_tools.stack.network import free_ports

_INTEGRATION_DIR = Path(__file__).parent / "integration"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "integration: needs real processes (Oxia, S3, Spark)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _INTEGRATION_DIR in item.path.parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Config:
    """A running local stack on free ports, as the config that reaches it."""
    install()
    stack_dir = tmp_path_factory.mktemp("stack")
    up(stack_dir=stack_dir, ports=free_ports())
    try:
        yield Config.load(env={}, settings_path=stack_dir / "settings.json")
    finally:
        down(stack_dir, purge=True)


#: Partitions of a topic a test creates by writing to it: tests write to partitions 0..15 of the
#: topics they make up (as a test Kafka cluster raises ``num.partitions``); tests of the default
#: (1, docs/protocol.md section 10) set ``default_partitions`` themselves.
TEST_DEFAULT_PARTITIONS = 16


@pytest.fixture
def config(stack: Config) -> Config:
    """The stack's config with a root prefix of its own, so tests do not see each other's data."""
    return stack.replace(root_prefix=f"t{uuid4().hex[:12]}", default_partitions=TEST_DEFAULT_PARTITIONS)


@pytest.fixture
def hooks():
    """``llog.failpoints.hooks``, emptied after the test: ``hooks[point] = fn`` runs ``fn`` when
    this process reaches ``point`` (an actor pauses there while ``fn`` runs others)."""
    failpoints.hooks.clear()
    yield failpoints.hooks
    failpoints.hooks.clear()
