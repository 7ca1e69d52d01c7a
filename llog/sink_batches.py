"""A sink batch's cut, pinned before any of it is committed (docs/protocol.md section 9.1).

A streaming sink's batch reaches the driver as staged slices: each task's rows, cut into bodies
by task, flush and partition. The sink's progress per partition says how many of the batch's
slices of that partition are committed, which identifies rows only if a replay of the batch is
cut the same way. Spark replays the same rows, not the same cut: other tasks (an llog source
re-plans its splits from an index compaction may have changed), another row order after a
shuffle, unkeyed rows placed by task id, flushes at other rows. So before the first slice of a
batch is committed, the driver pins the batch's slices in ``R/sinks/{sink_id}``; a replay of the
batch (the same ``batch_id``) commits the pinned slices, not its own, and its own blobs are left
to garbage collection. The progress then counts slices of one fixed cut, and every row of the
batch is committed exactly once whatever the replay's tasks did.

``(sink_id, batch_id)`` names exactly one commit. What a replay keeps is the batch's rows, so the
pinned record holds, per topic, the record count and the sum of record sizes (section 11.1); a
commit under a pinned ``(sink_id, batch_id)`` whose rows differ is another write, refused with
:class:`SinkBatchMismatch` before anything is committed.

The record stays small whatever the slice count: a cut whose record would pass
:data:`PINNED_INLINE_MAX_BYTES` is written to an immutable object ``R/sink-cuts/{uuid}`` first,
and the record names it. Before a batch is pinned, each distinct blob's age is taken as the older
of its ``created_at_ms`` (a task's clock) and the S3 server's ``Last-Modified``, by one HEAD per
blob (section 9.2: GC judges by the latter).

A pinned slice is a reference to its blob like a pending append's: the record is created only
while every slice (and its cut object) is younger than ``G/2`` (checked immediately before the
write), GC reads the pinned records before anything else, and a replay that finds pinned slices
older than ``G/4`` copies their bodies into a new blob and re-pins them first. The record of
batch ``B`` is replaced by batch ``B + 1``'s, which Spark starts only once ``B`` is committed: by
then every slice of ``B`` is referenced by the index (or a pending append), so the references
move forward, never back.

A replay whose rows truly differ is refused on every restart; the operator's way out is
:func:`finish_pinned` (``llog sinks finish``): the pin is marked finished, by CAS on the version
read, and its cut committed, so every later commit of that batch is a replay whatever its rows.
A pin whose sink never commits again stays until the operator retires it (:func:`list_pins`,
:func:`unpin_committed`): nothing here can know whether Spark may still replay its batch. A
retired record keeps the batch id and references nothing: a commit of that batch commits
nothing, an earlier batch is refused, a later one pins as usual.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import NamedTuple

from llog import failpoints
from llog.clock import Clock
from llog.codec import EncodedBatch, pack_shared
from llog.config import Config
from llog.control import backoff, check_blob_age, read_controls
from llog.coordination import EXPECTED_ABSENT, Coordination
from llog.deployment import MAX_SKEW_FRACTION
from llog.errors import (
    ClockSkew, CorruptRecord, LlogError, MaxRetriesExceeded, ObjectNotFound, SinkBatchMismatch, SinkBatchNotCommitted,
    SinkBatchNotPinned, SinkFinishUnsafe, SinkPinChanged, StaleBlob, StorageError, UnknownPartition, VersionConflict,
)
from llog.keys import parse_s3_uri, partition_keys, shared_wal_object, sink_cut_object, validate_group
from llog.objects import ObjectStore
from llog.topics import read_topic
from llog.writer import StagedSlice

log = logging.getLogger(__name__)

#: The partition key of every pinned batch record: one shard holds them all.
SINKS_PARTITION_KEY = "sinks"
#: A pinned record holds its cut inline up to this many bytes; a larger cut goes to an object
#: ``R/sink-cuts/{uuid}`` the record names (section 9.1), so the record stays this small.
PINNED_INLINE_MAX_BYTES = 64 * 1024
#: Blobs HEADed at once before a batch is pinned (one HEAD per distinct blob, section 9.1), on
#: threads kept for the process: a pool made per commit cost more than the HEADs (12 blobs: 21 ms
#: against 8 ms with a kept pool, on the local stack).
HEAD_THREADS = 16
_head_pool = ThreadPoolExecutor(max_workers=HEAD_THREADS, thread_name_prefix="llog-sink-head")
#: ``Last-Modified`` counts whole seconds: a task's stamp up to this far after it is consistent
#: with the S3 server's clock and kept as it is (section 9.1).
LAST_MODIFIED_RESOLUTION_MS = 1000
#: The cut format's version (section 9.1).
CUT_VERSION = 1


class SinkBatchOutOfOrder(LlogError):
    """A sink committed a batch older than the one it last pinned (or retired): not a replay
    Spark makes."""


def sink_command(command: str, sink_id: str, batch_id: int, *flags: str) -> str:
    """``llog sinks COMMAND --batch B [FLAGS] -- SINK_ID``: the command an error prints, runnable as
    printed also for a sink id starting with '-' (section 9.1, "Commands an operator pastes")."""
    return " ".join(["llog sinks", command, "--batch", str(batch_id), *flags, "--", sink_id])


def sink_batch_key(root: str, sink_id: str) -> str:
    """``R/sinks/{sink_id}``: the sink's pinned batch (a sink id follows the topic name rule)."""
    return f"{root}/sinks/{validate_group(sink_id)}"


