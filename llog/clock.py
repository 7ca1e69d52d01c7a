"""The clock every time check reads (docs/protocol.md sections 4.3, 4.4, 6.1, 6.3, 8, 9).

Each component that checks a time (a writer's blob age before a reserving CAS, a
materializer's budget ``D`` before an index create, the compactor's lag ``G`` and its blob age,
GC's grace period) holds a :class:`Clock` and reads it here, never ``time`` directly, so a test
can make time pass for one actor and not for another: the protocol's timing rules are about
what each actor sees when it checks.

:data:`SYSTEM` is the real clock; :class:`ShiftedClock` is the real clock plus an offset that a
test moves forward (wall and monotonic time together, as a real pause would).
"""

from __future__ import annotations

import time


class Clock:
    """Wall time for ages (ms since the epoch, comparable across processes) and monotonic
    time for budgets (seconds, this process only)."""

    def now_ms(self) -> int:
        return int(time.time() * 1000)

    def monotonic(self) -> float:
        return time.monotonic()


class ShiftedClock(Clock):
    """The system clock moved ``offset_s`` seconds ahead; :meth:`advance` moves it further."""

    def __init__(self, offset_s: float = 0.0):
        self.offset_s = offset_s

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock only moves forward, got {seconds}")
        self.offset_s += seconds

    def now_ms(self) -> int:
        return int((time.time() + self.offset_s) * 1000)

    def monotonic(self) -> float:
        return time.monotonic() + self.offset_s


#: The real clock, the default of every component.
SYSTEM = Clock()
