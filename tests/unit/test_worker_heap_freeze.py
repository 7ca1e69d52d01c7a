"""Spark's Python worker collects garbage after every task (``pyspark/daemon.py``); llog's Spark
entry points freeze what a worker keeps once its first task ends (``freeze_kept_objects``). Each
check runs in a new interpreter: a freeze is for the life of a process."""

from __future__ import annotations

import subprocess
import sys


def run(code: str) -> None:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_kept_objects_are_frozen_once_per_process():
    run("""
import gc
from llog.process_clients import freeze_kept_objects
assert gc.get_freeze_count() == 0
freeze_kept_objects()
frozen = gc.get_freeze_count()
assert frozen > 1000, frozen
made_later = [[] for _ in range(1000)]
freeze_kept_objects()
assert gc.get_freeze_count() == frozen, (gc.get_freeze_count(), frozen)
""")


def test_a_source_task_freezes_after_its_last_batch_not_before():
    run("""
import gc
from llog_source.spark_readers import _then_freeze
batches = _then_freeze(iter(["first", "second"]))
assert next(batches) == "first" and gc.get_freeze_count() == 0
assert list(batches) == ["second"] and gc.get_freeze_count() > 0
""")


def test_a_source_task_that_fails_freezes_nothing():
    run("""
import gc
from llog_source.spark_readers import _then_freeze
def broken():
    yield "first"
    raise OSError("S3 went away")
batches = _then_freeze(broken())
assert next(batches) == "first"
try:
    next(batches)
except OSError:
    pass
else:
    raise AssertionError("the task's error was swallowed")
assert gc.get_freeze_count() == 0
""")
