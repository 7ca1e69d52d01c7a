"""A writer and a reader on the test's own root prefix; a broker process shared by a module."""

from __future__ import annotations

from uuid import uuid4

import pytest

from llog.reader import LogReader
from llog.writer import LogWriter
from tests.conftest import TEST_DEFAULT_PARTITIONS
from tests.helpers.broker_process import run_broker


@pytest.fixture
def writer(config):
    with LogWriter(config, auto_initialize=True) as w:
        yield w


@pytest.fixture
def reader(config):
    with LogReader(config) as r:
        yield r


@pytest.fixture(scope="module")
def module_config(stack):
    """One root prefix for the tests of a module that share a broker (each uses its own topics)."""
    return stack.replace(root_prefix=f"t{uuid4().hex[:12]}", default_partitions=TEST_DEFAULT_PARTITIONS)


@pytest.fixture(scope="module")
def broker(module_config):
    """A broker process (``python -m broker_lite``) on ``module_config``; its base URL."""
    with run_broker(module_config) as (url, _):
        yield url
