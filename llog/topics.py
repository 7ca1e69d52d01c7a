"""Topics as objects (docs/protocol.md section 10): the topic record ``R/topics/{topic}``, and create, alter,
delete and list, each by the CAS the spec gives it. :class:`TopicCache` is what writers check
before reserving offsets: the topic exists (or is created on first use), is not being deleted,
and has the partition.

``llog topics create|list|describe|alter|delete`` (``llog_tools.cli``) calls these functions.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from llog import failpoints
from llog.clock import SYSTEM, Clock
from llog.config import COMPRESSION_TYPES, Config
from llog.control import backoff, initialize_partition
from llog.coordination import EXPECTED_ABSENT, Coordination
from llog.discovery import record_keys
from llog.errors import (
    ClaimHeld, InvalidTopicConfig, LlogError, MaxRetriesExceeded, PartitionNotInitialized, TopicAlreadyExists,
    TopicBeingDeleted, TopicDeleted, TopicNotFound, UnknownPartition, VersionConflict,
)
from llog.fence import fence
from llog.keys import (
    TOPICS_PARTITION_KEY, PartitionKeys, TopicPartition, s3_uri, topic_key, topic_keys_range, validate_topic,
)
from llog.records import ACTIVE, DELETED, DELETING, ControlRecord, TopicRecord

log = logging.getLogger(__name__)

#: Kafka's ``cleanup.policy`` values llog has (no log compaction by key).
CLEANUP_POLICIES = ("delete",)
#: The settings a topic may hold (docs/protocol.md section 10.1), in the order ``describe`` lists them.
TOPIC_CONFIGS = ("cleanup.policy", "compression.type", "retention.bytes", "retention.ms")
#: How long a writer trusts a cached topic record before reading it again (Kafka producers'
#: ``metadata.max.age.ms`` is 5 minutes; a config change reaches writers within this).
CACHE_TTL_S = 30.0
#: CAS rounds of an alter or a delete's state change before giving up.
_MAX_ATTEMPTS = 64
#: How long a delete waits, per partition, for a compactor to release the partition's claim.
DEFAULT_CLAIM_WAIT_S = 60.0


# --- settings -------------------------------------------------------------------------------------


def parse_config(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Check ``settings`` (Kafka's names; values as given on a command line or in JSON) and
    return them typed: ints for ``retention.*``, strings for the rest. Raises
    :class:`InvalidTopicConfig` naming the first bad one."""
    out: dict[str, Any] = {}
    for name, value in settings.items():
        if name in ("retention.ms", "retention.bytes"):
            try:
                number = int(value) if not isinstance(value, bool) else None
            except (TypeError, ValueError):
                number = None
            if number is None or number < -1:
                raise InvalidTopicConfig(f"{name}={value!r} must be an integer >= -1 (-1: no limit)")
            out[name] = number
        elif name == "cleanup.policy":
            if value not in CLEANUP_POLICIES:
                raise InvalidTopicConfig(f"cleanup.policy={value!r}: llog has only 'delete' (records go by "
                                         f"retention.ms and retention.bytes; there is no compaction by key)")
            out[name] = value
        elif name == "compression.type":
            if value not in COMPRESSION_TYPES:
                raise InvalidTopicConfig(f"compression.type={value!r} must be one of {', '.join(COMPRESSION_TYPES)}")
            out[name] = value
        else:
            raise InvalidTopicConfig(f"unknown topic setting {name!r}; known: {', '.join(TOPIC_CONFIGS)}")
    return out


def parse_config_pairs(pairs: Iterable[str]) -> dict[str, Any]:
    """``["retention.ms=3600000", ...]`` (the ``--config k=v`` flags) as typed settings."""
    raw: dict[str, str] = {}
    for pair in pairs:
        name, eq, value = pair.partition("=")
        if not eq or not name.strip():
            raise InvalidTopicConfig(f"--config {pair!r} must look like name=value, e.g. retention.ms=86400000")
        raw[name.strip()] = value.strip()
    return parse_config(raw)


