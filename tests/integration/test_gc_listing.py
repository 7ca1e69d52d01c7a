"""What GC lists as candidates (docs/protocol.md section 9.2, step 4): the shared WAL blobs and
sink cuts are the direct children of ``R/wal-shared/`` and ``R/sink-cuts/``; a topic may carry
either name, and its compacted blobs (``R/{topic}/{topic_id}/partitions/...``) then lie under the
same prefix, deeper. They are candidates only for a pass that scanned their partition."""

from __future__ import annotations

import uuid
from contextlib import closing
from datetime import datetime, timedelta, timezone

import pytest

from llog.gc import collect_garbage
from llog.keys import partition_keys, shared_wal_object
from llog.objects import ObjectStore


@pytest.mark.parametrize("topic", ["wal-shared", "sink-cuts"])
def test_a_topic_named_like_a_blob_prefix_keeps_its_compacted_blobs_when_not_scanned(config, topic):
    with closing(ObjectStore(config)) as objects:
        keys = partition_keys(config.root_prefix, topic, 0, str(uuid.uuid4()))
        compacted = objects.put(keys.compacted_object(), b"the only copy of a compacted run")
        orphan = objects.put(shared_wal_object(config.root_prefix), b"an unreferenced WAL blob")
        later = datetime.now(timezone.utc) + timedelta(milliseconds=2 * config.gc_grace_ms)
        # A compaction job that compacted other topics: this partition was not scanned.
        report = collect_garbage(objects, config.root_prefix, set(), config.gc_grace_ms, now=later, partitions=())
        assert orphan in report.deleted_uris  # the pass did collect
        assert compacted not in report.deleted_uris
        assert objects.get(compacted) == b"the only copy of a compacted run"
