"""The write path: one shared WAL blob, then one commit per partition (docs/protocol.md section 4).

``append_shared(groups)`` encodes each topic-partition's records as one bytes-batch-v1 body,
packs the bodies into one LLS1 blob, PUTs it (the only S3 write), then commits every partition
in lockstep, each step one Oxia RPC per shard for all of them: the reserving CAS on
``meta/control`` (blob age checked immediately before), the create-if-absent of the index entry
(within the materialization budget), and the CAS that clears ``pending``. The steps themselves
live in :mod:`llog.control`, shared with everyone who finishes another's append.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import pyarrow as pa

from llog import failpoints
from llog.clients import ClientUser
from llog.clock import SYSTEM, Clock
from llog.codec import Records, concat_records, encode_body, pack_shared, record_count, to_records
from llog.config import Config
from llog.control import (
    ControlState, backoff, clear, finish_pending, initialize_partition, materialize, read_controls, reserve, tripwire,
)
from llog.coordination import Coordination
from llog.errors import (
    AppendFailed, AppendOutcomeUnknown, CorruptRecord, DuplicateSequence, EmptyAppend, GroupsFailed, InvalidPayload,
    LlogError, LogFenced, MaxRetriesExceeded, OutOfOrderSequence, StaleBlob, TopicRecreated, UnknownPartition,
    VersionConflict, WriteOutcomeUnknown,
)
from llog.keys import PartitionKeys, TopicPartition, shared_wal_object
from llog.objects import ObjectStore
from llog.records import (
    BYTES_BATCH_V1, SEQUENCE_MODULUS, WAL, ControlRecord, IndexEntry, PendingAppend, ProducerBatch, SequenceVerdict,
    SinkProgress, judge_sequence, sequences_overlap,
)
from llog.topics import TopicCache

log = logging.getLogger(__name__)

#: Controls a writer remembers from its own clears (:meth:`LogWriter._remember`); past this many
#: it forgets them all and starts again.
MAX_REMEMBERED_CONTROLS = 10_000
#: Idempotent producers kept per partition in ``meta/control.producers``: the most recently
#: written ones (every reserving CAS reads and writes the whole record, so it stays small).
MAX_PRODUCERS_PER_PARTITION = 128
#: A producer's entry is dropped by the first write to its partition after it wrote nothing
#: there for this long (as sinks' progress, and Kafka's ``transactional.id.expiration.ms``).
PRODUCER_RETENTION_MS = 7 * 24 * 3600 * 1000
#: A producer id: what a client or ``POST /producers`` chooses, one Oxia JSON field name.
MAX_PRODUCER_ID_LENGTH = 64


@dataclass(frozen=True)
class AppendGroup:
    """Records for one topic-partition: values (a sequence of ``bytes``, ``None`` for a
    tombstone, or an Arrow binary array) and optionally, as long as them, keys, headers and
    event times (docs/protocol.md section 11; :func:`llog.codec.to_records` says what each takes)."""

    topic: str
    partition: int
    records: Sequence[bytes | None] | pa.Array
    keys: Sequence[bytes | str | None] | pa.Array | None = None
    headers: Sequence[Sequence[tuple[str | bytes, bytes | None]] | None] | pa.Array | None = None
    timestamps: Sequence[int | None] | pa.Array | None = None
    #: An idempotent producer's batch (Kafka's producer id and base sequence, both or neither):
    #: the partition writes it once, however often it is sent (:meth:`LogWriter.append_shared`).
    producer_id: str | None = None
    sequence: int | None = None


@dataclass(frozen=True)
class AppendResult:
    """Where a group's records landed: offsets ``start_offset..end_offset``."""

    topic: str
    partition: int
    start_offset: int
    end_offset: int
    index_key: str
    #: None for a duplicate (its blob is the first send's, which the partition does not keep).
    wal_uri: str | None
    #: An idempotent producer's batch the partition had written before: these are the offsets
    #: it got then, and nothing was written now. ``index_key`` is the entry it landed in then.
    duplicate: bool = False
    #: The ``created_at_ms`` of the entry the records landed in (None for a duplicate): what a
    #: reader of the index finds for them, and Kafka's log-append time of their batch.
    created_at_ms: int | None = None

    @property
    def count(self) -> int:
        return self.end_offset - self.start_offset + 1

    @property
    def topic_id(self) -> str:
        """The topic incarnation the records landed in (its id is a segment of every index key:
        ``R/{topic}/{topic_id}/partitions/{p}/index/{e}``, docs/protocol.md section 12)."""
        return self.index_key.rsplit("/", 5)[1]


@dataclass(frozen=True)
class StagedSlice:
    """One topic-partition's body in an uploaded WAL blob, not yet in the log: what
    :meth:`LogWriter.upload` returns and :meth:`LogWriter.commit_staged` commits. Plain data, so
    it can travel from the process that uploaded it (a Spark task) to the one that commits."""

    topic: str
    partition: int
    msg_count: int
    body_offset: int
    body_length: int
    wal_uri: str
    created_at_ms: int
    encoding: str = BYTES_BATCH_V1


@dataclass(frozen=True)
class SinkBatch:
    """Who commits: batch ``batch_id`` of sink ``sink_id`` (a streaming query's id). Its
    progress is recorded in each reserving CAS, so a replayed batch commits nothing twice."""

    sink_id: str
    batch_id: int


@dataclass(frozen=True)
class _ProducerGroup:
    """A group of a partition's body sent by an idempotent producer: the group's index in the
    append, its producer and sequence, its record count, and the records before it in the body."""

    group: int
    producer_id: str
    sequence: int
    count: int
    first: int


@dataclass(frozen=True)
class _SameAs:
    """A group resent within the same append: it gets group ``group``'s outcome."""

    group: int


@dataclass(frozen=True)
class _WrittenWith:
    """A group older than its producer's last batch that shares sequences with ``groups``, groups
    of the same body that precede it in the run and are not written yet (section 9.4): it gets
    ``error`` (:class:`DuplicateSequence`) once each of them is written (an :class:`AppendResult`,
    or DuplicateSequence itself), else the outcome of the first that is not (not done, in doubt)."""

    groups: tuple[int, ...]
    error: DuplicateSequence