@dataclass(frozen=True)
class TopicSettings:
    """A topic's effective settings: its record's, else the defaults (docs/protocol.md section 10.1)."""

    retention_ms: int
    retention_bytes: int
    cleanup_policy: str
    compression_type: str

    @classmethod
    def of(cls, topic: str, record: TopicRecord | None, config: Config) -> "TopicSettings":
        given = record.config if record is not None else {}
        return cls(
            retention_ms=given.get("retention.ms", config.retention_ms),
            retention_bytes=given.get("retention.bytes", config.retention_bytes),
            cleanup_policy=given.get("cleanup.policy", "delete"),
            compression_type=given.get("compression.type", config.compression(topic)),
        )

    def as_kafka(self) -> dict[str, Any]:
        return {"cleanup.policy": self.cleanup_policy, "compression.type": self.compression_type,
                "retention.bytes": self.retention_bytes, "retention.ms": self.retention_ms}


# --- reading ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VersionedTopic:
    record: TopicRecord
    version: int


def read_topic(coordination: Coordination, root: str, topic: str) -> VersionedTopic | None:
    """The topic's record and its version, or None when it has none."""
    found = coordination.get(topic_key(root, topic), TOPICS_PARTITION_KEY)
    return None if found is None else VersionedTopic(TopicRecord.from_json(found.value, found.key), found.version_id)


def list_topic_records(coordination: Coordination, root: str) -> list[TopicRecord]:
    """Every topic record, by name (one range scan of one shard)."""
    start, end = topic_keys_range(root)
    return sorted((TopicRecord.from_json(v.value, v.key) for v in coordination.range_scan(start, end, TOPICS_PARTITION_KEY)),
                  key=lambda r: r.topic)


# --- create ------------------------------------------------------------------------------------------


def create_topic(coordination: Coordination, root: str, topic: str, partitions: int,
                 settings: Mapping[str, Any] | None = None, if_not_exists: bool = False,
                 clock: Clock = SYSTEM, auto_created: bool = False) -> TopicRecord:
    """docs/protocol.md section 10.2, create: the record only if absent, with a new ``topic_id``, then
    its partitions (keys of their own: docs/protocol.md section 12). With ``if_not_exists`` an
    existing topic is returned as it is. ``auto_created``: a write creates it on first use, and
    later writes grow it (:func:`grow_topic`); otherwise its count changes only by an alter."""
    validate_topic(topic)
    if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
        raise InvalidTopicConfig(f"partitions must be an integer >= 1, got {partitions!r}")
    settings = parse_config(settings or {})
    existing = read_topic(coordination, root, topic)
    if existing is not None:
        return _existing(topic, existing.record, if_not_exists)
    now = clock.now_ms()
    record = TopicRecord(topic, str(uuid.uuid4()), partitions, dict(settings), ACTIVE, now, now,
                         auto_created=auto_created)
    try:
        coordination.put(topic_key(root, topic), record.to_json(), TOPICS_PARTITION_KEY,
                         EXPECTED_ABSENT)
    except VersionConflict:
        found = read_topic(coordination, root, topic)
        if found is None:  # created and deleted meanwhile, or our own attempt landed and was deleted
            raise TopicAlreadyExists(topic, "it was created and deleted while this create ran; try again") from None
        if found.record.topic_id == record.topic_id:  # our attempt landed (a retry after a failure in transit)
            record = found.record
        else:
            return _existing(topic, found.record, if_not_exists)
    initialize_partitions(coordination, root, record, range(partitions))
    log.info("created topic %s (%d partition(s), id %s%s)", topic, partitions, record.topic_id,
             ", on first use" if auto_created else "")
    return record


def _existing(topic: str, record: TopicRecord, if_not_exists: bool) -> TopicRecord:
    if record.deleting:
        raise TopicAlreadyExists(topic, "it is being deleted; create it again when the delete is done")
    if not if_not_exists:
        raise TopicAlreadyExists(topic, f"{record.partitions} partition(s)")
    return record


