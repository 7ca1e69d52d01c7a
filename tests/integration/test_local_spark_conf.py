"""The local Spark session (jobs/local_spark.py) takes its settings from conf/spark-defaults.conf
and starts quietly: no Ivy resolution output, no log4j banner; the Python processes Spark starts
import the installed pyspark, not the copy in pyspark.zip. Each session starts in a
subprocess, so its JVM's stdout and stderr are the test's to read (and no JVM of this process is
touched)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pyspark

from jobs.local_spark import (CHECKOUT, RESOLVE_LOCK_FILE, RESOLVED_JARS_FILE, _resolution_key, is_delta_key,
                              resolved_jars, spark_defaults, spark_home_without_zip)

#: Started in a subprocess: a session, then one JSON line of what the test checks.
SESSION_SCRIPT = """
import json, sys, tempfile
from jobs.local_spark import local_spark

delta = sys.argv[1] == "delta"
spark = local_spark("llog-conf-test", cores=3, delta=delta)
conf = spark.sparkContext.getConf()
report = {"conf": dict(conf.getAll()),
          "root_level": str(spark._jvm.org.apache.logging.log4j.LogManager.getRootLogger().getLevel())}
# setLogLevel reaches Spark's, Delta's and Parquet's loggers (a logger the file names keeps its
# own level): which of them still log warnings once the session asks for errors only.
spark.sparkContext.setLogLevel("ERROR")
log_manager = spark._jvm.org.apache.logging.log4j.LogManager
report["warn_after_set_error"] = [name for name in (
    "org.apache.spark.sql.execution.streaming.MicroBatchExecution", "org.apache.spark.scheduler.TaskSetManager",
    "io.delta.sql.DeltaSparkSessionExtension", "org.apache.parquet.hadoop.ParquetOutputFormat")
    if log_manager.getLogger(name).isWarnEnabled()]
spark.sparkContext.setLogLevel("WARN")
# Where a Python worker Spark started took pyspark from.
report["worker_pyspark"] = spark.sparkContext.parallelize([0], 1).map(
    lambda _: __import__("pyspark").__file__).collect()[0]
if delta:
    with tempfile.TemporaryDirectory() as table:
        spark.range(7).write.format("delta").mode("overwrite").save(table)
        report["delta_rows"] = spark.read.format("delta").load(table).count()
