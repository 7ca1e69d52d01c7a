"""A writer and a reader on the test's own root prefix; a broker process shared by a module."""

from __future__ import annotations

import subprocess
import time
from uuid import uuid4

import pytest

from llog.reader import LogReader
from llog.writer import LogWriter
from llog_tools.stack import build, network
from llog_tools.stack.oxia_server import oxia_problem
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


@pytest.fixture(scope="session")
def _four_shard_oxia_address(tmp_path_factory) -> str:
    """An Oxia server of its own with four shards (the stack's has one), on a free port, started
    once for the test session: each test keeps to its own root prefix (``config``)."""
    binary = build.install()["oxia"]
    ports = network.free_ports()
    address = f"127.0.0.1:{ports.oxia}"
    data = tmp_path_factory.mktemp("four-shard-oxia")
    server = subprocess.Popen(
        [str(binary), "standalone", "--shards", "4", "-p", address, "-m", f"127.0.0.1:{ports.oxia_metrics}",
         "--data-dir", str(data / "data"), "--wal-dir", str(data / "wal")],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while (problem := oxia_problem(ports)) is not None:  # the stack's own health probe
            assert server.poll() is None and time.monotonic() < deadline, f"oxia did not start: {problem}"
            time.sleep(0.1)
        yield address
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.fixture
def four_shard_oxia(_four_shard_oxia_address, config):
    """The test's config (its own root prefix) on the session's four-shard Oxia server."""
    return config.replace(oxia_service_address=_four_shard_oxia_address)
