"""The Kafka listeners' registry keys (docs/protocol.md sections 2 and 9.5): the range scan of
``[R/kafka/listeners/, R/kafka/listeners/~)`` holds every listener and no other key, whatever
the topics and groups are called."""

from __future__ import annotations

import uuid

import pytest

from llog.coordination import oxia_key_order
from llog.errors import InvalidGroupId
from llog.keys import (
    kafka_group_key, kafka_groups_range, kafka_listener_key, kafka_listeners_range, partition_keys, topic_key,
)

ROOT = "llog"


def _inside(key: str) -> bool:
    start, end = kafka_listeners_range(ROOT)
    return oxia_key_order(start) <= oxia_key_order(key) < oxia_key_order(end)


def test_the_listeners_range_holds_every_listener_and_no_other_key():
    assert all(_inside(kafka_listener_key(ROOT, n)) for n in (0, 1, 9, 10, 2 ** 31 - 1))
    others = [kafka_group_key(ROOT, g) for g in ("kafka", "listeners", "g", "_")]
    for topic in ("kafka", "listeners", "groups", "topics"):
        keys = partition_keys(ROOT, topic, 0, str(uuid.uuid4()))
        others += [topic_key(ROOT, topic), keys.control, keys.index(42), keys.consumer_group("listeners")]
    assert [k for k in others if _inside(k)] == []


def test_a_group_claim_names_a_valid_group():
    with pytest.raises(InvalidGroupId):
        kafka_group_key(ROOT, "a/b")


def test_the_groups_range_holds_every_claim_and_no_other_key():
    """ListGroups reads the claims with one range scan (docs/kafka.md section 6)."""
    start, end = kafka_groups_range(ROOT)

    def inside(key: str) -> bool:
        return oxia_key_order(start) <= oxia_key_order(key) < oxia_key_order(end)

    assert all(inside(kafka_group_key(ROOT, g)) for g in ("g", "_", "-", "groups", "listeners", "z" * 249))
    others = [kafka_listener_key(ROOT, n) for n in (0, 7)]
    for topic in ("kafka", "listeners", "groups", "topics"):
        keys = partition_keys(ROOT, topic, 0, str(uuid.uuid4()))
        others += [topic_key(ROOT, topic), keys.control, keys.index(42), keys.consumer_group("groups")]
    assert [k for k in others if inside(k)] == []
