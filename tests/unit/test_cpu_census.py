"""tests/cpu_census.py: what it calls each kind of process, and a census of a real command."""

from __future__ import annotations

import sys

from tests.cpu_census import census, kind, module_of

SPARK_CLASSPATH = ["/usr/lib/jvm/java-17/bin/java", "-cp", "/x/jars/*", "-Xmx1g"]


def test_kinds_from_command_lines():
    assert kind(SPARK_CLASSPATH + ["org.apache.spark.deploy.SparkSubmit", "pyspark-shell"]) == "spark driver JVM"
    assert kind(SPARK_CLASSPATH[:3] + ["org.apache.spark.launcher.Main", "org.apache.spark.deploy.SparkSubmit"]) \
        == "spark launcher JVM"
    assert kind(SPARK_CLASSPATH + ["org.apache.spark.executor.CoarseGrainedExecutorBackend"]) == "spark executor JVM"
    assert kind(["/venv/bin/python", "-m", "pyspark.daemon", "pyspark.worker"]) == "spark python worker"
    assert kind(["/venv/bin/python3.11", "-u", "-c", "import sys;exec(eval(sys.stdin.readline()))"]) == "pytest worker"
    assert kind(["/venv/bin/python", "-m", "broker_lite", "--port", "1"]) == "broker"
    assert kind(["/venv/bin/python", "-m", "jobs.demo"]) == "python (other)"
    assert kind(["/repo/.cache/bin/oxia", "standalone"]) == "oxia"
    assert kind([]) == "other" and kind(["/bin/sh", "-c", "true"]) == "other"
    assert module_of("tests/integration/test_x.py::test_y[a::b] (call)") == "tests/integration/test_x.py"


def test_a_census_files_a_busy_childs_cpu_under_its_kind():
    """The child's own row; the totals count every process on the machine (in make test, the other
    workers' too), so they are only at least the child's."""
    status, summary, rows = census([sys.executable, "-c", "import time\nt = time.process_time()\n"
                                    "while time.process_time() - t < 1.0: pass"], every_s=0.1)
    assert status == 0
    child = [r for r in rows if r["pid"] == summary["pid"]]
    assert len(child) == 1 and child[0]["kind"] == "python (other)", child
    assert 0.5 <= child[0]["cpu"] <= 1.5, child  # its last sample may be a loaded machine's moment before its end
    assert summary["by_kind"]["python (other)"] >= child[0]["cpu"] - 0.05, summary  # totals are rounded
    assert summary["machine_cpu_s"] >= child[0]["cpu"] - 0.2, summary


def test_a_shell_that_execs_is_filed_as_what_it_became():
    """spark-class is a bash script that execs the JVM: the process is read again after the exec."""
    busy = f"sleep 0.3; exec {sys.executable} -c 'import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass'"
    status, summary, rows = census(["bash", "-c", busy], every_s=0.05)
    assert status == 0
    child = [r for r in rows if r["pid"] == summary["pid"]]
    assert len(child) == 1 and child[0]["kind"] == "python (other)" and child[0]["cpu"] >= 0.25, child
