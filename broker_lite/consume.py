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

Retention (docs/topics.md section 3): every ok result and every ``OffsetOutOfRange`` one carries
the partition's log start offset, as Kafka's fetch response does. A fetch outside the readable
offsets (below the log start, or past the high watermark + 1) answers that partition with
``OffsetOutOfRange``, or, as the request's ``auto_offset_reset`` says, is read again from the log
start (``earliest``) or the log end (``latest``); a partition reset so is read from its new offset
for the rest of the request (a long poll waits there).
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec
import pyarrow as pa

from broker_lite.batcher import payload_bytes
from broker_lite.models import (
    ConsumedHeader, ConsumedRecord, ConsumePartition, ConsumeRequest, ConsumeResponse, ConsumeResult,
)
from broker_lite.tail_cache import TailCache, TailCacheDir
from llog.config import Config
from llog.errors import LlogError, OffsetOutOfRange, PartitionNotInitialized
from llog.keys import PartitionKeys, TopicPartition, validate_partition, validate_topic
from llog.reader import FetchRequest, Fetched, LogReader
from llog.records import ControlRecord
from llog.writer import AppendGroup, AppendResult

log = logging.getLogger(__name__)

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
#: How long a partition's log start offset, once read, lets the tail caches answer without reading
#: it again (see :meth:`ConsumeService._cache_start`).
LOG_START_MAX_AGE_S = 1.0
#: Resets (``auto_offset_reset``) of one partition in one pass: a retention pass that moves the
#: log start again between the reset and the read makes the read out of range once more.
MAX_RESETS = 3


