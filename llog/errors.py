"""Every error llog raises, in one place.

Each class names one thing that went wrong and carries the numbers a caller needs to act on it
(the topic-partition, the offsets, the key). All derive from :class:`LlogError`, so a caller can
catch the family or one member.
"""

from __future__ import annotations


class LlogError(Exception):
    """Base class of every llog error."""


# --- configuration and input -----------------------------------------------------------------


class ConfigError(LlogError):
    """A setting is missing or malformed."""


class GraceMismatch(ConfigError):
    """This process's ``LLOG_GC_GRACE_MS`` differs from the one its root prefix was set up with."""


class ClockSkew(ConfigError):
    """This machine's clock is too far from the S3 server's for the protocol's timing rules."""


class GraceBelowG(ConfigError, ValueError):
    """GC was given a grace period shorter than the ``G`` (``LLOG_GC_GRACE_MS``) its config
    passed the deployment gate with (docs/protocol.md section 9.2, step 4)."""


class RootPrefixMismatch(ConfigError, ValueError):
    """GC was given a root prefix other than its config's, the one the deployment gate checked
    (docs/protocol.md section 9.2, step 4)."""


class InvalidTopicName(LlogError, ValueError):
    """A topic name breaks Kafka's rule (docs/protocol.md section 1)."""

    def __init__(self, topic: object, reason: str):
        self.topic = topic
        super().__init__(f"invalid topic name {topic!r}: {reason}")


class InvalidGroupId(LlogError, ValueError):
    """A consumer group id breaks the topic name rule (it becomes one Oxia key segment)."""

    def __init__(self, group: object, reason: str):
        self.group = group
        super().__init__(f"invalid consumer group id {group!r}: {reason}")


class InvalidPartition(LlogError, ValueError):
    """A partition number is not an int >= 0."""

    def __init__(self, partition: object):
        self.partition = partition
        super().__init__(f"invalid partition {partition!r}: must be an int >= 0")


class InvalidPayload(LlogError, TypeError):
    """A record value is not bytes (or is null)."""


class EmptyAppend(LlogError, ValueError):
    """An append carried no groups, or a group carried no records."""


class InvalidOffset(LlogError, ValueError):
    """An offset argument is not an int >= 1, or a range is reversed."""


# --- log state --------------------------------------------------------------------------------


class PartitionNotInitialized(LlogError):
    """``meta/control`` does not exist for this topic-partition (docs/protocol.md section 5.1)."""

    def __init__(self, topic: str, partition: int):
        self.topic, self.partition = topic, partition
        super().__init__(
            f"{topic}[{partition}] is not initialized: no meta/control record "
            "(its topic does not exist or was deleted: `llog topics create`, or write to it with auto-creation on)"
        )


class OffsetOutOfRange(LlogError):
    """An offset lies outside ``[log_start_offset, high_watermark]``: past the end, or below the
    log start offset (removed by retention, docs/protocol.md section 10.3; ``below_start``)."""

    def __init__(self, topic: str, partition: int, offset: int, high_watermark: int, log_start_offset: int = 1):
        self.topic, self.partition = topic, partition
        self.offset, self.high_watermark, self.log_start_offset = offset, high_watermark, log_start_offset
        if high_watermark < log_start_offset:
            readable = (f"the partition holds no records (the next offset written is {high_watermark + 1})"
                        if log_start_offset > 1 else "readable offsets are 1..0 (the partition is empty)")
        else:
            readable = f"readable offsets are {log_start_offset}..{high_watermark}"
        if self.below_start:
            detail = f"offsets 1..{log_start_offset - 1} were removed by retention; {readable}"
        else:
            detail = readable
        super().__init__(f"offset {offset} of {topic}[{partition}] is out of range: {detail}")

    @property
    def below_start(self) -> bool:
        return self.offset < self.log_start_offset


class TopicNotFound(LlogError):
    """A topic has no topic record (docs/protocol.md section 10), and it was not created automatically."""

    def __init__(self, topic: str, why: str = ""):
        self.topic = topic
        super().__init__(f"topic {topic!r} does not exist" + (f": {why}" if why else ""))


class TopicDeleted(TopicNotFound):
    """A partition's ``meta/control`` is a tombstone: the incarnation of the topic it belongs to
    (its ``topic_id``) was deleted (docs/protocol.md section 12). A later topic of the same name, if
    any, is another incarnation with keys of its own."""

    def __init__(self, topic: str, partition: int, topic_id: str):
        self.partition, self.topic_id = partition, topic_id
        super().__init__(topic, f"partition {partition} of incarnation {topic_id} was deleted")