def initialize_partitions(coordination: Coordination, root: str, record: TopicRecord, partitions: Iterable[int]) -> None:
    """Initialize each partition of the record's incarnation (docs/protocol.md 4.1)."""
    wanted = set(partitions)
    for k in record_keys(root, record):
        if k.tp.partition in wanted:
            initialize_partition(coordination, k)


# --- alter -------------------------------------------------------------------------------------------


def alter_topic(coordination: Coordination, root: str, topic: str, partitions: int | None = None,
                set_config: Mapping[str, Any] | None = None, delete_config: Iterable[str] = (),
                clock: Clock = SYSTEM) -> TopicRecord:
    """docs/protocol.md section 10.2, alter: CAS on the version read. ``partitions`` only grows (the
    new ones are initialized after the CAS); ``set_config`` is checked, ``delete_config`` names
    settings to drop back to their defaults. Whether the topic was created on first use is kept."""
    set_config = parse_config(set_config or {})
    delete_config = list(delete_config)
    for name in delete_config:
        if name not in TOPIC_CONFIGS:
            raise InvalidTopicConfig(f"unknown topic setting {name!r}; known: {', '.join(TOPIC_CONFIGS)}")

    def change(record: TopicRecord) -> TopicRecord | None:
        count = record.partitions
        if partitions is not None:
            if partitions < record.partitions:
                raise InvalidTopicConfig(f"topic {topic!r} has {record.partitions} partitions; the count only "
                                         f"grows (as Kafka's), so it cannot become {partitions}")
            count = partitions
        settings = {k: v for k, v in {**record.config, **set_config}.items() if k not in delete_config}
        if count == record.partitions and settings == record.config:
            return None
        return record.with_changes(partitions=count, config=settings, updated_at_ms=clock.now_ms())

    return _update(coordination, root, topic, change, "altering")


def grow_topic(coordination: Coordination, root: str, topic: str, partitions: int, limit: int,
               clock: Clock = SYSTEM) -> TopicRecord:
    """docs/protocol.md section 10.2, growth on first use: a topic created on first use gets at least
    ``partitions`` partitions, by the alter's CAS (the new ones initialized after it). A record
    that already has them is the answer as it is, so writers racing to grow it all succeed and
    the count is the largest asked for. Raises :class:`UnknownPartition` for a topic created
    explicitly, or when ``partitions`` is over ``limit`` (``LLOG_MAX_AUTO_PARTITIONS``);
    :class:`TopicNotFound`, :class:`TopicBeingDeleted`."""
    partition = partitions - 1
    wrote = False

    def change(record: TopicRecord) -> TopicRecord | None:
        nonlocal wrote
        wrote = False
        if record.partitions >= partitions:
            return None
        if not record.auto_created:
            raise UnknownPartition(topic, partition, record.partitions, _EXPLICIT)
        if partitions > limit:
            raise UnknownPartition(topic, partition, record.partitions, _over_limit(limit))
        wrote = True
        return record.with_changes(partitions=partitions, updated_at_ms=clock.now_ms())

    record = _update(coordination, root, topic, change, "growing")
    if wrote:
        log.info("grew topic %s to %d partition(s) for a write to %s[%d]", topic, partitions, topic, partition)
    return record


#: Why a write does not grow a topic created explicitly (docs/protocol.md section 10.2).
_EXPLICIT = "the topic was created explicitly, so writes do not add partitions"


def _over_limit(limit: int) -> str:
    return (f"a write makes a topic created on first use have at most {limit} partitions "
            f"(LLOG_MAX_AUTO_PARTITIONS, or LLOG_DEFAULT_PARTITIONS if more): create the topic with "
            f"`llog topics create`, or alter it, for more")


