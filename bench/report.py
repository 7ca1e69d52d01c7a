"""JSON lines on stdout: one per measurement, a summary per case."""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def timed(fn: Callable[[], object], rounds: int, warmup: int = 1) -> list[float]:
    """Seconds per call of ``fn`` over ``rounds`` calls, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def timed_together(fns: dict[str, Callable[[], object]], rounds: int, warmup: int = 1) -> dict[str, list[float]]:
    """Like :func:`timed` for several cases, their calls taken in turn (a, b, a, b, ...), so a
    machine that speeds up or slows down during the run moves every case alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    out: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            out[name].append(time.perf_counter() - start)
    return out


def mb_s(nbytes: int, seconds: list[float]) -> float:
    """Throughput at the median call time (robust to one slow round on a shared machine)."""
    return nbytes / statistics.median(seconds) / 1e6


def progress(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)
