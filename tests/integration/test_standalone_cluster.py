"""llog on a real standalone Spark cluster: a master and two workers (1 core each), each its own
process from the installed pyspark, and drivers (tests.helpers.llog_driver) that connect to
``spark://``. Tasks run in the workers' executors, the sink's commit in the driver."""

from __future__ import annotations

import signal
import subprocess

import pytest

from llog.consumer_groups import describe_group
from llog.coordination import Coordination
from tests.helpers.spark_servers import (
    CHECKOUT, REPLAYED, assert_every_row_once, driver_argv, driver_env, run_driver, standalone_cluster, topic_values,
)

#: Batch 0 is committed in part and killed, replayed, then batch 1 runs on the replay's executors.
ROWS, BATCHES = 300, 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with standalone_cluster(tmp_path_factory.mktemp("cluster")) as running:
        yield running


def _master(cluster) -> list[str]:
    return ["--master", cluster.master_url]


def test_batch_write_and_read_then_a_consumer_group_reads_the_topic(cluster, config, tmp_path):
    """One driver (an application's start on the cluster is its slowest part): a batch write of
    500 rows into 3 partitions, a batch read, then an availableNow stream with a group."""
    out = run_driver(config, _master(cluster), "write-read group-read", "--topic", "batch", "--rows", "500",
                     "--group", "billing", "--checkpoint", str(tmp_path / "ck"))
    assert out["write-read"]["values"] == list(range(500))
    assert out["group-read"]["values"] == list(range(500))
    # The steps' tasks ran in the workers' executors, none in the driver (as local mode would).
    for step in ("write-read", "group-read"):
        tasks = out[step]["tasks_by_executor"]
        assert tasks and "driver" not in tasks and min(tasks.values()) > 0, (step, tasks)
    with Coordination(config) as coordination:
        lags = {(r.topic, r.partition): r.lag for r in describe_group(coordination, config.root_prefix, "billing")}
    assert lags == {("batch", p): 0 for p in range(3)}


def test_sink_writes_every_row_once_when_the_driver_is_killed_mid_commit(cluster, config, reader, tmp_path):
    """The driver (its Python, JVM and Python workers) is killed -9 after one slice of a batch's
    commit and run again from its checkpoint, with new executors: Spark replays the batch, llog
    skips what was committed."""
    args = ["--topic", "out", "--rows", str(ROWS), "--batches", str(BATCHES), "--checkpoint", str(tmp_path / "ck")]
    killed = subprocess.run(driver_argv(_master(cluster), "sink", *args), cwd=CHECKOUT, capture_output=True, text=True,
                            env=driver_env(config, {"LLOG_FAILPOINT": "writer.after_staged_slice",
                                                    "LLOG_FAILPOINT_SCOPE": "session"}),
                            timeout=300, start_new_session=True)
    assert killed.returncode == -signal.SIGKILL, f"not killed after a committed slice:\n{killed.stderr[-3000:]}"
    replay = subprocess.run(driver_argv(_master(cluster), "sink", *args), cwd=CHECKOUT, env=driver_env(config),
                            capture_output=True, text=True, timeout=300, start_new_session=True)
    assert replay.returncode == 0, replay.stderr[-4000:]
    assert_every_row_once(topic_values(config, reader, "out"), ROWS, BATCHES)
    assert REPLAYED.search(replay.stderr), "no batch was replayed"
    assert cluster.alive_workers() == 2
