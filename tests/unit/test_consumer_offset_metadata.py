"""The consumer record's optional metadata (docs/protocol.md section 9.3): records from before it
read as having none, none is never written as a field, and a string is kept as it is."""

from __future__ import annotations

import json

import pytest

from llog.errors import CorruptRecord
from llog.records import ConsumerOffset


def test_a_record_without_metadata_reads_as_none_and_none_is_not_written():
    assert ConsumerOffset.from_json(b'{"offset":7,"committed_at_ms":5}') == ConsumerOffset(7, 5, "")
    assert ConsumerOffset.from_json(b'{"offset":7,"committed_at_ms":5,"metadata":null}').metadata == ""
    assert json.loads(ConsumerOffset(7, 5).to_json()) == {"offset": 7, "committed_at_ms": 5}


def test_metadata_round_trips_and_must_be_a_string():
    record = ConsumerOffset(7, 5, "partition-time=1700000000000 ü")
    assert json.loads(record.to_json())["metadata"] == "partition-time=1700000000000 ü"
    assert ConsumerOffset.from_json(record.to_json()) == record
    with pytest.raises(CorruptRecord, match="metadata"):
        ConsumerOffset.from_json(b'{"offset":7,"committed_at_ms":5,"metadata":3}')