def _update(coordination: Coordination, root: str, topic: str,
            change: Callable[[TopicRecord], TopicRecord | None], doing: str) -> TopicRecord:
    """The CAS loop of an alter (docs/protocol.md section 10.2): read the record, ``change`` it
    (None: nothing to write, the record is the answer), CAS on the version read; a conflict reads
    again. Partitions the change added are initialized after the CAS."""
    for attempt in range(_MAX_ATTEMPTS):
        found = read_topic(coordination, root, topic)
        if found is None:
            raise TopicNotFound(topic)
        record = found.record
        if record.deleting:
            raise TopicBeingDeleted(topic)
        new = change(record)
        if new is None:
            return record
        failpoints.hit("topics.before_update_cas")
        try:
            coordination.put(topic_key(root, topic), new.to_json(), TOPICS_PARTITION_KEY, found.version)
        except VersionConflict:
            backoff(attempt)
            continue
        if new.partitions > record.partitions:
            initialize_partitions(coordination, root, new, range(record.partitions, new.partitions))
        return new
    raise MaxRetriesExceeded(f"{doing} topic {topic!r}", _MAX_ATTEMPTS)


# --- delete ------------------------------------------------------------------------------------------


@dataclass
class DeleteReport:
    topic: str
    partitions: int = 0
    compacted_objects: int = 0


def delete_topic(coordination: Coordination, objects, root: str, topic: str,
                 claim_wait_s: float = DEFAULT_CLAIM_WAIT_S, clock: Clock = SYSTEM,
                 config: Config | None = None) -> DeleteReport:
    """docs/protocol.md section 10.2 and docs/protocol.md section 12, delete: mark DELETING, then per
    partition take its compactor claim (waiting up to ``claim_wait_s``), fence it, turn its
    ``meta/control`` into a tombstone, delete its other keys and its compacted objects; last the
    record. Re-running it finishes an interrupted delete. ``objects``: an
    :class:`llog.objects.ObjectStore`."""
    validate_topic(topic)
    report = DeleteReport(topic)
    found = _mark_deleting(coordination, root, topic, clock)
    if found is None:
        raise TopicNotFound(topic)
    for keys in record_keys(root, found.record):
        report.compacted_objects += _delete_partition(coordination, objects, keys, claim_wait_s, clock, config)
        report.partitions += 1
    try:
        coordination.delete(topic_key(root, topic), TOPICS_PARTITION_KEY, expected_version=found.version)
    except VersionConflict:
        pass  # another delete of it finished first
    log.info("deleted topic %s: %d partition(s), %d compacted object(s)", topic, report.partitions,
             report.compacted_objects)
    return report


def _mark_deleting(coordination: Coordination, root: str, topic: str, clock: Clock) -> VersionedTopic | None:
    for attempt in range(_MAX_ATTEMPTS):
        found = read_topic(coordination, root, topic)
        if found is None or found.record.deleting:
            return found
        new = found.record.with_changes(state=DELETING, updated_at_ms=clock.now_ms())
        try:
            version = coordination.put(topic_key(root, topic), new.to_json(), TOPICS_PARTITION_KEY, found.version)
            return VersionedTopic(new, version)
        except VersionConflict:
            backoff(attempt)
    raise MaxRetriesExceeded(f"marking topic {topic!r} for deletion", _MAX_ATTEMPTS)


