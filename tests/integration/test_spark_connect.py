"""llog through a real Spark Connect server (``sc://``: Databricks serverless and shared
clusters, Spark 4's client mode), started from the installed pyspark in local mode; each client
is its own process (tests.helpers.llog_driver).

Through Connect the driver is the server: Spark's lookup of ``pyspark_*`` packages runs in the
server's Python, and what llog's tasks need must be installed there (docs/spark-connect.md).
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from llog.consumer_groups import describe_group
from llog.coordination import Coordination
from llog.topics import create_topic
from tests.helpers.spark_servers import (
    CHECKOUT, REPLAYED, ConnectServer, assert_every_row_once, connect_server, driver_argv, driver_env, run_driver, stop,
    topic_values,
)

#: Batch 0 is committed in part and killed, replayed, then batch 1 runs on the restarted server.
ROWS, BATCHES = 300, 2


@pytest.fixture(scope="module")
def server(module_config, tmp_path_factory):
    """One server for the module; its Python lists llog (the checkout on its PYTHONPATH), as
    with llog installed from a wheel there."""
    with connect_server(module_config, tmp_path_factory.mktemp("connect") / "server.log") as running:
        yield running


def _remote(server: ConnectServer, *more: str) -> list[str]:
    return ["--remote", server.url, *more]


def test_format_llog_writes_and_reads_with_no_registration(server, config):
    out = run_driver(config, _remote(server), "write-read", "--topic", "batch", "--rows", "500")
    assert out["values"] == list(range(500))


def test_the_venvs_python_lists_llog_as_sparks_lookup_does(tmp_path):
    """`make install` puts the checkout on the venv's path beside pip's editable install, so a
    Connect server started from the venv (no PYTHONPATH) finds format("llog") by itself."""
    listed = subprocess.run([sys.executable, "-c", "import pkgutil; "
                             "print(any(m.name == 'pyspark_llog' for m in pkgutil.iter_modules()))"],
                            env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert listed.stdout.strip() == "True", f"Spark's lookup would miss llog: {listed.stdout}{listed.stderr}"


# An editable install of the checkout as pip makes it by default: an import hook, which Python
# finds packages through but pkgutil.iter_modules (Spark's lookup) does not list. The checkout
# leaves the path (`make install` puts it there too: test above).
_EDITABLE_HOOK = f'''
import importlib.machinery, os, sys
sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != {str(CHECKOUT.resolve())!r}]
class _Checkout:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name in ("llog", "llog_sink", "llog_source", "pyspark_llog"):
            return importlib.machinery.PathFinder.find_spec(name, [{str(CHECKOUT)!r}])
sys.meta_path.insert(0, _Checkout)
'''


def test_register_makes_format_llog_work_where_the_servers_lookup_misses_llog(module_config, config, tmp_path):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_EDITABLE_HOOK)
    listed = subprocess.run([sys.executable, "-c", "import pkgutil, pyspark_llog; "
                             "print(any(m.name == 'pyspark_llog' for m in pkgutil.iter_modules()))"],
                            env={**driver_env(config), "PYTHONPATH": str(hook)}, cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert listed.stdout.strip() == "False", f"llog is listed (not an editable install?): {listed.stdout}{listed.stderr}"
    with connect_server(module_config, tmp_path / "server.log", pythonpath=str(hook)) as hooked:
        missed = subprocess.run(driver_argv(_remote(hooked), "write-read", "--topic", "t"), cwd=CHECKOUT,
                                env=driver_env(config), capture_output=True, text=True, timeout=300)
        assert missed.returncode != 0 and "DATA_SOURCE_NOT_FOUND" in missed.stderr, missed.stderr[-3000:]
        out = run_driver(config, _remote(hooked, "--register"), "write-read", "--topic", "t", "--rows", "50")
    assert out["values"] == list(range(50))


def test_a_consumer_group_reads_a_topic_and_commits_its_offsets(server, config, writer, tmp_path):
    create_topic(writer.coordination, config.root_prefix, "events", 2)
    for start in range(0, 300, 50):
        writer.append("events", start // 50 % 2, [str(v).encode() for v in range(start, start + 50)])
    out = run_driver(config, _remote(server), "group-read", "--topic", "events", "--group", "billing",
                     "--checkpoint", str(tmp_path / "ck"))
    assert out["values"] == list(range(300))
    with Coordination(config) as coordination:
        lags = {(r.topic, r.partition): r.lag for r in describe_group(coordination, config.root_prefix, "billing")}
    assert lags == {("events", 0): 0, ("events", 1): 0}


def test_sink_writes_every_row_once_when_the_server_is_killed_mid_commit(server, config, reader, tmp_path):
    """The server (the driver) is killed -9 after one slice of a batch's commit, started again,
    and the query run again from its checkpoint: Spark replays the batch, llog skips what was
    committed."""
    args = ["--topic", "out", "--rows", str(ROWS), "--batches", str(BATCHES), "--checkpoint", str(tmp_path / "ck")]
    server.stop()
    server.start(extra_env={"LLOG_FAILPOINT": "writer.after_staged_slice", "LLOG_FAILPOINT_SCOPE": "session"})
    client = subprocess.Popen(driver_argv(_remote(server), "sink", *args), cwd=CHECKOUT, env=driver_env(config),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert server.wait_exit(240) == -signal.SIGKILL
    finally:
        stop(client)  # its calls to the dead server would be retried for minutes
    server.start()
    run_driver(config, _remote(server), "sink", *args)
    assert_every_row_once(topic_values(config, reader, "out"), ROWS, BATCHES)
    assert REPLAYED.search(server.log_text()), "no batch was replayed"