class TopicAlreadyExists(LlogError):
    """``create`` of a topic whose record exists (maybe still being deleted)."""

    def __init__(self, topic: str, why: str = ""):
        self.topic = topic
        super().__init__(f"topic {topic!r} already exists" + (f" ({why})" if why else ""))


class TopicBeingDeleted(LlogError):
    """The topic's record is DELETING: nothing is written to it or changed in it any more."""

    def __init__(self, topic: str):
        self.topic = topic
        super().__init__(f"topic {topic!r} is being deleted: writes and changes are refused (run `llog topics "
                         f"delete {topic}` again to finish an interrupted delete)")


class TopicRecreated(LlogError):
    """The topic was deleted and created again while a read (or a broker's fetch) of it ran: what
    it would read next belongs to another incarnation (docs/protocol.md section 12.3)."""


class UnknownPartition(LlogError, ValueError):
    """A partition at or past the topic's partition count."""

    def __init__(self, topic: str, partition: int, partitions: int, why: str | None = None):
        self.topic, self.partition, self.partitions = topic, partition, partitions
        has = f"has {partitions} partition(s), 0..{partitions - 1}" if partitions else "does not exist yet"
        super().__init__(f"{topic}[{partition}] does not exist: topic {topic!r} {has}" + (f"; {why}" if why else "")
                         + (f" (add partitions with `llog topics alter {topic} --partitions N`)" if partitions else ""))


class PartitionCountMismatch(LlogError, ValueError):
    """A writer's partition count disagrees with the topic's (the Spark sink's ``partitions``)."""


class InvalidTopicConfig(LlogError, ValueError):
    """A topic setting is unknown or its value is not allowed (docs/protocol.md section 10.1)."""


class LogFenced(LlogError):
    """The partition is FENCED; appends are rejected (docs/protocol.md section 7)."""

    def __init__(self, topic: str, partition: int):
        self.topic, self.partition = topic, partition
        super().__init__(f"{topic}[{partition}] is FENCED: appends are rejected until it is unfenced")


class InconsistentReadState(LlogError):
    """The sparse index has a gap or an entry that contradicts its neighbours (section 5.5)."""


class MaxRetriesExceeded(LlogError):
    """A CAS loop or a transient-error retry gave up."""

    def __init__(self, what: str, attempts: int, last_error: BaseException | None = None):
        self.what, self.attempts, self.last_error = what, attempts, last_error
        detail = f": last error {type(last_error).__name__}: {last_error}" if last_error else ""
        super().__init__(f"{what} gave up after {attempts} attempts{detail}")


class AppendFailed(LlogError):
    """Some partitions of a shared append committed and others failed. ``results`` holds the
    committed ones, ``errors`` maps each failed ``(topic, partition)`` to its exception."""

    def __init__(self, results: list, errors: dict):
        self.results, self.errors = results, errors
        failed = "; ".join(f"{t}[{p}]: {e}" for (t, p), e in errors.items())
        super().__init__(f"append failed on {len(errors)} partition(s) ({failed}); "
                         f"{len(results)} group(s) were committed and stay committed")


class StaleBlob(LlogError):
    """A staged blob is older than half the GC grace period, so committing a reference to it
    could race garbage collection (docs/protocol.md section 9). Upload the records again (a Spark
    query does so when it re-runs the batch)."""


class SinkBatchMismatch(LlogError):
    """A sink commit names a (sink id, batch id) pinned before with other rows: it is not a
    replay of that commit but another write (docs/protocol.md section 9.1); nothing of it is
    committed."""


class SinkBatchNotPinned(LlogError):
    """An operator named a sink batch that is not the one pinned (no pin, or the sink pinned
    another batch since): nothing is changed (docs/protocol.md section 9.1)."""


class SinkPinChanged(LlogError):
    """A sink's pinned record changed between an operator's read of it and the CAS that would
    have changed it: nothing is changed; look at it again (docs/protocol.md section 9.1)."""


class SinkWriteInFlight(LlogError):
    """A foreachBatch write started while another write of the same label in the same micro-batch
    was still running: both would get one sink id (docs/protocol.md section 9.1); nothing written."""


class SinkBatchNotCommitted(LlogError):
    """An operator asked to remove a sink's pin whose cut is not wholly committed: a replay of
    its batch still needs it, so it is kept (docs/protocol.md section 9.1)."""


class SinkFinishUnsafe(LlogError):
    """An operator asked to finish a pin whose commit could write rows wrongly: a partition of
    its cut holds no progress of the batch past the progress retention (committed then evicted
    cannot be told from never committed), or a topic of its cut was created after the pin (if
    deleted and created again, its rows belonged to the deleted topic). Nothing is marked
    (docs/protocol.md section 9.1)."""