#: What a producer's group that is not written gets: its own outcome, or one that follows others'.
_Verdict = AppendResult | _SameAs | _WrittenWith | LlogError


class _Rejected(LlogError):
    """A slot whose body holds producers' groups the partition must not write (duplicates, or out
    of order): nothing was reserved; ``verdicts`` gives each of those groups its outcome (an
    :class:`AppendResult` of the earlier send, :class:`_SameAs`, :class:`_WrittenWith`, or its
    error). The writer stages the body again without them."""

    def __init__(self, verdicts: dict[int, _Verdict]):
        self.verdicts = verdicts
        super().__init__(f"{len(verdicts)} producer group(s) not to be written")


@dataclass
class _Slot:
    """One partition's part of a commit round: a staged slice, who commits it, and the reserving
    CAS attempts whose outcome is unknown (each its start offset and the control version it was
    conditioned on): while there are any, the slot is in doubt (:meth:`LogWriter._resolve`)."""

    keys: PartitionKeys
    staged: StagedSlice
    sink: tuple[SinkBatch, int] | None = None
    producers: tuple[_ProducerGroup, ...] = ()
    append_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    in_doubt: list[tuple[int, int]] = field(default_factory=list)


#: A slot's outcome: ``(start_offset, index_key)``, None (the sink had committed it), or the error.
_Outcome = tuple[int, str] | None | BaseException


#: A body's compression: one for every topic, a function of the topic, or None (the config's).
Compression = str | Callable[[str], str] | None


def stage(objects: ObjectStore, config: Config, groups: Sequence[AppendGroup], clock: Clock = SYSTEM,
          compression: Compression = None) -> list[StagedSlice]:
    """:meth:`LogWriter.upload` without a writer: needs S3 only, so a Spark task stages its
    records with no Oxia connection; the driver commits the slices. ``compression``: for every
    topic (or per topic, a function), instead of the config's ``compression.type``."""
    return _stage(objects, config, _merge(groups, "stage", config.max_record_bytes), clock, compression)


#: Each topic-partition's records, in order, with the index of the group they came from.
_Merged = dict[TopicPartition, list[tuple[int, Records]]]


def _merge(groups: Sequence[AppendGroup], what: str, max_record_bytes: int) -> _Merged:
    """Validate every group before any I/O; each topic-partition's records in order."""
    if not groups:
        raise EmptyAppend(f"{what} needs at least one group")
    merged: _Merged = {}
    for i, group in enumerate(groups):
        tp = TopicPartition(group.topic, group.partition)
        check_producer(group, f"{tp}: groups[{i}]")
        records = to_records(group.records, group.keys, group.headers, group.timestamps, f"{tp}: groups[{i}]",
                             max_record_bytes)
        merged.setdefault(tp, []).append((i, records))
    return merged


def _stage(objects: ObjectStore, config: Config, merged: _Merged, clock: Clock, compression: Compression = None
           ) -> list[StagedSlice]:
    """Section 4.2: one body per topic-partition (bytes-batch-v1 or records-v2, by its records
    and its topic's compression), packed into one LLS1 blob, PUT."""
    of = compression if callable(compression) else (lambda topic: compression or config.compression(topic))
    bodies = []
    for tp, parts in merged.items():
        records = concat_records([r for _, r in parts])
        bodies.append((tp.topic, tp.partition, encode_body(records, of(tp.topic))))
    created_at_ms = clock.now_ms()
    pieces, _, slices = pack_shared(bodies, created_at_ms)
    wal_uri = objects.put(shared_wal_object(config.root_prefix), pieces)
    failpoints.hit("writer.after_blob_put")
    return [StagedSlice(s.topic, s.partition, s.msg_count, s.body_offset, s.body_length, wal_uri, created_at_ms,
                        s.encoding) for s in slices]


def check_producer(group: AppendGroup, what: str) -> None:
    """A group's producer id and sequence: both or neither, a non-empty id of at most
    :data:`MAX_PRODUCER_ID_LENGTH` characters, a sequence that is an int in ``0..2^31-1``
    (Kafka's base sequence, which wraps: docs/protocol.md section 9.4)."""
    pid, sequence = group.producer_id, group.sequence
    if pid is None and sequence is None:
        return
    if pid is None or sequence is None:
        raise InvalidPayload(f"{what}: an idempotent group needs both producer_id and sequence, got "
                             f"producer_id={pid!r}, sequence={sequence!r}")
    if not isinstance(pid, str) or not 0 < len(pid) <= MAX_PRODUCER_ID_LENGTH:
        raise InvalidPayload(f"{what}: producer_id must be a string of 1..{MAX_PRODUCER_ID_LENGTH} characters, "
                             f"got {pid!r}")
    if not isinstance(sequence, int) or isinstance(sequence, bool) or not 0 <= sequence < SEQUENCE_MODULUS:
        raise InvalidPayload(f"{what}: sequence must be an int in 0..{SEQUENCE_MODULUS - 1} (Kafka's base sequence, "
                             f"which wraps to 0 after {SEQUENCE_MODULUS - 1}), got {sequence!r}")


def _producer_groups(groups: Sequence[AppendGroup], parts: list[tuple[int, Records]]) -> tuple[_ProducerGroup, ...]:
    """The producers' groups of one partition's body (``parts``, in body order)."""
    out, first = [], 0
    for i, records in parts:
        count = record_count(records)
        if groups[i].producer_id is not None:
            out.append(_ProducerGroup(i, groups[i].producer_id, groups[i].sequence, count, first))
        first += count
    return tuple(out)


#: Per topic-partition committed (or failed) as a whole: its groups, its slice, its outcome.
_Done = dict[TopicPartition, tuple[list[tuple[int, Records]], StagedSlice, _Outcome]]


