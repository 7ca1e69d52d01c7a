"""``POST /consume``: stateless fetches (the client sends ``fetch_offset`` each time), many
partitions per request, bounded in bytes, answered from the tail cache where it can and from
Oxia and S3 (``LogReader.fetch``: one GET per shared blob for the request) where it cannot, with
Kafka's long poll: wait up to ``max_wait_ms`` until ``min_bytes`` of records are there.

A waiting consumer is woken, not polled for:
- by a local produce: the group commit calls :meth:`ConsumeService.produced` for every durable
  batch, which caches its records and wakes the consumers waiting on its partition at once;
- by another writer (a Spark job, another broker): one probe task reads the high watermarks of
  every partition someone waits on, all in one multi-key Oxia read, every
  :data:`PROBE_INTERVAL_S` while anyone waits, and wakes those whose partition moved past what
  they have. No waiter, no probe.

A consumer is registered before each fetch, so a produce that commits while the fetch runs still
wakes it. Reader calls run in a thread pool, never on the event loop; at most
:data:`MAX_PENDING_FETCHES` queue for it, and past that (or :data:`MAX_WAITERS` long polls) a
request is refused with :class:`ConsumeBusy` (503, ``Retry-After``).

Retention (docs/protocol.md section 10.3): every ok result and every ``OffsetOutOfRange`` one carries
the partition's log start offset, as Kafka's fetch response does. A fetch outside the readable
offsets (below the log start, or past the high watermark + 1) answers that partition with
``OffsetOutOfRange``, or, as the request's ``auto_offset_reset`` says, is read again from the log
start (``earliest``) or the log end (``latest``); a partition reset so is read from its new offset
for the rest of the request (a long poll waits there).

Incarnations (docs/protocol.md section 12): a topic deleted and created again is another incarnation
(another ``topic_id``) whose offsets start at 1 again. Every cached run is of the incarnation its
append was reserved under, and a tail cache answers a partition only with runs of the incarnation
a read of its ``meta/control`` resolved (the topic record as the reader caches it, read again when
that control is a tombstone or missing), within :data:`LOG_START_MAX_AGE_S`; a read that finds
another incarnation drops the cached one. Every ok result names the ``topic_id`` its records are
of, so a client can tell a re-created topic and commit its offsets to the incarnation it read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

import msgspec
import pyarrow as pa

from broker_lite.batcher import payload_bytes
from broker_lite.models import (
    ConsumedHeader, ConsumedRecord, ConsumePartition, ConsumeRequest, ConsumeResponse, ConsumeResult,
)
from broker_lite.tail_cache import TailCache, TailCacheDir
from llog.codec import V2_SCHEMA, Records, concat_records, nulls, to_records
from llog.config import Config
from llog.errors import LlogError, OffsetOutOfRange, PartitionNotInitialized, TopicNotFound, TopicRecreated
from llog.keys import PartitionKeys, TopicPartition, validate_partition, validate_topic
from llog.reader import FetchRequest, Fetched, LogReader
from llog.records import ControlRecord
from llog.writer import AppendGroup, AppendResult

log = logging.getLogger(__name__)
#: What :meth:`ConsumeService.fetch`'s caller makes of each partition's outcome.
R = TypeVar("R")

#: How often the probe reads the high watermarks of the partitions consumers wait on.
PROBE_INTERVAL_S = 0.025
#: Reader fetches queued or running at once before a consume is refused with 503.
MAX_PENDING_FETCHES = 64
#: Long polls waiting at once before a consume is refused with 503.
MAX_WAITERS = 10_000
#: Threads running reader fetches (mostly waiting on S3 and Oxia, with the GIL released). 8, not
#: 16: on the local stack the broker is bound by its interpreter lock, and 16 threads contending
#: for it served 150-170k records/s on a miss where 8 served 200-220k (4: 150-190k).
FETCH_THREADS = 8
#: How long a partition's log start offset and incarnation, once read, let the tail caches answer
#: without reading them again (see :meth:`ConsumeService._cacheable`).
LOG_START_MAX_AGE_S = 1.0
#: Resets (``auto_offset_reset``) of one partition in one pass: a retention pass that moves the
#: log start again between the reset and the read makes the read out of range once more.
MAX_RESETS = 3


class ConsumeBusy(LlogError):
    """Too many consumes are fetching or waiting; retry after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: int = 1):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class _Known(NamedTuple):
    """What a read of a partition's ``meta/control`` found: its log start offset and the
    ``topic_id`` of the incarnation it is of (both None: no such partition, or its incarnation
    was deleted), and the ``time.monotonic()`` the read began at."""

    log_start: int | None
    topic_id: str | None
    at: float


