"""Clients kept for the life of a process: Spark reuses Python workers across tasks and batches,
so a sink task's S3 client, the driver-side commit's writer and a source's reader are built once
per config, and closed at exit (or by :func:`close_all`). Only a client that was built is kept:
one whose creation failed (its bounded connect gave up) is not, so the next call tries again. A
kept client rides through a restart of Oxia or the S3 server (:mod:`llog.coordination`,
:mod:`llog.objects`)."""

from __future__ import annotations

import atexit
import gc
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

from llog.config import Config

if TYPE_CHECKING:  # imported where first built: a Spark planner needs Oxia only, a task S3 too
    from llog.coordination import Coordination
    from llog.objects import ObjectStore
    from llog.reader import LogReader
    from llog.topics import TopicCache
    from llog.writer import LogWriter

C = TypeVar("C")


class _PerConfig(Generic[C]):
    def __init__(self, make: Callable[[Config], C]):
        self._make = make
        self._clients: dict[Config, C] = {}
        self._lock = threading.Lock()

    def get(self, config: Config) -> C:
        with self._lock:
            client = self._clients.get(config)
            if client is None:
                client = self._clients[config] = self._make(config)
                _count_built()
            return client

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()


def _make_store(config: Config) -> ObjectStore:
    from llog.objects import ObjectStore

    return ObjectStore(config)


def _make_writer(config: Config) -> LogWriter:
    from llog.writer import LogWriter

    return LogWriter(config, auto_initialize=True)


def _make_reader(config: Config) -> LogReader:
    from llog.reader import LogReader

    return LogReader(config, coordination=coordination(config))


def _make_coordination(config: Config) -> Coordination:
    from llog.coordination import Coordination

    return Coordination(config)


_stores: _PerConfig[ObjectStore] = _PerConfig(_make_store)
_writers: _PerConfig[LogWriter] = _PerConfig(_make_writer)
_readers: _PerConfig[LogReader] = _PerConfig(_make_reader)
_coordinations: _PerConfig[Coordination] = _PerConfig(_make_coordination)
_topic_caches: dict[Config, TopicCache] = {}
_topic_caches_lock = threading.Lock()


def object_store(config: Config) -> ObjectStore:
    """What a task stages blobs with (S3 only)."""
    return _stores.get(config)


def log_writer(config: Config) -> LogWriter:
    """What the driver-side commit commits with."""
    return _writers.get(config)


def log_reader(config: Config) -> LogReader:
    """What a source's tasks read with (on the process's :func:`coordination`)."""
    return _readers.get(config)


def coordination(config: Config) -> Coordination:
    """The process's Oxia client: what a source plans with on the driver (no S3 client, no
    reader's modules), and what its readers and topic caches share."""
    return _coordinations.get(config)


def topic_cache(config: Config) -> TopicCache:
    """Topic records for a Spark task that places rows by a topic's partition count or
    compresses by its ``compression.type`` (docs/protocol.md section 10), on the process's
    :func:`coordination`. It creates nothing: a missing topic is created, or grown, by the
    batch's commit on the driver, so a batch that fails creates nothing."""
    from llog.topics import TopicCache

    with _topic_caches_lock:
        cache = _topic_caches.get(config)
        if cache is None:
            cache = _topic_caches[config] = TopicCache(coordination(config), config, auto_create=False)
            _count_built()
        return cache


_built = 0  # clients this process has built and keeps
_frozen_at: int | None = None  # how many it had built at the last freeze
_built_lock = threading.Lock()


def _count_built() -> None:
    global _built
    with _built_lock:
        _built += 1


def freeze_kept_objects() -> None:
    """Hide what this process holds now from the cyclic garbage collector: the first time, and
    again once it has built more clients (say a worker that ran a sink's tasks reading a source).

    Spark's Python worker runs ``gc.collect()`` after every task it runs (``pyspark/daemon.py``),
    tasks and driver-side commits alike, and a reused worker keeps what llog built for its first
    task: modules, the Oxia and S3 clients, botocore's service model, about 180,000 objects that
    every collection would trace again (0.1 s each here, before the worker takes its next task).
    The Spark entry points call this when a task ends; later collections then trace only what
    was made since. A frozen object is still freed when its last reference goes: only a cycle
    among frozen objects is never collected, so garbage is collected first and what is frozen is
    what the process keeps anyway. Not for processes that are not Spark's workers: a user's
    driver keeps objects of its own."""
    global _frozen_at
    with _built_lock:
        if _frozen_at == _built:
            return
        _frozen_at = _built
    gc.collect()
    gc.freeze()


def close_all() -> None:
    """Close every kept client (at exit, or when their stack goes away)."""
    with _topic_caches_lock:
        _topic_caches.clear()
    _readers.close()  # before the Oxia client they share
    _coordinations.close()
    _writers.close()
    _stores.close()


atexit.register(close_all)
