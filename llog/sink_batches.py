"""A sink batch's cut, pinned before any of it is committed (docs/protocol.md section 9.1).

A streaming sink's batch reaches the driver as staged slices: each task's rows, cut into bodies
by task, flush and partition. The sink's progress per partition says how many of the batch's
slices of that partition are committed, which identifies rows only if a replay of the batch is
cut the same way. Spark replays the same rows, not the same cut: other tasks (an llog source
re-plans its splits from an index compaction may have changed), another row order after a
shuffle, unkeyed rows placed by task id, flushes at other rows. So before the first slice of a
batch is committed, the driver pins the batch's slices in ``R/sinks/{sink_id}``; a replay of the
batch (the same ``batch_id``) commits the pinned slices, not its own, and its own blobs are left
to garbage collection. The progress then counts slices of one fixed cut, and every row of the
batch is committed exactly once whatever the replay's tasks did.

A pinned slice is a reference to its blob like a pending append's: the record is created only
while every slice is younger than ``G/2`` (checked immediately before the write), GC reads the
pinned records before anything else, and a replay that finds pinned slices older than ``G/2``
copies their bodies into a new blob and re-pins them first. The record of batch ``B`` is replaced
by batch ``B + 1``'s, which Spark starts only once ``B`` is committed: by then every slice of
``B`` is referenced by the index (or a pending append), so the references move forward, never
back.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace

from llog.clock import Clock
from llog.codec import EncodedBatch, pack_shared
from llog.config import Config
from llog.control import backoff, check_blob_age
from llog.coordination import EXPECTED_ABSENT, Coordination
from llog.errors import CorruptRecord, LlogError, MaxRetriesExceeded, VersionConflict
from llog.keys import shared_wal_object, validate_group
from llog.objects import ObjectStore
from llog.writer import StagedSlice

log = logging.getLogger(__name__)

#: The partition key of every pinned batch record: one shard holds them all.
SINKS_PARTITION_KEY = "sinks"


class SinkBatchOutOfOrder(LlogError):
    """A sink committed a batch older than the one it last pinned: not a replay Spark makes."""


def sink_batch_key(root: str, sink_id: str) -> str:
    """``R/sinks/{sink_id}``: the sink's pinned batch (a sink id follows the topic name rule)."""
    return f"{root}/sinks/{validate_group(sink_id)}"


def sink_keys_range(root: str) -> tuple[str, str]:
    """``[R/sinks/, R/sinks/~)``: every pinned batch record and no other key."""
    return f"{root}/sinks/", f"{root}/sinks/~"


@dataclass(frozen=True)
class PinnedBatch:
    """``R/sinks/{sink_id}``: the slices of the sink's last batch, in commit order."""

    sink_id: str
    batch_id: int
    slices: tuple[StagedSlice, ...]
    pinned_at_ms: int

    def to_json(self) -> bytes:
        return json.dumps({"sink_id": self.sink_id, "batch_id": self.batch_id, "pinned_at_ms": self.pinned_at_ms,
                           "slices": [s.__dict__ for s in self.slices]}, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes, key: str) -> "PinnedBatch":
        try:
            obj = json.loads(raw)
            return cls(str(obj["sink_id"]), int(obj["batch_id"]), tuple(StagedSlice(**s) for s in obj["slices"]),
                       int(obj["pinned_at_ms"]))
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptRecord(f"{key}: not a pinned sink batch: {e}") from None


def pinned_references(coordination: Coordination, root: str) -> set[str]:
    """The ``s3://`` URIs of every blob a pinned batch references (one range scan of one shard):
    what GC reads first."""
    start, end = sink_keys_range(root)
    return {s.wal_uri for v in coordination.range_scan(start, end, SINKS_PARTITION_KEY)
            for s in PinnedBatch.from_json(v.value, v.key).slices}


def pin_batch(coordination: Coordination, objects: ObjectStore, config: Config, sink_id: str, batch_id: int,
              slices: list[StagedSlice], clock: Clock) -> list[StagedSlice]:
    """The slices batch ``batch_id`` of ``sink_id`` commits: ``slices``, pinned now, or, when
    this is a replay of a batch pinned before, the pinned ones (whose bodies are copied into a new
    blob first if they are older than ``G/2``)."""
    key = sink_batch_key(config.root_prefix, sink_id)
    for attempt in range(config.cas_max_attempts):
        if attempt:
            backoff(attempt - 1)
        found = coordination.get(key, SINKS_PARTITION_KEY)
        current = PinnedBatch.from_json(found.value, found.key) if found is not None else None
        if current is not None and current.batch_id > batch_id:
            raise SinkBatchOutOfOrder(f"sink {sink_id} commits batch {batch_id}, but batch {current.batch_id} was "
                                      f"pinned before it: two queries share this sink id (checkpoint)?")
        if current is not None and current.batch_id == batch_id:
            if list(current.slices) != list(slices):
                log.info("sink %s: batch %d is a replay cut differently (%d slice(s), the first attempt had %d); "
                         "committing the first attempt's", sink_id, batch_id, len(slices), len(current.slices))
            chosen = current
            if not _stale(chosen.slices, config, clock):
                return list(chosen.slices)
            chosen = replace(chosen, slices=_refresh(objects, config, chosen.slices, clock))
        else:
            chosen = PinnedBatch(sink_id, batch_id, _refresh(objects, config, tuple(slices), clock), clock.now_ms())

        def young() -> None:  # immediately before every attempt of the write: a reference to each blob
            for s in chosen.slices:
                check_blob_age(f"pinning batch {batch_id} of sink {sink_id}", s.wal_uri, s.created_at_ms, config,
                               clock, "the batch is pinned again from new copies")

        try:
            coordination.put(key, chosen.to_json(), SINKS_PARTITION_KEY,
                             found.version_id if found is not None else EXPECTED_ABSENT, guard=young)
            return list(chosen.slices)
        except VersionConflict:
            continue  # another commit of this sink (or our own attempt, in transit) came first: look again
    raise MaxRetriesExceeded(f"pinning batch {batch_id} of sink {sink_id}", config.cas_max_attempts)


def _stale(slices, config: Config, clock: Clock) -> list[StagedSlice]:
    """The slices too old to be referenced anew: older than ``G/2`` with a margin for the write."""
    limit = clock.now_ms() - config.gc_grace_ms // 4
    return [s for s in slices if s.created_at_ms < limit]


def _refresh(objects: ObjectStore, config: Config, slices: tuple[StagedSlice, ...], clock: Clock
             ) -> tuple[StagedSlice, ...]:
    """``slices`` with every stale one's body copied into one new shared WAL blob."""
    stale = _stale(slices, config, clock)
    if not stale:
        return slices
    bodies = [(s.topic, s.partition, EncodedBatch((body,), len(body), s.msg_count, s.encoding))
              for s in stale for body in [objects.get(s.wal_uri, s.body_offset, s.body_length)]]
    created_at_ms = clock.now_ms()
    pieces, _, packed = pack_shared(bodies, created_at_ms)
    uri = objects.put(shared_wal_object(config.root_prefix), pieces)
    log.info("copied %d slice(s) older than a quarter of LLOG_GC_GRACE_MS into %s", len(stale), uri)
    copies = {id(s): StagedSlice(s.topic, s.partition, s.msg_count, p.body_offset, p.body_length, uri, created_at_ms,
                                 s.encoding) for s, p in zip(stale, packed)}
    return tuple(copies.get(id(s), s) for s in slices)