def sink_keys_range(root: str) -> tuple[str, str]:
    """``[R/sinks/, R/sinks/~)``: every pinned batch record and no other key."""
    return f"{root}/sinks/", f"{root}/sinks/~"


#: Per topic, what a batch's rows are: ``(records, bytes)``, bytes as section 11.1 sizes a
#: record, or None where the commit did not carry them (then only records are compared).
Rows = Mapping[str, tuple[int, int | None]]


def rows_of(slices: Sequence[StagedSlice], sizes: Mapping[str, int] | None) -> dict[str, tuple[int, int | None]]:
    """Per topic of ``slices``: their record count, and the size ``sizes`` gives (if any)."""
    records: dict[str, int] = {}
    for s in slices:
        records[s.topic] = records.get(s.topic, 0) + s.msg_count
    return {topic: (n, None if sizes is None else sizes.get(topic)) for topic, n in sorted(records.items())}


@dataclass(frozen=True)
class PinnedBatch:
    """``R/sinks/{sink_id}``: the slices of the sink's last batch, in commit order, and what its
    rows are (``rows``; None in a record v1.2 wrote). ``cut_uri``: the object the cut is in, when
    the record does not hold it. ``finished_at_ms``: when an operator finished the cut (every
    commit of this batch is then a replay, whatever its rows; section 9.1). ``retired_at_ms``:
    a RETIRED BATCH (section 9.1): no slices, no cut, ``pinned_at_ms`` is ``retired_at_ms``."""

    sink_id: str
    batch_id: int
    slices: tuple[StagedSlice, ...]
    pinned_at_ms: int
    rows: Rows | None = None
    cut_uri: str | None = None
    cut_created_at_ms: int | None = None
    finished_at_ms: int | None = None
    retired_at_ms: int | None = None

    @classmethod
    def retired(cls, sink_id: str, batch_id: int, retired_at_ms: int) -> "PinnedBatch":
        """The RETIRED BATCH of ``batch_id``: it references nothing (section 9.1)."""
        return cls(sink_id, batch_id, (), retired_at_ms, retired_at_ms=retired_at_ms)

    def retired_json(self) -> bytes:
        return _dump({"sink_id": self.sink_id, "batch_id": self.batch_id, "retired_at_ms": self.retired_at_ms})

    def _head(self) -> dict:
        head = {"sink_id": self.sink_id, "batch_id": self.batch_id, "pinned_at_ms": self.pinned_at_ms}
        return head if self.finished_at_ms is None else {**head, "finished_at_ms": self.finished_at_ms}

    def body(self) -> dict:
        """``rows`` and ``cut``: what the record holds inline, or the cut object holds."""
        return {"rows": {t: {"records": n, "bytes": b} for t, (n, b) in (self.rows or {}).items()},
                "cut": encode_cut(self.slices)}

    def inline_json(self) -> bytes:
        return _dump({**self._head(), **self.body()})

    def header_json(self) -> bytes:
        """The record when the cut is in ``cut_uri``."""
        return _dump({**self._head(), "cut_uri": self.cut_uri, "cut_created_at_ms": self.cut_created_at_ms})

    @classmethod
    def from_json(cls, raw: bytes, key: str) -> "PinnedBatch":
        """The record as written; a record naming a cut object has no slices yet (:func:`read_cut`)."""
        try:
            obj = json.loads(raw)
            head = (str(obj["sink_id"]), int(obj["batch_id"]))
            if "retired_at_ms" in obj:
                return cls.retired(*head, int(obj["retired_at_ms"]))
            pinned_at_ms = int(obj["pinned_at_ms"])
            finished = None if obj.get("finished_at_ms") is None else int(obj["finished_at_ms"])
            if "cut_uri" in obj:
                parse_s3_uri(obj["cut_uri"])
                return cls(*head, (), pinned_at_ms, None, str(obj["cut_uri"]), int(obj["cut_created_at_ms"]), finished)
            if "cut" in obj:
                rows, slices = _parse_body(obj)
                return cls(*head, slices, pinned_at_ms, rows, finished_at_ms=finished)
            # v1.2: the slices as STAGED SLICE objects, no rows
            return cls(*head, tuple(StagedSlice(**s) for s in obj["slices"]), pinned_at_ms)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
            raise CorruptRecord(f"{key}: not a pinned sink batch: {e!r}") from None


def encode_cut(slices: Sequence[StagedSlice]) -> dict:
    """CUT (section 9.1): the slices in commit order, each a row of ints into the tables of
    topics, encodings and blobs (a blob's URI and ``created_at_ms`` once), about 35 bytes each."""
    topics: dict[str, int] = {}
    encodings: dict[str, int] = {}
    blobs: dict[tuple[str, int], int] = {}
    rows = [[blobs.setdefault((s.wal_uri, s.created_at_ms), len(blobs)), topics.setdefault(s.topic, len(topics)),
             s.partition, s.msg_count, s.body_offset, s.body_length, encodings.setdefault(s.encoding, len(encodings))]
            for s in slices]
    return {"version": CUT_VERSION, "topics": list(topics), "encodings": list(encodings),
            "blobs": [[uri, created] for uri, created in blobs], "slices": rows}


