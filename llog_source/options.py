"""The options of ``spark.readStream.format("llog")`` and ``spark.read.format("llog")``.

Names and meanings follow Spark's Kafka source. Everything that can be checked without Oxia is
checked when the options are parsed, so a bad value fails ``load()`` with a message naming the
option; what needs Oxia (unknown topics and partitions, offsets past the end) fails when the
subscription is first resolved.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Union

from llog.config import Config
from llog.errors import ConfigError, InvalidGroupId, InvalidPartition, InvalidTopicName, LlogError
from llog.keys import TopicPartition, validate_group, validate_partition, validate_topic

#: -2 and -1 in a JSON offsets option mean earliest and latest (Kafka's convention).
EARLIEST, LATEST = -2, -1
#: Default upper bound of records one Spark task reads, so a busy partition is split.
DEFAULT_MAX_RECORDS_PER_PARTITION = 1_000_000

OffsetSpec = Union[str, dict[TopicPartition, int]]  # "earliest" | "latest" | per partition

_SUBSCRIBE = ("topics", "topicpattern", "assign")
_OWN = {
    "topics", "topicpattern", "assign", "startingoffsets", "endingoffsets", "maxoffsetspertrigger",
    "minpartitions", "maxrecordsperpartition", "failondataloss", "groupid", "includeheaders",
}
_KNOWN = ("topics, topicPattern, assign, startingOffsets, endingOffsets, maxOffsetsPerTrigger, minPartitions, "
          "maxRecordsPerPartition, failOnDataLoss, groupId, includeHeaders, and llog.* connection settings")


class InvalidSourceOption(LlogError, ValueError):
    """An option of the llog source is missing, unknown or malformed."""


@dataclass(frozen=True)
class Subscription:
    """What to read: named ``topics``, every topic matching ``pattern``, or ``assigned``
    partitions."""

    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: tuple[TopicPartition, ...] = ()

    def describe(self) -> str:
        if self.pattern is not None:
            return f"topicPattern {self.pattern!r}"
        if self.assigned:
            return f"assign {', '.join(map(str, self.assigned))}"
        return f"topics {', '.join(self.topics)}"

    def matches(self, topic: str) -> bool:
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        if self.assigned:
            return any(tp.topic == topic for tp in self.assigned)
        return topic in self.topics


@dataclass(frozen=True)
class SourceOptions:
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec
    max_offsets_per_trigger: int | None
    min_partitions: int | None
    max_records_per_partition: int
    fail_on_data_loss: bool
    group_id: str | None
    config: Config
    #: Kafka's option: the ``headers`` column is read (and in the schema) only when true.
    include_headers: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, str], streaming: bool | None = None) -> "SourceOptions":
        """Parse and check ``options``. ``streaming`` adds the checks of one kind of read
        (None: only the checks both share)."""
        lowered = {k.lower(): v for k, v in options.items()}
        unknown = sorted(k for k in options if k.lower() not in _OWN and not _is_connection_setting(k))
        if unknown:
            raise InvalidSourceOption(f"unknown option(s) {', '.join(unknown)} for format('llog'); known: {_KNOWN}")
        given = [k for k in _SUBSCRIBE if lowered.get(k) not in (None, "")]
        if len(given) != 1:
            names = {"topics": "topics", "topicpattern": "topicPattern", "assign": "assign"}
            raise InvalidSourceOption(
                "exactly one of the options topics, topicPattern, assign is required"
                + (f"; got {', '.join(names[k] for k in given)}" if given else ""))
        subscription = _parse_subscription(given[0], lowered[given[0]])
        default_start = "latest" if streaming else "earliest"
        starting = _parse_offsets("startingOffsets", lowered.get("startingoffsets"), default_start, subscription)
        ending = _parse_offsets("endingOffsets", lowered.get("endingoffsets"), "latest", subscription)
        if streaming and lowered.get("endingoffsets") not in (None, ""):
            raise InvalidSourceOption("endingOffsets is for batch reads (spark.read); a stream has no end")
        if streaming is False:
            if starting == "latest" or (isinstance(starting, dict) and LATEST in starting.values()):
                raise InvalidSourceOption("startingOffsets latest (-1) is not allowed in a batch read: it would read nothing")
            if ending == "earliest" or (isinstance(ending, dict) and EARLIEST in ending.values()):
                raise InvalidSourceOption("endingOffsets earliest (-2) is not allowed in a batch read: it would read nothing")
        group_id = lowered.get("groupid") or None
        if group_id is not None:
            try:
                validate_group(group_id)
            except InvalidGroupId as e:
                raise InvalidSourceOption(f"groupId: {e}") from None
        return cls(
            subscription=subscription,
            starting=starting,
            ending=ending,
            max_offsets_per_trigger=_positive_int("maxOffsetsPerTrigger", lowered.get("maxoffsetspertrigger")),
            min_partitions=_positive_int("minPartitions", lowered.get("minpartitions")),
            max_records_per_partition=_positive_int("maxRecordsPerPartition", lowered.get("maxrecordsperpartition"))
            or DEFAULT_MAX_RECORDS_PER_PARTITION,
            fail_on_data_loss=_bool("failOnDataLoss", lowered.get("failondataloss"), True),
            group_id=group_id,
            config=_connection(options),
            include_headers=_bool("includeHeaders", lowered.get("includeheaders"), False),
        )


def _connection(options: Mapping[str, str]) -> Config:
    try:
        return Config.load({k: v for k, v in options.items() if k.lower() not in _OWN}).require(
            "oxia_service_address", "s3_bucket")
    except ConfigError as e:
        raise InvalidSourceOption(str(e)) from None


def _is_connection_setting(key: str) -> bool:
    return key.lower().startswith(("llog.", "llog_"))


def _parse_subscription(kind: str, raw: str) -> Subscription:
    if kind == "topics":
        topics = [t.strip() for t in raw.split(",") if t.strip()]
        if not topics:
            raise InvalidSourceOption(f"topics {raw!r} names no topic")
        for t in topics:
            _topic("topics", t)
        return Subscription(topics=tuple(dict.fromkeys(topics)))
    if kind == "topicpattern":
        try:
            re.compile(raw)
        except re.error as e:
            raise InvalidSourceOption(f"topicPattern {raw!r} is not a valid regular expression: {e}") from None
        return Subscription(pattern=raw)
    parsed = _json_object("assign", raw, 'like {"orders": [0, 1]}')
    assigned = []
    for topic, partitions in parsed.items():
        _topic("assign", topic)
        if not isinstance(partitions, list) or not partitions:
            raise InvalidSourceOption(f"assign: topic {topic!r} needs a non-empty list of partitions, got {partitions!r}")
        for p in partitions:
            assigned.append(TopicPartition(topic, _partition("assign", topic, p)))
    return Subscription(assigned=tuple(sorted(set(assigned))))


def _parse_offsets(name: str, raw: str | None, default: str, subscription: Subscription) -> OffsetSpec:
    if raw in (None, ""):
        return default
    if raw.strip().lower() in ("earliest", "latest"):
        return raw.strip().lower()
    parsed = _json_object(name, raw, '"earliest", "latest" or JSON like {"orders": {"0": 17}}')
    out: dict[TopicPartition, int] = {}
    for topic, offsets in parsed.items():
        _topic(name, topic)
        if not subscription.matches(topic):
            raise InvalidSourceOption(f"{name} names topic {topic!r}, which is not in the subscription "
                                      f"({subscription.describe()})")
        if not isinstance(offsets, dict) or not offsets:
            raise InvalidSourceOption(f'{name}: topic {topic!r} needs an object of partition to offset, like {{"0": 17}}')
        for partition, offset in offsets.items():
            try:
                p = int(partition)
            except ValueError:
                raise InvalidSourceOption(f"{name}: partition {partition!r} of topic {topic!r} is not a number") from None
            tp = TopicPartition(topic, _partition(name, topic, p))
            if subscription.assigned and tp not in subscription.assigned:
                raise InvalidSourceOption(f"{name} names {tp}, which is not assigned ({subscription.describe()})")
            if not isinstance(offset, int) or isinstance(offset, bool) or (offset < 1 and offset not in (EARLIEST, LATEST)):
                raise InvalidSourceOption(f"{name}: offset {offset!r} of {tp} must be an offset >= 1 (the next "
                                          f"record to read), -2 (earliest) or -1 (latest)")
            out[tp] = offset
    return out


def _json_object(name: str, raw: str, example: str) -> dict:
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as e:
        raise InvalidSourceOption(f"{name} {raw!r} is not valid JSON ({e}); expected {example}") from None
    if not isinstance(parsed, dict) or not parsed:
        raise InvalidSourceOption(f"{name} {raw!r} must be a non-empty JSON object, {example}")
    return parsed


def _topic(name: str, topic: object) -> str:
    try:
        return validate_topic(topic)
    except InvalidTopicName as e:
        raise InvalidSourceOption(f"{name}: {e}") from None


def _partition(name: str, topic: str, partition: object) -> int:
    try:
        return validate_partition(partition)
    except InvalidPartition:
        raise InvalidSourceOption(f"{name}: partition {partition!r} of topic {topic!r} must be an int >= 0") from None


def _positive_int(name: str, raw: str | None) -> int | None:
    if raw in (None, ""):
        return None
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise InvalidSourceOption(f"{name} must be a positive integer, got {raw!r}") from None
    if value < 1:
        raise InvalidSourceOption(f"{name} must be a positive integer, got {value}")
    return value


def _bool(name: str, raw: str | None, default: bool) -> bool:
    if raw in (None, ""):
        return default
    if str(raw).strip().lower() in ("true", "false"):
        return str(raw).strip().lower() == "true"
    raise InvalidSourceOption(f"{name} must be true or false, got {raw!r}")
