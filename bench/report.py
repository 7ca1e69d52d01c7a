"""JSON lines on stdout: one per measurement, a summary per case; and what every case uses
(timing, sizes from the environment, random record values)."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa


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


def env_int(name: str, default: int, minimum: int = 1) -> int:
    """A size from the environment variable ``name`` (a quick run shrinks a case), at least
    ``minimum``."""
    value = int(os.environ.get(name, default))
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def random_values(rows: int, size: int, seed: int) -> pa.BinaryArray:
    """``rows`` random ``size``-byte values as an Arrow binary array (what the Spark sink hands
    over), built without a per-record loop."""
    data = np.random.default_rng(seed).integers(0, 256, size * rows, dtype=np.uint8)
    offsets = np.arange(0, size * (rows + 1), size, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), rows, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
