"""Everything stored under a root prefix, to show that an actor wrote nothing: every Oxia key with
its version, every S3 object with its size and time."""

from __future__ import annotations

from dataclasses import dataclass

from llog.coordination import Coordination
from llog.objects import ObjectStore

#: Keys are at most this many segments below the root prefix (``R/{topic}/{topic_id}/partitions/
#: {p}/consumers/{group}`` is 6); scanned deeper to be sure.
MAX_KEY_DEPTH = 10
#: Partition keys tried to reach each Oxia shard (a key's shard is a hash of its partition key).
_PROBES = 256


@dataclass(frozen=True)
class Stored:
    """Oxia keys (key -> version id) and S3 objects (key -> (size, last modified))."""

    oxia: dict[str, int]
    s3: dict[str, tuple]

    def __str__(self) -> str:
        return f"{len(self.oxia)} Oxia key(s), {len(self.s3)} S3 object(s)"


def stored(coordination: Coordination, objects: ObjectStore, root: str) -> Stored:
    """Every Oxia key under ``root`` on every shard, and every S3 object under ``root/``. Oxia
    orders keys segment by segment (:func:`llog.coordination.oxia_key_order`), so every key ``d``
    segments below the root lies in ``[R + "/" * d, R + "/~" * d)`` (segments are ASCII, below
    ``~``): one scan per depth and shard, their union is every key."""
    by_shard: dict[int, str] = {}
    for n in range(_PROBES):
        by_shard.setdefault(coordination._shard(f"probe-{n}", f"probe-{n}"), f"probe-{n}")
    oxia = {}
    for probe in by_shard.values():
        for depth in range(1, MAX_KEY_DEPTH + 1):
            start = root + "/" * depth
            end = root + "/~" * depth
            oxia.update((v.key, v.version_id) for v in coordination.range_scan(start, end, probe))
    s3 = {o.key: (o.size, o.last_modified) for o in objects.list(f"{root}/")}
    return Stored(oxia, s3)
