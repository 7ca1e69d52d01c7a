"""A writer and a reader on the test's own root prefix."""

from __future__ import annotations

import pytest

from llog.reader import LogReader
from llog.writer import LogWriter


@pytest.fixture
def writer(config):
    with LogWriter(config, auto_initialize=True) as w:
        yield w


@pytest.fixture
def reader(config):
    with LogReader(config) as r:
        yield r
