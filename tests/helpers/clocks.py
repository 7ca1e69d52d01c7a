"""Clocks for tests (:mod:`llog.clock`)."""

from __future__ import annotations

from llog.clock import ShiftedClock

#: How far ahead :func:`past_the_lag` runs: far beyond any test's grace period ``G``.
LAG_OFFSET_S = 3600.0


def past_the_lag() -> ShiftedClock:
    """A compactor's clock an hour ahead, so entries written just now are older than the
    compaction lag ``G`` (docs/protocol.md section 6.1) and get compacted at once. Its own age
    checks (of the blob it writes) read the same clock, so they are unaffected."""
    return ShiftedClock(LAG_OFFSET_S)
