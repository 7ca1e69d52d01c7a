"""What a module pulls in when imported. Spark starts a fresh Python process for a stream's planner
(``python_streaming_source_runner``), whose imports are on every query's start-up path: the
source's planner needs Oxia, never the S3 client, the reader or the writer (those are imported in
the tasks). Each check runs in a new interpreter, since this one has imported everything."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: What no driver-side planning may import: the read and write paths, S3 and boto3; and the
#: ``oxia`` package (betterproto2, pydantic: 0.11 s) and tenacity (with tornado: 0.05 s), which
#: only claims and retries need (``llog.coordination``).
READ_WRITE_PATH = ["llog.reader", "llog.writer", "llog.objects", "llog.codec", "llog_source.partition_reader",
                   "boto3", "botocore", "oxia", "betterproto2", "pydantic", "tenacity"]


def loaded_after(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nimport json\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.parametrize("statement", [
    "import llog_source.spark_readers",
    "from pyspark_llog import DefaultSource",
    "import llog.config",
])
def test_planning_imports_no_read_or_write_path(statement):
    loaded = loaded_after(statement)
    assert not loaded & set(READ_WRITE_PATH), sorted(loaded & set(READ_WRITE_PATH))


def test_the_source_planner_has_oxia_and_a_split_reader_imports_the_rest():
    assert "llog.coordination" in loaded_after("import llog_source.spark_readers")
    loaded = loaded_after("from llog_source.partition_reader import read_split")
    assert {"llog.reader", "llog.objects", "llog.codec"} <= loaded


def test_the_package_api_is_there_on_first_use():
    loaded = loaded_after("import llog\nassert 'llog.writer' not in sys.modules\n"
                          "from llog import AppendGroup, Config, LogReader, LogWriter, ReadRequest, RECORD_SCHEMA\n"
                          "assert LogWriter.__module__ == 'llog.writer' and LogReader.__module__ == 'llog.reader'\n"
                          "assert sorted(llog.__all__) == sorted(n for n in dir(llog) if n in llog.__all__)")
    assert {"llog.reader", "llog.writer", "llog.config"} <= loaded


def test_an_unknown_package_attribute_is_an_attribute_error():
    import llog

    with pytest.raises(AttributeError, match="no attribute 'LogWritr'"):
        llog.LogWritr  # noqa: B018