class ConsumeBusy(LlogError):
    """Too many consumes are fetching or waiting; retry after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: int = 1):
        super().__init__(message)
        self.retry_after_s = retry_after_s


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
        #: Per partition: its log start offset (None: the partition does not exist) and the
        #: ``time.monotonic()`` of the read it came from (taken before the read began).
        self._log_starts: dict[TopicPartition, tuple[int | None, float]] = {}
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
        by_partition: dict[TopicPartition, list[tuple[AppendResult, pa.BinaryArray]]] = {}
        for group, outcome in zip(groups, outcomes):
            if isinstance(outcome, AppendResult):
                by_partition.setdefault(TopicPartition(outcome.topic, outcome.partition), []).append(
                    (outcome, group.records))
        for tp, committed in by_partition.items():
            first, last = committed[0][0].start_offset, committed[-1][0].end_offset
            values = committed[0][1] if len(committed) == 1 else pa.concat_arrays([v for _, v in committed])
            self.cache.add(tp, first, values)
            if self.shared is not None:
                self._files.submit(self._share, tp, first, values)
            for waiter in self._by_partition.get(tp, ()):
                if last >= waiter.wanted[tp]:
                    waiter.event.set()

    def _want(self, waiter: _Waiter, wanted: dict[TopicPartition, int]) -> None:
        """Set what ``waiter`` waits for (``{}``: nothing; it leaves the index)."""
        for tp in waiter.wanted.keys() - wanted.keys():
            self._by_partition[tp].discard(waiter)
            if not self._by_partition[tp]:
                del self._by_partition[tp]
        waiter.wanted = wanted
        for tp in wanted:
            self._by_partition.setdefault(tp, set()).add(waiter)

    def _share(self, tp: TopicPartition, first: int, values) -> None:
        try:
            self.shared.add(tp, first, values)
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

    async def _fetch(self, partitions: list[ConsumePartition], max_bytes: int,
                     stats: ConsumeStats) -> list[tuple[ConsumeResult, int]]:
        """Each partition's result and its record bytes: the tail cache for each partition it
        holds (and may answer, :meth:`_cache_start`), the reader for the rest (one call, so
        shared blobs are fetched once); byte budgets applied in request order."""
        results: list[tuple[ConsumeResult, int] | None] = [None] * len(partitions)
        misses: list[int] = []
        remaining = max_bytes
        tps = [TopicPartition(p.topic, p.partition) for p in partitions]
        if self.cache.enabled:  # the partitions the cache may hold at their offsets
            await self._know_log_starts([tp for tp, p in zip(tps, partitions)
                                         if (tail := self.cache.tail(tp)) is not None and p.fetch_offset <= tail])
        for i, (tp, p) in enumerate(zip(tps, partitions)):
            if remaining <= 0:
                misses.append(i)  # the reader answers with the high watermark and no records
                continue
            log_start = self._cache_start(tp, p.fetch_offset) if self.cache.enabled else None
            hit = (self.cache.get(tp, p.fetch_offset, min(p.partition_max_bytes, remaining))
                   if log_start is not None else None)
            if hit is None:
                misses.append(i)
                stats.cache_misses += self.cache.enabled
                continue
            stats.cache_hits += 1
            results[i] = _from_values(p, hit.first, hit.values, hit.tail, log_start)
            remaining -= results[i][1]
        if misses:
            wanted = [partitions[i] for i in misses]
            self._admit_fetch()
            self._pending_fetches += 1
            try:
                fetched, shared_hits = await asyncio.get_running_loop().run_in_executor(
                    self._pool, self._read, wanted, max(remaining, 0))
            finally:
                self._pending_fetches -= 1
            for i, result in zip(misses, fetched):
                results[i] = result
            stats.cache_hits += shared_hits
            stats.cache_misses -= min(shared_hits, stats.cache_misses)
        return results

    def _admit_fetch(self) -> None:
        if self._pending_fetches >= MAX_PENDING_FETCHES:
            raise ConsumeBusy(f"{self._pending_fetches} fetches are waiting for Oxia and S3, the most this broker queues")

    # --- log start offsets (docs/topics.md section 3) -------------------------------------------

    def _cache_start(self, tp: TopicPartition, offset: int) -> int | None:
        """The log start offset of ``tp`` when a tail cache (this process's or the shared
        directory) may answer it at ``offset``, else None: only when the partition's log start
        offset was read within :data:`LOG_START_MAX_AGE_S` and ``offset`` is not below it.

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
        read also keeps a deleted topic's cached records from being served (no ``meta/control``:
        the reader answers ``PartitionNotInitialized``)."""
        known = self._known_start(tp)
        return known if known is not None and offset >= known else None

    def _known_start(self, tp: TopicPartition) -> int | None:
        """``tp``'s log start offset as read within :data:`LOG_START_MAX_AGE_S` (None: not read
        then, or no such partition)."""
        known = self._log_starts.get(tp)
        if known is None or time.monotonic() - known[1] > LOG_START_MAX_AGE_S:
            return None
        return known[0]

    async def _know_log_starts(self, partitions: list[TopicPartition]) -> None:
        """Read the log start offsets of ``partitions`` whose known one is too old for
        :meth:`_cache_start` (one multi-key Oxia read, in the pool)."""
        stale = self._stale(partitions)
        if stale:
            self._admit_fetch()
            self._pending_fetches += 1
            try:
                await asyncio.get_running_loop().run_in_executor(self._pool, self._read_controls, stale)
            finally:
                self._pending_fetches -= 1

    def _stale(self, partitions: Sequence[TopicPartition]) -> list[TopicPartition]:
        now = time.monotonic()
        return list(dict.fromkeys(tp for tp in partitions if tp not in self._log_starts
                                  or now - self._log_starts[tp][1] > LOG_START_MAX_AGE_S))

    def _learn(self, tp: TopicPartition, log_start: int | None, at: float) -> None:
        """``tp``'s log start offset (None: no such partition) as a read that began at ``at``
        found it; an older read finishing later does not replace it."""
        known = self._log_starts.get(tp)
        if known is None or known[1] <= at:
            self._log_starts[tp] = (log_start, at)

    def _read_controls(self, partitions: list[TopicPartition]) -> dict[TopicPartition, ControlRecord]:
        """In a pool thread: the partitions' ``meta/control`` records (one multi-key read), their
        log starts learned; the partitions that exist."""
        at = time.monotonic()
        keys = [PartitionKeys(self.root, tp) for tp in partitions]
        found = self.reader.coordination.get_many([(k.control, k.partition_key) for k in keys])
        controls = {tp: ControlRecord.from_json(v.value, k.control)
                    for tp, k, v in zip(partitions, keys, found) if v is not None}
        for tp in partitions:
            self._learn(tp, controls[tp].log_start_offset if tp in controls else None, at)
        return controls

    def _read(self, partitions: list[ConsumePartition], max_bytes: int) -> tuple[list[tuple[ConsumeResult, int]], int]:
        """In a pool thread: the shared tail cache directory first (if any, where it may answer),
        then Oxia and S3 for the rest, building the results here, off the loop. Also returns the
        directory's hits."""
        out: list[tuple[ConsumeResult, int] | None] = [None] * len(partitions)
        remaining, hits = max_bytes, 0
        if self.shared is not None:
            stale = self._stale([TopicPartition(p.topic, p.partition) for p in partitions])
            if stale:
                self._read_controls(stale)
            for i, p in enumerate(partitions):
                log_start = self._cache_start(TopicPartition(p.topic, p.partition), p.fetch_offset)
                if remaining <= 0 or log_start is None:
                    continue
                hit = self._shared_get(p, min(p.partition_max_bytes, remaining))
                if hit is not None:
                    out[i] = _from_values(p, hit.first, hit.values, hit.tail, log_start)
                    remaining -= out[i][1]
                    hits += 1
        rest = [i for i, r in enumerate(out) if r is None]
        if rest:
            requests = [FetchRequest(partitions[i].topic, partitions[i].partition, partitions[i].fetch_offset,
                                     partitions[i].partition_max_bytes) for i in rest]
            at = time.monotonic()
            outcomes = self.reader.fetch(requests, max_bytes=max(remaining, 0))
            starts = self._log_starts_of(rest, partitions, outcomes, at)
            for i, outcome in zip(rest, outcomes):
                out[i] = _from_outcome(partitions[i], outcome, starts.get(i))
        return out, hits

    def _log_starts_of(self, indexes: list[int], partitions: list[ConsumePartition], outcomes: list,
                       at: float) -> dict[int, int]:
        """Per fetched partition (by index), its log start offset, learned: as the fetch read it
        (``Fetched.log_start_offset``, ``OffsetOutOfRange.log_start_offset``), else (a reader
        whose ``Fetched`` does not carry it) as known within :data:`LOG_START_MAX_AGE_S` or as a
        read of ``meta/control`` after the fetch finds it."""
        starts: dict[int, int] = {}
        unknown: list[int] = []
        for i, outcome in zip(indexes, outcomes):
            tp = TopicPartition(partitions[i].topic, partitions[i].partition)
            start = getattr(outcome, "log_start_offset", None)
            if isinstance(outcome, PartitionNotInitialized):
                self._learn(tp, None, at)
            elif start is not None:
                starts[i] = start
                self._learn(tp, start, at)
            elif isinstance(outcome, Fetched):
                if (known := self._known_start(tp)) is not None and known <= outcome.offset:
                    starts[i] = known
                else:
                    unknown.append(i)
        if unknown:
            tps = [TopicPartition(partitions[i].topic, partitions[i].partition) for i in unknown]
            controls = self._read_controls(tps)
            starts.update({i: controls[tp].log_start_offset for i, tp in zip(unknown, tps) if tp in controls})
        return starts

    def _shared_get(self, p: ConsumePartition, max_bytes: int):
        try:
            return self.shared.get(TopicPartition(p.topic, p.partition), p.fetch_offset, max_bytes)
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


