"""Clients ride through a restart of Oxia or SeaweedFS (``llog.local_stack.restart_service``):
the same writer and reader go on once the server is back, with no new client. A stack of the
test's own, since restarting the session's stack would disturb other tests."""

from __future__ import annotations

import time

import pytest

from llog.config import Config
from llog.errors import LlogError
from llog.local_stack import down, free_ports, restart_service, status, up
from llog.reader import LogReader
from llog.writer import LogWriter


@pytest.fixture
def own_stack(tmp_path):
    up(stack_dir=tmp_path, ports=free_ports())
    try:
        yield tmp_path, Config.load(env={}, settings_path=tmp_path / "settings.json")
    finally:
        down(tmp_path, purge=True)


@pytest.mark.parametrize("service", ["oxia", "seaweedfs"])
def test_a_writer_and_reader_go_on_after_a_server_restart(own_stack, service):
    stack_dir, config = own_stack
    with LogWriter(config, auto_initialize=True) as writer, LogReader(config) as reader:
        writer.append("r", 0, [b"before"])
        pid = status(stack_dir)[service]["pid"]
        restart_service(stack_dir, service)
        assert status(stack_dir)[service]["pid"] != pid and status(stack_dir)["running"]
        started = time.monotonic()
        writer.append("r", 0, [b"after"])
        assert [r.value for r in reader.read_range("r", 0, 1)] == [b"before", b"after"]
        assert time.monotonic() - started < 60


def test_restart_service_names_what_is_wrong(tmp_path):
    with pytest.raises(LlogError, match="unknown service 'kafka'"):
        restart_service(tmp_path, "kafka")
    with pytest.raises(LlogError, match=f"no running stack in {tmp_path}"):
        restart_service(tmp_path, "oxia")