def decode_cut(cut: dict) -> tuple[StagedSlice, ...]:
    if cut["version"] != CUT_VERSION:
        raise ValueError(f"cut version {cut['version']!r}, this llog reads {CUT_VERSION}")
    topics, encodings, blobs = cut["topics"], cut["encodings"], cut["blobs"]
    return tuple(StagedSlice(topics[t], int(p), int(n), int(offset), int(length), blobs[b][0], int(blobs[b][1]),
                             encodings[e])
                 for b, t, p, n, offset, length, e in cut["slices"])


def _parse_body(obj: dict) -> tuple[dict[str, tuple[int, int | None]], tuple[StagedSlice, ...]]:
    rows = {str(t): (int(r["records"]), None if r["bytes"] is None else int(r["bytes"])) for t, r in obj["rows"].items()}
    return rows, decode_cut(obj["cut"])


def read_cut(objects: ObjectStore, pinned: PinnedBatch, key: str) -> PinnedBatch:
    """``pinned`` with its slices and rows read from its cut object (as it is, if inline).
    :class:`CorruptRecord` if the object is not a cut; :class:`StorageError` if it cannot be read."""
    if pinned.cut_uri is None:
        return pinned
    raw = objects.get(pinned.cut_uri)
    try:
        rows, slices = _parse_body(json.loads(raw))
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        raise CorruptRecord(f"{key}: its cut {pinned.cut_uri} is not a sink cut: {e}") from None
    return replace(pinned, slices=slices, rows=rows)