def _wanted(partitions: list[ConsumePartition], results: list[ConsumeResult]) -> dict[TopicPartition, int]:
    """Per requested partition without an error: the offset after what the last pass returned."""
    return {TopicPartition(p.topic, p.partition): r.next_fetch_offset for p, r in zip(partitions, results) if r.ok}


def _reset_offset(policy: str, result: ConsumeResult) -> int | None:
    """Where ``auto_offset_reset`` moves a partition answered out of range (None: it stays):
    ``earliest`` to the log start, ``latest`` to the log end (the high watermark + 1)."""
    if result.ok or result.error_type != OffsetOutOfRange.__name__ or policy == "none":
        return None
    return result.log_start_offset if policy == "earliest" else result.high_watermark + 1


def _from_outcome(p: ConsumePartition, outcome: Fetched | LlogError, log_start: int | None) -> tuple[ConsumeResult, int]:
    """The result of the reader's outcome for ``p``, and its record bytes."""
    if isinstance(outcome, Fetched) and any(_has_more_than_values(b) for b in outcome.batches):
        return _from_batches(p, outcome, log_start)
    if isinstance(outcome, Fetched):
        columns = [b.column(1) for b in outcome.batches]
        values = pa.concat_arrays(columns) if len(columns) > 1 else columns[0] if columns else []
        return _from_values(p, p.fetch_offset, values, outcome.high_watermark, log_start)
    if isinstance(outcome, OffsetOutOfRange):  # where the readable offsets are: a client can reset
        return ConsumeResult(p.topic, p.partition, False, high_watermark=outcome.high_watermark,
                             log_start_offset=outcome.log_start_offset, error_type=type(outcome).__name__,
                             error=str(outcome)), 0
    return ConsumeResult(p.topic, p.partition, False, error_type=type(outcome).__name__, error=str(outcome)), 0


def _from_values(p: ConsumePartition, first: int, values: list[bytes] | pa.BinaryArray,
                 high_watermark: int, log_start: int | None) -> tuple[ConsumeResult, int]:
    """The result of records ``first..`` (``values``), and their bytes."""
    if not len(values):
        return ConsumeResult(p.topic, p.partition, True, high_watermark=high_watermark, log_start_offset=log_start,
                             next_fetch_offset=p.fetch_offset, record_count=0, records=[]), 0
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
                         record_count=len(values), records=records), size


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


def _from_batches(p: ConsumePartition, fetched: Fetched, log_start: int | None) -> tuple[ConsumeResult, int]:
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
                         next_fetch_offset=last + 1, record_count=len(records), records=records), size


def _response(results: list[ConsumeResult]) -> ConsumeResponse:
    failed = sum(not r.ok for r in results)
    return ConsumeResponse(results, len(results) - failed, failed)
