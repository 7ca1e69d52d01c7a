"""pyspark_llog.register's input check (the registration itself, on a Spark Connect server whose
lookup misses llog, is in tests/integration/test_spark_connect.py)."""

from __future__ import annotations

import pytest

import pyspark_llog


def test_register_refuses_what_is_not_a_session_naming_it():
    with pytest.raises(TypeError, match="needs a SparkSession of pyspark >= 4.0, not SparkContext"):
        pyspark_llog.register(type("SparkContext", (), {})())

