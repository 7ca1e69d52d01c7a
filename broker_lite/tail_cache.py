"""The tail cache: records this broker produced recently, kept in memory so a consumer reading
near the end of a partition is answered without Oxia or S3.

A record enters only once it is durable, when its offsets are reserved (so the cache never holds
anything a reader of Oxia and S3 could not see: such a reader reads the reservation as the
readable tail), as a *run*: a batch's consecutive offsets in one partition. A
lookup at an offset inside a run returns records from there, on through the runs that follow it
without a gap (another writer's offsets in between are not here: the lookup stops at the gap and
the consumer's next fetch misses and goes to the reader). Offsets are immutable within an
incarnation of a topic, so a cached record is never stale; only the high watermark a hit reports
can be behind one that another writer moved.

Runs are cached per incarnation (docs/protocol.md section 12): a topic deleted and created again is a
new incarnation with a new ``topic_id``, whose offsets start at 1 again, so every run carries the
``topic_id`` its append was reserved under and a lookup names the ``topic_id`` the fetch resolved:
a run of another incarnation is never an answer. A partition keeps the runs of one incarnation:
a run of another one drops them (so does :meth:`TailCache.forget`, when a fetch resolves another).

Bounded by ``LLOG_TAIL_CACHE_MAX_BYTES`` (record bytes plus a per-record overhead); the oldest
runs are evicted first. ``0`` turns the cache off. Used from the event loop only: no locks.
"""

from __future__ import annotations

import bisect
import collections
import os
import re
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llog.codec import (
    HEADERS_TYPE, V2_SCHEMA, Records, decode_batch, encode_batch, nulls, record_count, to_binary_array,
)
from llog.keys import TopicPartition, validate_topic_id
from llog.reader import RECORD_SCHEMA, Fetched

#: The name of a run's file in :class:`TailCacheDir`: first and last offset, created_at_ms.
_RUN_NAME = re.compile(r"[0-9]{20}-[0-9]{20}-[0-9]{20}\.llb")
#: Bytes a cached record costs beyond its value (its offset in the run's table, about).
RECORD_OVERHEAD = 16


#: A run: ``(first offset, value bytes back to back, where each value ends, created_at_ms,
#: records-v2)``. ``created_at_ms`` is that of the index entry the run landed in (what a reader
#: of the log finds for its records; Kafka's log-append time). ``records-v2`` is None when the
#: records are values and nothing more (an HTTP producer's, a Spark job's); otherwise (a Kafka
#: producer's: keys, headers, event times, tombstones) it is the run's records as one Arrow IPC
#: message of :data:`~llog.codec.V2_SCHEMA` (an Arrow buffer), the value bytes are not kept a
#: second time (the second item is empty), and the ends still count each value's bytes (a
#: tombstone's as 0), the budget a lookup spends. Only atomic objects, a numeric array and an
#: Arrow buffer, none of which the garbage collector tracks, so it stops tracking the tuple: the
#: cache holds tens of thousands of runs, and every object it tracks is walked by each full
#: collection (a list per run, then an object per run, made those pauses 40-100 ms).
_Run = tuple[int, bytes, np.ndarray, int, pa.Buffer | None]


def _run(first: int, records: Records | list[bytes], created_at_ms: int) -> _Run:
    if isinstance(records, pa.RecordBatch):  # records-v2
        if not records.schema.equals(V2_SCHEMA):
            records = records.cast(V2_SCHEMA)
        records = _compact(records)
        values = records.column("value")
        offsets = np.frombuffer(values.buffers()[1], dtype=np.int32, count=len(values) + 1, offset=4 * values.offset)
        lengths = np.diff(offsets).astype(np.int64)
        if values.null_count:  # a tombstone counts 0 bytes, whatever its offsets say
            lengths[values.is_null().to_numpy(zero_copy_only=False)] = 0
        return first, b"", np.cumsum(lengths), created_at_ms, records.serialize()
    if isinstance(records, pa.Array):  # the produce path: no Python object per record
        offsets = np.frombuffer(records.buffers()[1], dtype=np.int32, count=len(records) + 1, offset=4 * records.offset)
        data = records.buffers()[2].to_pybytes()[offsets[0]:offsets[-1]] if len(records) else b""
        return first, data, (offsets[1:] - offsets[0]).astype(np.int64), created_at_ms, None
    ends = np.cumsum(np.fromiter(map(len, records), dtype=np.int64, count=len(records)))
    return first, b"".join(records), ends, created_at_ms, None


