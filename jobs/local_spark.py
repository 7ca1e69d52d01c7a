"""A local SparkSession for the demo, benchmarks and tests: this Python on the driver and the
workers, loopback only, the checkout importable by the workers."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def local_spark(app: str, cores: int = 2, task_retries: int = 1):
    """``local[cores,task_retries]`` with a small footprint; the env is set before the JVM starts."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    checkout = str(Path(__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (checkout, os.environ.get("PYTHONPATH")) if p)
    from pyspark.sql import SparkSession

    return (SparkSession.builder.master(f"local[{cores},{task_retries}]").appName(app)
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", str(cores))
            .config("spark.driver.memory", "1g")
            .config("spark.sql.streaming.stopTimeout", "30s")
            .getOrCreate())
