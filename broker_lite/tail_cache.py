"""The tail cache: records this broker produced recently, kept in memory so a consumer reading
near the end of a partition is answered without Oxia or S3.

A record enters only after its commit (so the cache never holds anything a reader of Oxia and
S3 could not see), as a *run*: a produce request's consecutive offsets in one partition. A
lookup at an offset inside a run returns records from there, on through the runs that follow it
without a gap (another writer's offsets in between are not here: the lookup stops at the gap and
the consumer's next fetch misses and goes to the reader). Offsets are immutable, so a cached
record is never stale; only the high watermark a hit reports can be behind one that another
writer moved.

Bounded by ``LLOG_TAIL_CACHE_MAX_BYTES`` (record bytes plus a per-record overhead); the oldest
runs are evicted first. ``0`` turns the cache off. Used from the event loop only: no locks.
"""

from __future__ import annotations

import bisect
import collections
import itertools
from dataclasses import dataclass, field

from llog.keys import TopicPartition

#: Bytes a cached record costs beyond its value (a bytes object and its list slot, about).
RECORD_OVERHEAD = 64


@dataclass
class _Run:
    first: int
    values: list[bytes]
    created_at_ms: int
    #: ``ends[i]``: bytes of values ``0..i``.
    ends: list[int] = field(default_factory=list)

    @property
    def last(self) -> int:
        return self.first + len(self.values) - 1

    @property
    def cost(self) -> int:
        return (self.ends[-1] if self.ends else 0) + RECORD_OVERHEAD * len(self.values)


@dataclass(frozen=True)
class CacheHit:
    """Records ``first..first + len(values) - 1``; ``tail``: the last offset this broker knows
    was committed in the partition."""

    first: int
    values: list[bytes]
    tail: int

    @property
    def nbytes(self) -> int:
        return sum(map(len, self.values))


class TailCache:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = self.misses = self.evictions = 0
        self._runs: dict[TopicPartition, list[_Run]] = {}
        self._firsts: dict[TopicPartition, list[int]] = {}
        self._age: collections.deque[tuple[TopicPartition, _Run]] = collections.deque()

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def add(self, tp: TopicPartition, first: int, values: list[bytes], created_at_ms: int = 0) -> None:
        """Records committed at offsets ``first..``; a run larger than the whole cache is not kept."""
        if not self.enabled or not values:
            return
        run = _Run(first, values, created_at_ms, list(itertools.accumulate(map(len, values))))
        if run.cost > self.max_bytes:
            return
        runs, firsts = self._runs.setdefault(tp, []), self._firsts.setdefault(tp, [])
        at = bisect.bisect_left(firsts, first)
        if at < len(firsts) and firsts[at] == first:
            return  # already here (the same commit answered twice cannot happen; be safe)
        runs.insert(at, run)
        firsts.insert(at, first)
        self._age.append((tp, run))
        self.bytes += run.cost
        while self.bytes > self.max_bytes:
            self._evict()

    def _evict(self) -> None:
        tp, run = self._age.popleft()
        runs, firsts = self._runs[tp], self._firsts[tp]
        at = 0 if runs[0] is run else next(i for i, r in enumerate(runs) if r is run)
        del runs[at], firsts[at]
        if not runs:
            del self._runs[tp], self._firsts[tp]
        self.bytes -= run.cost
        self.evictions += 1

    def tail(self, tp: TopicPartition) -> int | None:
        """The last offset cached for ``tp`` (None if none)."""
        runs = self._runs.get(tp)
        return runs[-1].last if runs else None

    def get(self, tp: TopicPartition, offset: int, max_bytes: int) -> CacheHit | None:
        """Records from ``offset`` while they are cached without a gap, about ``max_bytes`` of
        them (the first always); None when ``offset`` is not cached (a miss)."""
        firsts = self._firsts.get(tp)
        at = bisect.bisect_right(firsts, offset) - 1 if firsts else -1
        runs = self._runs.get(tp)
        if at < 0 or runs[at].last < offset:
            self.misses += 1
            return None
        self.hits += 1
        out: list[bytes] = []
        budget, position = max_bytes, offset
        while True:
            run = runs[at]
            skip = position - run.first
            base = run.ends[skip - 1] if skip else 0
            take = bisect.bisect_right(run.ends, base + budget, lo=skip) - skip
            if not out and take == 0:
                take = 1
            out += run.values[skip:skip + take]
            position += take
            if skip + take < len(run.values):
                break  # the budget ended inside this run
            budget -= run.ends[-1] - base
            at += 1
            if budget <= 0 or at == len(runs) or runs[at].first != position:
                break
        return CacheHit(offset, out, runs[-1].last)
