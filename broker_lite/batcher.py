"""Group commit: produce requests from every connection go into one open batch, and each batch
is written with one ``LogWriter.append_shared`` (one S3 PUT, every partition committed in
lockstep). A request is answered as soon as the offsets of the batch that holds it are
reserved (``append_shared``'s ``on_durable``: from then the records are durable, ordered and
readable, docs/protocol.md section 4), with its own offsets: ``append_shared`` gives each group its
own consecutive range, and a partition's groups keep the order in which they were admitted. The
flush goes on to write the index entries and clear the reservations; a failure there loses
nothing (the next writer finishes them) and is logged.

When the open batch is sealed and handed to a flush:
- it reached ``LLOG_BATCH_MAX_BYTES``;
- no flush is running (flush-when-idle): a lone producer waits for no window;
- a flush ended and the open batch can start (below): under load the window becomes the time
  the previous flush took, which adapts by itself;
- ``LLOG_BATCH_MAX_DELAY_MS`` passed since its first record and it can start in a second flush
  slot alongside a running flush. If it cannot start, it stays open and keeps gathering: sealing
  it would only queue it, and a queue of small batches (one PUT and one round of commits each)
  is what a group commit is there to avoid.

At most ``max_inflight`` flushes run at once (2: a third adds latency, not throughput, since the
writer's Python side is the limit), and two running flushes never share a partition: a sealed
batch that touches a partition still being written waits, so a partition's batches commit in
seal order. ``LLOG_BATCH_MAX_BUFFER_BYTES`` bounds the record bytes held uncommitted (open,
sealed, and in flight until answered): a request past it is refused at once with
:class:`BackPressure`, which says when to retry, instead of queueing without bound.

Input is validated when a request is admitted, so one bad request never fails a batch of
others. A flush that fails fails exactly the requests in it, per partition: where
``append_shared`` committed some partitions and not others (:class:`~llog.errors.AppendFailed`),
each request learns the outcome of each of its partitions.

Everything here runs on one asyncio event loop; the writer's blocking calls run in a thread pool
of ``max_inflight`` threads, never on the loop.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import logging
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from llog.codec import to_binary_array
from llog.config import Config
from llog.errors import AppendFailed, EmptyAppend, GroupsFailed, LlogError
from llog.keys import TopicPartition
from llog.writer import AppendGroup, AppendResult, LogWriter, check_producer

log = logging.getLogger(__name__)

#: Flushes running at once, by default.
DEFAULT_MAX_INFLIGHT = 2


class BackPressure(LlogError):
    """The group commit holds ``LLOG_BATCH_MAX_BUFFER_BYTES`` of uncommitted records: retry
    after ``retry_after_s`` seconds. Nothing of the request was taken."""

    def __init__(self, buffered: int, wanted: int, limit: int, retry_after_s: int):
        self.retry_after_s = retry_after_s
        super().__init__(f"{buffered} bytes are waiting to be committed; {wanted} more would pass "
                         f"LLOG_BATCH_MAX_BUFFER_BYTES={limit}; retry after {retry_after_s} s")


class RequestTooLarge(LlogError, ValueError):
    """A request holds more record bytes than ``LLOG_BATCH_MAX_BUFFER_BYTES``: it could never be
    admitted, so it is refused as bad input instead of with backpressure (which means retry)."""


class BatcherClosed(LlogError):
    """The group commit was closed (the broker is shutting down); the request was not taken."""


#: One group's outcome: where its records landed, or its partition's error.
Outcome = AppendResult | BaseException


@dataclass
class _Batch:
    groups: list[AppendGroup] = field(default_factory=list)
    #: Per admitted request: its future and the indexes of its groups in ``groups``.
    requests: list[tuple[asyncio.Future, range]] = field(default_factory=list)
    partitions: set[TopicPartition] = field(default_factory=set)
    bytes: int = 0
    #: ``time.monotonic()`` of each admitted request, of the first one, and of sealing (metrics).
    admitted_at: list[float] = field(default_factory=list)
    opened_at: float = 0.0
    sealed_at: float = 0.0
    #: Whether its requests were answered (when its offsets were reserved, or at the end), and
    #: whether that answer was success.
    answered: bool = False
    acked: bool = False


class Batcher:
    """The group commit of one broker process (module doc). Use from one event loop."""

    def __init__(self, writer: LogWriter, config: Config | None = None, max_inflight: int = DEFAULT_MAX_INFLIGHT):
        config = config or writer.config
        if max_inflight < 1:
            raise ValueError(f"max_inflight must be >= 1, got {max_inflight}")
        self.writer = writer
        self.max_bytes = config.batch_max_bytes
        self.max_delay_s = config.batch_max_delay_ms / 1000
        self.max_buffer_bytes = config.batch_max_buffer_bytes
        self.max_inflight = max_inflight
        self._pool = ThreadPoolExecutor(max_inflight, thread_name_prefix="llog-broker-flush")
        self._open = _Batch()
        self._timer: asyncio.TimerHandle | None = None
        self._sealed: collections.deque[_Batch] = collections.deque()
        self._inflight: dict[asyncio.Task, _Batch] = {}
        self._buffered = 0
        self._closed = False
        #: Record bytes per second of recent flushes (for ``Retry-After``); None before the first.
        self._flush_rate: float | None = None
        #: Counts for metrics: requests, enqueued_bytes, backpressure_rejections, flushes,
        #: flush_failures, flushed_records, flushed_bytes, flush_seconds (a float sum).
        self.stats: collections.Counter[str] = collections.Counter()
        self.last_flush_s: float | None = None
        #: Called on the loop with ``(name, value)``: ``queue_wait_s`` per request (admitted to
        #: its flush starting), ``seal_to_flush_start_s`` and ``flush_duration_s`` per
        #: batch, ``flush_bytes`` per batch written without error. Set by
        #: :mod:`broker_lite.metrics`; its errors are logged.
        self.observer: Callable[[str, float], None] | None = None
        #: Called on the loop with ``(groups, outcomes)`` for every batch reserved at least in
        #: part, before its requests are answered (the tail cache; its errors are logged).
        self.on_durable: Callable[[Sequence[AppendGroup], Sequence[Outcome]], None] | None = None

    @property
    def buffered_bytes(self) -> int:
        """Record bytes admitted and not yet answered (open, sealed and in flight)."""
        return self._buffered

    # --- read-only state for metrics (cheap; read on the loop) --------------------------------

    @property
    def waiting_requests(self) -> int:
        """Requests admitted and not yet answered."""
        return sum(len(b.requests) for b in self._batches())

    @property
    def queued_bytes(self) -> int:
        """Record bytes in the open batch and in sealed batches not yet flushing."""
        return self._open.bytes + sum(b.bytes for b in list(self._sealed))

    @property
    def inflight_bytes(self) -> int:
        """Record bytes of the batches being flushed."""
        return sum(b.bytes for b in list(self._inflight.values()))

    @property
    def pending_batches(self) -> int:
        """Batches not yet flushing: the open one (if it holds records) and the sealed ones."""
        return (1 if self._open.groups else 0) + len(self._sealed)

    @property
    def sealed_batches(self) -> int:
        """Sealed batches waiting for a flush slot (or for a partition a flush holds)."""
        return len(self._sealed)

    @property
    def inflight_flushes(self) -> int:
        return len(self._inflight)

    @property
    def oldest_pending_age_s(self) -> float:
        """Seconds since the first record of the oldest batch not yet flushing (0 if none)."""
        sealed = list(self._sealed)
        oldest = sealed[0] if sealed else self._open if self._open.groups else None
        return time.monotonic() - oldest.opened_at if oldest is not None else 0.0

    def _batches(self) -> list[_Batch]:
        return [self._open, *list(self._sealed), *list(self._inflight.values())]

    def _observe(self, name: str, value: float) -> None:
        if self.observer is not None:
            try:
                self.observer(name, value)
            except Exception:  # noqa: BLE001 - metrics never fail a flush
                log.exception("batch metrics observer failed on %s", name)

    async def produce(self, groups: Sequence[AppendGroup]) -> list[Outcome]:
        """Admit ``groups`` (one request) into the open batch and wait until the batch that
        holds it committed; per group, in order, its :class:`AppendResult` or its partition's
        error. Raises before admitting
        anything: a validation error for bad input (:class:`RequestTooLarge` included),
        :class:`BackPressure`, :class:`BatcherClosed`."""
        if self._closed:
            raise BatcherClosed("the broker is shutting down; nothing was written")
        if not groups:
            raise EmptyAppend("a produce request needs at least one group")
        checked = []
        for i, g in enumerate(groups):
            tp = TopicPartition(g.topic, g.partition)  # validates both
            check_producer(g, f"{tp}: groups[{i}]")
            checked.append(dataclasses.replace(g, topic=tp.topic, partition=tp.partition,
                                               records=to_binary_array(g.records, f"{tp}: groups[{i}].records",
                                                                       nulls=True)))  # tombstones
        size = sum(payload_bytes(g.records) for g in checked)
        if size > self.max_buffer_bytes:
            raise RequestTooLarge(f"the request holds {size} record bytes, more than "
                                  f"LLOG_BATCH_MAX_BUFFER_BYTES={self.max_buffer_bytes}; split it")
        if self._buffered + size > self.max_buffer_bytes:
            self.stats["backpressure_rejections"] += 1
            raise BackPressure(self._buffered, size, self.max_buffer_bytes, self._retry_after_s())
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        batch = self._open
        first = len(batch.groups)
        now = time.monotonic()
        batch.opened_at = batch.opened_at or now
        batch.admitted_at.append(now)
        batch.groups += checked
        batch.requests.append((future, range(first, len(batch.groups))))
        batch.partitions.update(TopicPartition(g.topic, g.partition) for g in checked)
        batch.bytes += size
        self._buffered += size
        self.stats["requests"] += 1
        self.stats["enqueued_bytes"] += size
        if batch.bytes >= self.max_bytes or self._idle():
            self._seal()
        elif self._timer is None:
            self._timer = loop.call_later(self.max_delay_s, self._on_delay)
        return await future

    async def close(self, timeout_s: float = 30.0) -> None:
        """Stop admitting, flush what was admitted and wait for it (at most ``timeout_s``).
        Requests whose batch could not start by then fail with :class:`BatcherClosed`; a flush
        already running is waited for, since its outcome decides what its requests are told."""
        self._closed = True
        if self._open.groups:
            self._seal()
        deadline = time.monotonic() + timeout_s
        while self._inflight and time.monotonic() < deadline:
            await asyncio.wait(list(self._inflight), timeout=max(0.0, deadline - time.monotonic()))
        while self._sealed:
            self._answer(self._sealed.popleft(), error=BatcherClosed(
                f"the broker shut down before this request's batch could be written (waited {timeout_s:.0f} s); "
                "nothing of it was written"))
        if self._inflight:
            await asyncio.wait(list(self._inflight))
        self._pool.shutdown(wait=True)

    # --- sealing and flushing -----------------------------------------------------------------

    def _idle(self) -> bool:
        return not self._inflight and not self._sealed

    def _startable(self, batch: _Batch) -> bool:
        """Whether ``batch`` could start flushing now: a free slot, no sealed batch before it,
        no partition shared with a running flush."""
        if self._sealed or len(self._inflight) >= self.max_inflight:
            return False
        return not batch.partitions & set().union(*(b.partitions for b in self._inflight.values()))

    def _on_delay(self) -> None:
        """``LLOG_BATCH_MAX_DELAY_MS`` after its first request: the open batch takes a free flush
        slot if it can; if it cannot start anyway, it stays open and keeps gathering (sealing it
        would only queue it, and a queue of small batches is what the group commit avoids) until
        a flush ends."""
        self._timer = None
        if self._open.groups and self._startable(self._open):
            self._seal()

    def _seal(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._open.groups:
            self._open.sealed_at = time.monotonic()
            self._sealed.append(self._open)
            self._open = _Batch()
        self._start_flushes()

    def _start_flushes(self) -> None:
        """Start sealed batches in order while a slot is free and the next one shares no
        partition with a running flush."""
        while self._sealed and len(self._inflight) < self.max_inflight:
            busy = set().union(*(b.partitions for b in self._inflight.values()))
            if self._sealed[0].partitions & busy:
                return
            batch = self._sealed.popleft()
            task = asyncio.get_running_loop().create_task(self._flush(batch))
            self._inflight[task] = batch

    async def _flush(self, batch: _Batch) -> None:
        started = time.monotonic()
        try:
            self._observe("seal_to_flush_start_s", started - batch.sealed_at)
            for admitted in batch.admitted_at:
                self._observe("queue_wait_s", started - admitted)
            loop = asyncio.get_running_loop()

            def durable(outcome: list[AppendResult] | Exception) -> None:  # in the flush thread
                loop.call_soon_threadsafe(self._settle, batch, outcome)

            try:
                results = await loop.run_in_executor(self._pool, functools.partial(
                    self.writer.append_shared, batch.groups, on_durable=durable))
            except Exception as e:  # noqa: BLE001 - every request of the batch is told, with the error
                if batch.acked:
                    log.warning("a batch of %d request(s), acknowledged when its offsets were reserved, failed "
                                "after that (durable as pending, which the next writer finishes): %s",
                                len(batch.requests), e)
                self._settle(batch, e)
            else:
                self._settle(batch, results)
            self.stats["flushes"] += 1
            elapsed = time.monotonic() - started
            self.stats["flush_seconds"] += elapsed
            self.last_flush_s = elapsed
            self._observe("flush_duration_s", elapsed)
            seconds = max(elapsed, 1e-3)
            rate = batch.bytes / seconds
            self._flush_rate = rate if self._flush_rate is None else 0.7 * self._flush_rate + 0.3 * rate
        finally:
            if not batch.answered:  # cancelled: its requests are abandoned, so are their bytes
                batch.answered = True
                self._buffered -= batch.bytes
            del self._inflight[asyncio.current_task()]
            self._start_flushes()
            if self._open.groups and self._startable(self._open):
                self._seal()  # what gathered during this flush goes now

    def _settle(self, batch: _Batch, outcome: Sequence[AppendResult] | Exception) -> None:
        """Answer ``batch``'s requests with the outcome of its append, once: as soon as its offsets
        are reserved (durable), or when the append returns if it never said so."""
        if batch.answered:
            return
        batch.answered = True
        self._buffered -= batch.bytes  # durable or failed: no longer waiting to be committed
        if isinstance(outcome, AppendFailed):
            self.stats["flush_failures"] += 1
            self._answer(batch, failed=outcome)
        elif isinstance(outcome, Exception):
            self.stats["flush_failures"] += 1
            log.warning("flush of %d request(s), %d bytes failed: %s", len(batch.requests), batch.bytes, outcome)
            self._answer(batch, error=outcome)
        else:
            batch.acked = True
            self.stats["flushed_records"] += sum(len(g.records) for g in batch.groups)
            self.stats["flushed_bytes"] += batch.bytes
            self._observe("flush_bytes", batch.bytes)
            self._answer(batch, results=outcome)

    def _answer(self, batch: _Batch, results: Sequence[AppendResult] | None = None,
                failed: AppendFailed | None = None, error: BaseException | None = None) -> None:
        """Tell every request of ``batch`` the outcome of each of its groups."""
        outcomes: Sequence[Outcome]
        if results is not None:
            outcomes = results
        elif failed is not None:
            outcomes = _outcomes_of_partial(batch.groups, failed)
        else:
            outcomes = [error] * len(batch.groups)
        if self.on_durable is not None and error is None:
            try:
                self.on_durable(batch.groups, outcomes)
            except Exception:  # noqa: BLE001 - a cache never fails a produce
                log.exception("the on_durable hook failed on a batch of %d request(s)", len(batch.requests))
        for future, indexes in batch.requests:
            if not future.done():  # a client that went away cancelled its wait
                future.set_result([outcomes[i] for i in indexes])

    def _retry_after_s(self) -> int:
        """Whole seconds until the buffered bytes are likely committed (at least 1)."""
        if not self._flush_rate:
            return 1
        return max(1, math.ceil(self._buffered / self._flush_rate))


def _outcomes_of_partial(groups: Sequence[AppendGroup], failed: AppendFailed) -> list[Outcome]:
    """Per group, its result or its partition's error. ``failed.results`` holds the committed
    groups' results in group order (a partition commits all of its groups or none, unless the
    error says each group's outcome: :class:`GroupsFailed`, idempotent producers' groups)."""
    if isinstance(failed, GroupsFailed):
        return list(failed.outcomes)
    committed: dict[tuple[str, int], collections.deque[AppendResult]] = collections.defaultdict(collections.deque)
    for r in failed.results:
        committed[(r.topic, r.partition)].append(r)
    out = []
    for g in groups:
        key = (g.topic, g.partition)
        out.append(committed[key].popleft() if committed.get(key) else failed.errors.get(key) or failed)
    return out


def payload_bytes(records: pa.BinaryArray | Sequence[bytes]) -> int:
    """The record bytes of an array or list (what counts against the buffer): never more than
    the JSON that carried them, so a request the broker accepts by size always fits the buffer."""
    if not isinstance(records, pa.Array):
        return sum(map(len, records))
    offsets = np.frombuffer(records.buffers()[1], dtype=np.int32)
    return int(offsets[records.offset + len(records)] - offsets[records.offset])
