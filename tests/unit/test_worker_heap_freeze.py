"""Spark's Python worker collects garbage after every task (``pyspark/daemon.py``); llog's Spark
entry points freeze what a worker keeps when a task ends, the first time and after the worker
built more clients (``freeze_kept_objects``). Each check runs in a new interpreter: a freeze is for
the life of a process."""

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


def test_a_worker_that_builds_more_clients_freezes_again_without_the_garbage():
    run("""
import gc
import weakref
from llog.config import Config
from llog.process_clients import _PerConfig, freeze_kept_objects
freeze_kept_objects()  # a sink's first task ended
frozen = gc.get_freeze_count()
kept = _PerConfig(lambda config: [[] for _ in range(1000)])  # a reader with its modules, say
client = kept.get(Config.load(env={}))
class Garbage:
    pass
garbage = Garbage()
garbage.itself = garbage  # a cycle the task left behind
gone = weakref.ref(garbage)
del garbage
freeze_kept_objects()  # a source's first task ended in that worker
assert gc.get_freeze_count() >= frozen + 1000, (gc.get_freeze_count(), frozen)
assert gone() is None, "the cycle was frozen, never to be collected"
again = gc.get_freeze_count()
freeze_kept_objects()  # nothing new built: nothing to do
assert gc.get_freeze_count() == again
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
