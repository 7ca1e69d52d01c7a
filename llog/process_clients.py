"""Clients kept for the life of a process: Spark reuses Python workers across tasks and batches,
so a sink task's S3 client, the driver-side commit's writer and a source's reader are built once
per config, and closed at exit (or by :func:`close_all`). Only a client that was built is kept:
one whose creation failed (its bounded connect gave up) is not, so the next call tries again. A
kept client rides through a restart of Oxia or the S3 server (:mod:`llog.coordination`,
:mod:`llog.objects`)."""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from llog.config import Config
from llog.coordination import Coordination
from llog.objects import ObjectStore
from llog.reader import LogReader
from llog.topics import TopicCache
from llog.writer import LogWriter

C = TypeVar("C", ObjectStore, LogWriter, LogReader, Coordination)


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
            return client

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()


_stores = _PerConfig(ObjectStore)
_writers = _PerConfig(lambda config: LogWriter(config, auto_initialize=True))
_readers = _PerConfig(LogReader)
_coordinations = _PerConfig(Coordination)
_topic_caches: dict[Config, TopicCache] = {}
_topic_caches_lock = threading.Lock()


def object_store(config: Config) -> ObjectStore:
    """What a task stages blobs with (S3 only)."""
    return _stores.get(config)


def log_writer(config: Config) -> LogWriter:
    """What the driver-side commit commits with."""
    return _writers.get(config)


def log_reader(config: Config) -> LogReader:
    """What a source reads with: its Oxia client plans on the driver, its S3 client fetches in
    the tasks."""
    return _readers.get(config)


def topic_cache(config: Config) -> TopicCache:
    """Topic records for a Spark task that places rows by a topic's partition count or
    compresses by its ``compression.type`` (docs/topics.md; creates a missing topic when
    ``LLOG_AUTO_CREATE_TOPICS`` allows), on an Oxia client of its own."""
    with _topic_caches_lock:
        cache = _topic_caches.get(config)
        if cache is None:
            cache = _topic_caches[config] = TopicCache(_coordinations.get(config), config)
        return cache


def close_all() -> None:
    """Close every kept client (at exit, or when their stack goes away)."""
    with _topic_caches_lock:
        _topic_caches.clear()
    _coordinations.close()
    _readers.close()
    _writers.close()
    _stores.close()


atexit.register(close_all)