def _delete_partition(coordination: Coordination, objects, keys: PartitionKeys, claim_wait_s: float,
                      clock: Clock, config: Config | None) -> int:
    """Steps 2 and 3 of a delete for one partition; returns the compacted objects deleted.

    The tombstone goes first (docs/protocol.md section 12): from then on no append, compaction,
    retention pass or initializer acts on this incarnation's partition, whatever it read before,
    and a reader or a broker that meets the tombstone knows the incarnation is gone."""
    claim = f'{{"compactor_id": "topic-delete", "claimed_at_ms": {int(time.time() * 1000)}}}'.encode()
    waited_until = time.monotonic() + claim_wait_s
    while True:
        try:
            coordination.claim(keys.compactor_claim, claim, keys.partition_key)
            break
        except ClaimHeld as e:
            if time.monotonic() >= waited_until:
                raise ClaimHeld(f"{keys.tp}: a compactor has held its claim for {claim_wait_s:.0f} s ({e}); the topic "
                                f"stays marked for deletion: run the delete again") from None
            time.sleep(0.5)
    try:
        fence(coordination, keys, config)
    except (PartitionNotInitialized, TopicDeleted):
        pass  # never initialized, or an earlier delete got this far
    _tombstone(coordination, keys, clock)
    for start, end in keys.all_but_control:
        coordination.delete_range(start, end, keys.partition_key)  # the claim goes with them
    bucket = objects.config.s3_bucket
    doomed = [s3_uri(bucket, info.key) for info in objects.list(keys.compacted_prefix)]
    if doomed:
        objects.delete_many(doomed)
    return len(doomed)


def _tombstone(coordination: Coordination, keys: PartitionKeys, clock: Clock) -> None:
    """Make ``meta/control`` a DELETED tombstone (created if the partition was never initialized,
    so no late initializer can bring it back), keeping its counter and extension fields."""
    for attempt in range(_MAX_ATTEMPTS):
        found = coordination.get(keys.control, keys.partition_key)
        current = ControlRecord.from_json(found.value, found.key) if found is not None else ControlRecord()
        if current.deleted:
            return
        tombstone = current.with_changes(log_state=DELETED, pending=None).with_extra(
            topic_id=keys.topic_id, deleted_at_ms=clock.now_ms())
        try:
            coordination.put(keys.control, tombstone.to_json(), keys.partition_key,
                             found.version_id if found is not None else EXPECTED_ABSENT)
            return
        except VersionConflict:
            backoff(attempt)
    raise MaxRetriesExceeded(f"marking {keys.tp} deleted", _MAX_ATTEMPTS)


# --- what writers check ----------------------------------------------------------------------------


