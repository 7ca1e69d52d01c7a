"""The broker's request and response bodies, as msgspec Structs: the one definition that decodes
and validates requests and encodes responses (the HTTP contract of the reference
implementation). A body that does not match gets a 400 naming the field.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from llog.records import SEQUENCE_MODULUS

#: A topic as the request shape checks it; llog's topic rule (docs/protocol.md section 1) is checked
#: when the request is admitted, also with a 400.
Topic = Annotated[str, msgspec.Meta(min_length=1)]
Partition = Annotated[int, msgspec.Meta(ge=0)]
#: An idempotent producer's id (Kafka's producer id): chosen by the client, or by ``POST /producers``.
ProducerId = Annotated[str, msgspec.Meta(pattern="^[A-Za-z0-9._:-]{1,64}$")]


class Base64Record(msgspec.Struct, forbid_unknown_fields=True):
    """A record given as base64 (raw bytes); a plain JSON string is a record of its UTF-8 bytes."""

    base64: bytes


class ProduceGroup(msgspec.Struct, forbid_unknown_fields=True):
    topic: Topic
    partition: Partition
    records: Annotated[list[str | Base64Record], msgspec.Meta(min_length=1)]
    #: With the request's ``producer_id`` (required then, refused without it): the sequence of
    #: this group's first record, per producer and partition (Kafka's base sequence, an int32:
    #: 0..2147483647). The first batch a partition sees from a producer may start anywhere (0,
    #: usually); each next one starts where the last ended (its sequence plus its record count,
    #: wrapping to 0 after 2147483647: docs/protocol.md section 9.4). A group resent with its
    #: sequence is answered with the offsets it got the first time, and written once.
    sequence: Annotated[int, msgspec.Meta(ge=0, le=SEQUENCE_MODULUS - 1)] | None = None


class ProduceRequest(msgspec.Struct, forbid_unknown_fields=True):
    topic_partitions: Annotated[list[ProduceGroup], msgspec.Meta(min_length=1)]
    #: Makes the request idempotent (Kafka's idempotent producer): every group then carries its
    #: ``sequence``. The same request sent again, to this broker or another, is answered with the
    #: offsets of the first and writes nothing.
    producer_id: ProducerId | None = None


class ProduceResult(msgspec.Struct, omit_defaults=True):
    """One topic-partition group of a request: where it landed (``ok``), or why not."""

    topic: str
    partition: int
    ok: bool
    start_offset: int | None = None
    end_offset: int | None = None
    count: int | None = None
    index_key: str | None = None
    wal_uri: str | None = None
    #: True when the group is an idempotent producer's batch written before: the offsets are the
    #: ones it got then, nothing was written now (no ``wal_uri``).
    duplicate: bool = False
    error_type: str | None = None
    error: str | None = None


class ProducerAllocated(msgspec.Struct):
    """``POST /producers``: a new producer id (Kafka's InitProducerId); its sequences start at 0
    on every partition."""

    producer_id: str


class ProduceResponse(msgspec.Struct, omit_defaults=True):
    results: list[ProduceResult]
    success_count: int
    error_count: int
    #: With 503: when to try again (also the ``Retry-After`` header, in whole seconds).
    retry_after_ms: int | None = None
    #: With 404 (every group names a topic or partition that does not exist): the first group's
    #: error, as an :class:`ErrorBody` would carry it (each group's is in ``results``).
    error_type: str | None = None
    error: str | None = None


class Health(msgspec.Struct):
    status: str
    broker_id: str
    host: str
    port: int
    started_at_ms: int


class ErrorBody(msgspec.Struct):
    """A request refused as a whole (400, 404, 413)."""

    error_type: str
    error: str


# --- POST /consume ---------------------------------------------------------------------------

#: Kafka's fetch defaults: 1 MiB per partition, 50 MiB per request.
DEFAULT_PARTITION_MAX_BYTES = 1024 * 1024
DEFAULT_MAX_BYTES = 50 * 1024 * 1024


class ConsumePartition(msgspec.Struct, forbid_unknown_fields=True):
    topic: Topic
    partition: Partition
    #: The first offset to return (offsets start at 1); a stateless consumer sends the
    #: ``next_fetch_offset`` of its previous answer.
    fetch_offset: Annotated[int, msgspec.Meta(ge=1)]
    #: Record bytes to return for this partition at most (the first record always, even if larger).
    partition_max_bytes: Annotated[int, msgspec.Meta(gt=0)] = DEFAULT_PARTITION_MAX_BYTES


#: What a fetch outside a partition's readable offsets does (Kafka's ``auto.offset.reset``).
OffsetReset = Literal["none", "earliest", "latest"]


class ConsumeRequest(msgspec.Struct, forbid_unknown_fields=True):
    topic_partitions: Annotated[list[ConsumePartition], msgspec.Meta(min_length=1)]
    #: Long poll: wait up to this long (capped by the broker) for ``min_bytes`` of records.
    max_wait_ms: Annotated[int, msgspec.Meta(ge=0)] = 0
    min_bytes: Annotated[int, msgspec.Meta(ge=0)] = 1
    #: Record bytes to return for the whole request at most (the first record always).
    max_bytes: Annotated[int, msgspec.Meta(gt=0)] = DEFAULT_MAX_BYTES
    #: A ``fetch_offset`` below the partition's log start (removed by retention, docs/protocol.md section 10
    #: section 3) or past its high watermark + 1: ``none`` answers the partition with
    #: ``OffsetOutOfRange`` (its ``log_start_offset`` and ``high_watermark`` say where to go);
    #: ``earliest`` reads from the log start instead, ``latest`` from the log end (no records,
    #: ``next_fetch_offset`` the high watermark + 1). The result's ``start_offset`` and
    #: ``next_fetch_offset`` show where it read.
    auto_offset_reset: OffsetReset = "none"


class ConsumedHeader(msgspec.Struct, omit_defaults=True):
    """A record header: its key, and its value as ``value`` when UTF-8, else ``value_base64``
    (neither: a null value)."""

    key: str
    value: str | None = None
    value_base64: bytes | None = None


class ConsumedRecord(msgspec.Struct, omit_defaults=True):
    """A record: its value as ``payload`` when its bytes are UTF-8, else ``base64`` (neither: a
    tombstone, Kafka's null value). Records written with a key, headers or an event time
    (docs/protocol.md section 11) also carry ``key`` (or ``key_base64``), ``headers`` and ``timestamp``
    (ms since the epoch)."""

    offset: int
    payload: str | None = None
    base64: bytes | None = None
    key: str | None = None
    key_base64: bytes | None = None
    headers: list[ConsumedHeader] | None = None
    timestamp: int | None = None


class ConsumeResult(msgspec.Struct, omit_defaults=True):
    """One requested topic-partition: its records from ``fetch_offset`` (maybe none), or why not."""

    topic: str
    partition: int
    ok: bool
    high_watermark: int | None = None
    #: The first offset still in the log (docs/protocol.md section 10.3; Kafka's fetch response has
    #: it): on every ok result, and on an ``OffsetOutOfRange`` one, so a client can reset.
    log_start_offset: int | None = None
    start_offset: int | None = None
    end_offset: int | None = None
    next_fetch_offset: int | None = None
    record_count: int | None = None
    records: list[ConsumedRecord] | None = None
    #: The incarnation of the topic the records are of (its record's ``topic_id``; docs/protocol.md
    #: section 12), on every ok result and on an ``OffsetOutOfRange`` one. A topic deleted and
    #: created again has a new one, and its offsets start at 1 again: a client that sees it
    #: change starts over, and commits its offsets with the id it read them from.
    topic_id: str | None = None
    error_type: str | None = None
    error: str | None = None


class ConsumeResponse(msgspec.Struct, omit_defaults=True):
    results: list[ConsumeResult]
    success_count: int
    error_count: int


# --- consumer groups -------------------------------------------------------------------------

Group = Annotated[str, msgspec.Meta(min_length=1)]


class GroupOffset(msgspec.Struct, forbid_unknown_fields=True):
    topic: Topic
    partition: Partition
    #: The next offset the group will read (Kafka's committed offset): last consumed + 1.
    offset: Annotated[int, msgspec.Meta(ge=1)]
    #: The ``topic_id`` of the consume results the offset was read from (Kafka's topic id in an
    #: offset commit). Checked: an id that is not the topic's current one (the topic was deleted,
    #: maybe created again) refuses the whole commit with 409 ``UnknownTopicId``, nothing
    #: committed. Without it, the offset goes to the topic's incarnation current when the commit
    #: is handled.
    topic_id: Annotated[str, msgspec.Meta(pattern="^[A-Za-z0-9-]{1,64}$")] | None = None


class GroupCommitRequest(msgspec.Struct, forbid_unknown_fields=True):
    offsets: Annotated[list[GroupOffset], msgspec.Meta(min_length=1)]


class GroupCommitted(msgspec.Struct):
    topic: str
    partition: int
    offset: int
    #: False when the group had already committed this offset or a later one (commits only move
    #: forward; ``llog groups reset`` moves back).
    moved: bool


class GroupCommitResponse(msgspec.Struct):
    group: str
    offsets: list[GroupCommitted]


class GroupPartitionLag(msgspec.Struct):
    topic: str
    partition: int
    committed_offset: int
    committed_at_ms: int
    high_watermark: int
    #: Records at or after the committed offset.
    lag: int


class GroupDescription(msgspec.Struct):
    group: str
    partitions: list[GroupPartitionLag]
    total_lag: int


# --- topics ----------------------------------------------------------------------------------

class TopicConfig(msgspec.Struct):
    """A topic's effective settings (docs/protocol.md section 10.1, Kafka's names): its record's, else
    the defaults."""

    cleanup_policy: str = msgspec.field(name="cleanup.policy")
    compression_type: str = msgspec.field(name="compression.type")
    #: Per partition; -1: no limit.
    retention_bytes: int = msgspec.field(name="retention.bytes")
    #: -1: records are kept forever.
    retention_ms: int = msgspec.field(name="retention.ms")


class TopicSummary(msgspec.Struct):
    topic: str
    #: The topic record's partition count (partitions ``0..partitions-1``).
    partitions: int
    #: ``ACTIVE``, or ``DELETING`` while a delete runs.
    state: str
    #: New at every create (docs/protocol.md section 10.1): the incarnation of the topic (docs/protocol.md
    #: section 12), as consume results name it.
    topic_id: str
    config: TopicConfig


class TopicList(msgspec.Struct):
    topics: list[TopicSummary]


class PartitionSummary(msgspec.Struct):
    partition: int
    log_state: str
    #: The first offset still in the log: ``log_start_offset..high_watermark`` are readable,
    #: the offsets below were removed by retention (docs/protocol.md section 10.3).
    log_start_offset: int
    high_watermark: int
    index_entries: int
    compacted_entries: int
    #: Bytes of the record bodies the index references (shared WAL slices and compacted objects).
    bytes: int | None


class TopicDescription(msgspec.Struct):
    topic: str
    #: Its initialized partitions (one below ``partition_count`` may be missing for a moment
    #: after a create that crashed midway: the next write initializes it).
    partitions: list[PartitionSummary]
    #: As :class:`TopicSummary`'s ``partitions``, ``state`` and ``topic_id``.
    partition_count: int
    state: str
    topic_id: str
    config: TopicConfig