def _results(groups: Sequence[AppendGroup], done: _Done, settled: dict[int, object] | None = None,
             refused: dict[int, BaseException] | None = None) -> list[AppendResult]:
    """Each group's :class:`AppendResult`, in group order, from its partition's outcome
    (``done``), its own (``settled``: a producer's group not written) or its partition's refusal
    (``refused``, by group, before anything was written). When some failed, raises their error
    if it is the same for every group, else :class:`GroupsFailed` with each group's outcome."""
    by_group: dict[int, AppendResult | BaseException] = dict(refused or {})
    for tp, (parts, s, outcome) in done.items():
        if isinstance(outcome, BaseException):
            by_group.update((i, outcome) for i, _ in parts)
            continue
        start, index_key = outcome
        for i, records in parts:
            count = record_count(records)
            by_group[i] = AppendResult(tp.topic, tp.partition, start, start + count - 1, index_key, s.wal_uri,
                                       created_at_ms=s.created_at_ms)
            start += count
    settled = settled or {}
    by_group.update((i, v) for i, v in settled.items() if not isinstance(v, (_SameAs, _WrittenWith)))
    for i in sorted(settled):  # each follows groups before it in its body, so these come first
        v = settled[i]
        if isinstance(v, _SameAs):
            first = by_group[v.group]
            by_group[i] = replace(first, duplicate=True) if isinstance(first, AppendResult) else first
        elif isinstance(v, _WrittenWith):
            unwritten = [by_group[j] for j in v.groups
                         if isinstance(by_group[j], BaseException) and not isinstance(by_group[j], DuplicateSequence)]
            by_group[i] = unwritten[0] if unwritten else v.error
    outcomes = [by_group[i] for i in range(len(groups))]
    ok = [o for o in outcomes if isinstance(o, AppendResult)]
    if len(ok) == len(outcomes):
        return ok
    errors: dict[tuple[str, int], BaseException] = {}
    for i in [*(refused or {}), *range(len(groups))]:
        if isinstance(outcomes[i], BaseException):
            errors.setdefault((groups[i].topic, groups[i].partition), outcomes[i])
    if not ok and _one_kind(errors.values()) and (
            len({id(o) for o in outcomes}) == 1 or not any(isinstance(v, LlogError) for v in settled.values())):
        raise next(iter(errors.values()))  # nothing was written (or all in doubt): the (first) reason
    raise GroupsFailed(ok, errors, outcomes)


def _one_kind(errors) -> bool:
    """Whether ``errors`` give one answer of section 4.6: all in doubt, or all not done. Only then
    may one of them stand for all (a caller told "not done" must not miss a partition in doubt)."""
    return len({isinstance(e, AppendOutcomeUnknown) for e in errors}) <= 1