def _compact(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with columns an IPC message holds as their own bytes only: an all-null column
    made afresh (:func:`llog.codec.nulls` hands out slices of one long array, which a message
    would carry whole: half a MiB for the headers' list type), a list column copied (a slice
    of one carries its children whole too)."""
    columns = []
    for column in batch.columns:
        if column.null_count == len(column):
            column = pa.nulls(len(column), column.type)
        elif pa.types.is_list(column.type):
            column = pa.concat_arrays([column])
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, schema=batch.schema)


def _last(run: _Run) -> int:
    return run[0] + len(run[2]) - 1


def _cost(run: _Run) -> int:
    return len(run[1]) + len(run[4] or b"") + RECORD_OVERHEAD * len(run[2])


def _batch(run: _Run, start: int, stop: int) -> pa.RecordBatch:
    """Records ``start..stop - 1`` (indexes in the run) as a batch of
    :data:`~llog.reader.RECORD_SCHEMA`, as the log's reader returns them (no copy of the values)."""
    first, data, ends, created_at_ms, v2 = run
    count = stop - start
    if v2 is None:
        offsets = np.empty(count + 1, dtype=np.int32)
        offsets[0] = ends[start - 1] if start else 0
        offsets[1:] = ends[start:stop]
        values = pa.Array.from_buffers(pa.binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
        keys, headers, times = nulls(pa.binary(), count), nulls(HEADERS_TYPE, count), nulls(pa.int64(), count)
    else:
        keys, values, headers, times = pa.ipc.read_record_batch(v2, V2_SCHEMA).slice(start, count).columns
    return _record_batch(first + start, values, created_at_ms, keys, headers, times)


def _record_batch(first: int, values: pa.Array, created_at_ms: int, keys: pa.Array | None = None,
                  headers: pa.Array | None = None, times: pa.Array | None = None) -> pa.RecordBatch:
    count = len(values)
    return pa.RecordBatch.from_arrays([
        pa.array(np.arange(first, first + count, dtype=np.int64)), values,
        pa.array(np.full(count, created_at_ms, dtype=np.int64)),
        keys if keys is not None else nulls(pa.binary(), count),
        headers if headers is not None else nulls(HEADERS_TYPE, count),
        times if times is not None else nulls(pa.int64(), count),
    ], schema=RECORD_SCHEMA)


@dataclass(frozen=True)
class CacheHit:
    """Records ``first..first + count - 1`` as batches of :data:`~llog.reader.RECORD_SCHEMA` (one a
    run, as :class:`~llog.reader.Fetched` has them); ``tail``: the last offset this broker knows
    was committed in the partition."""

    first: int
    batches: list[pa.RecordBatch]
    tail: int

    @property
    def count(self) -> int:
        return sum(b.num_rows for b in self.batches)

    @property
    def values(self) -> list[bytes | None]:
        return [v for b in self.batches for v in b.column(1).to_pylist()]

    def fetched(self, tp: TopicPartition, log_start_offset: int) -> Fetched:
        """The hit as the log's reader would have answered the fetch."""
        return Fetched(tp.topic, tp.partition, self.first, self.tail, self.batches, log_start_offset)


class TailCache:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = self.misses = self.evictions = 0
        #: Per partition: the ``topic_id`` of the incarnation its runs are of.
        self._ids: dict[TopicPartition, str] = {}
        self._runs: dict[TopicPartition, list[_Run]] = {}
        self._firsts: dict[TopicPartition, list[int]] = {}
        #: ``(topic, partition, topic_id, first)`` of every run, oldest first (atomic tuples: untracked).
        self._age: collections.deque[tuple[str, int, str, int]] = collections.deque()

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def add(self, tp: TopicPartition, topic_id: str, first: int, records: Records | list[bytes],
            created_at_ms: int) -> None:
        """Records committed at offsets ``first..`` of incarnation ``topic_id``, in an entry made
        at ``created_at_ms`` (values, or a batch of records-v2); a run larger than the whole cache
        is not kept. The runs of another incarnation of ``tp`` are dropped."""
        if not self.enabled or not record_count(records):
            return
        run = _run(first, records, created_at_ms)
        if _cost(run) > self.max_bytes:
            return
        if self._ids.get(tp, topic_id) != topic_id:
            self.forget(tp)  # the topic was deleted (and created again): those runs are of no use
        self._ids[tp] = topic_id
        runs, firsts = self._runs.setdefault(tp, []), self._firsts.setdefault(tp, [])
        at = bisect.bisect_left(firsts, first)
        if (at < len(firsts) and firsts[at] <= _last(run)) or (at and _last(runs[at - 1]) >= first):
            # Offsets are reserved once within an incarnation, so this is a bug elsewhere: keep
            # only the newest run rather than guess which records an offset has.
            self.forget(tp)
            self._ids[tp] = topic_id
            runs, firsts, at = self._runs.setdefault(tp, []), self._firsts.setdefault(tp, []), 0
        runs.insert(at, run)
        firsts.insert(at, first)
        self._age.append((tp.topic, tp.partition, topic_id, first))
        self.bytes += _cost(run)
        while self.bytes > self.max_bytes:
            self._evict()

    def forget(self, tp: TopicPartition) -> None:
        """Drop every run of ``tp`` (their age entries are skipped when they come up)."""
        for run in self._runs.pop(tp, []):
            self.bytes -= _cost(run)
        self._firsts.pop(tp, None)
        self._ids.pop(tp, None)

    def _evict(self) -> None:
        topic, partition, topic_id, first = self._age.popleft()
        tp = TopicPartition(topic, partition)
        if self._ids.get(tp) != topic_id:
            return  # forgotten, with its incarnation
        runs, firsts = self._runs.get(tp), self._firsts.get(tp)
        at = -1 if not firsts else 0 if firsts[0] == first else bisect.bisect_left(firsts, first)
        if at < 0 or at == len(firsts) or firsts[at] != first:
            return  # forgotten
        self.bytes -= _cost(runs[at])
        del runs[at], firsts[at]
        if not runs:
            del self._runs[tp], self._firsts[tp], self._ids[tp]
        self.evictions += 1

    def incarnation(self, tp: TopicPartition) -> str | None:
        """The ``topic_id`` of the runs cached for ``tp`` (None if none)."""
        return self._ids.get(tp)

    def tail(self, tp: TopicPartition) -> int | None:
        """The last offset cached for ``tp``, of its cached incarnation (None if none)."""
        runs = self._runs.get(tp)
        return _last(runs[-1]) if runs else None

    def get(self, tp: TopicPartition, topic_id: str, offset: int, max_bytes: int) -> CacheHit | None:
        """Records of incarnation ``topic_id`` from ``offset`` while they are cached without a
        gap, about ``max_bytes`` of them (the first always); None when ``offset`` of that
        incarnation is not cached (a miss)."""
        firsts = self._firsts.get(tp) if self._ids.get(tp) == topic_id else None
        at = bisect.bisect_right(firsts, offset) - 1 if firsts else -1
        runs = self._runs.get(tp)
        if at < 0 or _last(runs[at]) < offset:
            self.misses += 1
            return None
        self.hits += 1
        out: list[pa.RecordBatch] = []
        budget, position = max_bytes, offset
        while True:
            run = runs[at]
            first, _, ends = run[:3]
            skip = position - first
            base = int(ends[skip - 1]) if skip else 0
            take = max(int(np.searchsorted(ends, base + budget, side="right")) - skip, 0)
            if not out and take == 0:
                take = 1
            if take:
                out.append(_batch(run, skip, skip + take))
            position += take
            if skip + take < len(ends):
                break  # the budget ended inside this run
            budget -= int(ends[-1]) - base
            at += 1
            if budget <= 0 or at == len(runs) or runs[at][0] != position:
                break
        return CacheHit(offset, out, _last(runs[-1]))


class TailCacheDir:
    """The tail cache shared by the brokers of one machine through a directory
    (``LLOG_TAIL_CACHE_DIR``): a broker that produces writes each committed run as a file, a
    broker that consumes (another process, e.g. ``--role read``) reads runs from there before it
    asks Oxia and S3.

    A run is the file
    ``{dir}/{root}/{topic}/{topic_id}/{partition}/{first:020d}-{last:020d}-{created_at_ms:020d}.llb``
    (one directory per incarnation of a topic, as in :class:`TailCache`; ``created_at_ms`` that of
    the index entry the run landed in), one bytes-batch-v1 body
    (docs/protocol.md section 3, CRC checked when read), written to a temporary name and renamed, so a
    reader sees a whole run or none. A reader looks only in the directory of the incarnation its
    fetch resolved. A writer keeps at most ``max_bytes`` of its own runs and deletes its oldest
    first; its first run of an incarnation removes the partition's directories of the others. A
    run deleted while a reader looks for it is a miss. Only runs of values are shared (records
    with keys, headers, event times or tombstones are not: bytes-batch-v1 holds values). Blocking:
    call from threads, not the event loop.
    """

    def __init__(self, directory: str | os.PathLike, root: str, max_bytes: int):
        self.root = Path(directory) / root
        self.max_bytes = max_bytes
        self.bytes = 0
        self._written: collections.deque[tuple[Path, int]] = collections.deque()
        self._lock = threading.Lock()
        #: Per partition: the incarnation this process last wrote a run of.
        self._writing: dict[TopicPartition, str] = {}
        #: Per partition and incarnation: its directory's mtime and the runs listed then (:meth:`_spans`).
        self._listings: dict[tuple[TopicPartition, str], tuple[int, list[tuple[int, int, str]]]] = {}

    def _dir(self, tp: TopicPartition, topic_id: str) -> Path:
        return self.root / tp.topic / validate_topic_id(topic_id) / str(tp.partition)

    def add(self, tp: TopicPartition, topic_id: str, first: int, values: pa.BinaryArray | list[bytes],
            created_at_ms: int) -> None:
        body = encode_batch(to_binary_array(values))
        if not values or body.length > self.max_bytes:
            return
        directory = self._dir(tp, topic_id)
        if self._writing.get(tp) != topic_id:
            self._drop_other_incarnations(tp, topic_id)
            self._writing[tp] = topic_id
        directory.mkdir(parents=True, exist_ok=True)
        last = first + len(values) - 1
        for run_first, run_last, name in self._spans(tp, topic_id, first):  # a bug elsewhere (TailCache.add)
            if run_first <= last and run_last >= first:
                (directory / name).unlink(missing_ok=True)
        path = directory / f"{first:020d}-{last:020d}-{created_at_ms:020d}.llb"
        partial = directory / f".{path.name}.{os.getpid()}.{threading.get_ident()}"
        with open(partial, "wb") as f:
            for piece in body.pieces:
                f.write(piece)
        os.replace(partial, path)
        with self._lock:
            self._written.append((path, body.length))
            self.bytes += body.length
            while self.bytes > self.max_bytes:
                old, size = self._written.popleft()
                old.unlink(missing_ok=True)
                self.bytes -= size

    def _drop_other_incarnations(self, tp: TopicPartition, topic_id: str) -> None:
        """Remove ``tp``'s runs of every incarnation but ``topic_id`` (no reader serves them: this
        only frees the space; a writer of an older one still at work may write some again)."""
        try:
            ids = os.listdir(self.root / tp.topic)
        except FileNotFoundError:
            return
        for other in ids:
            if other != topic_id:
                shutil.rmtree(self.root / tp.topic / other / str(tp.partition), ignore_errors=True)
                try:
                    (self.root / tp.topic / other).rmdir()  # when that was its last partition
                except OSError:
                    pass

    def _spans(self, tp: TopicPartition, topic_id: str, offset: int) -> list[tuple[int, int, str]]:
        """The runs in the directory of ``tp``'s incarnation ``topic_id`` as ``(first, last, file
        name)``, ascending (names of another form are not runs). The listing is kept while the directory's mtime stays and ``offset``
        is within it (a listing is thousands of names; the mtime may not change for two runs
        written within its tick, so an offset past the listing lists again). A stale listing only
        costs misses: a run deleted since is not found when read."""
        directory = self._dir(tp, topic_id)
        try:
            mtime = os.stat(directory).st_mtime_ns
        except FileNotFoundError:
            return []
        kept = self._listings.get((tp, topic_id))
        if kept is not None and kept[0] == mtime and kept[1] and offset <= kept[1][-1][1]:
            return kept[1]
        try:
            names = sorted(n for n in os.listdir(directory) if _RUN_NAME.fullmatch(n))
        except FileNotFoundError:  # removed since (its incarnation was replaced)
            return []
        spans = [(int(n[:20]), int(n[21:41]), n) for n in names]
        self._listings[(tp, topic_id)] = (mtime, spans)
        return spans

    def get(self, tp: TopicPartition, topic_id: str, offset: int, max_bytes: int) -> CacheHit | None:
        """Like :meth:`TailCache.get`, from the directory of incarnation ``topic_id``; ``tail`` is
        the last offset of the runs found there."""
        spans = self._spans(tp, topic_id, offset)
        at = bisect.bisect_right(spans, (offset, float("inf"))) - 1
        if at < 0 or spans[at][1] < offset:
            return None
        directory = self._dir(tp, topic_id)
        out: list[pa.RecordBatch] = []
        budget, position = max_bytes, offset
        while at < len(spans) and spans[at][0] <= position <= spans[at][1] and budget > 0:
            first, last, name = spans[at]
            try:
                raw = (directory / name).read_bytes()
            except FileNotFoundError:
                break
            values = decode_batch(raw, last - first + 1, str(directory / name)).slice(position - first)
            sizes = np.cumsum(pc.binary_length(values).to_numpy(zero_copy_only=False), dtype=np.int64)
            take = max(int(np.searchsorted(sizes, budget, side="right")), 0 if out else 1)
            if take:
                out.append(_record_batch(position, values.slice(0, take), int(name[42:62])))
            budget -= int(sizes[take - 1]) if take else budget
            position += take
            if take < len(values):
                break
            at += 1
        if not out:
            return None
        return CacheHit(offset, out, spans[-1][1])