def _dump(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


@dataclass(frozen=True)
class PinnedReferences:
    """What GC reads first (section 9.2): the blobs and cut objects pinned batches reference,
    and the keys of pinned records it could not read (each may reference any WAL blob)."""

    uris: frozenset[str]
    unreadable: tuple[str, ...]


def pinned_references(coordination: Coordination, objects: ObjectStore, root: str) -> PinnedReferences:
    """Every pinned batch's references (one range scan of one shard, then a GET of each cut
    object). A record that cannot be read (not a pinned batch, its cut object missing or not a
    cut) does not stop the reading; its key is reported, and its cut object, if it names one,
    counts as referenced."""
    start, end = sink_keys_range(root)
    uris: set[str] = set()
    unreadable: list[str] = []
    for v in coordination.range_scan(start, end, SINKS_PARTITION_KEY):
        try:
            pinned = PinnedBatch.from_json(v.value, v.key)
            if pinned.cut_uri is not None:
                uris.add(pinned.cut_uri)
            uris.update(s.wal_uri for s in read_cut(objects, pinned, v.key).slices)
        except (CorruptRecord, StorageError) as e:
            log.error("pinned sink batch %s cannot be read (%s): GC keeps every WAL blob until it is fixed or "
                      "removed (`llog sinks unpin`)", v.key, e)
            unreadable.append(v.key)
    return PinnedReferences(frozenset(uris), tuple(unreadable))


def unpin_unreadable(coordination: Coordination, objects: ObjectStore, root: str, sink_id: str) -> str:
    """Delete sink ``sink_id``'s pinned record if, and only if, it cannot be read (section 9.2,
    the operator's way out), at the version read. Returns what was done. A readable record is
    kept: it is a reference GC honours, and a replay of its batch needs it."""
    key = sink_batch_key(root, sink_id)
    found = coordination.get(key, SINKS_PARTITION_KEY)
    if found is None:
        return f"{key}: no pinned batch"
    try:
        pinned = read_cut(objects, PinnedBatch.from_json(found.value, found.key), key)
    except (CorruptRecord, ObjectNotFound) as e:  # not an S3 outage: that raises, and nothing is deleted
        try:
            coordination.delete(key, SINKS_PARTITION_KEY, expected_version=found.version_id)
        except VersionConflict:
            return f"{key}: changed while being read; nothing deleted (run again)"
        return f"{key}: deleted (it could not be read: {e})"
    return (f"{key}: kept: it reads as batch {pinned.batch_id} ({len(pinned.slices)} slice(s)); a readable pin is "
            f"a reference GC honours and a replay needs")


def _not_pinned(sink_id: str, pinned: PinnedBatch | None, batch_id: int) -> SinkBatchNotPinned:
    if pinned is not None and pinned.batch_id == batch_id:  # retired
        return SinkBatchNotPinned(f"sink {sink_id} batch {batch_id} is retired (its cut was committed; `llog sinks "
                                  f"unpin --committed`): nothing done")
    held = "no pinned batch" if pinned is None else f"batch {pinned.batch_id} " + (
        "retired" if pinned.retired_at_ms is not None else "pinned")
    return SinkBatchNotPinned(f"sink {sink_id} has {held}, not batch {batch_id}: nothing done")


def finish_pinned(coordination: Coordination, objects: ObjectStore, config: Config, sink_id: str, batch_id: int,
                  clock: Clock) -> PinnedBatch:
    """Mark sink ``sink_id``'s pin of batch ``batch_id`` finished (section 9.1, ``llog sinks
    finish``): the record as it was plus ``finished_at_ms``, by CAS on the version read, so every
    later commit of that batch is a replay whatever its rows. The caller then commits the pinned
    cut (:func:`pin_batch` with ``replay_only``). :class:`SinkBatchNotPinned` unless the record
    holds that batch (a retired one does not); :class:`UnknownPartition` when a partition of the
    cut does not exist (nothing marked); :class:`SinkPinChanged` when it changed after it was
    read. :class:`SinkFinishUnsafe` (nothing marked) when finishing could write rows wrongly
    (:func:`finish_hazard`). A pin already finished is returned as it is, and so is ours when the
    CAS's reply was lost (:func:`_put_ours`)."""
    root = config.root_prefix
    key = sink_batch_key(root, sink_id)
    found = coordination.get(key, SINKS_PARTITION_KEY)
    header = None if found is None else PinnedBatch.from_json(found.value, found.key)
    if header is None or header.batch_id != batch_id or header.retired_at_ms is not None:
        raise _not_pinned(sink_id, header, batch_id)
    pinned = read_cut(objects, header, key)
    if header.finished_at_ms is None:
        hazard = finish_hazard(coordination, config, pinned, committed_slices(coordination, root, pinned), clock)
        if hazard is not None:
            raise SinkFinishUnsafe(f"sink {sink_id} batch {batch_id}: {hazard}; nothing marked, nothing committed")
    _check_cut_partitions(coordination, root, pinned)
    if header.finished_at_ms is not None:
        return pinned
    finished = replace(header, finished_at_ms=clock.now_ms())
    guard = None
    if header.cut_uri is not None:  # the same cut object: no reference is made or dropped
        value = finished.header_json()
    else:  # inline (a v1.2 record is written in the inline form, smaller than the one it replaces)
        finished = replace(finished, rows=_pinned_rows(header))
        value = finished.inline_json()
        if len(value) > PINNED_INLINE_MAX_BYTES:  # the mark's bytes passed the budget (section 2)
            created_at_ms = clock.now_ms()  # before the PUT, as a blob's
            finished = replace(finished, cut_uri=objects.put(sink_cut_object(root), _dump(finished.body())),
                               cut_created_at_ms=created_at_ms)
            value = finished.header_json()

            def guard() -> None:  # a new reference: the cut object, under the age rule (section 9.1)
                check_blob_age(f"finishing batch {batch_id} of sink {sink_id}", finished.cut_uri,
                               finished.cut_created_at_ms, config, clock, "run the command again")
    failpoints.hit("sink_batches.before_finish_cas")
    _put_ours(coordination, key, value, found.version_id, batch_id, "nothing done", guard)
    return read_cut(objects, finished, key)


def finish_hazard(coordination: Coordination, config: Config, pinned: PinnedBatch,
                  committed: Mapping[tuple[str, int], PartitionCommitted], clock: Clock) -> str | None:
    """Why committing the rest of ``pinned``'s cut on an operator's word (``llog sinks finish``)
    could write rows wrongly, or None (section 9.1, "The operator finishes a pinned cut"): a topic
    of the cut created after the pin, beyond the clock-skew bound (deleted and created again, the
    rows would go into another incarnation; "A pin does not name its incarnation"), or a pin older
    than the progress retention less that bound with a partition that holds no progress of the
    batch (committed then evicted cannot be told from never committed: the slice would be written
    twice). A pin younger than that cannot have lost an entry of its batch."""
    skew_ms = int(config.gc_grace_ms * MAX_SKEW_FRACTION)
    for topic in sorted({s.topic for s in pinned.slices}):
        found = read_topic(coordination, config.root_prefix, topic)
        if found is not None and found.record.created_at_ms > pinned.pinned_at_ms + skew_ms:
            return (f"topic {topic!r} was created {found.record.created_at_ms - pinned.pinned_at_ms} ms after the "
                    f"batch was pinned (more than the {skew_ms} ms clock-skew bound): if it was deleted and created "
                    f"again, the batch's rows belonged to the deleted topic and finishing would write them into the "
                    f"new one (if the batch's own commit created it, the query's replay still commits them)")
    age_ms = clock.now_ms() - pinned.pinned_at_ms
    if age_ms <= config.sink_progress_retention_ms - skew_ms:
        return None
    unknown = [f"{t}[{p}]" for (t, p), c in sorted(committed.items()) if c.committed == 0 and c.later_batch is None]
    if not unknown:
        return None
    return (f"the pin is {age_ms} ms old, past LLOG_SINK_PROGRESS_RETENTION_MS "
            f"({config.sink_progress_retention_ms} ms), and {', '.join(unknown)} hold(s) no progress of batch "
            f"{pinned.batch_id}: committed then evicted (another sink's commit drops an expired entry) cannot be told "
            f"from never committed, and finishing would write a committed slice a second time")


class RetireVerdict(NamedTuple):
    """Whether a pin may be retired (``kept`` None) or why it is kept, in the words both
    ``llog sinks unpin --committed`` and ``llog sinks list`` print (section 9.1)."""

    committed: Mapping[tuple[str, int], PartitionCommitted]
    kept: str | None


def retire_verdict(coordination: Coordination, config: Config, pinned: PinnedBatch, clock: Clock) -> RetireVerdict:
    """Retirable only when the sink's progress of the pinned batch covers every slice of the cut,
    in every partition (section 9.1, "How long a pin lives"). Else why it is kept: what is proven,
    that absent progress cannot be told from evicted progress, what the pin costs (its blobs held
    from GC: their count and the pinned slices' bytes), that the sink's next batch replaces it, and
    ``llog sinks finish`` only where :func:`finish_hazard` allows it."""
    committed = committed_slices(coordination, config.root_prefix, pinned)
    if all(c.committed == c.slices for c in committed.values()):
        return RetireVerdict(committed, None)
    blobs = len({s.wal_uri for s in pinned.slices}) + (pinned.cut_uri is not None)
    size = sum(s.body_length for s in pinned.slices)
    kept = (f"{describe_committed(committed)}; only the sink's progress of batch {pinned.batch_id} proves a slice "
            f"committed: a partition without it may never have been committed there, or committed with its progress "
            f"evicted later (an entry older than LLOG_SINK_PROGRESS_RETENTION_MS is dropped by another sink's commit "
            f"there), and the two cannot be told apart. The pin is kept: it keeps {blobs} blob(s) from GC "
            f"({size} byte(s) of pinned slices) until sink {pinned.sink_id} commits batch {pinned.batch_id + 1}, "
            f"which replaces it")
    if pinned.finished_at_ms is None and finish_hazard(coordination, config, pinned, committed, clock) is None:
        kept += (f" (to commit the rest of the cut now, as a replay would: "
                 f"`{sink_command('finish', pinned.sink_id, pinned.batch_id)}`)")
    return RetireVerdict(committed, kept)


def _check_cut_partitions(coordination: Coordination, root: str, pinned: PinnedBatch) -> None:
    """:class:`UnknownPartition` for the first partition of the cut its topic does not have now
    (a topic re-created with fewer partitions, or deleted): the cut cannot be committed whole, so
    nothing is marked (section 9.1); the error names ``llog topics alter``, the way out."""
    for topic in sorted({s.topic for s in pinned.slices}):
        found = read_topic(coordination, root, topic)
        partitions = 0 if found is None else found.record.partitions
        missing = sorted({s.partition for s in pinned.slices if s.topic == topic and s.partition >= partitions})
        if missing:
            raise UnknownPartition(topic, missing[0], partitions,
                                   f"sink {pinned.sink_id} batch {pinned.batch_id}'s pinned cut has slices for "
                                   f"partition(s) {missing}; nothing marked, nothing committed")


def _put_ours(coordination: Coordination, key: str, value: bytes, version_id: int, batch_id: int, nothing: str,
              guard=None) -> None:
    """Write ``value`` to ``key`` by CAS on ``version_id``; when the CAS conflicts after an attempt
    whose reply was lost (``outcome_unknown``), the record is read again and, if it holds
    ``value``, our write landed (section 9.1, "A lost reply"). Else :class:`SinkPinChanged`."""
    try:
        coordination.put(key, value, SINKS_PARTITION_KEY, version_id, guard=guard)
    except VersionConflict as e:
        if e.outcome_unknown:
            now = coordination.get(key, SINKS_PARTITION_KEY)
            if now is not None and now.value == value:
                log.info("%s: the reply of our write was lost; the record holds what we wrote", key)
                return
        raise SinkPinChanged(f"{key} changed while it was read (it held batch {batch_id} at version "
                             f"{version_id}): {nothing}; look at it again (`llog sinks list`)") from None


@dataclass(frozen=True)
class PinSummary:
    """One record of ``R/sinks/`` as ``llog sinks list`` shows it: its batch, age, and how much of
    its cut the sink's progress of that batch covers (``committed`` of ``slices``); ``later``: the
    partitions whose progress is of a later batch (``{"t[0]": 7}``: nothing of this batch is
    counted there, a commit of it would skip those slices); ``retired``: a RETIRED BATCH (no cut;
    ``age_ms`` since it was retired); ``problem``: why it could not be read (then only ``key``);
    ``kept``: why ``llog sinks unpin --committed`` would keep it (:func:`retire_verdict`), None
    when it may be retired."""

    key: str
    sink_id: str | None = None
    batch_id: int | None = None
    age_ms: int | None = None
    slices: int = 0
    committed: int = 0
    finished: bool = False
    retired: bool = False
    later: dict[str, int] | None = None
    problem: str | None = None
    kept: str | None = None


def list_pins(coordination: Coordination, objects: ObjectStore, config: Config, clock: Clock) -> list[PinSummary]:
    """Every record under ``R/sinks/`` (section 9.1, "How long a pin lives"), by sink id, with
    :func:`retire_verdict`'s words where a pin is kept."""
    start, end = sink_keys_range(config.root_prefix)
    out = []
    for v in coordination.range_scan(start, end, SINKS_PARTITION_KEY):
        try:
            pinned = read_cut(objects, PinnedBatch.from_json(v.value, v.key), v.key)
            verdict = retire_verdict(coordination, config, pinned, clock)
        except (CorruptRecord, StorageError) as e:
            out.append(PinSummary(v.key, problem=str(e)))
            continue
        committed = verdict.committed
        later = {f"{t}[{p}]": c.later_batch for (t, p), c in sorted(committed.items()) if c.later_batch is not None}
        out.append(PinSummary(v.key, pinned.sink_id, pinned.batch_id, clock.now_ms() - pinned.pinned_at_ms,
                              len(pinned.slices), sum(c.committed for c in committed.values()),
                              pinned.finished_at_ms is not None, pinned.retired_at_ms is not None, later or None,
                              kept=None if pinned.retired_at_ms is not None else verdict.kept))
    return out


def unpin_committed(coordination: Coordination, objects: ObjectStore, config: Config, sink_id: str, batch_id: int,
                    clock: Clock) -> str:
    """Retire sink ``sink_id``'s pin of batch ``batch_id`` if its cut is committed (section 9.1,
    ``llog sinks unpin --batch B --committed``): replace it, by CAS on the version read, with a
    RETIRED BATCH, which references nothing and keeps the batch id, so a commit of that batch
    commits nothing and an earlier one is refused. Committed: in each partition every pinned
    slice is covered by the sink's progress of the batch (:func:`retire_verdict`; absent
    progress is not evidence, at any age: it cannot be told from evicted). Only the operator
    knows that Spark will not replay the batch (the query is gone, or its checkpoint's
    ``commits/`` holds it). A record already retired at that batch is left as it is.
    :class:`SinkBatchNotPinned`, :class:`SinkBatchNotCommitted` (kept), :class:`SinkPinChanged`:
    nothing written; a lost reply of our own CAS is success."""
    root = config.root_prefix
    key = sink_batch_key(root, sink_id)
    found = coordination.get(key, SINKS_PARTITION_KEY)
    pinned = None if found is None else read_cut(objects, PinnedBatch.from_json(found.value, found.key), key)
    if pinned is None or pinned.batch_id != batch_id:
        raise _not_pinned(sink_id, pinned, batch_id)
    if pinned.retired_at_ms is not None:
        return f"{key}: batch {batch_id} already retired; nothing done"
    verdict = retire_verdict(coordination, config, pinned, clock)
    if verdict.kept is not None:
        raise SinkBatchNotCommitted(f"sink {sink_id} batch {batch_id}: {verdict.kept}")
    retired = PinnedBatch.retired(sink_id, batch_id, clock.now_ms())
    failpoints.hit("sink_batches.before_unpin_cas")
    _put_ours(coordination, key, retired.retired_json(), found.version_id, batch_id, "nothing retired")
    return (f"{key}: retired (batch {batch_id}, {len(pinned.slices)} slice(s), all committed); its blobs are "
            f"collected once the index no longer names them. A commit of batch {batch_id} from now on commits nothing, "
            f"one of an earlier batch is refused (a new query needs its own llog.sink.id), batch {batch_id + 1} pins "
            f"as usual")


def pin_batch(coordination: Coordination, objects: ObjectStore, config: Config, sink_id: str, batch_id: int,
              slices: list[StagedSlice], clock: Clock, sizes: Mapping[str, int] | None = None,
              replay_only: bool = False) -> list[StagedSlice]:
    """The slices batch ``batch_id`` of ``sink_id`` commits: ``slices``, pinned now, or, when
    this is a replay of a batch pinned before, the pinned ones (whose bodies are copied into a new
    blob first if they are older than ``G/4``). ``sizes``: per topic, the sum of the record sizes
    (section 11.1) of the rows the slices hold, as the tasks counted them.

    A pin of batch ``batch_id`` whose rows differ from this commit's is not its replay:
    :class:`SinkBatchMismatch`, unless an operator finished it (then this commit's rows are
    dropped); a retired record of ``batch_id`` makes it a replay that commits nothing (``[]``;
    an earlier batch than the retired one is :class:`SinkBatchOutOfOrder`). Before ``slices`` are
    pinned, each blob's age is checked by the S3 server's clock too (:func:`by_server_age`).
    ``replay_only``: pin nothing new, :class:`SinkBatchNotPinned` unless batch ``batch_id`` is
    pinned (the operator's finish)."""
    key = sink_batch_key(config.root_prefix, sink_id)
    rows = rows_of(slices, sizes)
    uris = list(dict.fromkeys(s.wal_uri for s in slices))
    heads = [_head_pool.submit(objects.last_modified_ms, uri) for uri in uris]  # while the record is read
    checked: tuple[StagedSlice, ...] | None = None
    for attempt in range(config.cas_max_attempts):
        if attempt:
            backoff(attempt - 1)
        found = coordination.get(key, SINKS_PARTITION_KEY)
        current = read_cut(objects, PinnedBatch.from_json(found.value, found.key), key) if found is not None else None
        if current is not None and current.batch_id > batch_id:
            if current.retired_at_ms is not None:
                raise SinkBatchOutOfOrder(
                    f"sink {sink_id} commits batch {batch_id}, but batch {current.batch_id} of sink {sink_id} was "
                    f"retired (`llog sinks unpin --committed`): a new query under an old query's sink id? Give it a "
                    f"new llog.sink.id: the old id's progress would have this query's batches up to "
                    f"{current.batch_id} skipped. Nothing of batch {batch_id} is committed")
            raise SinkBatchOutOfOrder(f"sink {sink_id} commits batch {batch_id}, but batch {current.batch_id} was "
                                      f"pinned before it: two queries share this sink id (checkpoint)? A new query "
                                      f"needs a new llog.sink.id")
        if current is not None and current.batch_id == batch_id and current.retired_at_ms is not None:
            if replay_only:
                raise _not_pinned(sink_id, current, batch_id)
            log.info("sink %s batch %d was retired by an operator (committed): this replay commits nothing (%s dropped)",
                     sink_id, batch_id, _describe(rows))
            return []
        if current is not None and current.batch_id == batch_id:
            if current.finished_at_ms is None:
                _check_replay(coordination, config, current, rows, clock)
            elif slices and _differs(current, rows):
                log.warning("sink %s batch %d: its pinned cut was finished by an operator; this commit's rows (%s) are "
                            "dropped, the pinned ones (%s) are the batch's", sink_id, batch_id, _describe(rows),
                            _describe(_pinned_rows(current)))
            if not _stale(current.slices, config, clock):
                return list(current.slices)
            chosen = replace(current, slices=_refresh(objects, config, current.slices, clock), cut_uri=None,
                             cut_created_at_ms=None,
                             rows=current.rows if current.rows is not None else rows_of(current.slices, None))
        elif replay_only:
            raise _not_pinned(sink_id, current, batch_id)
        else:
            if checked is None:
                checked = by_server_age(config, tuple(slices), dict(zip(uris, (h.result() for h in heads))), clock)
            chosen = PinnedBatch(sink_id, batch_id, _refresh(objects, config, checked, clock), clock.now_ms(), rows)
        value = chosen.inline_json()
        if len(value) > PINNED_INLINE_MAX_BYTES:
            created_at_ms = clock.now_ms()  # before the PUT, as a blob's
            chosen = replace(chosen, cut_uri=objects.put(sink_cut_object(config.root_prefix), _dump(chosen.body())),
                             cut_created_at_ms=created_at_ms)
            value = chosen.header_json()

        def young() -> None:  # immediately before every attempt of the write: a reference to each blob
            what = f"pinning batch {batch_id} of sink {sink_id}"
            for s in chosen.slices:
                check_blob_age(what, s.wal_uri, s.created_at_ms, config, clock, "the batch is pinned again from new copies")
            if chosen.cut_uri is not None:
                check_blob_age(what, chosen.cut_uri, chosen.cut_created_at_ms, config, clock, "the batch is pinned again")

        try:
            coordination.put(key, value, SINKS_PARTITION_KEY, found.version_id if found is not None else EXPECTED_ABSENT,
                             guard=young)
            return list(chosen.slices)
        except VersionConflict:
            continue  # another commit of this sink (or our own attempt, in transit) came first: look again
    raise MaxRetriesExceeded(f"pinning batch {batch_id} of sink {sink_id}", config.cas_max_attempts)


def _pinned_rows(pinned: PinnedBatch) -> Rows:
    return pinned.rows if pinned.rows is not None else rows_of(pinned.slices, None)  # v1.2: counts only


def _differs(pinned: PinnedBatch, rows: Rows) -> bool:
    """Whether ``rows`` are not the pinned batch's: per topic another record count or, where both
    know it, another size."""
    before = _pinned_rows(pinned)
    return set(before) != set(rows) or any(
        before[t][0] != rows[t][0] or (None not in (before[t][1], rows[t][1]) and before[t][1] != rows[t][1])
        for t in before)


def _check_replay(coordination: Coordination, config: Config, pinned: PinnedBatch, rows: Rows, clock: Clock) -> None:
    """A commit of a pinned ``(sink_id, batch_id)`` is its replay only if it carries the same
    rows; else :class:`SinkBatchMismatch`, naming both, how much of the pinned cut is committed
    and the operator's way out, ``llog sinks finish``, unless :func:`finish_hazard` refuses it
    (then why, and no command; section 9.1)."""
    if not _differs(pinned, rows):
        return
    try:
        found = committed_slices(coordination, config.root_prefix, pinned)
        committed, hazard = describe_committed(found), finish_hazard(coordination, config, pinned, found, clock)
    except LlogError as e:
        committed, hazard = f"how much of the pinned cut is committed could not be read ({e})", None
    if hazard is not None:
        raise SinkBatchMismatch(
            f"sink {pinned.sink_id} batch {pinned.batch_id} was pinned with {_describe(_pinned_rows(pinned))}; this "
            f"commit carries {_describe(rows)}: not a replay of it (a replay carries the same rows). {committed}. "
            f"Nothing of this write is committed. `llog sinks finish` is refused for this pin: {hazard}. A replay "
            f"with the pinned rows goes through; a query whose rows changed for good needs a new llog.sink.id "
            f"(docs/spark-sink.md)")
    raise SinkBatchMismatch(
        f"sink {pinned.sink_id} batch {pinned.batch_id} was pinned with {_describe(_pinned_rows(pinned))}; this "
        f"commit carries {_describe(rows)}: not a replay of it (a replay carries the same rows). {committed}. Nothing "
        f"of this write is committed. If two writes share this sink id, give each write of a micro-batch its own "
        f"(write_batch's name=). If this replay differs for good (the query's code changed, a non-deterministic "
        f"column, a source that lost offsets), run `{sink_command('finish', pinned.sink_id, pinned.batch_id)}`: "
        f"it commits the rest of the pinned cut, and the replay then goes through with none of its own rows of "
        f"batch {pinned.batch_id} (docs/spark-sink.md)")


class PartitionCommitted(NamedTuple):
    """How much of a pinned cut one partition holds: ``committed`` of its ``slices`` by the sink's
    progress of the pinned batch; ``later_batch``: the batch of the progress when it is a later
    one (then ``committed`` is 0: that progress counts slices of another batch)."""

    committed: int
    slices: int
    later_batch: int | None = None


def committed_slices(coordination: Coordination, root: str, pinned: PinnedBatch
                     ) -> dict[tuple[str, int], PartitionCommitted]:
    """Per partition of the pinned cut, how many of its pinned slices the sink's progress of the
    pinned batch in that partition's ``meta/control`` covers (section 9.1), of how many, and the
    batch of a later batch's progress there. A partition of a topic that does not exist, or that
    holds no progress of the sink, has none."""
    totals: dict[tuple[str, int], int] = {}
    for s in pinned.slices:
        totals[(s.topic, s.partition)] = totals.get((s.topic, s.partition), 0) + 1
    ids = {topic: read_topic(coordination, root, topic) for topic in {t for t, _ in totals}}
    live = [tp for tp in totals if ids[tp[0]] is not None]
    states = read_controls(coordination, [partition_keys(root, t, p, ids[t].record.topic_id) for t, p in live])
    progress = {tp: None if state is None else state.record.sink_progress(pinned.sink_id)
                for tp, state in zip(live, states)}
    out = {}
    for tp, total in totals.items():
        found = progress.get(tp)
        if found is not None and found.batch_id > pinned.batch_id:
            out[tp] = PartitionCommitted(0, total, found.batch_id)
        else:
            out[tp] = PartitionCommitted(min(found.slices, total) if found and found.batch_id == pinned.batch_id
                                         else 0, total)
    return out


def describe_committed(committed: Mapping[tuple[str, int], PartitionCommitted]) -> str:
    done, total = sum(c.committed for c in committed.values()), sum(c.slices for c in committed.values())
    return (f"{done} of the pinned cut's {total} slice(s) are committed ("
            + ", ".join(f"{t}[{p}]: {c.committed} of {c.slices}" + (
                "" if c.later_batch is None else f", the sink's progress there is of a later batch ({c.later_batch})")
                        for (t, p), c in sorted(committed.items())) + ")")


def _describe(rows: Rows) -> str:
    if not rows:
        return "no rows"
    return ", ".join(f"{t}: {n} record(s)" + ("" if b is None else f" of {b} byte(s)") for t, (n, b) in rows.items())


def by_server_age(config: Config, slices: tuple[StagedSlice, ...], modified: Mapping[str, int | None], clock: Clock
                  ) -> tuple[StagedSlice, ...]:
    """``slices`` with each blob's ``created_at_ms`` the older of the task's stamp and the S3
    server's ``Last-Modified`` (``modified``, by blob: one HEAD each, :data:`HEAD_THREADS` at
    once; None: no such object); a stamp within :data:`LAST_MODIFIED_RESOLUTION_MS` after it is
    kept. A blob that no longer exists is :class:`StaleBlob` (GC collected it), a stamp more than
    5% of ``G`` ahead of ``clock`` is :class:`ClockSkew` (the task's clock is off): nothing is
    pinned (section 9.1)."""
    missing = [uri for uri in dict.fromkeys(s.wal_uri for s in slices) if modified[uri] is None]
    if missing:
        raise StaleBlob(f"{len(missing)} staged blob(s) of the batch, first {missing[0]}, do not exist (collected: "
                        f"older than the grace period by the S3 server's clock, whatever the task's stamp says); "
                        f"nothing of the batch is committed: upload the records again")
    now, skew_ms = clock.now_ms(), int(config.gc_grace_ms * MAX_SKEW_FRACTION)
    ahead = [s for s in slices if s.created_at_ms > now + skew_ms]
    if ahead:
        raise ClockSkew(f"a task stamped {ahead[0].wal_uri} created_at_ms={ahead[0].created_at_ms}, "
                        f"{ahead[0].created_at_ms - now} ms in the future of this driver's clock, more than the "
                        f"{skew_ms} ms allowed (5% of LLOG_GC_GRACE_MS): that executor's clock is off; nothing of the "
                        f"batch is committed")
    return tuple(s if s.created_at_ms <= modified[s.wal_uri] + LAST_MODIFIED_RESOLUTION_MS
                 else replace(s, created_at_ms=modified[s.wal_uri]) for s in slices)


def _stale(slices, config: Config, clock: Clock) -> list[StagedSlice]:
    """The slices too old to be referenced anew: older than ``G/2`` with a margin for the write."""
    limit = clock.now_ms() - config.gc_grace_ms // 4
    return [s for s in slices if s.created_at_ms < limit]


def _refresh(objects: ObjectStore, config: Config, slices: tuple[StagedSlice, ...], clock: Clock
             ) -> tuple[StagedSlice, ...]:
    """``slices`` with every stale one's body copied into one new shared WAL blob."""
    stale = _stale(slices, config, clock)
    if not stale:
        return slices
    bodies = [(s.topic, s.partition, EncodedBatch((body,), len(body), s.msg_count, s.encoding))
              for s in stale for body in [objects.get(s.wal_uri, s.body_offset, s.body_length)]]
    created_at_ms = clock.now_ms()
    pieces, _, packed = pack_shared(bodies, created_at_ms)
    uri = objects.put(shared_wal_object(config.root_prefix), pieces)
    log.info("copied %d slice(s) older than a quarter of LLOG_GC_GRACE_MS into %s", len(stale), uri)
    copies = {id(s): StagedSlice(s.topic, s.partition, s.msg_count, p.body_offset, p.body_length, uri, created_at_ms,
                                 s.encoding) for s, p in zip(stale, packed)}
    return tuple(copies.get(id(s), s) for s in slices)
