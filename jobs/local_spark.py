"""A local SparkSession for the demo, benchmarks and tests: this Python on the driver and the
workers, loopback only, the checkout importable by the workers.

Jobs take theirs from :func:`job_spark`: the cluster's session when Spark started the process
(``spark-submit``, a Databricks task), else this local one.

With ``delta=True`` the session can read and write Delta tables: the Delta jar
(:data:`DELTA_PACKAGE`) and its dependencies are resolved by Spark's Ivy from Maven Central into
``.cache/ivy`` of the checkout (git-ignored) the first time, and taken from there afterwards.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
#: Where Spark's Ivy keeps the Delta jar and its dependencies (``spark.jars.ivy``).
IVY_DIR = CHECKOUT / ".cache" / "ivy"
_DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
#: The Delta jar for pyspark 4.2 (the artifact name carries Spark's major.minor and Scala's
#: version, as in ``delta.configure_spark_with_delta_pip``). It is 4.4.0, not the 4.4.1 of the
#: pinned ``delta-spark`` Python package: Maven Central has no 4.4.1 jar (the Python package
#: only wraps the jar's classes, and this code uses none of its API).
DELTA_PACKAGE = "io.delta:delta-spark_4.2_2.13:4.4.0"


def local_spark(app: str, cores: int = 2, task_retries: int = 1, delta: bool = False):
    """``local[cores,task_retries]`` with a small footprint; the env is set before the JVM starts.

    ``delta=True`` adds the Delta jar (:data:`DELTA_PACKAGE` as ``spark.jars.packages``, cached
    in :data:`IVY_DIR`), its SQL extension and its catalog. Jars are only loaded when the JVM
    starts: if this process already runs a Spark JVM without Delta (a session made earlier with
    ``delta=False``), that JVM is stopped and a new one started.
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(CHECKOUT), os.environ.get("PYTHONPATH")) if p)
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(f"local[{cores},{task_retries}]").appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", str(cores))
               .config("spark.driver.memory", "1g")
               .config("spark.sql.streaming.stopTimeout", "30s"))
    if delta:
        _stop_jvm_without_delta()
        IVY_DIR.mkdir(parents=True, exist_ok=True)
        builder = (builder.config("spark.jars.packages", DELTA_PACKAGE)
                   .config("spark.jars.ivy", str(IVY_DIR))
                   .config("spark.sql.extensions", _DELTA_EXTENSION)
                   .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
                   # The log's state is rebuilt in this many tasks (default 50: slow for small tables).
                   .config("spark.databricks.delta.snapshotPartitions", str(cores)))
    return builder.getOrCreate()


def launched_by_spark() -> bool:
    """Whether Spark started this Python process as a driver (``spark-submit``, which hands it the
    JVM's gateway, or a Databricks task)."""
    return bool(os.environ.get("PYSPARK_GATEWAY_PORT") or os.environ.get("DATABRICKS_RUNTIME_VERSION"))


def job_spark(app: str, delta: bool = False):
    """A job's session and whether the job owns it (and should stop it when done): the session
    of the cluster that started this process (:func:`launched_by_spark`; its master, jars and
    settings are the submitter's, so Delta must be there already), else :func:`local_spark`."""
    if launched_by_spark():
        from pyspark.sql import SparkSession

        return SparkSession.builder.appName(app).getOrCreate(), False
    return local_spark(app, delta=delta), True


def _stop_jvm_without_delta() -> None:
    """Stop this process's Spark JVM if it was started without the Delta jar, so the next
    session starts one with it (``spark.jars.packages`` is read only at JVM start)."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    gateway = SparkContext._gateway
    if gateway is None:
        return
    if gateway.jvm.org.apache.spark.util.Utils.classIsLoadable(_DELTA_EXTENSION):
        return
    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
    if SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.stop()
    proc = getattr(gateway, "proc", None)
    gateway.shutdown()
    if proc is not None:  # the JVM exits when its stdin closes
        proc.stdin.close()
        proc.wait(timeout=60)
    SparkContext._gateway = None
    SparkContext._jvm = None


def wait_for_running_tasks(spark, timeout_s: float = 10) -> None:
    """Until the tasks of a stopped query have ended (Spark cancels them, and logs that as
    errors), so what runs next has the cores, and the log, to itself."""
    import time

    deadline = time.monotonic() + timeout_s
    tracker = spark.sparkContext.statusTracker()
    while time.monotonic() < deadline and (tracker.getActiveStageIds()
                                           or any(e.numRunningTasks for e in tracker.getExecutorInfos())):
        time.sleep(0.1)