class TopicCache:
    """Topic records as a writer (or a Spark task placing keyed rows) needs them: cached for
    :data:`CACHE_TTL_S`, read again when they do not answer (a partition past the count, a
    ``topic_id`` that differs), and created on first use, and grown by writes to higher
    partitions, when ``auto_create`` and ``LLOG_AUTO_CREATE_TOPICS`` allow (docs/protocol.md
    section 10.2). Thread-safe."""

    def __init__(self, coordination: Coordination, config: Config, clock: Clock = SYSTEM, auto_create: bool = True):
        self.coordination = coordination
        self.config = config
        self.clock = clock
        self.auto_create = auto_create and config.auto_create_topics
        self._records: dict[str, tuple[float, TopicRecord | None]] = {}
        self._lock = threading.Lock()

    @property
    def auto_limit(self) -> int:
        """The most partitions a write makes a topic created on first use have (docs/protocol.md
        section 10.2): ``LLOG_MAX_AUTO_PARTITIONS``, or ``LLOG_DEFAULT_PARTITIONS`` if more."""
        return max(self.config.max_auto_partitions, self.config.default_partitions)

    def get(self, topic: str, fresh: bool = False) -> TopicRecord | None:
        """The topic's record (None: it has none), from the cache unless ``fresh`` or stale. An
        absence is never answered from the cache: a topic missing now is usually about to be
        created (by the first write, on the driver of a Spark query whose tasks asked first)."""
        now = time.monotonic()
        with self._lock:
            cached = self._records.get(topic)
        if cached is not None and cached[1] is not None and not fresh and now - cached[0] < CACHE_TTL_S:
            return cached[1]
        found = read_topic(self.coordination, self.config.root_prefix, topic)
        record = found.record if found is not None else None
        with self._lock:
            self._records[topic] = (now, record)
        return record

    def require(self, topic: str, create_partitions: int | None = None, fresh: bool = False,
                highest: int | None = None) -> TopicRecord:
        """The topic's record for a write: created if missing and allowed (docs/protocol.md section
        10.2). With ``create_partitions`` it is created explicitly with that count (the sink's
        ``partitions`` option); otherwise on first use, with ``LLOG_DEFAULT_PARTITIONS``
        partitions or ``highest + 1`` (the highest partition the write names), whichever is more.
        Raises :class:`TopicNotFound` when it has none and is not created,
        :class:`TopicBeingDeleted`, :class:`UnknownPartition` when ``highest`` is past
        ``LLOG_MAX_AUTO_PARTITIONS`` (nothing is created)."""
        record = self.get(topic, fresh)
        if record is None and self.auto_create:
            record = self._create(topic, create_partitions, highest)
        if record is not None and record.deleting:
            record = self.get(topic, fresh=True)  # the delete may be done
            if record is not None and record.deleting:
                raise TopicBeingDeleted(topic)
            if record is None and self.auto_create:
                record = self._create(topic, create_partitions, highest)
        if record is None:
            raise TopicNotFound(topic, "create it with `llog topics create`, or allow LLOG_AUTO_CREATE_TOPICS")
        return record

    def _create(self, topic: str, explicit: int | None, highest: int | None) -> TopicRecord:
        if explicit is not None:
            partitions = explicit
        else:
            partitions = max(self.config.default_partitions, (highest or 0) + 1)
            if partitions > self.auto_limit:
                raise UnknownPartition(topic, highest, 0, _over_limit(self.auto_limit))
        try:
            record = create_topic(self.coordination, self.config.root_prefix, topic, partitions, if_not_exists=True,
                                  clock=self.clock, auto_created=explicit is None)
        except TopicAlreadyExists:  # being deleted
            raise TopicBeingDeleted(topic) from None
        self._remember(topic, record)
        return record

    def _remember(self, topic: str, record: TopicRecord) -> None:
        with self._lock:
            self._records[topic] = (time.monotonic(), record)

    def check(self, topic: str, partition: int, fresh: bool = False) -> TopicRecord:
        """The record of a topic a write goes to, after checking the partition exists (one fresh
        read before :class:`UnknownPartition`: the count may have grown). A topic created on first
        use is created with, or grown to, enough partitions for ``partition`` (docs/protocol.md
        section 10.2); so a write naming several partitions of a topic checks its highest first."""
        record = self.require(topic, fresh=fresh, highest=partition)
        if partition >= record.partitions:
            record = self.require(topic, fresh=True, highest=partition)
            if partition >= record.partitions:
                if not (record.auto_created and self.auto_create):
                    raise UnknownPartition(topic, partition, record.partitions,
                                           None if record.auto_created else _EXPLICIT)
                record = grow_topic(self.coordination, self.config.root_prefix, topic, partition + 1,
                                    self.auto_limit, self.clock)
                self._remember(topic, record)
        return record

    def keys(self, topic: str, partition: int, fresh: bool = False) -> PartitionKeys:
        """The keys of ``topic[partition]`` in the topic's current incarnation, as the cached
        record names it (``fresh``: read again first). Raises :class:`TopicNotFound`. For a
        reader: nothing is created and the count is not checked (an absent partition reads as
        not initialized)."""
        record = self.get(topic, fresh)
        if record is None:
            raise TopicNotFound(topic)
        return _partition_keys(self.config.root_prefix, topic, partition, record.topic_id)

    def compression(self, topic: str) -> str:
        """The compression of new bodies of ``topic`` (its record's, else the config's)."""
        try:
            record = self.get(topic)
        except LlogError:
            record = None
        return TopicSettings.of(topic, record, self.config).compression_type

    def forget(self, topic: str) -> None:
        with self._lock:
            self._records.pop(topic, None)


@functools.lru_cache(maxsize=65536)
def _partition_keys(root: str, topic: str, partition: int, topic_id: str) -> PartitionKeys:
    """Made once per partition and incarnation: every read and append asks for them."""
    return PartitionKeys(root, TopicPartition(topic, partition), topic_id)
