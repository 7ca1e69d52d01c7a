"""Typed Oxia records and their JSON form (docs/protocol.md section 2).

The only place that turns JSON into records and back. Readers ignore unknown fields;
:class:`ControlRecord` keeps them in ``extra`` so a CAS writes them back unchanged.
"""

from __future__ import annotations

import enum
import json
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from llog.errors import CorruptRecord, SinkProgressFull

OPEN = "OPEN"
FENCED = "FENCED"
#: A deleted incarnation's partition: its ``meta/control`` stays as this tombstone (section 12).
DELETED = "DELETED"
WAL = "WAL"
COMPACTED = "COMPACTED"
#: Body encodings (docs/protocol.md section 3, docs/protocol.md section 11).
BYTES_BATCH_V1 = "bytes-batch-v1"
RECORDS_V2 = "records-v2"


def now_ms() -> int:
    return int(time.time() * 1000)


def _load(raw: bytes | str, key: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (ValueError, TypeError) as e:
        raise CorruptRecord(f"{key}: value is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise CorruptRecord(f"{key}: value must be a JSON object, got {type(value).__name__}")
    return value


def _dump(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _set_fields(record: Any) -> dict[str, Any]:
    """A flat record's fields that are not None, in declaration order (``asdict`` without its
    deep copy, which a write pays several times per partition)."""
    return {k: v for k in record.__dataclass_fields__ if (v := getattr(record, k)) is not None}


def _field(obj: dict[str, Any], name: str, kind: type | tuple[type, ...], key: str, optional: bool = False):
    value = obj.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise CorruptRecord(f"{key}: field {name!r} must be {getattr(kind, '__name__', kind)}, got {value!r}")
    return value



def _body_fields(obj: dict[str, Any], key: str) -> dict[str, Any]:
    """Where a batch's records are and how many: the fields an index entry and a pending append share."""
    return {
        "msg_count": _field(obj, "msg_count", int, key),
        "data_key": _field(obj, "data_key", str, key),
        "encoding": _field(obj, "encoding", str, key),
        "created_at_ms": _field(obj, "created_at_ms", int, key, optional=True) or 0,
        "byte_offset": _field(obj, "byte_offset", int, key, optional=True),
        "byte_length": _field(obj, "byte_length", int, key, optional=True),
    }

@dataclass(frozen=True)
class IndexEntry:
    """``P/index/{end_offset:020d}``: one batch of ``msg_count`` offsets ending at the key's offset.

    ``byte_offset``/``byte_length`` locate the body inside a shared WAL blob; None means the whole
    object is the body.
    """

    type: str
    msg_count: int
    data_key: str
    encoding: str = BYTES_BATCH_V1
    created_at_ms: int = 0
    byte_offset: int | None = None
    byte_length: int | None = None

    def to_json(self) -> bytes:
        return _dump(_set_fields(self))

    @classmethod
    def from_json(cls, raw: bytes | str, key: str = "index entry") -> "IndexEntry":
        obj = _load(raw, key)
        entry = cls(type=_field(obj, "type", str, key), **_body_fields(obj, key))
        return _check_entry(entry, key)


def _check_entry(entry: IndexEntry, key: str) -> IndexEntry:
    if entry.type not in (WAL, COMPACTED):
        raise CorruptRecord(f"{key}: unknown entry type {entry.type!r}")
    if entry.msg_count < 1:
        raise CorruptRecord(f"{key}: msg_count must be >= 1, got {entry.msg_count}")
    if (entry.byte_offset is None) != (entry.byte_length is None):
        raise CorruptRecord(f"{key}: byte_offset and byte_length must be both set or both absent")
    if entry.byte_offset is not None and (entry.byte_offset < 0 or entry.byte_length < 1):
        raise CorruptRecord(f"{key}: byte range {entry.byte_offset}+{entry.byte_length} is invalid")
    return entry


@dataclass(frozen=True)
class LocatedEntry:
    """An index entry (or a pending append) with the offsets it covers."""

    end_offset: int
    entry: IndexEntry
    from_pending: bool = False

    @property
    def start_offset(self) -> int:
        return self.end_offset - self.entry.msg_count + 1

    def covers(self, offset: int) -> bool:
        return self.start_offset <= offset <= self.end_offset


@dataclass(frozen=True)
class PendingAppend:
    """``meta/control.pending``: an append whose offsets are reserved, index entry maybe not yet
    written (docs/protocol.md section 4)."""

    append_id: str
    start_offset: int
    end_offset: int
    msg_count: int
    data_key: str
    entry_type: str = WAL
    encoding: str = BYTES_BATCH_V1
    created_at_ms: int = 0
    byte_offset: int | None = None
    byte_length: int | None = None

    def to_index_entry(self) -> IndexEntry:
        return IndexEntry(
            type=self.entry_type,
            msg_count=self.msg_count,
            data_key=self.data_key,
            encoding=self.encoding,
            created_at_ms=self.created_at_ms,
            byte_offset=self.byte_offset,
            byte_length=self.byte_length,
        )

    def located(self) -> LocatedEntry:
        return LocatedEntry(self.end_offset, self.to_index_entry(), from_pending=True)

    def to_dict(self) -> dict[str, Any]:
        return _set_fields(self)

    @classmethod
    def from_dict(cls, obj: Any, key: str) -> "PendingAppend":
        if not isinstance(obj, dict):
            raise CorruptRecord(f"{key}: pending must be an object or null, got {obj!r}")
        pending = cls(
            append_id=_field(obj, "append_id", str, key),
            start_offset=_field(obj, "start_offset", int, key),
            end_offset=_field(obj, "end_offset", int, key),
            entry_type=_field(obj, "entry_type", str, key),
            **_body_fields(obj, key),
        )
        if pending.end_offset - pending.start_offset + 1 != pending.msg_count or pending.msg_count < 1 \
                or pending.start_offset < 1:
            raise CorruptRecord(f"{key}: pending range {pending.start_offset}..{pending.end_offset} "
                                f"does not hold msg_count={pending.msg_count}")
        # The pending becomes an index entry: it must be one that readers accept.
        _check_entry(pending.to_index_entry(), f"{key} (pending)")
        return pending


#: Kafka's producer sequence is an int32 that wraps: sequences are ``0 <= s < 2^31``, and the one
#: after ``2^31 - 1`` is 0 (docs/protocol.md section 9.4).
SEQUENCE_MODULUS = 2 ** 31
#: At most this many sequences before a producer's last batch are known to be written, half the
#: sequence space: a batch whose base is fewer sequences than this past the last batch's base
#: (``last.count + gap < 2^30``) is never taken for a batch behind (section 9.4).
SEQUENCE_WINDOW = 2 ** 30


class SequenceVerdict(enum.Enum):
    """What a partition does with an idempotent producer's batch (docs/protocol.md section 9.4)."""

    #: The sequence the partition expects (or any, from a producer it does not know): written.
    NEXT = "next"
    #: The producer's last batch again: not written; answered with the offsets it got then.
    REPEAT = "repeat"
    #: An older batch, wholly in the run known written: not written again (``DuplicateSequence``;
    #: against a run that batches of the same body extend, only once those are written).
    OLDER = "older"
    #: A gap, a batch inside the last one, or behind it past what is known: ``OutOfOrderSequence``.
    OUT_OF_ORDER = "out of order"


@dataclass(frozen=True)
class ProducerBatch:
    """``meta/control.producers[producer_id]``: an idempotent producer's last batch written to the
    partition: its base ``sequence`` and ``count`` records, at offsets from ``start_offset``, in
    the entry ending at ``entry_end_offset``, reserved at ``written_at_ms``; ``known_before``:
    how many of the producer's sequences just before ``sequence`` the partition wrote without a
    break (at most :data:`SEQUENCE_WINDOW`; 0 in entries v1.2 wrote). Written by the CAS that
    reserves those offsets (docs/protocol.md section 9.4)."""

    sequence: int
    count: int
    start_offset: int
    entry_end_offset: int
    written_at_ms: int
    known_before: int = 0

    @property
    def next_sequence(self) -> int:
        """The sequence the partition expects next from this producer (it wraps past ``2^31 - 1``)."""
        return (self.sequence + self.count) % SEQUENCE_MODULUS

    def judge(self, sequence: int, count: int) -> SequenceVerdict:
        """Section 9.4's check of a batch of ``count`` records from base ``sequence``, with this
        batch the producer's last on the partition (:func:`judge_sequence` for no last batch)."""
        if sequence == self.next_sequence:
            return SequenceVerdict.NEXT
        if sequence == self.sequence and count == self.count:
            return SequenceVerdict.REPEAT
        behind = (self.sequence - sequence) % SEQUENCE_MODULUS
        if 0 < behind <= self.known_before and count <= behind:  # wholly in the run known written
            return SequenceVerdict.OLDER
        return SequenceVerdict.OUT_OF_ORDER

    def followed_by(self, sequence: int, count: int, start_offset: int, entry_end_offset: int,
                    written_at_ms: int) -> "ProducerBatch":
        """The producer's next batch (``sequence`` is :attr:`next_sequence`), continuing the run."""
        return ProducerBatch(sequence, count, start_offset, entry_end_offset, written_at_ms,
                             min(self.known_before + self.count, SEQUENCE_WINDOW))

    def to_dict(self) -> dict[str, int]:
        return {"sequence": self.sequence, "count": self.count, "start_offset": self.start_offset,
                "entry_end_offset": self.entry_end_offset, "written_at_ms": self.written_at_ms,
                "known_before": self.known_before}

    @classmethod
    def from_dict(cls, obj: Any, key: str) -> "ProducerBatch":
        names = ("sequence", "count", "start_offset", "entry_end_offset", "written_at_ms")
        if not isinstance(obj, dict) or not all(_is_int(obj.get(n)) for n in names) \
                or not _is_int(obj.get("known_before", 0)):
            raise CorruptRecord(f"{key}: a producer's last batch must be an object of ints {', '.join(names)} "
                                f"(and known_before), got {obj!r}")
        batch = cls(*(obj[n] for n in names), obj.get("known_before", 0))
        if batch.sequence < 0 or batch.count < 1 or batch.start_offset < 1 \
                or batch.entry_end_offset < batch.start_offset + batch.count - 1 \
                or not 0 <= batch.known_before <= SEQUENCE_WINDOW:
            raise CorruptRecord(f"{key}: a producer's last batch does not add up: {obj!r}")
        return batch


def judge_sequence(last: ProducerBatch | None, sequence: int, count: int) -> SequenceVerdict:
    """Section 9.4's check of an idempotent producer's batch against ``last``, its last batch on
    the partition: a producer the partition does not know (None) may start at any sequence."""
    return SequenceVerdict.NEXT if last is None else last.judge(sequence, count)


def sequences_overlap(sequence: int, count: int, other_sequence: int, other_count: int) -> bool:
    """Whether a batch of ``count`` records from base ``sequence`` and one of ``other_count`` from
    ``other_sequence`` share a sequence, mod ``2^31`` (either may straddle the wrap; section 9.4)."""
    return (other_sequence - sequence) % SEQUENCE_MODULUS < count or (sequence - other_sequence) % SEQUENCE_MODULUS \
        < other_count


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


#: Sinks' progress entries kept per partition in ``meta/control.sinks``: the most recently
#: committed ones (docs/protocol.md section 9.1). Each is at most ~330 bytes (a 249-character
#: sink id), so ``sinks`` stays within ~330 KB, well inside the Oxia value budget.
MAX_SINKS_PER_PARTITION = 1000


@dataclass(frozen=True)
class SinkProgress:
    """``sinks[sink_id]`` in ``meta/control`` (docs/protocol.md section 9): a sink (a streaming
    query) has committed the first ``slices`` of its batch ``batch_id``'s slices for this
    partition, and everything of its earlier batches, the last time at ``committed_at_ms``.
    Written by the CAS that reserves offsets."""

    batch_id: int
    slices: int
    committed_at_ms: int | None = None  # None in entries written before llog recorded it

    def covers(self, batch_id: int, slice_no: int) -> bool:
        """Whether slice ``slice_no`` (0-based) of batch ``batch_id`` is already committed."""
        return batch_id < self.batch_id or (batch_id == self.batch_id and slice_no < self.slices)

    def to_dict(self) -> dict[str, int]:
        out = {"batch_id": self.batch_id, "slices": self.slices}
        if self.committed_at_ms is not None:
            out["committed_at_ms"] = self.committed_at_ms
        return out

    @classmethod
    def from_dict(cls, obj: Any, key: str) -> "SinkProgress":
        if not isinstance(obj, dict):
            raise CorruptRecord(f"{key}: sink progress must be an object, got {obj!r}")
        progress = cls(_field(obj, "batch_id", int, key), _field(obj, "slices", int, key),
                       _field(obj, "committed_at_ms", int, key, optional=True))
        if progress.batch_id < 0 or progress.slices < 0:
            raise CorruptRecord(f"{key}: sink progress must not be negative, got {obj!r}")
        return progress


@dataclass(frozen=True)
class ControlRecord:
    """``P/meta/control``: log state, the next offset, and at most one pending append."""

    log_state: str = OPEN
    sequence_counter: int = 1
    pending: PendingAppend | None = None
    #: Fields this version does not know (extensions); written back unchanged by every CAS.
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def high_watermark(self) -> int:
        """Last readable offset (0 when the log is empty)."""
        return self.sequence_counter - 1

    @property
    def fenced(self) -> bool:
        return self.log_state == FENCED

    @property
    def deleted(self) -> bool:
        """A tombstone: the partition's topic incarnation was deleted (section 12)."""
        return self.log_state == DELETED

    @property
    def log_start_offset(self) -> int:
        """The first offset still in the log (docs/protocol.md section 10.3); 1 when never moved."""
        value = self.extra.get("log_start_offset", 1)
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= self.sequence_counter:
            raise CorruptRecord(f"meta/control: log_start_offset must be an int in 1..{self.sequence_counter} (the "
                                f"sequence counter), got {value!r}")
        return value

    @property
    def topic_id(self) -> str | None:
        """The ``topic_id`` of the topic that initialized the partition (docs/protocol.md section 10 section
        1); None for a partition initialized before topic records existed."""
        value = self.extra.get("topic_id")
        if value is not None and not isinstance(value, str):
            raise CorruptRecord(f"meta/control: topic_id must be a string, got {value!r}")
        return value

    def with_extra(self, **fields: Any) -> "ControlRecord":
        """This record with extension fields set (docs/protocol.md section 10: ``log_start_offset``, ``topic_id``)."""
        return replace(self, extra={**self.extra, **fields})

    def with_changes(self, **changes: Any) -> "ControlRecord":
        return replace(self, **changes)

    def sink_progress(self, sink_id: str) -> SinkProgress | None:
        """What sink ``sink_id`` has committed here (section 9), if anything."""
        sinks = self.extra.get("sinks")
        if sinks is None:
            return None
        if not isinstance(sinks, dict):
            raise CorruptRecord(f"meta/control: 'sinks' must be an object, got {sinks!r}")
        found = sinks.get(sink_id)
        return None if found is None else SinkProgress.from_dict(found, f"meta/control sinks[{sink_id!r}]")

    def with_sink_progress(self, sink_id: str, progress: SinkProgress, retention_ms: int) -> "ControlRecord":
        """This record with ``progress`` for ``sink_id`` (stamped ``committed_at_ms``) and
        without other sinks' entries that last committed more than ``retention_ms`` before it.
        A sink new to the partition when :data:`MAX_SINKS_PER_PARTITION` live entries are there
        is refused (:class:`SinkProgressFull`): no live entry is dropped.
        An entry with no time (written before llog recorded one) gets this commit's time, so
        it expires a retention period later. Entries that are not well-formed progress are
        someone else's and stay as they are."""
        self.sink_progress(sink_id)  # the existing entry must be well-formed
        now = progress.committed_at_ms
        if now is None:
            raise ValueError("sink progress to write needs committed_at_ms")
        sinks: dict[str, Any] = {}
        ages: dict[str, int] = {}  # well-formed entries kept, by when they last committed
        for other_id, obj in (self.extra.get("sinks") or {}).items():
            try:
                other = SinkProgress.from_dict(obj, other_id)
            except CorruptRecord:
                sinks[other_id] = obj
                continue
            if other_id == sink_id:
                continue
            if other.committed_at_ms is None:
                sinks[other_id] = replace(other, committed_at_ms=now).to_dict()
                ages[other_id] = now
            elif now - other.committed_at_ms <= retention_ms:
                sinks[other_id] = obj
                ages[other_id] = other.committed_at_ms
        # At most MAX_SINKS_PER_PARTITION entries with ours. A live entry is never dropped (its
        # sink's replay would write its batch again): a new sink finds the partition full.
        if len(ages) + 1 > MAX_SINKS_PER_PARTITION and sink_id not in (self.extra.get("sinks") or {}):
            raise SinkProgressFull(
                f"sink {sink_id}: this partition's meta/control already holds the progress of {len(ages)} sinks "
                f"that committed in the last {retention_ms // 3_600_000} h (at most {MAX_SINKS_PER_PARTITION}): "
                f"nothing was written; write to it under fewer sink ids (foreachBatch writes: fewer `name=` "
                f"labels), or wait for entries to expire (LLOG_SINK_PROGRESS_RETENTION_MS)")
        sinks[sink_id] = progress.to_dict()
        return replace(self, extra={**self.extra, "sinks": sinks})

    def to_json(self) -> bytes:
        return _dump({
            **self.extra,
            "log_state": self.log_state,
            "sequence_counter": self.sequence_counter,
            "pending": self.pending.to_dict() if self.pending else None,
        })

    @classmethod
    def from_json(cls, raw: bytes | str, key: str = "meta/control") -> "ControlRecord":
        obj = _load(raw, key)
        state = _field(obj, "log_state", str, key)
        if state not in (OPEN, FENCED, DELETED):
            raise CorruptRecord(f"{key}: unknown log_state {state!r}")
        counter = _field(obj, "sequence_counter", int, key)
        if counter < 1:
            raise CorruptRecord(f"{key}: sequence_counter must be >= 1, got {counter}")
        raw_pending = obj.get("pending")
        pending = None if raw_pending is None else PendingAppend.from_dict(raw_pending, key)
        extra = {k: v for k, v in obj.items() if k not in ("log_state", "sequence_counter", "pending")}
        return cls(state, counter, pending, extra)


@dataclass(frozen=True)
class CompactionCursor:
    """``P/meta/compaction-cursor``: the first offset not yet compacted."""

    offset: int = 1

    def to_json(self) -> bytes:
        return _dump({"offset": self.offset})

    @classmethod
    def from_json(cls, raw: bytes | str, key: str = "meta/compaction-cursor") -> "CompactionCursor":
        offset = _field(_load(raw, key), "offset", int, key)
        if offset < 1:
            raise CorruptRecord(f"{key}: offset must be >= 1, got {offset}")
        return cls(offset)


@dataclass(frozen=True)
class ConsumerOffset:
    """``P/consumers/{group}`` (docs/protocol.md section 9): the group's next offset to read."""

    offset: int
    committed_at_ms: int
    #: The string a Kafka client committed with the offset ("": none; section 9.3).
    metadata: str = ""

    def to_json(self) -> bytes:
        fields = {"offset": self.offset, "committed_at_ms": self.committed_at_ms}
        if self.metadata:
            fields["metadata"] = self.metadata
        return _dump(fields)

    @classmethod
    def from_json(cls, raw: bytes | str, key: str = "consumers/{group}") -> "ConsumerOffset":
        obj = _load(raw, key)
        offset = _field(obj, "offset", int, key)
        if offset < 1:
            raise CorruptRecord(f"{key}: offset must be >= 1, got {offset}")
        return cls(offset, _field(obj, "committed_at_ms", int, key),
                   _field(obj, "metadata", str, key, optional=True) or "")


#: ``meta/compaction`` states (docs/protocol.md section 6), in order.
WRITING_COMPACTED_INDEX = "WRITING_COMPACTED_INDEX"
DELETING_OLD = "DELETING_OLD"
UPDATING_CURSOR = "UPDATING_CURSOR"
COMPACTION_STATES = (WRITING_COMPACTED_INDEX, DELETING_OLD, UPDATING_CURSOR)


@dataclass(frozen=True)
class CompactionRecord:
    """``P/meta/compaction``: the compaction in flight, the record any compactor resumes from
    (docs/protocol.md section 6). ``end_entry_version``: the version of ``index/{end_offset}``
    read in step 1, at which every step 4 of the record CASes; None in a record written before
    v1.3 (step 0 gives it one, and it is then left out of the JSON)."""

    compaction_id: str
    state: str
    start_offset: int
    end_offset: int
    msg_count: int
    data_key: str
    encoding: str
    created_at_ms: int
    last_entry_start_offset: int
    end_entry_version: int | None = None

    def to_json(self) -> bytes:
        fields = asdict(self)
        if self.end_entry_version is None:
            del fields["end_entry_version"]
        return _dump(fields)

    def with_end_entry_version(self, version: int) -> "CompactionRecord":
        return replace(self, end_entry_version=version)

    def with_state(self, state: str) -> "CompactionRecord":
        return replace(self, state=state)

    def index_entry(self) -> IndexEntry:
        """The COMPACTED entry this compaction writes at ``index/{end_offset}``."""
        return IndexEntry(COMPACTED, self.msg_count, self.data_key, self.encoding, self.created_at_ms)

    @classmethod
    def from_json(cls, raw: bytes | str, key: str = "meta/compaction") -> "CompactionRecord":
        obj = _load(raw, key)
        record = cls(
            compaction_id=_field(obj, "compaction_id", str, key),
            state=_field(obj, "state", str, key),
            start_offset=_field(obj, "start_offset", int, key),
            end_offset=_field(obj, "end_offset", int, key),
            msg_count=_field(obj, "msg_count", int, key),
            data_key=_field(obj, "data_key", str, key),
            encoding=_field(obj, "encoding", str, key),
            created_at_ms=_field(obj, "created_at_ms", int, key),
            last_entry_start_offset=_field(obj, "last_entry_start_offset", int, key),
            end_entry_version=_field(obj, "end_entry_version", int, key, optional=True),
        )
        if record.state not in COMPACTION_STATES:
            raise CorruptRecord(f"{key}: unknown compaction state {record.state!r}")
        if not 1 <= record.start_offset <= record.last_entry_start_offset <= record.end_offset \
                or record.msg_count != record.end_offset - record.start_offset + 1:
            raise CorruptRecord(f"{key}: inconsistent offsets {record.start_offset}..{record.end_offset} "
                                f"(last entry from {record.last_entry_start_offset}, msg_count {record.msg_count})")
        if record.end_entry_version is not None and record.end_entry_version < 0:
            raise CorruptRecord(f"{key}: end_entry_version must be >= 0, got {record.end_entry_version}")
        return record


#: Topic states (docs/protocol.md section 10.1).
ACTIVE = "ACTIVE"
DELETING = "DELETING"
TOPIC_STATES = (ACTIVE, DELETING)


@dataclass(frozen=True)
class TopicRecord:
    """``R/topics/{topic}`` (docs/protocol.md section 10.1): partition count, explicit config, state,
    and whether a write created it on first use (``auto_created``: then later writes grow it,
    10.2; written only when true, so a record without the field reads as created explicitly).
    Unknown fields are kept in ``extra`` and written back by every CAS."""

    topic: str
    topic_id: str
    partitions: int
    config: dict[str, Any] = field(default_factory=dict)
    state: str = ACTIVE
    created_at_ms: int = 0
    updated_at_ms: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    auto_created: bool = False

    @property
    def deleting(self) -> bool:
        return self.state == DELETING

    def with_changes(self, **changes: Any) -> "TopicRecord":
        return replace(self, **changes)

    def to_json(self) -> bytes:
        return _dump({**self.extra, "topic": self.topic, "topic_id": self.topic_id, "state": self.state,
                      "partitions": self.partitions, "config": self.config, "created_at_ms": self.created_at_ms,
                      "updated_at_ms": self.updated_at_ms, **({"auto_created": True} if self.auto_created else {})})

    @classmethod
    def from_json(cls, raw: bytes | str, key: str = "topics/{topic}") -> "TopicRecord":
        obj = _load(raw, key)
        record = cls(
            topic=_field(obj, "topic", str, key),
            topic_id=_field(obj, "topic_id", str, key),
            partitions=_field(obj, "partitions", int, key),
            config=_field(obj, "config", dict, key),
            state=_field(obj, "state", str, key),
            created_at_ms=_field(obj, "created_at_ms", int, key),
            updated_at_ms=_field(obj, "updated_at_ms", int, key, optional=True) or 0,
            extra={k: v for k, v in obj.items() if k not in _TOPIC_FIELDS},
            auto_created=_field(obj, "auto_created", bool, key, optional=True) or False,
        )
        if record.state not in TOPIC_STATES:
            raise CorruptRecord(f"{key}: unknown topic state {record.state!r}")
        if record.partitions < 1:
            raise CorruptRecord(f"{key}: partitions must be >= 1, got {record.partitions}")
        return record


_TOPIC_FIELDS = ("topic", "topic_id", "state", "partitions", "config", "created_at_ms", "updated_at_ms", "auto_created")
