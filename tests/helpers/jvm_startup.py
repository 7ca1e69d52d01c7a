"""Spark drivers that start on a third of the CPU, for the tests (tests/conftest.py sets
``SPARK_SUBMIT_OPTS`` for the session, so every ``spark-submit`` the tests start, in process or
not, gets it).

A test's Spark driver lives seconds and handles little data, and the suite starts hundreds of
them on two cores: most of a driver's CPU is the JVM starting, loading and compiling Spark's
classes, not the test's work. Measured on this machine for a local session that runs one small
query (machine-wide CPU seconds, 2026-12-02): 22 by default, 11.5 with C1 alone
(``-XX:TieredStopAtLevel=1``: no C2 compiler threads optimizing code the test runs twice) and the
serial GC, 7 with Spark's classes from a class-data-sharing archive as well (JDK 17's dynamic
AppCDS, written once under ``.cache/spark-cds`` by a probe session that exits cleanly).

Only the tests do this: a long-running job wants C2's faster code and the parallel GC. A driver
whose class path differs from the archive's (a Spark Connect server, say) starts without it, as
it would anyway; ``-Xlog:disable`` keeps the JVM's CDS warnings out of the output tests read.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

#: C1 alone and the serial GC (module doc).
QUICK_START = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
CHECKOUT = Path(__file__).resolve().parents[2]
ARCHIVE_DIR = CHECKOUT / ".cache" / "spark-cds"
#: A session that loads the classes a test's driver uses: SQL, an aggregation, Arrow and a
#: Python worker (a Python UDF), a write.
_PROBE = """
from jobs.local_spark import local_spark
from pyspark.sql.functions import udf
spark = local_spark("spark-cds-probe")
df = spark.range(1000).selectExpr("id % 7 AS k", "id").groupBy("k").count()
df.select(udf(lambda k: k + 1, "long")("k")).collect()
spark.createDataFrame([("a", b"b")], "key string, value binary").toPandas()
spark.range(10).write.format("noop").mode("overwrite").save()
spark.stop()
"""


def _archive_path() -> Path:
    """The archive of this JVM, pyspark and flags (a change of any of them makes another)."""
    import pyspark

    java = os.path.realpath(os.path.join(os.environ["JAVA_HOME"], "bin", "java")) if os.environ.get("JAVA_HOME") \
        else subprocess.run(["sh", "-c", "readlink -f \"$(command -v java)\""], capture_output=True, text=True,
                            timeout=10).stdout.strip()
    key = hashlib.sha1(f"{java}|{pyspark.__version__}|{pyspark.__file__}|{QUICK_START}".encode()).hexdigest()[:12]
    return ARCHIVE_DIR / f"spark-{pyspark.__version__}-{key}.jsa"


def spark_submit_opts() -> str:
    """The ``SPARK_SUBMIT_OPTS`` for the tests: :data:`QUICK_START`, and the class-data archive
    (written by a probe session first when missing, about 20 s once; without it if that fails)."""
    archive = _archive_path()
    if not archive.is_file():
        ARCHIVE_DIR.mkdir(parents=True, exist_ok=True)
        partial = archive.with_suffix(f".{os.getpid()}.partial")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(CHECKOUT), os.environ.get("PYTHONPATH")) if p),
               "SPARK_SUBMIT_OPTS": f"{QUICK_START} -XX:ArchiveClassesAtExit={partial} -Xlog:disable"}
        try:
            subprocess.run([sys.executable, "-c", _PROBE], cwd=CHECKOUT, env=env, capture_output=True, timeout=300,
                           check=True)
        except (subprocess.SubprocessError, OSError) as e:
            print(f"tests: Spark drivers start without a class-data archive ({type(e).__name__}: {e})", file=sys.stderr)
        if partial.is_file():
            partial.rename(archive)
    if not archive.is_file():
        return QUICK_START
    return f"{QUICK_START} -XX:SharedArchiveFile={archive} -Xlog:disable"


def quick_start_env() -> dict[str, str]:
    """The tests' ``SPARK_SUBMIT_OPTS`` (set by tests/conftest.py), for an environment built
    without the caller's ``SPARK_*`` variables: empty when it is not set."""
    opts = os.environ.get("SPARK_SUBMIT_OPTS")
    return {"SPARK_SUBMIT_OPTS": opts} if opts else {}
