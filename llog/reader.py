"""The read path (docs/protocol.md section 5).

Offsets resolve to index entries (a range scan, then a ceiling get for the tail, then
``pending``), entries group by blob, each blob is fetched once per call (a range GET spanning the
slices needed), and bodies decode straight into Arrow arrays over the fetched bytes. A gap in the
index is an error, never a skip.

Compaction may be midway (section 6, between the end-key overwrite and the delete range): a
COMPACTED entry then overlaps the WAL entries below it. Both hold the same records, so the
resolver takes each offset from the first entry in key order that covers it.

Compaction and GC may also finish between resolving and fetching: the WAL blob an entry named
is then gone, and its offsets are in a compacted entry. The slices of a blob found missing,
and only those, are resolved again and fetched; the rest of the read keeps what it fetched (a
long read of a partition whose entries keep reaching the compaction lag would otherwise lose
the race again and again). One more round suffices: GC collects a blob only once no index
entry references it, an index key is never created again (section 8), so those offsets now
resolve to compacted entries, which GC keeps. A blob still missing after
:data:`MISSING_ROUNDS` rounds raises :class:`ObjectNotFound`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from llog import failpoints
from llog.clients import ClientUser
from llog.codec import (
    BATCH_HEADER_SIZE, HEADERS_TYPE, Records, binary_bytes, body_compression, decode_body, nulls, offsets_prefix_length,
    read_batch_header, record_span,
)
from llog.config import Config
from llog.control import ControlState, read_control
from llog.coordination import Coordination, Versioned
from llog.errors import (
    CorruptBatch, InconsistentReadState, InvalidOffset, LlogError, ObjectNotFound, OffsetOutOfRange,
    PartitionNotInitialized, TopicDeleted, TopicNotFound, TopicRecreated,
)
from llog.keys import PartitionKeys
from llog.objects import ObjectStore
from llog.records import BYTES_BATCH_V1, RECORDS_V2, ControlRecord, IndexEntry, LocatedEntry

#: Schema of the Arrow batches the reads return: offset, value (null: a tombstone), the time the
#: log accepted the record, then what records-v2 adds (docs/protocol.md section 11; null for records
#: written as bytes-batch-v1): key, headers and the producer's event time (ms).
RECORD_SCHEMA = pa.schema([
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("value", pa.binary()),
    pa.field("created_at_ms", pa.int64(), nullable=False),
    pa.field("key", pa.binary()),
    pa.field("headers", HEADERS_TYPE),
    pa.field("timestamp", pa.int64()),
])
#: How often the slices of a blob found missing are resolved again before ObjectNotFound.
MISSING_ROUNDS = 2
#: Offsets :meth:`LogReader.iter_from` resolves per round trip.
ITER_WINDOW = 100_000
#: Bytes of record bodies :meth:`LogReader.stream_batches` fetches per step, and steps in flight.
STREAM_CHUNK_BYTES = 32 * 1024 * 1024
STREAM_LOOKAHEAD = 2
#: :meth:`LogReader.fetch` reads a body in part (its offsets table, then the records within the
#: budget: two GETs one after the other) when it is larger than this many times the budget and
#: than :data:`PARTIAL_READ_MIN_BYTES`, or its size is unknown (a compacted object), instead of
#: fetching it whole.
PARTIAL_READ_FACTOR = 2
#: Bodies up to this size are fetched whole whatever the budget: one GET of a MiB takes less
#: than two GETs' round trips (on S3 a GET's first byte takes 10-30 ms, a MiB about 10 ms more;
#: on the local stack a consume of 500 records from 100 KB bodies went 15-20% faster).
PARTIAL_READ_MIN_BYTES = 1 << 20
#: A partial read fetches the offsets of at most ``budget // PARTIAL_MIN_RECORD_BYTES`` records
#: (smaller records fill less of the budget).
PARTIAL_MIN_RECORD_BYTES = 64
#: Bytes per record assumed when planning how far a fetch reads past an entry of unknown size.
_ASSUMED_RECORD_BYTES = 100


@dataclass(frozen=True)
class Record:
    """One record. ``value`` None is a tombstone; ``key``, ``headers`` (``(key, value)``
    pairs) and ``timestamp`` (the producer's event time, ms) are None when the record has none."""

    topic: str
    partition: int
    offset: int
    value: bytes | None
    created_at_ms: int
    key: bytes | None = None
    headers: list[tuple[str, bytes | None]] | None = None
    timestamp: int | None = None


@dataclass(frozen=True)
class ReadRequest:
    """Offsets ``start..end`` (inclusive) of one topic-partition; ``end=None`` means up to the
    high watermark at the time of the read."""

    topic: str
    partition: int
    start: int
    end: int | None = None


@dataclass(frozen=True)
class PartitionBatches:
    """What one :class:`ReadRequest` returned: Arrow batches in offset order
    (:data:`RECORD_SCHEMA`), and the high watermark seen."""

    topic: str
    partition: int
    start: int
    end: int
    high_watermark: int
    batches: list[pa.RecordBatch]
    #: The ``topic_id`` in the partition's ``meta/control`` when the range was resolved
    #: (docs/protocol.md section 10.1; None: initialized before topic records).
    topic_id: str | None = None

    @property
    def count(self) -> int:
        return sum(b.num_rows for b in self.batches)

    def table(self) -> pa.Table:
        return pa.Table.from_batches(self.batches, schema=RECORD_SCHEMA)


@dataclass(frozen=True)
class FetchRequest:
    """Records of one topic-partition from ``offset`` on, about ``max_bytes`` of record bytes at
    most (the first record always, even if larger)."""

    topic: str
    partition: int
    offset: int
    max_bytes: int


@dataclass(frozen=True)
class Fetched:
    """What one :class:`FetchRequest` returned: records ``offset..`` in Arrow batches
    (:data:`RECORD_SCHEMA`), maybe none (``offset`` is the high watermark + 1)."""

    topic: str
    partition: int
    offset: int
    high_watermark: int
    batches: list[pa.RecordBatch]
    #: The partition's first readable offset when the fetch read ``meta/control``.
    log_start_offset: int = 1

    @property
    def count(self) -> int:
        return sum(b.num_rows for b in self.batches)

    @property
    def nbytes(self) -> int:
        """Record bytes (the values, not offsets or timestamps)."""
        return sum(binary_bytes(b.column(1)) for b in self.batches)


@dataclass(frozen=True)
class _Slice:
    """Offsets ``lo..hi`` to take from ``located``."""

    located: LocatedEntry
    lo: int
    hi: int


def _check_offset(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidOffset(f"{name} must be an int >= 1 (offsets start at 1), got {value!r}")
    return value


class LogReader(ClientUser):
    """Reads records by offset. Thread-safe; reuse one per process."""

    def __init__(self, config: Config, coordination: Coordination | None = None,
                 objects: ObjectStore | None = None, max_workers: int = 8):
        super().__init__(config.require("oxia_service_address"), coordination, objects, max_workers, "llog-read")

    def high_watermark(self, topic: str, partition: int) -> int:
        """Last readable offset (0 for an empty partition)."""
        return self._read_control(topic, partition)[1].record.high_watermark

    def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        """``(log_start_offset, high_watermark)``: the readable offsets are the range between
        them, inclusive (none when the start is past the high watermark); below the start,
        retention removed them (docs/protocol.md section 10.3)."""
        record = self._read_control(topic, partition)[1].record
        return record.log_start_offset, record.high_watermark

    # --- the incarnation a read is of (section 12) ----------------------------------------------

    def _locate(self, targets: Sequence[tuple[str, int, int]]
                ) -> list[tuple[PartitionKeys | LlogError, ControlState | None, Versioned | None]]:
        """Per ``(topic, partition, offset)``: the partition's keys in its topic's current
        incarnation (or :class:`TopicNotFound`), its ``meta/control`` (None: missing) and the
        ceiling index entry of ``offset``, in one multi-key read per shard. A control missing or a tombstone under a
        cached topic id may mean the topic was re-created since it was cached: those topics'
        records are read again, and the read repeated once."""
        self.warn_clock_once()
        stale: set[str] = set()
        for attempt in range(2):
            for topic in stale:
                self.topics.get(topic, fresh=True)
            keys: list[PartitionKeys | LlogError] = []
            for topic, partition, offset in targets:
                _check_offset("start offset", offset)  # before it goes into a key
                try:
                    keys.append(self.keys(topic, partition))
                except TopicNotFound as e:
                    keys.append(e)
            live = [(i, k) for i, k in enumerate(keys) if isinstance(k, PartitionKeys)]
            found = self.coordination.get_many(
                [(k.control, k.partition_key) for _, k in live]
                + [(k.index(targets[i][2]), k.partition_key) for i, k in live],
                ceiling_within=[None] * len(live) + [k.index_prefix for _, k in live],
            ) if live else []
            out: list[tuple[PartitionKeys | LlogError, ControlState | None, Versioned | None]] = [
                (k, None, None) for k in keys]
            for j, (i, k) in enumerate(live):
                control = found[j]
                out[i] = (k, None if control is None else ControlState(ControlRecord.from_json(control.value, k.control),
                                                                       control.version_id), found[len(live) + j])
            stale = {k.tp.topic for k, control, _ in out if isinstance(k, PartitionKeys)
                     and (control is None or control.record.deleted)}
            if not stale or attempt:
                return out
        raise AssertionError("unreachable")

    @staticmethod
    def _live(keys: PartitionKeys | LlogError, state: ControlState | None) -> ControlState:
        """The control state of a located partition, or its error: no topic, not initialized,
        or its incarnation deleted."""
        if isinstance(keys, LlogError):
            raise keys
        if state is None:
            raise PartitionNotInitialized(keys.tp.topic, keys.tp.partition)
        if state.record.deleted:
            raise TopicDeleted(keys.tp.topic, keys.tp.partition, keys.topic_id)
        return state

    def _read_control(self, topic: str, partition: int) -> tuple[PartitionKeys, ControlState]:
        keys, control, _ = self._locate([(topic, partition, 1)])[0]
        return keys, self._live(keys, control)

    # --- resolving offsets to entries (sections 5.1 to 5.3, 5.5) -----------------------------

    def _control(self, keys: PartitionKeys, start: int, end: int | None,
                 state: ControlState | None = None) -> tuple[ControlState, int]:
        state = state or read_control(self.coordination, keys)
        hw, first = state.record.high_watermark, state.record.log_start_offset
        _check_offset("start offset", start)
        if end is None:
            end = hw
        elif _check_offset("end offset", end) < start:
            raise InvalidOffset(f"end offset {end} is before start offset {start}")
        if start > hw or end > hw:
            raise OffsetOutOfRange(keys.tp.topic, keys.tp.partition, end if start <= hw else start, hw, first)
        if start < first:
            raise OffsetOutOfRange(keys.tp.topic, keys.tp.partition, start, hw, first)
        return state, end

    def _gone(self, keys: PartitionKeys, offset: int, problem: InconsistentReadState) -> LlogError:
        """The error for offsets no entry covers: :class:`OffsetOutOfRange` when ``meta/control``,
        read again, has a log start past ``offset`` (a retention pass dropped them after this
        read began; docs/protocol.md section 10.3), else ``problem`` (a gap)."""
        record = read_control(self.coordination, keys).record
        if offset < record.log_start_offset:
            return OffsetOutOfRange(keys.tp.topic, keys.tp.partition, offset, record.high_watermark,
                                    record.log_start_offset)
        return problem

    def _resolve(self, keys: PartitionKeys, state: ControlState, start: int, end: int) -> list[_Slice]:
        """Cover ``start..end`` with entries: a range scan of the keys below ``end``, a ceiling
        get for the entry covering ``end``, ``pending`` for the unmaterialized tail."""
        pk = keys.partition_key
        candidates = [
            LocatedEntry(keys.index_end_offset(v.key), IndexEntry.from_json(v.value, v.key))
            for v in self.coordination.range_scan(keys.index(start), keys.index(end), pk)
        ]
        tail = self.coordination.ceiling(keys.index(end), pk, keys.index_prefix)
        if tail is not None:
            candidates.append(LocatedEntry(keys.index_end_offset(tail.key), IndexEntry.from_json(tail.value, tail.key)))
        if state.record.pending is not None:
            candidates.append(state.record.pending.located())
        candidates.sort(key=lambda c: c.end_offset)  # stable: an index entry before its pending twin

        slices, position = [], start
        for located in candidates:
            if position > end:
                break
            if located.end_offset < position:
                continue  # already covered (an overlapping entry of a compaction midway)
            if located.start_offset > position:
                raise self._gone(keys, position, InconsistentReadState(
                    f"{keys.tp}: no index entry covers offset {position} (next entry covers "
                    f"{located.start_offset}..{located.end_offset}); the high watermark is "
                    f"{state.record.high_watermark}"
                ))
            slices.append(_Slice(located, position, min(end, located.end_offset)))
            position = min(end, located.end_offset) + 1
        if position <= end:
            raise self._gone(keys, position, InconsistentReadState(
                f"{keys.tp}: offsets {position}..{end} are below the high watermark "
                f"{state.record.high_watermark} but no index entry or pending append covers them"
            ))
        return slices

    # --- fetching and decoding (section 5.4) --------------------------------------------------

    @staticmethod
    def _by_blob(slices: Sequence[_Slice]) -> list[tuple[str, list[_Slice]]]:
        by_blob: dict[str, list[_Slice]] = {}
        for s in slices:
            by_blob.setdefault(s.located.entry.data_key, []).append(s)
        return list(by_blob.items())

    def _fetch_blob(self, uri: str, group: Sequence[_Slice]) -> list[tuple[_Slice, memoryview]]:
        """The bodies of ``group``'s entries in blob ``uri``: one range GET spanning them when
        they all have byte ranges, else one GET of the object."""
        if all(s.located.entry.byte_offset is not None for s in group):
            lo = min(s.located.entry.byte_offset for s in group)
            hi = max(s.located.entry.byte_offset + s.located.entry.byte_length for s in group)
            blob = memoryview(self.objects.get(uri, lo, hi - lo))
        else:
            lo, blob = 0, memoryview(self.objects.get(uri))
        return [(s, blob if s.located.entry.byte_offset is None else
                 blob[s.located.entry.byte_offset - lo: s.located.entry.byte_offset - lo + s.located.entry.byte_length])
                for s in group]

    @staticmethod
    def _decode(s: _Slice, body: memoryview) -> Records:
        where = f"{s.located.entry.data_key} (offsets {s.located.start_offset}..{s.located.end_offset})"
        return decode_body(s.located.entry.encoding, body, s.located.entry.msg_count, where)

    def _fetch(self, slices: Sequence[_Slice]) -> dict[int, Records]:
        """Decode every slice's entry, fetching each blob once; :class:`ObjectNotFound` if a blob
        is missing."""
        decoded, missing = self._fetch_available(slices)
        if missing is not None:
            raise missing
        return decoded

    def _fetch_available(self, slices: Sequence[_Slice], compressions: dict[int, str] | None = None
                         ) -> tuple[dict[int, Records], ObjectNotFound | None]:
        """Decode the entry of every slice whose blob exists, fetching each blob once; and the
        error of a blob found missing, if any. Blobs are fetched in parallel; decoding (a CRC at
        several GB/s) runs in the calling thread."""

        def fetch(item: tuple[str, list[_Slice]]) -> list[tuple[_Slice, memoryview]] | ObjectNotFound:
            try:
                return self._fetch_blob(*item)
            except ObjectNotFound as e:
                return e

        failpoints.hit("reader.before_fetch")
        decoded: dict[int, Records] = {}
        missing = None
        for part in self._map(fetch, self._by_blob(slices)):
            if isinstance(part, ObjectNotFound):
                missing = part
                continue
            for s, body in part:
                decoded[id(s)] = self._decode(s, body)
                if compressions is not None:
                    compressions[id(s)] = body_compression(body) if s.located.entry.encoding == RECORDS_V2 else "none"
        return decoded, missing

    def _batches(self, items: Sequence[tuple[str, int, _Slice]],
                 topic_ids: dict[tuple[str, int], str | None] | None = None) -> list[list[pa.RecordBatch]]:
        """The record batches of each ``(topic, partition, slice)``, in offset order, fetching
        each blob once per round. The slices of a blob found missing are resolved again and
        fetched in the next round, at most :data:`MISSING_ROUNDS` times (module doc)."""
        parts: list[list[tuple[_Slice, pa.RecordBatch | None]]] = [[(s, None)] for _, _, s in items]
        for round_ in range(MISSING_ROUNDS + 1):
            decoded, missing = self._fetch_available([s for part in parts for s, batch in part if batch is None])
            gone = [(i, s) for i, part in enumerate(parts) for s, batch in part if batch is None and id(s) not in decoded]
            if gone and round_ == MISSING_ROUNDS:
                raise missing
            resolved = self._resolve_many([ReadRequest(items[i][0], items[i][1], s.lo, s.hi) for i, s in gone]) \
                if gone else []
            for (i, _), (state, _, _) in zip(gone, resolved):
                _same_topic(items[i][0], items[i][1], topic_ids, state)
            again = iter(resolved)
            for i, part in enumerate(parts):
                parts[i] = []
                for s, batch in part:
                    if batch is not None:
                        parts[i].append((s, batch))
                    elif id(s) in decoded:
                        parts[i].append((s, self._to_batch(s, decoded[id(s)])))
                    else:  # in the order of ``gone``
                        parts[i] += [(fresh, None) for fresh in next(again)[2]]
            if not gone:
                break
        return [[batch for _, batch in part] for part in parts]

    def _map(self, fn, items: list) -> list:
        return list(self._pool.map(fn, items)) if len(items) > 1 else [fn(i) for i in items]

    @staticmethod
    def _to_batch(s: _Slice, records: Records) -> pa.RecordBatch:
        return _record_batch(s.lo, s.located.entry.created_at_ms, records, s.lo - s.located.start_offset,
                             s.hi - s.lo + 1)

    # --- public reads -------------------------------------------------------------------------

    def _resolve_many(self, requests: Sequence[ReadRequest]) -> list[tuple[ControlState, int, list[_Slice]]]:
        """Per request: the partition's control, the end offset and the slices covering the
        range. One multi-key Oxia read per shard for all requests gets every partition's
        ``meta/control`` record and the ceiling index entry of every start offset (section 5,
        steps 1 and 2); a request one entry does not cover falls back to :meth:`_resolve`."""
        resolved = []
        for req, (k, control, first) in zip(requests, self._locate([(r.topic, r.partition, r.start) for r in requests])):
            state, end = self._control(k, req.start, req.end, self._live(k, control))
            located = first and LocatedEntry(k.index_end_offset(first.key), IndexEntry.from_json(first.value, first.key))
            if located is not None and located.start_offset <= req.start and located.end_offset >= end:
                resolved.append((state, end, [_Slice(located, req.start, end)]))
            else:
                resolved.append((state, end, self._resolve(k, state, req.start, end)))
        return resolved

    def read_batches(self, requests: Sequence[ReadRequest]) -> list[PartitionBatches]:
        """Read several topic-partition ranges as Arrow batches, one result per request.

        Resolution is one multi-key Oxia read per shard (:meth:`_resolve_many`); then every
        blob is fetched once for the whole call, even when several partitions share it.
        """
        requests = list(requests)
        resolved = self._resolve_many(requests)
        topic_ids = {(req.topic, req.partition): state.record.topic_id for req, (state, _, _) in zip(requests, resolved)}
        batches = iter(self._batches([(req.topic, req.partition, s)
                                      for req, (_, _, slices) in zip(requests, resolved) for s in slices], topic_ids))
        return [
            PartitionBatches(req.topic, req.partition, req.start, end, state.record.high_watermark,
                             [batch for _ in slices for batch in next(batches)], state.record.topic_id)
            for req, (state, end, slices) in zip(requests, resolved)
        ]

    def fetch(self, requests: Sequence[FetchRequest], max_bytes: int | None = None,
              _again: bool = True) -> list[Fetched | LlogError]:
        """Records from each request's offset, bounded in bytes: a consumer's fetch (the HTTP
        broker's ``POST /consume``). Each request gets its own outcome: a :class:`Fetched`
        (empty at the high watermark + 1) or its partition's error
        (:class:`PartitionNotInitialized`, :class:`OffsetOutOfRange` past the high watermark + 1,
        a storage error), so one bad partition does not fail the others.

        A partition returns about ``max_bytes`` of record bytes at most, the whole call
        ``max_bytes`` at most, in request order; a partition gets at least its first record
        while the call's budget is not spent, so a consumer always moves on. Resolution is one
        multi-key Oxia read per shard, plus a range scan for a request that reaches past its
        first entry; bodies within the budget are fetched whole, one GET per blob for the whole
        call (CRC checked); a body much larger than the budget, or of unknown size (a compacted
        object), is read in part: its offsets table, then the records that fit (bounds checked).
        """
        requests = list(requests)
        for r in requests:
            _check_offset("fetch offset", r.offset)
            if r.max_bytes < 1:
                raise InvalidOffset(f"max_bytes must be >= 1, got {r.max_bytes}")
        located = self._locate([(r.topic, r.partition, r.offset) for r in requests])
        outcomes: list[Fetched | LlogError | None] = [None] * len(requests)
        plans: dict[int, tuple[int, int, list[_Slice]]] = {}  # request -> (high watermark, budget, slices)
        starts: dict[int, int] = {}  # request -> log start offset
        topic_ids: dict[tuple[str, int], str | None] = {}  # partition -> topic_id when this fetch began
        remaining = max_bytes if max_bytes is not None else float("inf")
        for i, (req, (k, control, first)) in enumerate(zip(requests, located)):
            try:
                state = self._live(k, control)
            except LlogError as e:
                outcomes[i] = e
                continue
            topic_ids[(req.topic, req.partition)] = state.record.topic_id
            hw, log_start = state.record.high_watermark, state.record.log_start_offset
            if req.offset > hw + 1 or req.offset < log_start:
                outcomes[i] = OffsetOutOfRange(req.topic, req.partition, req.offset, hw, log_start)
                continue
            budget = int(min(req.max_bytes, max_bytes or req.max_bytes))
            if req.offset == hw + 1 or remaining <= 0:  # caught up, or the call's budget is spent (estimated)
                outcomes[i] = Fetched(req.topic, req.partition, req.offset, hw, [], log_start)
                continue
            try:
                slices = self._plan(k, state, req.offset, budget,
                                    first and LocatedEntry(k.index_end_offset(first.key), IndexEntry.from_json(first.value, first.key)))
            except LlogError as e:
                outcomes[i] = e
                continue
            plans[i] = (hw, budget, slices)
            starts[i] = log_start
            remaining -= sum(_estimate(s) for s in slices)

        whole = [(i, s) for i, (_, budget, slices) in plans.items() for s in slices if not _partial(s, budget)]
        partial = [(i, s) for i, (_, budget, slices) in plans.items() for s in slices if _partial(s, budget)]
        got: dict[int, list[pa.RecordBatch]] = {id(s): [] for _, (_, _, slices) in plans.items() for s in slices}
        failed: dict[int, LlogError] = {}
        try:
            for (_, s), batches in zip(whole, self._batches([(requests[i].topic, requests[i].partition, s) for i, s in whole],
                                                               topic_ids)):
                got[id(s)] = batches
        except LlogError:  # find whose: each partition on its own
            for i in {i for i, _ in whole}:
                mine = [s for j, s in whole if j == i]
                try:
                    for s, batches in zip(mine, self._batches([(requests[i].topic, requests[i].partition, s) for s in mine],
                                                                      topic_ids)):
                        got[id(s)] = batches
                except LlogError as e:
                    failed[i] = e
        for (i, s), part in zip(partial, self._map(lambda item: self._read_partial(item[1], plans[item[0]][1]), partial)):
            if isinstance(part, LlogError):
                failed.setdefault(i, part)
            else:
                got[id(s)] = [part]

        retry = [i for i, e in failed.items() if isinstance(e, ObjectNotFound) and _again]
        if retry:  # compacted and collected since it was resolved: once more, now from the compacted entry
            for i, outcome in zip(retry, self.fetch([requests[i] for i in retry], None, _again=False)):
                outcomes[i] = outcome
        remaining = max_bytes if max_bytes is not None else float("inf")
        for i, (hw, _, slices) in plans.items():
            if outcomes[i] is not None:
                continue
            if i in failed:
                outcomes[i] = failed[i]
                continue
            batches = _trim(_contiguous(slices, got), int(min(requests[i].max_bytes, remaining)))
            outcomes[i] = Fetched(requests[i].topic, requests[i].partition, requests[i].offset, hw, batches, starts[i])
            remaining -= outcomes[i].nbytes
        return outcomes

    def _plan(self, keys: PartitionKeys, state: ControlState, offset: int, budget: int,
              first: LocatedEntry | None) -> list[_Slice]:
        """The slices a fetch of ``budget`` bytes from ``offset`` reads: the entry covering
        ``offset`` (``first``, from the ceiling get), and when its estimated bytes fall short of
        the budget, the entries after it up to an offset estimated from its record size."""
        hw = state.record.high_watermark
        if first is not None and first.start_offset <= offset:
            head = _Slice(first, offset, min(first.end_offset, hw))
            if head.hi >= hw or _estimate(head) >= budget:
                return [head]
            per_record = _record_bytes(first)
            end = min(hw, max(head.hi + 1, offset + -(-budget // per_record)))
        else:  # only pending covers it (or compaction is midway): resolve a window
            end = min(hw, offset + max(1, budget // _ASSUMED_RECORD_BYTES))
        slices, total = [], 0
        for s in self._resolve(keys, state, offset, end):
            slices.append(s)
            total += _estimate(s)
            if total >= budget:
                break
        return slices

    def _read_partial(self, s: _Slice, budget: int) -> pa.RecordBatch | LlogError:
        """The first records of slice ``s`` that fit ``budget`` (one at least), read in part:
        the offsets table of the records considered, then their bytes (two range GETs). The
        offsets are checked to be ordered and inside the body; with no CRC over a part, that
        is the check, plus magic and count when the table is read from the body's start."""
        entry, located = s.located.entry, s.located
        uri, base = entry.data_key, entry.byte_offset or 0
        where = f"{uri} (offsets {located.start_offset}..{located.end_offset})"
        first = s.lo - located.start_offset
        considered = min(s.hi - s.lo + 1, max(1, budget // PARTIAL_MIN_RECORD_BYTES))
        try:
            table_start = 0 if first * 4 <= 4096 else BATCH_HEADER_SIZE + 4 * first
            table_end = BATCH_HEADER_SIZE + 4 * (first + considered + 1)
            raw, size = self.objects.get_with_size(uri, base + table_start, table_end - table_start)
            if table_start == 0:
                read_batch_header(raw, entry.msg_count, where)
            body_length = entry.byte_length if entry.byte_length is not None else size - base
            table = np.frombuffer(raw, dtype="<u4", offset=BATCH_HEADER_SIZE + 4 * first - table_start).astype(np.int64)
            data_start = BATCH_HEADER_SIZE + 4 * (entry.msg_count + 1)
            if (np.diff(table) < 0).any() or data_start + table[-1] > body_length:
                raise CorruptBatch(f"{where}: the offsets of records {first}..{first + considered - 1} are out of order or past the body")
            sizes = np.cumsum(np.diff(table))
            count = max(1, int(np.searchsorted(sizes, budget, side="right")))
            length = int(table[count] - table[0])
            data = self.objects.get(uri, base + data_start + int(table[0]), length) if length else b""
        except LlogError as e:
            return e
        values = pa.BinaryArray.from_buffers(pa.binary(), count, [None, pa.py_buffer((table[:count + 1] - table[0]).astype(np.int32)), pa.py_buffer(data)])
        return _record_batch(s.lo, entry.created_at_ms, values, 0, count)

    def stream_batches(self, request: ReadRequest, chunk_bytes: int = STREAM_CHUNK_BYTES,
                       lookahead: int = STREAM_LOOKAHEAD,
                       on_missing: Callable[[int, int, ObjectNotFound], None] | None = None
                       ) -> Iterator[pa.RecordBatch]:
        """The records of one range as Arrow batches (one per index entry slice), in offset
        order, in bounded memory: slices are fetched ``chunk_bytes`` at a time with up to
        ``lookahead`` chunks in flight while the caller consumes the current one.

        The slices of a blob found missing are resolved again (it may have been compacted and
        collected meanwhile; module doc); still missing, it raises :class:`ObjectNotFound`, or
        with ``on_missing``, ``on_missing(first_offset, last_offset, error)`` is called per slice
        instead, and the slice is skipped if it returns.
        """
        state, _, slices = self._resolve_many([request])[0]
        topic_ids = {(request.topic, request.partition): state.record.topic_id}
        chunks = _chunks(slices, chunk_bytes)

        def submit(chunk: list[_Slice]) -> tuple[list[_Slice], list[tuple[list[_Slice], Future]]]:
            return chunk, [(group, self._pool.submit(self._fetch_blob, uri, group)) for uri, group in self._by_blob(chunk)]

        pending = deque(submit(c) for c in chunks[:lookahead])
        upcoming = iter(chunks[lookahead:])
        while pending:
            chunk, fetches = pending.popleft()
            ready: dict[int, list[pa.RecordBatch]] = {}
            for group, future in fetches:
                try:
                    for s, body in future.result():
                        ready[id(s)] = [self._to_batch(s, self._decode(s, body))]
                except ObjectNotFound:
                    for s in group:  # compacted and collected since it was resolved?
                        try:
                            ready[id(s)] = self._reread(request.topic, request.partition, s.lo, s.hi, topic_ids)
                        except ObjectNotFound as missing:
                            if on_missing is None:
                                raise
                            on_missing(s.lo, s.hi, missing)
            following = next(upcoming, None)
            if following is not None:
                pending.append(submit(following))
            for s in chunk:
                yield from ready.pop(id(s), ())

    def _reread(self, topic: str, partition: int, lo: int, hi: int,
                topic_ids: dict[tuple[str, int], str | None] | None = None) -> list[pa.RecordBatch]:
        """Offsets ``lo..hi`` resolved and fetched again: after a blob turned out to be gone,
        which happens when compaction swapped its entries for a compacted one and garbage
        collection deleted it after this reader resolved them."""
        state, _, slices = self._resolve_many([ReadRequest(topic, partition, lo, hi)])[0]
        _same_topic(topic, partition, topic_ids, state)
        return [batch for part in self._batches([(topic, partition, s) for s in slices], topic_ids) for batch in part]

    def entry_values(self, entries: Sequence[LocatedEntry]) -> list[tuple[Records, str]]:
        """Every record of each entry, CRC checked, fetching each blob once (one range GET
        spanning the entries' bodies in it), with the compression of its body: what
        compaction rewrites."""
        slices = [_Slice(e, e.start_offset, e.end_offset) for e in entries]
        compressions: dict[int, str] = {}
        decoded, missing = self._fetch_available(slices, compressions)
        if missing is not None:
            raise missing
        return [(decoded[id(s)], compressions[id(s)]) for s in slices]

    def read_range(self, topic: str, partition: int, start: int, end: int | None = None) -> list[Record]:
        """Records ``start..end`` (inclusive; ``end=None``: to the high watermark)."""
        result = self.read_batches([ReadRequest(topic, partition, start, end)])[0]
        return list(_records(topic, partition, result.batches))

    def read_offset(self, topic: str, partition: int, offset: int) -> Record:
        """One record. A slice of a shared WAL blob is fetched with one range GET and fully
        checked; a record of a whole-object (compacted) body with two small range GETs (header
        and offsets, then the record), checked for magic, count and bounds."""
        keys, state = self._read_control(topic, partition)
        state, _ = self._control(keys, offset, offset, state)
        s, = self._resolve(keys, state, offset, offset)
        try:
            return self._read_one(topic, partition, offset, s)
        except ObjectNotFound:  # compacted or dropped by retention, and collected, since it was resolved
            result = self.read_batches([ReadRequest(topic, partition, offset, offset)])[0]
            _same_topic(topic, partition, {(topic, partition): state.record.topic_id}, result)
            return next(_records(topic, partition, result.batches))

    def _read_one(self, topic: str, partition: int, offset: int, s: _Slice) -> Record:
        entry = s.located.entry
        if entry.byte_offset is not None or entry.encoding != BYTES_BATCH_V1:  # records-v2 is read whole
            return next(_records(topic, partition, [self._to_batch(s, self._fetch([s])[id(s)])]))
        index = offset - s.located.start_offset
        where = f"{entry.data_key} (offsets {s.located.start_offset}..{s.located.end_offset})"
        prefix, size = self.objects.get_with_size(entry.data_key, 0, offsets_prefix_length(index))
        begin, stop = record_span(prefix, index, entry.msg_count, size, where)
        value = self.objects.get(entry.data_key, begin, stop - begin) if stop > begin else b""
        return Record(topic, partition, offset, value, entry.created_at_ms)

    def iter_from(self, topic: str, partition: int, start: int, end: int | None = None,
                  window: int = ITER_WINDOW) -> Iterator[Record]:
        """Records from ``start`` to ``end`` (default: the high watermark when called), resolved
        and fetched ``window`` offsets at a time."""
        if end is None:
            end = self.high_watermark(topic, partition)
            if _check_offset("start offset", start) > end:
                return
        position, topic_ids = start, None
        while position <= end:
            upto = min(end, position + window - 1)
            result = self.read_batches([ReadRequest(topic, partition, position, upto)])[0]
            if topic_ids is None:  # the first window's topic: every later window must be of it
                topic_ids = {(topic, partition): result.topic_id}
            _same_topic(topic, partition, topic_ids, result)
            yield from _records(topic, partition, result.batches)
            position = upto + 1


def _same_topic(topic: str, partition: int, topic_ids: dict[tuple[str, int], str | None] | None,
                now: ControlState | PartitionBatches) -> None:
    """Raise :class:`TopicRecreated` when the partition's ``topic_id`` differs from the one this
    read began with (``topic_ids``): the topic was deleted and created again meanwhile, and what
    the offsets resolve to now are another topic's records (docs/protocol.md section 10.2)."""
    if topic_ids is None or (topic, partition) not in topic_ids:
        return
    found = now.topic_id if isinstance(now, PartitionBatches) else now.record.topic_id
    began = topic_ids[(topic, partition)]
    if found != began:
        raise TopicRecreated(f"{topic}[{partition}] was deleted and created again while this read ran (topic id "
                             f"{began}, now {found}): the records it was reading are gone")


def _chunks(slices: Sequence[_Slice], chunk_bytes: int) -> list[list[_Slice]]:
    """Consecutive slices, about ``chunk_bytes`` of bodies each (a whole-object body, whose size
    the index does not say, counts as one chunk of its own)."""
    chunks: list[list[_Slice]] = []
    size = chunk_bytes
    for s in slices:
        length = s.located.entry.byte_length
        if length is None or size + length > chunk_bytes:
            chunks.append([])
            size = 0
        chunks[-1].append(s)
        size = chunk_bytes if length is None else size + length
    return chunks



def _record_bytes(located: LocatedEntry) -> int:
    """Bytes per record an entry's body suggests (its header and offsets table included); the
    assumed record size when its body is a whole object of unknown size."""
    length = located.entry.byte_length
    return max(1, length // located.entry.msg_count) if length is not None else _ASSUMED_RECORD_BYTES


def _estimate(s: _Slice) -> int:
    return (s.hi - s.lo + 1) * _record_bytes(s.located)


def _partial(s: _Slice, budget: int) -> bool:
    """Whether :meth:`LogReader.fetch` reads slice ``s`` in part rather than its whole body (a
    bytes-batch-v1 body only: records-v2 has no offsets table to read a part by)."""
    if s.located.entry.encoding != BYTES_BATCH_V1:
        return False
    length = s.located.entry.byte_length
    return length is None or length > max(PARTIAL_READ_FACTOR * max(budget, 1), PARTIAL_READ_MIN_BYTES)


def _contiguous(slices: Sequence[_Slice], got: dict[int, list[pa.RecordBatch]]) -> list[pa.RecordBatch]:
    """The batches of ``slices`` in order, up to the first slice a partial read returned only in
    part (what follows it would leave a gap)."""
    out = []
    for s in slices:
        part = [b for b in got[id(s)] if b.num_rows]
        out += part
        if sum(b.num_rows for b in part) < s.hi - s.lo + 1:
            break
    return out


def _trim(batches: list[pa.RecordBatch], budget: int) -> list[pa.RecordBatch]:
    """The leading records of ``batches`` whose bytes fit ``budget``, one at least if the budget
    is not spent."""
    out, total = [], 0
    if budget < 1:
        return out
    for batch in batches:
        sizes = np.cumsum(np.diff(np.frombuffer(batch.column(1).buffers()[1], dtype=np.int32,
                                                count=batch.num_rows + 1, offset=4 * batch.column(1).offset)))
        fits = int(np.searchsorted(sizes, budget - total, side="right"))
        if not out and fits == 0:
            fits = 1
        if fits < batch.num_rows:
            if fits:
                out.append(batch.slice(0, fits))
            return out
        out.append(batch)
        total += int(sizes[-1]) if batch.num_rows else 0
    return out


def _record_batch(first_offset: int, created_at_ms: int, records: Records, start: int, count: int) -> pa.RecordBatch:
    """``count`` records from row ``start`` of ``records`` as a batch of :data:`RECORD_SCHEMA`,
    the first at offset ``first_offset``."""
    offsets = pa.array(np.arange(first_offset, first_offset + count, dtype=np.int64))
    created = pa.array(np.full(count, created_at_ms, dtype=np.int64))
    if isinstance(records, pa.RecordBatch):
        part = records.slice(start, count)
        columns = [offsets, part.column(1), created, part.column(0), part.column(2), part.column(3)]
    else:
        columns = [offsets, records.slice(start, count), created, nulls(pa.binary(), count),
                   nulls(HEADERS_TYPE, count), nulls(pa.int64(), count)]
    return pa.RecordBatch.from_arrays(columns, schema=RECORD_SCHEMA)


def _records(topic: str, partition: int, batches: Sequence[pa.RecordBatch]) -> Iterator[Record]:
    for batch in batches:
        offsets, values, times, keys, headers, stamps = (batch.column(i).to_pylist() for i in range(6))
        for offset, value, created, key, hs, ts in zip(offsets, values, times, keys, headers, stamps):
            yield Record(topic, partition, offset, value, created, key,
                         None if hs is None else [(h["key"], h["value"]) for h in hs], ts)