@dataclass(eq=False)  # hashed by identity: kept in sets
class _Waiter:
    event: asyncio.Event
    #: Per partition: the offset whose commit would give this consumer something new.
    wanted: dict[TopicPartition, int]


@dataclass
class ConsumeStats:
    """What one consume did (for metrics)."""

    records: int = 0
    bytes: int = 0
    partitions: int = 0
    errors: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    long_poll: str | None = None  # "hit" (woken with records) or "timeout"
    #: The most record bytes one pass held (what the answer costs in memory).
    peak_bytes: int = 0


class ConsumeService:
    def __init__(self, reader: LogReader, config: Config, serves_reads: bool = True):
        """``serves_reads=False``: a write-only broker, which only writes runs to the shared
        directory (``LLOG_TAIL_CACHE_DIR``) for the readers of this machine."""
        self.reader = reader
        self.root = config.root_prefix
        self.cache = TailCache(config.tail_cache_max_bytes if serves_reads else 0)
        #: The directory shared with the other brokers of this machine (``LLOG_TAIL_CACHE_DIR``).
        self.shared = (TailCacheDir(config.tail_cache_dir, config.root_prefix, config.tail_cache_max_bytes)
                       if config.tail_cache_dir and config.tail_cache_max_bytes > 0 else None)
        self._files = ThreadPoolExecutor(1, thread_name_prefix="llog-broker-tail-files")
        self.max_wait_ms = config.broker_max_wait_ms
        self._pool = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="llog-broker-fetch")
        self._pending_fetches = 0
        self._waiters: set[_Waiter] = set()
        self._by_partition: dict[TopicPartition, set[_Waiter]] = {}
        self._probe: asyncio.Task | None = None
        self._closed = False
        #: Per partition: what the latest read of its ``meta/control`` found.
        self._known: dict[TopicPartition, _Known] = {}
        #: Per topic: the ``topic_id`` the latest read of any of its partitions found, and the
        #: ``time.monotonic()`` that read began at (a partition known of another is read again).
        self._latest_ids: dict[str, tuple[str, float]] = {}
        #: Called on the loop with each answered consume's :class:`ConsumeStats` (the metrics).
        self.observer: Callable[[ConsumeStats], None] | None = None

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    # --- produce side ---------------------------------------------------------------------------

    def produced(self, groups: Sequence[AppendGroup], outcomes: Sequence[object]) -> None:
        """A batch is durable (its offsets reserved; ``outcomes``: per group, its
        :class:`AppendResult` or its error; ``groups``: the batch's, records as Arrow arrays):
        cache each partition's records as one run (``append_shared`` gives a partition's groups
        consecutive offsets, in order) and wake the consumers waiting on it."""
        by_partition: dict[tuple[TopicPartition, str | None], list[tuple[AppendResult, Records]]] = {}
        for group, outcome in zip(groups, outcomes):
            if isinstance(outcome, AppendResult) and not outcome.duplicate:  # a duplicate's records are old
                tp = TopicPartition(outcome.topic, outcome.partition)
                records = group.records if _values_only(group) else _as_records(group)
                by_partition.setdefault((tp, outcome.topic_id), []).append((outcome, records))
        for (tp, topic_id), committed in by_partition.items():
            first, last = committed[0][0].start_offset, committed[-1][0].end_offset
            if topic_id is not None:
                records = concat_records([r for _, r in committed])
                created_at_ms = committed[0][0].created_at_ms
                self.cache.add(tp, topic_id, first, records, created_at_ms)
                # The shared directory holds values (bytes-batch-v1): records with more (a Kafka
                # client's keys, headers, times, tombstones) are read from the log by the others.
                if self.shared is not None and isinstance(records, pa.Array):
                    self._files.submit(self._share, tp, topic_id, first, records, created_at_ms)
            for waiter in self._by_partition.get(tp, ()):
                if last >= waiter.wanted[tp]:
                    waiter.event.set()

    async def wait_for(self, wanted: dict[TopicPartition, int], timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` until some partition of ``wanted`` has the offset it names
        committed (a produce here, or another writer the probe sees): True when woken, False on
        timeout, when too many wait (:data:`MAX_WAITERS`) or when the service closes. The Kafka
        listener's long poll; the probe also wakes a waiter whose offset was committed just
        before it registered."""
        if timeout_s <= 0 or not wanted or self._closed or len(self._waiters) >= MAX_WAITERS:
            return False
        waiter = _Waiter(asyncio.Event(), {})
        self._waiters.add(waiter)
        self._want(waiter, wanted)
        self._start_probe()
        try:
            await asyncio.wait_for(waiter.event.wait(), timeout_s)
            return not self._closed
        except TimeoutError:
            return False
        finally:
            self._want(waiter, {})
            self._waiters.discard(waiter)

    def _want(self, waiter: _Waiter, wanted: dict[TopicPartition, int]) -> None:
        """Set what ``waiter`` waits for (``{}``: nothing; it leaves the index)."""
        for tp in waiter.wanted.keys() - wanted.keys():
            self._by_partition[tp].discard(waiter)
            if not self._by_partition[tp]:
                del self._by_partition[tp]
        waiter.wanted = wanted
        for tp in wanted:
            self._by_partition.setdefault(tp, set()).add(waiter)

    def _share(self, tp: TopicPartition, topic_id: str, first: int, values, created_at_ms: int) -> None:
        try:
            self.shared.add(tp, topic_id, first, values, created_at_ms)
        except OSError as e:  # opportunistic: readers miss and go to Oxia and S3
            log.warning("cannot write to the tail cache directory %s: %s", self.shared.root, e)

    # --- consume --------------------------------------------------------------------------------

    async def consume(self, request: ConsumeRequest) -> ConsumeResponse:
        """Answer ``request`` (module doc); :class:`ConsumeBusy` when too busy."""
        response, stats = await self._consume(request)
        if self.observer is not None:
            try:
                self.observer(stats)
            except Exception:  # noqa: BLE001 - metrics never fail a consume
                log.exception("consume observer failed")
        return response

    async def _consume(self, request: ConsumeRequest) -> tuple[ConsumeResponse, ConsumeStats]:
        for p in request.topic_partitions:  # bad names are a 400 for the whole request
            validate_topic(p.topic)
            validate_partition(p.partition)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(request.max_wait_ms, self.max_wait_ms) / 1000
        stats = ConsumeStats()
        partitions = list(request.topic_partitions)  # a reset partition's fetch_offset moves
        results, nbytes = await self._pass(request, partitions, stats)
        if nbytes >= request.min_bytes or loop.time() >= deadline or any(not r.ok for r in results):
            return _response(results), stats
        if len(self._waiters) >= MAX_WAITERS:
            raise ConsumeBusy(f"{len(self._waiters)} consumers are long-polling, the most this broker holds")
        waiter = _Waiter(asyncio.Event(), {})
        self._waiters.add(waiter)
        self._start_probe()
        try:
            while True:
                self._want(waiter, _wanted(partitions, results))
                remaining = deadline - loop.time()
                if remaining <= 0:
                    stats.long_poll = "timeout"
                    break
                try:
                    await asyncio.wait_for(waiter.event.wait(), remaining)
                except TimeoutError:
                    stats.long_poll = "timeout"
                    break
                waiter.event.clear()  # registered before the fetch: a commit during it wakes us again
                if self._closed:
                    break
                results, nbytes = await self._pass(request, partitions, stats)
                if nbytes >= request.min_bytes:
                    stats.long_poll = "hit"
                    break
        finally:
            self._want(waiter, {})
            self._waiters.discard(waiter)
        if stats.long_poll == "timeout":  # what arrived in the last moment is still returned
            results, _ = await self._pass(request, partitions, stats)
        return _response(results), stats

    async def _pass(self, request: ConsumeRequest, partitions: list[ConsumePartition],
                    stats: ConsumeStats) -> tuple[list[ConsumeResult], int]:
        """One pass over the request's ``partitions``: fetch each, then reset the ones out of range
        as ``auto_offset_reset`` says (their new offsets replace theirs in ``partitions``) and
        fetch those again, with what is left of the request's bytes."""
        answered = await self._fetch(partitions, request.max_bytes, stats)
        for _ in range(MAX_RESETS):
            moved = {i: offset for i, (r, _) in enumerate(answered)
                     if (offset := _reset_offset(request.auto_offset_reset, r)) is not None}
            if not moved:
                break
            for i, offset in moved.items():
                partitions[i] = msgspec.structs.replace(partitions[i], fetch_offset=offset)
            spent = sum(n for i, (_, n) in enumerate(answered) if i not in moved)
            again = await self._fetch([partitions[i] for i in moved], request.max_bytes - spent, stats)
            for i, result in zip(moved, again):
                answered[i] = result
        results = [r for r, _ in answered]
        nbytes = sum(n for _, n in answered)
        # The answer is the last pass: its counts replace an earlier pass's (a long poll's).
        stats.partitions = len(results)
        stats.errors = sum(not r.ok for r in results)
        stats.records = sum(r.record_count or 0 for r in results)
        stats.bytes = nbytes
        stats.peak_bytes = max(stats.peak_bytes, nbytes)
        return results, nbytes

    async def fetch(self, partitions: list[ConsumePartition], max_bytes: int,
                    result: Callable[[ConsumePartition, Fetched | LlogError, int | None, str | None], tuple[R, int]],
                    stats: ConsumeStats | None = None) -> list[tuple[R, int]]:
        """One pass of fetches (``partitions``, names checked; no long poll, no offset reset):
        per partition ``result(partition, outcome, log start, topic_id)``, where the outcome is
        what the log's reader answers (a :class:`Fetched` or an error), from this broker's tail
        cache where it can. ``result`` (say, the Kafka listener's encoding) runs on the event loop
        for a cache hit and in a fetch thread otherwise; it returns its answer and the record
        bytes it holds, which the byte budgets count. ``stats`` counts the cache's hits and misses.
        :class:`ConsumeBusy` when too busy."""
        return await self._fetch(partitions, max_bytes, stats or ConsumeStats(), result, shared=False)

    async def _fetch(self, partitions: list[ConsumePartition], max_bytes: int, stats: ConsumeStats,
                     result=None, shared: bool = True) -> list[tuple[object, int]]:
        """Each partition's result and its record bytes: the tail cache for each partition it
        holds (and may answer, :meth:`_cacheable`), the reader for the rest (one call, so
        shared blobs are fetched once); byte budgets applied in request order. ``result`` makes
        a partition's result of its outcome (default :func:`_from_outcome`); ``shared``: whether
        the shared tail cache directory may answer (it holds values alone)."""
        result = result or _from_outcome
        results: list[tuple[object, int] | None] = [None] * len(partitions)
        misses: list[int] = []
        remaining = max_bytes
        tps = [TopicPartition(p.topic, p.partition) for p in partitions]
        if self.cache.enabled:  # the partitions the cache may hold at their offsets
            cached = [tp for tp, p in zip(tps, partitions)
                      if (tail := self.cache.tail(tp)) is not None and p.fetch_offset <= tail]
            await self._know_log_starts(cached)
            for tp in cached:
                known = self._fresh_known(tp)
                if known is not None and known.topic_id != self.cache.incarnation(tp):
                    self.cache.forget(tp)  # the cached incarnation was deleted (maybe created again)
        for i, (tp, p) in enumerate(zip(tps, partitions)):
            if remaining <= 0:
                misses.append(i)  # the reader answers with the high watermark and no records
                continue
            known = self._cacheable(tp, p.fetch_offset) if self.cache.enabled else None
            hit = (self.cache.get(tp, known.topic_id, p.fetch_offset, min(p.partition_max_bytes, remaining))
                   if known is not None else None)
            if hit is None:
                misses.append(i)
                stats.cache_misses += self.cache.enabled
                continue
            stats.cache_hits += 1
            results[i] = result(p, hit.fetched(tp, known.log_start), known.log_start, known.topic_id)
            remaining -= results[i][1]
        if misses:
            wanted = [partitions[i] for i in misses]
            self._admit_fetch()
            self._pending_fetches += 1
            try:
                fetched, shared_hits = await asyncio.get_running_loop().run_in_executor(
                    self._pool, self._read, wanted, max(remaining, 0), result, shared)
            finally:
                self._pending_fetches -= 1
            for i, answered in zip(misses, fetched):
                results[i] = answered
            stats.cache_hits += shared_hits
            stats.cache_misses -= min(shared_hits, stats.cache_misses)
        return results

    def _admit_fetch(self) -> None:
        if self._pending_fetches >= MAX_PENDING_FETCHES:
            raise ConsumeBusy(f"{self._pending_fetches} fetches are waiting for Oxia and S3, the most this broker queues")

    # --- log start offsets (docs/protocol.md section 10.3) and incarnations (docs/protocol.md section 12) -----

    def _cacheable(self, tp: TopicPartition, offset: int) -> _Known | None:
        """What was read of ``tp`` when a tail cache (this process's or the shared directory) may
        answer it at ``offset``, else None: only when the partition's log start offset and
        incarnation were read within :data:`LOG_START_MAX_AGE_S`, the partition exists and is
        not deleted, and ``offset`` is not below the log start. The cache then answers with runs
        of that incarnation only.

        A cache holds records this broker produced, and offsets are immutable, so a cached
        record below the log start is still the right record of its offset; but retention
        removed it from the log (an idle partition's tail can outlive it: retention drops
        entries older than ``retention.ms``, whatever a cache holds). Answering with it would
        make the answer depend on which broker a consumer asks, and on what its cache still
        holds: one broker returns records another calls out of range, and a consumer never
        learns that it lost data. The spec (section 3) and Kafka both say out of range, so the
        cache answers only at or above a log start it knows; the log start it knows may be up to
        :data:`LOG_START_MAX_AGE_S` old (a retention pass in that window looks as if it ran that
        much later), which costs a hot partition one multi-key Oxia read a second. The same
        read resolves the incarnation, so a deleted topic's cached records are not served (its
        ``meta/control`` is a tombstone), nor are they as a later topic of the same name's; a
        delete in that window looks as if it ran that much later too."""
        known = self._fresh_known(tp)
        return known if known is not None and known.log_start is not None and offset >= known.log_start else None

    def _fresh_known(self, tp: TopicPartition) -> _Known | None:
        """What was read of ``tp`` within :data:`LOG_START_MAX_AGE_S`, unless a later read of a
        partition of its topic found another incarnation (None: read it again)."""
        known = self._known.get(tp)
        if known is None or time.monotonic() - known.at > LOG_START_MAX_AGE_S:
            return None
        latest = self._latest_ids.get(tp.topic)
        if known.topic_id is not None and latest is not None and latest[0] != known.topic_id and latest[1] >= known.at:
            return None
        return known

    async def _know_log_starts(self, partitions: list[TopicPartition]) -> None:
        """Read the log start offsets and incarnations of ``partitions`` whose known ones are
        too old for :meth:`_cacheable` (one multi-key Oxia read, in the pool)."""
        stale = self._stale(partitions)
        if stale:
            self._admit_fetch()
            self._pending_fetches += 1
            try:
                await asyncio.get_running_loop().run_in_executor(self._pool, self._read_controls, stale)
            finally:
                self._pending_fetches -= 1

    def _stale(self, partitions: Sequence[TopicPartition]) -> list[TopicPartition]:
        return [tp for tp in dict.fromkeys(partitions) if self._fresh_known(tp) is None]

    def _learn(self, tp: TopicPartition, log_start: int | None, topic_id: str | None, at: float) -> None:
        """``tp``'s log start offset and incarnation (both None: no such partition, or deleted)
        as a read that began at ``at`` found them; an older read finishing later does not replace
        them."""
        known = self._known.get(tp)
        if known is None or known.at <= at:
            self._known[tp] = _Known(log_start, topic_id, at)
        if topic_id is not None:
            self.learn_incarnation(tp.topic, topic_id, at)

    def learn_incarnation(self, topic: str, topic_id: str, at: float) -> None:
        """``topic``'s current incarnation as a read of its record that began at ``at``
        (``time.monotonic()``) found it, somewhere else in this broker (a group commit): a
        partition known of another incarnation, from an older read, is read again before a tail
        cache answers it. Any thread."""
        latest = self._latest_ids.get(topic)
        if latest is None or latest[1] <= at:
            self._latest_ids[topic] = (topic_id, at)

    def _read_controls(self, partitions: list[TopicPartition]) -> dict[TopicPartition, ControlRecord]:
        """In a pool thread: the ``meta/control`` of each partition in its topic's current
        incarnation (the topic record as the reader caches it), in one multi-key read, their log
        starts and incarnations learned; the partitions that exist and are not deleted. A control
        missing or a tombstone may mean the topic was created again since its record was cached:
        those topics' records are read again and, where the id changed, their controls once more
        (as :meth:`LogReader.fetch` does)."""
        at = time.monotonic()
        found: dict[TopicPartition, tuple[str, ControlRecord]] = {}
        todo = list(partitions)
        for attempt in range(2):
            keys: dict[TopicPartition, PartitionKeys] = {}
            for tp in todo:
                try:
                    keys[tp] = self.reader.keys(tp.topic, tp.partition)
                except TopicNotFound:
                    pass  # its record was read just now (an absence is not cached): no such topic
            values = self.reader.coordination.get_many([(k.control, k.partition_key) for k in keys.values()]) \
                if keys else []
            gone = []
            for (tp, k), value in zip(keys.items(), values):
                record = ControlRecord.from_json(value.value, k.control) if value is not None else None
                if record is not None and not record.deleted:
                    found[tp] = (k.topic_id, record)
                else:
                    gone.append(tp)
            if not gone or attempt:
                break
            ids = {}
            for topic in {tp.topic for tp in gone}:
                record = self.reader.topics.get(topic, fresh=True)
                ids[topic] = record.topic_id if record is not None else None
            todo = [tp for tp in gone if ids[tp.topic] not in (None, keys[tp].topic_id)]
        for tp in partitions:
            topic_id, record = found.get(tp, (None, None))
            self._learn(tp, record.log_start_offset if record is not None else None, topic_id, at)
        return {tp: record for tp, (_, record) in found.items()}

    def _read(self, partitions: list[ConsumePartition], max_bytes: int, result,
              shared: bool) -> tuple[list[tuple[object, int]], int]:
        """In a pool thread: the shared tail cache directory first (if any, and ``shared``, where
        it may answer), then Oxia and S3 for the rest, building the results here (``result``),
        off the loop. Also returns the directory's hits."""
        out: list[tuple[object, int] | None] = [None] * len(partitions)
        remaining, hits = max_bytes, 0
        if self.shared is not None and shared:
            stale = self._stale([TopicPartition(p.topic, p.partition) for p in partitions])
            if stale:
                self._read_controls(stale)
            for i, p in enumerate(partitions):
                known = self._cacheable(TopicPartition(p.topic, p.partition), p.fetch_offset)
                if remaining <= 0 or known is None:
                    continue
                hit = self._shared_get(p, known.topic_id, min(p.partition_max_bytes, remaining))
                if hit is not None:
                    tp = TopicPartition(p.topic, p.partition)
                    out[i] = result(p, hit.fetched(tp, known.log_start), known.log_start, known.topic_id)
                    remaining -= out[i][1]
                    hits += 1
        rest = [i for i, r in enumerate(out) if r is None]
        if rest:
            self._read_log(partitions, rest, out, max(remaining, 0), result)
        return out, hits

    def _read_log(self, partitions: list[ConsumePartition], indexes: list[int],
                  out: list[tuple[object, int] | None], max_bytes: int, result) -> None:
        """In a pool thread: ``partitions[i]`` for each of ``indexes`` from Oxia and S3 (one
        :meth:`LogReader.fetch`) into ``out[i]``, log starts and incarnations learned.

        The reader resolves each partition's incarnation from its cached topic record (read again
        when it meets a tombstone), and says which by the record it caches: the same before and
        after the fetch, that is the one. When it changed (the topic was created again, and the
        fetch or another read noticed), the partition is fetched once more; if it changes again,
        it answers :class:`TopicRecreated` (fetch again)."""
        todo = indexes
        for attempt in range(2):
            requests = [FetchRequest(partitions[i].topic, partitions[i].partition, partitions[i].fetch_offset,
                                     partitions[i].partition_max_bytes) for i in todo]
            at = time.monotonic()
            before = self._topic_ids({partitions[i].topic for i in todo})
            outcomes = self.reader.fetch(requests, max_bytes=max_bytes)
            after = self._topic_ids({p.topic for p, o in zip(requests, outcomes)
                                     if isinstance(o, (Fetched, OffsetOutOfRange))})
            again = []
            for i, outcome in zip(todo, outcomes):
                topic = partitions[i].topic
                topic_id = after.get(topic)
                if isinstance(outcome, (Fetched, OffsetOutOfRange)) and topic_id != before[topic]:
                    if not attempt:
                        again.append(i)
                        continue
                    outcome = TopicRecreated(f"topic {topic!r} was deleted and created again while this fetch "
                                             f"ran (topic id {before[topic]}, then {topic_id}): fetch again")
                log_start = self._learn_outcome(partitions[i], outcome, topic_id, at)
                out[i] = result(partitions[i], outcome, log_start, topic_id)
                max_bytes = max(max_bytes - out[i][1], 0)
            if not again:
                return
            todo = again

    def _topic_ids(self, topics: set[str]) -> dict[str, str | None]:
        """Each topic's ``topic_id`` as the reader caches its record (None: no record)."""
        ids = {}
        for topic in topics:
            record = self.reader.topics.get(topic)
            ids[topic] = record.topic_id if record is not None else None
        return ids

    def _learn_outcome(self, p: ConsumePartition, outcome: Fetched | LlogError, topic_id: str | None,
                       at: float) -> int | None:
        """Learn what a fetch of ``p`` (in incarnation ``topic_id``) found: the partition's log
        start offset (``Fetched.log_start_offset``, ``OffsetOutOfRange.log_start_offset``), or
        that it does not exist (no topic, not initialized, deleted). Returns the log start."""
        tp = TopicPartition(p.topic, p.partition)
        if isinstance(outcome, (PartitionNotInitialized, TopicNotFound)):
            self._learn(tp, None, None, at)
            return None
        start = getattr(outcome, "log_start_offset", None)
        if start is not None and topic_id is not None and isinstance(outcome, (Fetched, OffsetOutOfRange)):
            self._learn(tp, start, topic_id, at)
        return start

    def _shared_get(self, p: ConsumePartition, topic_id: str, max_bytes: int):
        try:
            return self.shared.get(TopicPartition(p.topic, p.partition), topic_id, p.fetch_offset, max_bytes)
        except (OSError, LlogError) as e:  # a run being deleted, or damaged: Oxia and S3 answer
            log.warning("tail cache directory: %s: %s", type(e).__name__, e)
            return None

    # --- the high-watermark probe ---------------------------------------------------------------

    def _start_probe(self) -> None:
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._run_probe())

    async def _run_probe(self) -> None:
        """While anyone waits: every :data:`PROBE_INTERVAL_S`, one multi-key read of the waited
        partitions' high watermarks; wake the waiters whose partition moved."""
        loop = asyncio.get_running_loop()
        while self._waiters and not self._closed:
            await asyncio.sleep(PROBE_INTERVAL_S)
            partitions = sorted({tp for w in self._waiters for tp in w.wanted}, key=str)
            if not partitions:
                continue
            try:
                marks = await loop.run_in_executor(self._pool, self._high_watermarks, partitions)
            except Exception as e:  # noqa: BLE001 - a failed probe is retried at the next interval
                log.warning("high watermark probe failed: %s: %s", type(e).__name__, e)
                continue
            for waiter in list(self._waiters):
                if any(marks.get(tp, 0) >= wanted for tp, wanted in waiter.wanted.items()):
                    waiter.event.set()

    def _high_watermarks(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        """The partitions' high watermarks (their log starts learned on the way)."""
        return {tp: control.high_watermark for tp, control in self._read_controls(partitions).items()}

    async def close(self) -> None:
        """Wake every waiter (they answer with what they have) and stop the pool."""
        self._closed = True
        for waiter in list(self._waiters):
            self._want(waiter, {})
            waiter.event.set()
        if self._probe is not None:
            self._probe.cancel()
        await asyncio.to_thread(self._pool.shutdown, wait=True)
        await asyncio.to_thread(self._files.shutdown, wait=True)


def _as_records(group: AppendGroup) -> Records:
    """A group's records as a batch of records-v2, for the tail cache: its Arrow columns as they
    are when they have the types (the Kafka listener's; the writer has checked them), else
    :func:`llog.codec.to_records`."""
    columns = [group.keys, group.records, group.headers, group.timestamps]
    n = len(group.records)
    if all(c is None or (isinstance(c, pa.Array) and c.type == f.type) for c, f in zip(columns, V2_SCHEMA)):
        return pa.RecordBatch.from_arrays([c if c is not None else nulls(f.type, n) for c, f in zip(columns, V2_SCHEMA)],
                                          schema=V2_SCHEMA)
    return to_records(group.records, group.keys, group.headers, group.timestamps)


def _values_only(group: AppendGroup) -> bool:
    """Whether a group's records are values and nothing more (what the tail caches hold)."""
    return (group.keys is None and group.headers is None and group.timestamps is None
            and not (isinstance(group.records, pa.Array) and group.records.null_count))


def _wanted(partitions: list[ConsumePartition], results: list[ConsumeResult]) -> dict[TopicPartition, int]:
    """Per requested partition without an error: the offset after what the last pass returned."""
    return {TopicPartition(p.topic, p.partition): r.next_fetch_offset for p, r in zip(partitions, results) if r.ok}


def _reset_offset(policy: str, result: ConsumeResult) -> int | None:
    """Where ``auto_offset_reset`` moves a partition answered out of range (None: it stays):
    ``earliest`` to the log start, ``latest`` to the log end (the high watermark + 1)."""
    if result.ok or result.error_type != OffsetOutOfRange.__name__ or policy == "none":
        return None
    return result.log_start_offset if policy == "earliest" else result.high_watermark + 1


def _from_outcome(p: ConsumePartition, outcome: Fetched | LlogError, log_start: int | None,
                  topic_id: str | None) -> tuple[ConsumeResult, int]:
    """The result of the reader's outcome for ``p`` (of incarnation ``topic_id``), and its record
    bytes."""
    if isinstance(outcome, Fetched) and any(_has_more_than_values(b) for b in outcome.batches):
        return _from_batches(p, outcome, log_start, topic_id)
    if isinstance(outcome, Fetched):
        columns = [b.column(1) for b in outcome.batches]
        values = pa.concat_arrays(columns) if len(columns) > 1 else columns[0] if columns else []
        return _from_values(p, p.fetch_offset, values, outcome.high_watermark, log_start, topic_id)
    if isinstance(outcome, OffsetOutOfRange):  # where the readable offsets are: a client can reset
        return ConsumeResult(p.topic, p.partition, False, high_watermark=outcome.high_watermark,
                             log_start_offset=outcome.log_start_offset, topic_id=topic_id,
                             error_type=type(outcome).__name__, error=str(outcome)), 0
    return ConsumeResult(p.topic, p.partition, False, error_type=type(outcome).__name__, error=str(outcome)), 0


def _from_values(p: ConsumePartition, first: int, values: list[bytes] | pa.BinaryArray,
                 high_watermark: int, log_start: int | None, topic_id: str | None) -> tuple[ConsumeResult, int]:
    """The result of records ``first..`` (``values``) of incarnation ``topic_id``, and their bytes."""
    if not len(values):
        return ConsumeResult(p.topic, p.partition, True, high_watermark=high_watermark, log_start_offset=log_start,
                             next_fetch_offset=p.fetch_offset, record_count=0, records=[], topic_id=topic_id), 0
    records = None
    if isinstance(values, pa.Array):  # from Oxia and S3: UTF-8 checked by Arrow for all at once
        size = payload_bytes(values)
        try:
            texts = values.view(pa.string())
            texts.validate(full=True)
            records = list(map(ConsumedRecord, range(first, first + len(values)), texts.to_pylist()))
        except pa.ArrowInvalid:  # some record is not UTF-8: record by record below
            values = values.to_pylist()
    else:
        size = sum(map(len, values))
    if records is None:
        records = []
        for offset, value in enumerate(values, first):
            try:
                records.append(ConsumedRecord(offset, payload=value.decode()))
            except UnicodeDecodeError:
                records.append(ConsumedRecord(offset, base64=value))
    last = first + len(values) - 1
    return ConsumeResult(p.topic, p.partition, True, high_watermark=max(high_watermark, last),
                         log_start_offset=log_start, start_offset=first, end_offset=last, next_fetch_offset=last + 1,
                         record_count=len(values), records=records, topic_id=topic_id), size


def _has_more_than_values(batch: pa.RecordBatch) -> bool:
    """Whether a fetched batch has a tombstone, a key, headers or an event time (records-v2)."""
    n = batch.num_rows
    return bool(batch.column(1).null_count) or any(batch.column(c).null_count < n for c in (3, 4, 5))


def _text_or_base64(value: bytes | None) -> tuple[str | None, bytes | None]:
    if value is None:
        return None, None
    try:
        return value.decode(), None
    except UnicodeDecodeError:
        return None, value


def _from_batches(p: ConsumePartition, fetched: Fetched, log_start: int | None,
                  topic_id: str | None) -> tuple[ConsumeResult, int]:
    """The result of fetched records that carry more than a value (records-v2), record by record."""
    records, size = [], 0
    for batch in fetched.batches:
        size += payload_bytes(batch.column(1))
        offsets, values, _, keys, headers, stamps = (batch.column(c).to_pylist() for c in range(6))
        for offset, value, key, hs, ts in zip(offsets, values, keys, headers, stamps):
            payload, raw = _text_or_base64(value)
            key_text, key_raw = _text_or_base64(key)
            records.append(ConsumedRecord(
                offset, payload, raw, key_text, key_raw,
                None if hs is None else [ConsumedHeader(h["key"], *_text_or_base64(h["value"])) for h in hs], ts))
    last = p.fetch_offset + len(records) - 1
    return ConsumeResult(p.topic, p.partition, True, high_watermark=max(fetched.high_watermark, last),
                         log_start_offset=log_start, start_offset=p.fetch_offset, end_offset=last,
                         next_fetch_offset=last + 1, record_count=len(records), records=records,
                         topic_id=topic_id), size


def _response(results: list[ConsumeResult]) -> ConsumeResponse:
    failed = sum(not r.ok for r in results)
    return ConsumeResponse(results, len(results) - failed, failed)