class SinkProgressFull(LlogError):
    """A partition's ``meta/control.sinks`` holds its most entries, all of sinks that committed
    within the progress retention: a new sink's first commit there is refused, nothing written
    (docs/protocol.md section 9.1); dropping a live sink's entry would make its replay write twice."""


class AppendOutcomeUnknown(LlogError):
    """A reserving CAS failed in transit and it cannot be told whether it landed: the answer "in
    doubt" of docs/protocol.md section 4.6 (every other error of an append means nothing of it was
    reserved on that partition).

    Raised only when the reservation is neither visible as ``pending`` nor as the index entry it
    would have produced. The caller may retry (at-least-once) or stop.
    """


# --- storage and encoding ---------------------------------------------------------------------


class CorruptBatch(LlogError):
    """A bytes-batch-v1 body or LLS1 blob failed validation (docs/protocol.md section 3)."""


class CorruptRecord(LlogError):
    """An Oxia value is not the JSON record its key promises (docs/protocol.md section 2)."""


class ValueTooLarge(LlogError, ValueError):
    """An Oxia value over the value-size budget (docs/protocol.md section 2), refused before it
    is sent."""


class StorageError(LlogError):
    """Object storage failed after bounded retries, or an object is missing."""


class ObjectNotFound(StorageError):
    """An object an index entry or pending append names does not exist (any more)."""


class CoordinationError(LlogError):
    """Oxia failed after bounded retries or did not answer before the deadline."""


class VersionConflict(LlogError):
    """A conditional Oxia write found another version than the one expected."""

    def __init__(self, key: str, expected_version: int | None, outcome_unknown: bool = False):
        self.key, self.expected_version = key, expected_version
        # True when an earlier attempt of the same write failed in transit: the write may have
        # landed, and the conflict may be with ourselves.
        self.outcome_unknown = outcome_unknown
        super().__init__(f"version conflict on {key} (expected version {expected_version})")


class ClaimHeld(LlogError):
    """An ephemeral claim already exists (docs/protocol.md section 6, claims)."""


# --- outcomes and idempotent produce ------------------------------------------------------------


class WriteOutcomeUnknown(CoordinationError):
    """A put was sent and its reply was lost (the RPC failed in transit, or failed for good after
    an attempt went out): it may or may not have landed. One key's outcome in what
    :meth:`llog.coordination.Coordination.put_many` reports."""

    def __init__(self, key: str, cause: BaseException):
        self.key, self.cause = key, cause
        super().__init__(f"oxia put {key}: the outcome is unknown (an attempt was sent and its reply lost: "
                         f"{type(cause).__name__}: {cause})")


class GroupsFailed(AppendFailed):
    """An :class:`AppendFailed` that gives each group its own outcome: ``outcomes[i]`` is group
    ``i``'s result or its error. Groups of one partition may differ here (an idempotent produce
    refuses a producer's group and commits the others' groups of the same partition)."""

    def __init__(self, results: list, errors: dict, outcomes: list):
        self.outcomes = outcomes
        super().__init__(results, errors)


class OutOfOrderSequence(LlogError):
    """An idempotent produce's sequence is not the one the partition expects from its producer
    (Kafka's ``OutOfOrderSequenceException``): past it (a gap), inside the last batch without
    being it, or behind it further than the partition knows it wrote (docs/protocol.md section
    9.4; sequences wrap at ``2^31``). Nothing of that group was written."""

    def __init__(self, topic: str, partition: int, producer_id: str, sequence: int, expected: int):
        self.topic, self.partition, self.producer_id = topic, partition, producer_id
        self.sequence, self.expected = sequence, expected
        super().__init__(f"{topic}[{partition}]: producer {producer_id!r} sent sequence {sequence}, the partition "
                         f"expects {expected}; nothing of this group was written")


class DuplicateSequence(LlogError):
    """An idempotent produce's batch is older than the producer's last batch on the partition and
    lies in the run of its batches the partition knows it wrote (Kafka's
    ``DuplicateSequenceException``, docs/protocol.md section 9.4): written before; its offsets are
    no longer kept (only the last batch's are). Nothing of that group was written again."""

    def __init__(self, topic: str, partition: int, producer_id: str, sequence: int, last: int):
        self.topic, self.partition, self.producer_id = topic, partition, producer_id
        self.sequence, self.last = sequence, last
        super().__init__(f"{topic}[{partition}]: producer {producer_id!r} sent sequence {sequence}, older than its "
                         f"last batch (sequence {last}); it was written before and is not written again")