class LogWriter(ClientUser):
    """Appends records to topic-partitions. Thread-safe; reuse one per process.

    Before offsets are reserved, each topic's record is checked (docs/protocol.md section 10.2,
    :class:`llog.topics.TopicCache`): the partition must be below the topic's count
    (:class:`UnknownPartition`) and the topic not being deleted. With ``auto_initialize`` a topic
    without a record is created on its first append (``LLOG_AUTO_CREATE_TOPICS``, as Kafka creates
    topics on first use, with ``LLOG_DEFAULT_PARTITIONS`` partitions or enough for the partitions
    the append names), and a topic so created grows when an append names a higher partition (up
    to ``LLOG_MAX_AUTO_PARTITIONS``); without it, a topic without a record is refused
    (:class:`TopicNotFound`).
    """

    def __init__(self, config: Config, coordination: Coordination | None = None,
                 objects: ObjectStore | None = None, auto_initialize: bool = False, max_workers: int = 16,
                 clock: Clock | None = None, compression: str | None = None):
        super().__init__(config.require("oxia_service_address", "s3_bucket"), coordination, objects, max_workers,
                         "llog-commit", clock)
        self.auto_initialize = auto_initialize
        #: The compression of every body this writer writes; None: each topic's ``compression.type``.
        self.compression = compression
        self.topics = TopicCache(self.coordination, self.config, self.clock, auto_create=auto_initialize)
        #: How this writer names itself in the deployment record and its errors.
        self._who = f"writer on {config.client_identifier or socket.gethostname()} (pid {os.getpid()})"
        #: By control key, the controls this writer's last clears wrote (:meth:`_remember`).
        self._known: dict[str, ControlState] = {}
        self._known_lock = threading.Lock()
        #: Counts of what went wrong without changing an answer: ``failed_after_reserve``
        #: (rounds whose reserved appends were not finished, section 4.6), ``producers_evicted``
        #: (producers dropped past :data:`MAX_PRODUCERS_PER_PARTITION`, section 9.4).
        self.stats: collections.Counter[str] = collections.Counter()
        self._stats_lock = threading.Lock()

    def initialize_partition(self, topic: str, partition: int) -> bool:
        """Section 4.1 in the topic's current incarnation (created first if this writer
        auto-initializes). Returns True if this call created the partition."""
        tp = TopicPartition(topic, partition)  # both checked before anything is read or created
        record = self.topics.check(topic, partition, fresh=True)
        return initialize_partition(self.coordination, PartitionKeys(self.config.root_prefix, tp, record.topic_id))

    def check_partitions(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, LlogError]:
        """docs/protocol.md section 10.2: each partition's topic exists and has it (if this writer
        auto-initializes, a topic is created on first use, or grown, to have them); the ones that
        fail, with their errors. Each topic's highest partition goes first, so a topic created
        here gets enough partitions for all of them at once."""
        refused: dict[TopicPartition, LlogError] = {}
        for tp in sorted(partitions, key=lambda tp: (tp.topic, -tp.partition)):
            try:
                self.topics.check(tp.topic, tp.partition)
            except LlogError as e:
                refused[tp] = e
        return refused

    def _compression(self) -> Compression:
        return self.compression or self.topics.compression

    def append(self, topic: str, partition: int, records: Sequence[bytes | None] | pa.Array, keys=None, headers=None,
               timestamps=None) -> AppendResult:
        """Append to one partition (a shared append of one group; :class:`AppendGroup` says
        what each argument takes)."""
        return self.append_shared([AppendGroup(topic, partition, records, keys, headers, timestamps)])[0]

    def append_shared(self, groups: Sequence[AppendGroup],
                      on_durable: Callable[[list[AppendResult] | Exception], None] | None = None
                      ) -> list[AppendResult]:
        """Append every group through one shared WAL blob; one result per group, in order.

        Groups of the same topic-partition are written as one body, in the order given, and
        get consecutive offsets. Input is validated before anything is written. Each partition
        is answered done, not done or in doubt (docs/protocol.md section 4.6): if some partitions
        commit and others fail, :class:`AppendFailed` carries both; if all fail, and all with an
        error that says nothing was reserved (or all with :class:`AppendOutcomeUnknown`), the
        first error is raised (e.g. :class:`LogFenced`). A partition that fails before its
        offsets are reserved leaves nothing but the unreferenced blob (garbage collection removes
        it). One whose reservation landed is done, with its offsets, even if its index entry or
        clear then fails (logged, counted in :attr:`stats`): it is durable as ``pending``, and
        the next writer finishes it.

        ``on_durable`` (called at most once, in this thread) gets the results as soon as every
        partition is reserved or failed, before the last reservations are materialized and
        cleared: an append is durable and ordered once reserved (section 4), so a caller may
        acknowledge it then. It gets the error instead where this call would raise one (an
        :class:`AppendFailed` with the partitions reserved so far). Whatever fails after that
        point is durable as ``pending`` (readers read it, the next writer finishes it), and the
        answer here is the same. Its exceptions are logged, never raised.

        **Idempotent producers** (Kafka's model): a group with a ``producer_id`` and ``sequence``
        is written only if the sequence is the one its partition expects from that producer (the
        end of its last batch, or any sequence for a producer the partition does not know), and
        the reserving CAS records it as the producer's last batch (``meta/control.producers``).
        Sequences wrap to 0 after ``2^31 - 1``, as Kafka's. A group that is that last batch again
        is not written: its result is the offsets it got then (``duplicate``). An older batch the
        partition knows it wrote fails with :class:`DuplicateSequence`, any other sequence with
        :class:`OutOfOrderSequence` (docs/protocol.md section 9.4). An older batch that repeats
        sequences of groups of the same append gets DuplicateSequence only once those are written,
        else their error (it is never said of a batch not written). Such groups are known only once the
        control is read, after the blob's PUT: their partition's body is staged again without
        them (another PUT), so the other groups of the append, producers' or not, are written as
        usual. Then :class:`GroupsFailed` gives each group its own outcome.
        """
        merged = _merge(groups, "append_shared", self.config.max_record_bytes)
        self.check_deployment(self._who)
        refused = self.check_partitions(list(merged))
        refused_groups = {i: e for tp, e in refused.items() for i, _ in merged[tp]}
        if refused:
            merged = {tp: parts for tp, parts in merged.items() if tp not in refused}
            if not merged:  # each partition's own error (one partition: that error itself)
                error = next(iter(refused.values())) if len(refused) == 1 else AppendFailed(
                    [], {(tp.topic, tp.partition): e for tp, e in refused.items()})
                if on_durable is not None:
                    try:
                        on_durable(error)
                    except Exception:  # noqa: BLE001 - the caller's problem, not the append's
                        log.exception("on_durable callback failed")
                raise error
        done: _Done = {}
        settled: dict[int, object] = {}  # producers' groups not written, each with its outcome
        told = on_durable is None

        def tell(done_now: _Done) -> None:
            nonlocal told
            told = True
            try:
                results: list[AppendResult] | Exception = _results(groups, done_now, settled, refused_groups)
            except Exception as e:  # noqa: BLE001 - handed over, not raised
                results = e
            try:
                on_durable(results)
            except Exception:  # noqa: BLE001 - the caller's problem, not the append's
                log.exception("on_durable callback failed")

        todo = merged
        while todo:
            try:
                staged = _stage(self.objects, self.config, todo, self.clock, self._compression())
            except LlogError as e:  # nothing of these is reserved; earlier rounds' answers stand (4.6)
                done.update((tp, (parts, None, e)) for tp, parts in todo.items())
                break
            slots = [_Slot(self.keys(s.topic, s.partition), s, producers=_producer_groups(groups, parts))
                     for parts, s in zip(todo.values(), staged)]

            def decided(outcomes: list[_Outcome], todo=todo, staged=staged) -> None:
                if not any(isinstance(o, _Rejected) for o in outcomes):  # else decided after staging again
                    tell({**done, **{tp: (parts, s, o) for (tp, parts), s, o in zip(todo.items(), staged, outcomes)}})

            outcomes = self._commit(slots, None if told else decided)
            again: _Merged = {}
            for (tp, parts), s, outcome in zip(todo.items(), staged, outcomes):
                if isinstance(outcome, _Rejected):
                    settled.update(outcome.verdicts)
                    left = [(i, records) for i, records in parts if i not in outcome.verdicts]
                    if left:
                        again[tp] = left
                else:
                    done[tp] = (parts, s, outcome)
            todo = again
        if not told:  # the last round left nothing to stage again
            tell(done)
        return _results(groups, done, settled, refused_groups)

    def upload(self, groups: Sequence[AppendGroup]) -> list[StagedSlice]:
        """Section 4.2 only: encode the groups and PUT them as one shared WAL blob. Nothing is
        written to Oxia; until :meth:`commit_staged` commits the slices, the blob is garbage.
        Groups of one topic-partition become one body, in the order given. Idempotent producers'
        groups are refused (:class:`InvalidPayload`): their checks need :meth:`append_shared`."""
        if any(g.producer_id is not None or g.sequence is not None for g in groups):
            raise InvalidPayload("upload: groups with a producer_id or sequence are written by append_shared")
        self.check_deployment(self._who)
        return _stage(self.objects, self.config, _merge(groups, "upload", self.config.max_record_bytes), self.clock,
                      self._compression())

    def commit_staged(self, staged: Sequence[StagedSlice], sink: SinkBatch | None = None) -> list[AppendResult | None]:
        """Sections 4.3 to 4.5 for slices :meth:`upload` staged, here or in other processes.
        One result per slice; ``None`` where ``sink`` had committed that slice before.

        Partitions commit in lockstep; the slices of one partition commit one after another in
        the order given (round ``n`` commits every partition's slice ``n``), and with ``sink``
        slice ``n`` of a partition records progress ``(batch_id, n + 1)`` in its reserving CAS.
        Replaying the same batch with the same slices (a restarted query, a commit that failed
        halfway) skips what is committed and commits the rest, so every slice lands exactly
        once. A slice older than half the GC grace period raises :class:`StaleBlob` before
        anything is committed (and is checked again before every reserving CAS). Failures are
        reported as :meth:`append_shared` reports them; a partition that fails commits none of
        its later slices.
        """
        if not staged:
            return []
        self.check_deployment(self._who)
        now = self.clock.now_ms()
        stale = [s for s in staged if now - s.created_at_ms > self.config.gc_grace_ms // 2]
        if stale:
            raise StaleBlob(f"{len(stale)} staged slice(s), first in {stale[0].wal_uri}, were uploaded more than "
                            f"{self.config.gc_grace_ms // 2} ms ago (half of LLOG_GC_GRACE_MS); upload the records "
                            f"again")
        refused = self.check_partitions(sorted({TopicPartition(s.topic, s.partition) for s in staged}))
        if refused:  # nothing is committed: the whole batch fails, naming the partition
            raise next(iter(refused.values()))
        by_partition: dict[TopicPartition, list[int]] = {}
        for i, s in enumerate(staged):
            by_partition.setdefault(TopicPartition(s.topic, s.partition), []).append(i)
        results: list[AppendResult | None] = [None] * len(staged)
        errors: dict[tuple[str, int], BaseException] = {}
        # Every slice of a partition goes to one incarnation: the one checked above.
        keys = {tp: self.keys(tp.topic, tp.partition) for tp in by_partition}
        for n in range(max(len(ix) for ix in by_partition.values())):
            round_ = [(tp, ix[n]) for tp, ix in by_partition.items()
                      if n < len(ix) and (tp.topic, tp.partition) not in errors]
            slots = [_Slot(keys[tp], staged[i], sink and (sink, n)) for tp, i in round_]
            for (tp, i), outcome in zip(round_, self._commit(slots) if slots else []):
                if isinstance(outcome, BaseException):
                    errors[(tp.topic, tp.partition)] = outcome
                elif outcome is not None:
                    start, index_key = outcome
                    results[i] = AppendResult(tp.topic, tp.partition, start, start + staged[i].msg_count - 1,
                                              index_key, staged[i].wal_uri, created_at_ms=staged[i].created_at_ms)
                    failpoints.hit("writer.after_staged_slice")
        if errors:
            committed = [r for r in results if r is not None]
            if not committed and len(errors) == len(by_partition) and _one_kind(errors.values()):
                raise next(iter(errors.values()))
            raise AppendFailed(committed, errors)
        return results

    # --- sections 4.3 to 4.5, every partition in lockstep --------------------------------------

    def _commit(self, slots: Sequence[_Slot], on_decided: Callable[[list[_Outcome]], None] | None = None
                ) -> list[_Outcome]:
        """Commit one slice per partition: reserve (4.3), materialize (4.4), clear (4.5), each
        step one RPC per shard for all partitions (:mod:`llog.control`).

        Each round reads every control still to reserve; a partition holding someone's pending
        append has it finished first (as any writer must), a fenced one fails, one the sink
        already committed is done, and the rest are reserved by one CAS each; what a round
        reserved is materialized and cleared at once, so no pending waits on another
        partition's contention. A partition whose CAS lost a race goes to the next round
        (jittered backoff; bounded). A CAS that failed in transit is looked for before it is
        tried again, so it is never made twice, and the slot stays in doubt until every such
        attempt is known to have landed or never to land (:meth:`_resolve`); a slot that ends in
        doubt fails with :class:`AppendOutcomeUnknown`, never with an error that says nothing was
        written. A partition whose reservation landed is done (section 4.6): if its index entry
        or clear fails, it is not retried, and is durable as ``pending``, which the next writer
        finishes.

        ``on_decided`` is called once every slot is reserved or failed (or never, if the rounds
        run out), with what this returns except that the last round's reservations are not yet
        materialized.
        """
        out: list[_Outcome] = [None] * len(slots)
        todo = list(range(len(slots)))
        remembered, attempt = True, 0
        while todo and attempt < self.config.cas_max_attempts:
            if attempt:
                backoff(attempt - 1)
            reserved: list[tuple[int, ControlState]] = []
            todo, stale = self._reserve_round(slots, todo, out, reserved, remembered)
            if not (remembered and stale):  # a remembered state gone stale costs no attempt
                attempt += 1
            remembered = False
            if not todo and on_decided is not None:
                decided = list(out)
                for i, state in reserved:
                    pending = state.record.pending
                    decided[i] = (pending.start_offset, slots[i].keys.index(pending.end_offset))
                on_decided(decided)
            if reserved:
                self._finish_reserved(slots, reserved, out)
        for i in todo:
            out[i] = _unless_in_doubt(slots[i], MaxRetriesExceeded(f"reserving offsets on {slots[i].keys.tp}",
                                                                   self.config.cas_max_attempts))
        return out

    def _finish_reserved(self, slots: Sequence[_Slot], reserved: list[tuple[int, ControlState]],
                         out: list[_Outcome]) -> None:
        """Sections 4.4 and 4.5 for the appends a round reserved (``state``: after the CAS).

        Each is done with its offsets whatever happens here (section 4.6): it is durable since
        its reservation landed. A failure to materialize or clear (Oxia unreachable, attempts
        used up) is logged and counted (``stats["failed_after_reserve"]``); the pending stays
        readable, and whoever next changes the partition's ``meta/control`` finishes it."""
        for i, state in reserved:
            pending = state.record.pending
            out[i] = (pending.start_offset, slots[i].keys.index(pending.end_offset))
        wire = None
        try:
            failpoints.hit("writer.after_reserve")
            states, created = materialize(self.coordination, [(slots[i].keys, s) for i, s in reserved], self.config,
                                          self.clock)
            failpoints.hit("writer.after_index_put")
            wire = self._pool.submit(tripwire, self.coordination, created)  # alongside the clears
            cleared = clear(self.coordination, [(slots[i].keys, slots[i].append_id, s)
                                                for (i, _), s in zip(reserved, states) if s is not None],
                            self.config, self.clock)
            self._remember(cleared)
            failpoints.hit("writer.after_clear")
        except LlogError as e:
            with self._stats_lock:
                self.stats["failed_after_reserve"] += 1
            log.warning("%d append(s) reserved and durable, first on %s, were not finished (index entry or clear): "
                        "%s; they stay pending, readable, and the next writer, fence or compactor finishes them",
                        len(reserved), slots[reserved[0][0]].keys.tp, e)
        if wire is not None:
            try:
                wire.result()
            except LlogError as e:  # the append is done either way
                log.warning("tripwire check after appending failed: %s", e)

    def _remember(self, states: dict[str, ControlState]) -> None:
        """Keep the controls this writer's clears wrote: its next append to those partitions
        sends its reserving CAS on them without reading first (if another writer moved one
        meanwhile, the CAS fails on the version and the control is read, as after any lost race)."""
        with self._known_lock:
            if len(self._known) + len(states) > MAX_REMEMBERED_CONTROLS:
                self._known.clear()
            self._known.update(states)

    def _recall(self, keys: Sequence[PartitionKeys]) -> list[ControlState | None]:
        """The remembered controls of ``keys`` (None where none is), each forgotten as it is
        used: a remembered state is tried once."""
        with self._known_lock:
            return [self._known.pop(k.control, None) for k in keys]

    def _reserve_round(self, slots: Sequence[_Slot], todo: list[int], out: list[_Outcome],
                       reserved: list[tuple[int, ControlState]], remembered: bool = False) -> tuple[list[int], bool]:
        """One round of section 4.3 for the slots in ``todo``; returns the slots for the next,
        and whether a remembered control (``remembered``: use them) was stale: a CAS on one lost,
        or a producer's group was refused on one (another writer, e.g. another broker the
        producer's requests were routed to, may have moved that producer's sequence since: the
        verdict stands only on a control read now)."""
        again: list[int] = []
        helping: list[tuple[int, ControlState]] = []
        cas: list[tuple[int, ControlState, ControlRecord]] = []
        keys = [slots[i].keys for i in todo]
        rejected_stale = False
        states = self._recall(keys) if remembered else [None] * len(todo)
        used = {i for i, state in zip(todo, states) if state is not None}
        unknown = [j for j, state in enumerate(states) if state is None]
        try:
            if unknown:
                for j, state in zip(unknown, read_controls(self.coordination, [keys[j] for j in unknown], self.clock)):
                    states[j] = state
        except LlogError as e:
            for i in todo:
                out[i] = _unless_in_doubt(slots[i], e)  # nothing reserved yet, or a reservation in doubt
            return [], False
        for i, state in zip(todo, states):
            slot = slots[i]
            try:
                if state is None:
                    self._initialize(slot)
                    again.append(i)
                    continue
                if state.record.deleted:
                    if slot.in_doubt:  # did an attempt land before the tombstone? It keeps the counter
                        landed = self._resolve(slot, state)
                        if landed is not None:  # acknowledged in the deleted incarnation, gone with it
                            out[i] = (landed, slot.keys.index(landed + slot.staged.msg_count - 1))
                            continue
                    self._follow(slot)
                    again.append(i)
                    continue
                pending = state.record.pending
                if pending is not None and pending.append_id == slot.append_id:
                    reserved.append((i, state))  # a CAS that failed in transit had landed
                    continue
                if slot.in_doubt:
                    landed = self._resolve(slot, state)
                    if landed is not None:  # it landed, and someone else finished it
                        out[i] = (landed, slot.keys.index(landed + slot.staged.msg_count - 1))
                        continue
                if pending is not None:
                    helping.append((i, state))
                    again.append(i)
                    continue
                new = self._reservation(slot, state.record)
            except _Rejected as e:
                if i in used:  # judged on a remembered control, which another writer may have moved: read it
                    again.append(i)
                    rejected_stale = True
                else:  # a _Rejected slot in doubt is not staged again either
                    out[i] = _unless_in_doubt(slot, e)
                continue
            except LlogError as e:
                out[i] = _unless_in_doubt(slot, e)
                continue
            if new is None:
                out[i] = None  # the sink committed this slice before
            else:
                cas.append((i, state, new))
        if helping:
            try:
                finish_pending(self.coordination, [(slots[i].keys, s) for i, s in helping], self.config, self.clock)
            except LlogError as e:
                for i, _ in helping:
                    out[i] = _unless_in_doubt(slots[i], e)
                again = [i for i in again if i not in {j for j, _ in helping}]
        if cas:
            sent_at = self.clock.monotonic()  # no later than the CAS is sent: the budget's start
            try:
                results = reserve(self.coordination, [(slots[i].keys, s, new) for i, s, new in cas], self.config,
                                  self.clock)
            except LlogError as e:  # e.g. StaleBlob, or Oxia gone: each key's outcome is its own
                outcomes = getattr(e, "outcomes", None) or [None] * len(cas)
                results = [e if o is None else o if isinstance(o, (VersionConflict, BaseException))
                           else ControlState(new, o, sent_at) for (_, _, new), o in zip(cas, outcomes)]
            stale = rejected_stale
            for (i, state, new), result in zip(cas, results):
                attempt = (new.pending.start_offset, state.version)
                if isinstance(result, VersionConflict):
                    if result.outcome_unknown:  # an attempt may have landed: in doubt until resolved
                        slots[i].in_doubt.append(attempt)
                    again.append(i)
                    stale = stale or i in used
                elif isinstance(result, WriteOutcomeUnknown):  # no answer: looked for next round
                    slots[i].in_doubt.append(attempt)
                    again.append(i)
                elif isinstance(result, BaseException):  # not sent (e.g. StaleBlob): nothing of this round landed
                    out[i] = _unless_in_doubt(slots[i], result)
                else:
                    reserved.append((i, result))
            return again, stale
        return again, rejected_stale

    def _initialize(self, slot: _Slot) -> None:
        """A partition with no ``meta/control``: initialize it when its topic's record, read
        fresh, is still of the slot's incarnation and has it (docs/protocol.md section 10.2); when the
        record names another incarnation, move the slot there (:meth:`_follow`)."""
        tp = slot.keys.tp
        record = self.topics.require(tp.topic, fresh=True)
        if record.topic_id != slot.keys.topic_id:
            self._follow(slot)
            return
        if tp.partition >= record.partitions:
            raise UnknownPartition(tp.topic, tp.partition, record.partitions)
        initialize_partition(self.coordination, slot.keys)

    def _follow(self, slot: _Slot) -> None:
        """The slot's topic incarnation was deleted (its ``meta/control`` is a tombstone, or the
        record names another id; docs/protocol.md section 12) with no reservation of the slot there
        (none sent, or each in doubt shown not to have landed: :meth:`_resolve` on the tombstone):
        move the slot to the topic's current incarnation, as a Kafka producer goes on writing to a
        topic created again under the same name. :class:`AppendOutcomeUnknown` while an attempt
        is still in doubt (it may be in the deleted incarnation, and may have been read there);
        :class:`TopicNotFound` or :class:`TopicBeingDeleted` when there is none yet (a writer that
        auto-initializes creates it), :class:`UnknownPartition` when it has fewer partitions."""
        tp = slot.keys.tp
        record = self.topics.require(tp.topic, fresh=True, highest=tp.partition)
        if record.topic_id == slot.keys.topic_id:  # not deleted after all: the record and control disagree
            raise TopicRecreated(f"{tp}: meta/control of topic id {record.topic_id} is a tombstone, but the topic "
                                 f"record names that id as live; nothing was reserved")
        if tp.partition >= record.partitions:
            record = self.topics.check(tp.topic, tp.partition)  # grown if created on first use
        if slot.in_doubt:
            # An attempt at the deleted incarnation may have landed before its tombstone (and been
            # read there): written again here, the same records would be in both.
            raise AppendOutcomeUnknown(
                f"{tp}: topic id {slot.keys.topic_id} was deleted while an attempt to reserve offsets there was "
                f"in doubt; the append ({slot.staged.msg_count} records in {slot.staged.wal_uri}) may be in the "
                f"deleted topic, so it is not written to topic id {record.topic_id}")
        log.info("%s: topic id %s was deleted; appending to the topic's current id %s", tp, slot.keys.topic_id,
                 record.topic_id)
        slot.keys = PartitionKeys(slot.keys.root, tp, record.topic_id)

    def _reservation(self, slot: _Slot, control: ControlRecord) -> ControlRecord | None:
        """The control a reserving CAS writes for ``slot`` (section 4.3, with the sink's progress,
        section 9, and the producers' last batches), or None when the sink had committed this
        slice. Raises :class:`_Rejected` when producers' groups of the body must not be written."""
        keys, s = slot.keys, slot.staged
        if control.fenced:
            raise LogFenced(keys.tp.topic, keys.tp.partition)
        if slot.sink is not None:
            (batch, slice_no), progress = slot.sink, control.sink_progress(slot.sink[0].sink_id)
            if progress is not None and progress.covers(batch.batch_id, slice_no):
                return None
            control = control.with_sink_progress(batch.sink_id, SinkProgress(batch.batch_id, slice_no + 1,
                                                                              self.clock.now_ms()),
                                                  self.config.sink_progress_retention_ms)
        start = control.sequence_counter
        if slot.producers:
            control = self._with_producers(slot, control, start, start + s.msg_count - 1)
        pending = PendingAppend(
            append_id=slot.append_id, start_offset=start, end_offset=start + s.msg_count - 1, msg_count=s.msg_count,
            data_key=s.wal_uri, entry_type=WAL, encoding=s.encoding, created_at_ms=s.created_at_ms,
            byte_offset=s.body_offset, byte_length=s.body_length,
        )
        return control.with_changes(sequence_counter=pending.end_offset + 1, pending=pending)

    def _with_producers(self, slot: _Slot, control: ControlRecord, start: int, end: int) -> ControlRecord:
        """``control`` with each producer's group of the body (offsets from ``start``, the entry
        ending at ``end``) as that producer's last batch, when every group's sequence is the one
        the partition expects; else :class:`_Rejected` with the verdict of each group that is not.

        Section 9.4's check (:func:`judge_sequence`): the expected sequence is the end of the
        producer's last batch, mod ``2^31``, or any for a producer the control does not know (new,
        expired or evicted). A group that is the last batch again (same sequence and count) is a
        duplicate: the offsets it got then. An older batch wholly in the run the partition knows
        it wrote: :class:`DuplicateSequence`, or, when it shares sequences with groups of this body
        (not written yet), :class:`_WrittenWith` them; any other: :class:`OutOfOrderSequence`. Entries of
        producers that wrote nothing for :data:`PRODUCER_RETENTION_MS` are dropped, and so are
        (evicted: logged, counted in ``stats["producers_evicted"]``) those past the newest
        :data:`MAX_PRODUCERS_PER_PARTITION`; entries that are not well-formed are someone else's
        and stay (``producers`` is an llog extension of ``meta/control``)."""
        tp, now = slot.keys.tp, self.clock.now_ms()
        raw = control.extra.get("producers") or {}
        if not isinstance(raw, dict):
            raise CorruptRecord(f"{slot.keys.control}: 'producers' must be an object, got {raw!r}")
        batches: dict[str, ProducerBatch] = {}
        for pid, obj in raw.items():
            try:
                batches[pid] = ProducerBatch.from_dict(obj, f"{slot.keys.control} producers[{pid!r}]")
            except CorruptRecord:
                if any(g.producer_id == pid for g in slot.producers):
                    raise  # ours must be well-formed; others' are kept as they are
        here: dict[str, int] = {}  # producers whose last batch is a group of this body: that group
        chained: dict[str, list[_ProducerGroup]] = {}  # each producer's groups of this body written as NEXT
        verdicts: dict[int, _Verdict] = {}
        for g in slot.producers:
            last = batches.get(g.producer_id)
            verdict = judge_sequence(last, g.sequence, g.count)
            if verdict is SequenceVerdict.NEXT:
                batches[g.producer_id] = ProducerBatch(g.sequence, g.count, start + g.first, end, now) if last is None \
                    else last.followed_by(g.sequence, g.count, start + g.first, end, now)
                here[g.producer_id] = g.group
                chained.setdefault(g.producer_id, []).append(g)
            elif verdict is SequenceVerdict.REPEAT:
                verdicts[g.group] = _SameAs(here[g.producer_id]) if g.producer_id in here else AppendResult(
                    tp.topic, tp.partition, last.start_offset, last.start_offset + last.count - 1,
                    slot.keys.index(last.entry_end_offset), None, duplicate=True)
            elif verdict is SequenceVerdict.OLDER:
                error = DuplicateSequence(tp.topic, tp.partition, g.producer_id, g.sequence, last.sequence)
                unwritten = tuple(h.group for h in chained.get(g.producer_id, ())
                                  if sequences_overlap(g.sequence, g.count, h.sequence, h.count))
                verdicts[g.group] = _WrittenWith(unwritten, error) if unwritten else error
            else:
                verdicts[g.group] = OutOfOrderSequence(tp.topic, tp.partition, g.producer_id, g.sequence,
                                                       last.next_sequence)
        if verdicts:
            raise _Rejected(verdicts)
        fresh = [pid for pid, b in batches.items() if now - b.written_at_ms <= PRODUCER_RETENTION_MS]
        live = sorted(fresh, key=lambda pid: (pid in here, batches[pid].written_at_ms),
                      reverse=True)[:MAX_PRODUCERS_PER_PARTITION]
        if len(fresh) > len(live):
            evicted = sorted(set(fresh) - set(live))
            with self._stats_lock:
                self.stats["producers_evicted"] += len(evicted)
            log.warning("%s: more than %d producers wrote within %d days; the least recent, %s, are forgotten: a "
                        "resend of their last batch would be written again (docs/protocol.md section 9.4)", tp,
                        MAX_PRODUCERS_PER_PARTITION, PRODUCER_RETENTION_MS // 86_400_000, ", ".join(evicted[:5])
                        + (f" and {len(evicted) - 5} more" if len(evicted) > 5 else ""))
        producers = {pid: obj for pid, obj in raw.items() if pid not in batches}
        producers.update((pid, batches[pid].to_dict()) for pid in live)
        return control.with_extra(producers=producers)

    def _owner(self, keys: PartitionKeys, offset: int, current: ControlState) -> IndexEntry | None:
        """The index entry (or pending append) covering ``offset``, if any."""
        found = self.coordination.ceiling(keys.index(offset), keys.partition_key, keys.index_prefix)
        if found is not None:
            entry = IndexEntry.from_json(found.value, found.key)
            if keys.index_end_offset(found.key) - entry.msg_count + 1 <= offset:
                return entry
        pending = current.record.pending
        if pending is not None and pending.start_offset <= offset <= pending.end_offset:
            return pending.to_index_entry()
        return None

    def _resolve(self, slot: _Slot, current: ControlState) -> int | None:
        """A slot in doubt, with ``pending`` (in ``current``) not naming its append: did an attempt
        land, and someone else finish it? Returns the start offset of the one that did, or None.

        For each attempt in doubt, look at what now owns its start offset. An index entry
        pointing at this append's bytes: it landed. Another WAL append, or nobody because the
        counter never got there: it has not landed. Such an attempt, conditioned on a control
        version other than ``current``'s, never will (versions only grow), and is no longer in
        doubt; one conditioned on ``current``'s version stays in doubt (its request may still
        arrive; the next CAS names the same version, so at most one of them lands), and so does
        the slot, a later round's clean conflict notwithstanding. An owner that cannot be told
        (the range was compacted meanwhile): :class:`AppendOutcomeUnknown`.
        """
        keys, staged = slot.keys, slot.staged
        undecided = []
        for start, version in slot.in_doubt:
            if current.record.sequence_counter <= start:
                continue
            owner = self._owner(keys, start, current)
            if owner is not None and owner.data_key == staged.wal_uri and owner.byte_offset == staged.body_offset:
                return start
            if owner is None or owner.type != WAL:
                undecided.append(start)
        if undecided:
            raise AppendOutcomeUnknown(
                f"reserving offsets on {keys.tp} failed in transit and the log has moved on; the append "
                f"({staged.msg_count} records in {staged.wal_uri}) may or may not be in the log")
        slot.in_doubt = [(start, version) for start, version in slot.in_doubt if version == current.version]
        return None


def _unless_in_doubt(slot: _Slot, error: BaseException) -> BaseException:
    """What a slot that fails with ``error`` reports: ``error``, or :class:`AppendOutcomeUnknown`
    while a reserving CAS attempt of it may have landed (an error then must not say that nothing
    was written)."""
    if not slot.in_doubt or isinstance(error, AppendOutcomeUnknown):
        return error
    unknown = AppendOutcomeUnknown(
        f"reserving offsets on {slot.keys.tp}: an attempt whose reply was lost may have landed, and it could not be "
        f"resolved ({type(error).__name__}: {error}); the append ({slot.staged.msg_count} records in "
        f"{slot.staged.wal_uri}) may or may not be in the log")
    unknown.__cause__ = error
    return unknown

