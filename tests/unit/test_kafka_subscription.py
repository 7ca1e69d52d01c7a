"""OffsetDelete's check of the topics a group's members subscribe to (docs/kafka.md section 6):
the topics are read from each version of Kafka's ConsumerProtocolSubscription, as kafka-python
encodes it, and metadata that is not one reads as unknown (every topic, as Kafka takes it)."""

from __future__ import annotations

import pytest
from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription

from broker_lite.kafka.groups import _subscription_topics


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_every_version_of_a_consumer_subscription_names_its_topics(version):
    fields = dict(version=version, topics=["orders", "b.c"], user_data=b"x")
    if version >= 1:
        fields["owned_partitions"] = [ConsumerProtocolSubscription.TopicPartition(topic="orders", partitions=[0, 1])]
    assert _subscription_topics(ConsumerProtocolSubscription(**fields).encode()) == {"orders", "b.c"}


@pytest.mark.parametrize("metadata", [b"", b"m", b"\x00\x00\x00\x00\x00\x05\x00",
                                      b"\x00\x00\x00\x00\x00\x01\x00\x09abc"])
def test_metadata_that_is_not_a_subscription_reads_as_unknown(metadata):
    assert _subscription_topics(metadata) is None