spark.stop()
print("REPORT " + json.dumps(report), flush=True)
"""

#: The one line a quiet start still prints: the JVM's own warning for the incubator module
#: Spark's launcher always adds (--add-modules=jdk.incubator.vector); no setting removes it.
JVM_WARNING = "WARNING: Using incubator modules: jdk.incubator.vector"
#: Markers of what the conf files are there to silence.
NOISE = ("repos.spark-packages.org", ":: resolving", "Ivy Default Cache", ":: loading settings",
         "added as a dependency", ":: resolution report", ":: retrieving", "log4j profile",
         "Setting default log level", "NativeCodeLoader")


def start_session(delta: bool) -> tuple[dict, list[str]]:
    """What the session reported, and every other line its process printed (stdout and stderr)."""
    run = subprocess.run([sys.executable, "-c", SESSION_SCRIPT, "delta" if delta else "plain"], cwd=CHECKOUT,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    lines = (run.stdout + run.stderr).splitlines()
    reports = [json.loads(line[len("REPORT "):]) for line in lines if line.startswith("REPORT ")]
    assert len(reports) == 1, run.stdout[-2000:]
    return reports[0], [line for line in lines if line.strip() and not line.startswith("REPORT ")]


@pytest.fixture(scope="module")
def warm_ivy_cache():
    """Resolve the Delta jar once if no earlier session recorded its jars (a fresh checkout: Ivy
    downloads them from Maven Central, printing its report), so the test sees a warm start."""
    if resolved_jars(spark_defaults(delta=True)) is None:
        start_session(delta=True)
    jars = resolved_jars(spark_defaults(delta=True))
    assert jars, "the Delta session did not record the jars Ivy retrieved"
    return jars


def assert_quiet(output: list[str]) -> None:
    for marker in NOISE:
        assert not [line for line in output if marker in line], f"{marker!r} in the output:\n" + "\n".join(output)
    assert set(output) <= {JVM_WARNING}, "unexpected output:\n" + "\n".join(output)


def assert_has_settings(conf: dict[str, str], expected: dict[str, str]) -> None:
    """``conf`` (the session's) has ``expected``; Spark puts its own JVM options before ours."""
    actual = {k: conf.get(k) for k in expected}
    for key in [k for k in expected if k.endswith("extraJavaOptions") and actual[k]]:
        actual[key] = actual[key][actual[key].find(expected[key]):]
    assert actual == expected


def test_delta_session_starts_quietly_with_the_conf_files_settings(warm_ivy_cache):
    report, output = start_session(delta=True)
    assert_quiet(output)
    conf = report["conf"]
    # Every setting of the file, but the resolution's: the recorded jars replace those.
    assert_has_settings(conf, {k: v for k, v in spark_defaults(cores=3, delta=True).items()
                               if not k.startswith("spark.jars.")})
    assert conf["spark.sql.shuffle.partitions"] == "3" and conf["spark.databricks.delta.snapshotPartitions"] == "3"
    assert "spark.jars.packages" not in conf and "spark.jars.ivySettings" not in conf
    loaded = conf["spark.jars"].split(",")
    assert all(any(str(jar) in uri for uri in loaded) for jar in warm_ivy_cache)
    assert report["root_level"] == "WARN"  # conf/log4j2.properties, not Spark's default profile
    assert report["warn_after_set_error"] == []  # the demo and benches quiet a query's stop this way
    assert report["delta_rows"] == 7  # the jars are on the classpath: Delta writes and reads


def test_plain_session_has_no_delta_settings():
    report, output = start_session(delta=False)
    assert_quiet(output)
    conf = report["conf"]
    assert_has_settings(conf, spark_defaults(cores=3))
    assert not [k for k in conf if is_delta_key(k)]
    assert "delta" not in conf.get("spark.jars", "")
    assert report["root_level"] == "WARN"
    # Not from $SPARK_HOME/python/lib/pyspark.zip, compiled anew by each process (module doc there).
    assert report["worker_pyspark"] == pyspark.__file__


def test_spark_home_without_zip_links_the_installed_pyspark(tmp_path):
    package = Path(pyspark.__file__).parent
    assert (package / "python" / "lib" / "pyspark.zip").is_file()  # what it is there to avoid
    home = spark_home_without_zip(tmp_path)
    assert home is not None and home.parent == tmp_path
    assert sorted(p.name for p in home.iterdir()) == ["bin", "jars"]
    assert (home / "bin" / "spark-submit").resolve() == (package / "bin" / "spark-submit").resolve()
    assert spark_home_without_zip(tmp_path) == home  # made once
    (home / "jars").unlink()  # damaged: removed (Spark runs as it would), then made again
    assert spark_home_without_zip(tmp_path) is None and not home.exists()
    assert spark_home_without_zip(tmp_path) == home and (home / "jars").resolve() == (package / "jars").resolve()
    (tmp_path / "file").touch()
    assert spark_home_without_zip(tmp_path / "file" / "below") is None  # cannot be made


#: Started in a subprocess of a copy of the checkout: a Delta session, and the jars it loaded.
WAITING_SESSION_SCRIPT = """
import json
from jobs.local_spark import local_spark

spark = local_spark("llog-conf-test-waits", delta=True)
conf = dict(spark.sparkContext.getConf().getAll())
spark.stop()
print("REPORT " + json.dumps({"jars": conf.get("spark.jars", ""), "packages": conf.get("spark.jars.packages")}),
      flush=True)
"""


def opened_by(pid: int, path: Path) -> bool:
    try:
        return any(Path(f"/proc/{pid}/fd/{fd}").resolve() == path for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


def test_a_session_waits_for_another_processs_resolution_and_loads_what_it_recorded(warm_ivy_cache, tmp_path):
    """Ivy's cache is not safe for two resolutions at once: on a fresh clone, pytest's workers
    started Delta sessions together and each JVM exited before Spark started (``unresolved
    dependency``, a ``.part`` file another resolution had moved). A session that finds no record
    waits for the process resolving, then loads the jars it recorded without running Ivy."""
    checkout = tmp_path / "checkout"
    for part in ("jobs", "conf"):
        shutil.copytree(CHECKOUT / part, checkout / part)
    ivy = checkout / ".cache" / "ivy"
    (ivy / "jars").mkdir(parents=True)
    lock = ivy / RESOLVE_LOCK_FILE
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as a session resolving in another process holds it
        session = subprocess.Popen([sys.executable, "-c", WAITING_SESSION_SCRIPT], cwd=checkout,
                                   env={**os.environ, "PYTHONPATH": os.pathsep.join([str(checkout), str(CHECKOUT)])},
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 120
            while not opened_by(session.pid, lock.resolve()):
                assert session.poll() is None, "the session did not wait: " + session.stdout.read()[-3000:]
                assert time.monotonic() < deadline, "the session did not take the resolution lock in 120 s"
                time.sleep(0.1)
            time.sleep(1)  # it waits: nothing resolves while the lock is held
            assert session.poll() is None and not (ivy / "cache").exists()
            # What the other process's resolution leaves: the jars, and the record of them.
            for jar in warm_ivy_cache:
                (ivy / "jars" / jar.name).symlink_to(jar)
            resolved_for = {k: v.replace(str(CHECKOUT), str(checkout))
                            for k, v in _resolution_key(spark_defaults(delta=True)).items()}
            (ivy / RESOLVED_JARS_FILE).write_text(json.dumps(
                {"resolved_for": resolved_for, "jars": [f"jars/{jar.name}" for jar in warm_ivy_cache]}))
        except BaseException:
            session.kill()
            raise
    output, _ = session.communicate(timeout=600)
    assert session.returncode == 0, output[-4000:]
    assert ":: resolving" not in output and not (ivy / "cache").exists(), output  # Ivy did not run
    report = json.loads(next(line for line in output.splitlines() if line.startswith("REPORT "))[len("REPORT "):])
    assert report["packages"] is None
    assert all(str(ivy / "jars" / jar.name) in report["jars"] for jar in warm_ivy_cache), report
