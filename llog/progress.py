"""How long library calls count their work, showing none of it.

Library code (:mod:`llog.gc`, :mod:`llog.compactor`) takes a :data:`TaskFactory` argument that
defaults to :func:`silent`, and counts into the :class:`Advance` it yields::

    def scan(partitions, progress: TaskFactory = silent):
        with progress("scanning", len(partitions), unit="partitions") as advance:
            for partition in partitions:
                ...
                advance()                      # one more done; advance(n) for n more

The command line passes :func:`llog_tools.progress.task` instead, which draws the count as a
bar: what a person sees is decided there, and the core neither imports rich nor draws.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, TypeVar

T = TypeVar("T")


class Advance:
    """What a :data:`TaskFactory` yields: call it to count work done (``advance()`` is one,
    ``advance(n)`` is ``n``). Thread-safe. ``completed`` is the count so far."""

    def __init__(self, description: str, total: int | None):
        self.description = description
        self.total = total
        self.completed = 0
        self._lock = threading.Lock()

    def __call__(self, amount: int = 1) -> None:
        if amount < 0:
            raise ValueError(f"progress only moves forward: advance({amount})")
        with self._lock:
            self.completed += amount
            self._changed(completed=self.completed)

    def update(self, *, description: str | None = None, total: int | None = None,
               completed: int | None = None) -> None:
        """Change the line: a new description, a total now known (or changed), or the count set
        outright (say from a counter kept elsewhere)."""
        check_total(total)
        if completed is not None and completed < 0:
            raise ValueError(f"completed must be >= 0, got {completed}")
        with self._lock:
            if description is not None:
                self.description = description
            if total is not None:
                self.total = total
            if completed is not None:
                self.completed = completed
            self._changed(description=self.description, total=self.total, completed=self.completed)

    def _changed(self, **fields: Any) -> None:
        """Called under the lock after each change, with the fields to show: a display redraws
        here (:mod:`llog_tools.progress`); counting alone shows nothing."""


#: The shape of :func:`silent` and of :func:`llog_tools.progress.task`, for library functions
#: that take either: ``(description, total=None, *, unit="", console=None)``, a context manager
#: yielding an :class:`Advance`.
TaskFactory = Callable[..., AbstractContextManager[Advance]]


@contextmanager
def silent(description: str, total: int | None = None, *, unit: str = "",
           console: Any = None) -> Iterator[Advance]:
    """A task that only counts: the default :data:`TaskFactory` of library code. ``total``: how
    many units of work there are, or None if unknown; ``unit`` and ``console`` are those of
    :func:`llog_tools.progress.task`, unused here."""
    check_total(total)
    yield Advance(description, total)


def track(items: Iterable[T], description: str, total: int | None = None, *, unit: str = "",
          progress: TaskFactory = silent) -> Iterator[T]:
    """Yield the items of ``items`` inside a task of ``progress``, advancing it by one after
    each. ``total`` defaults to ``len(items)`` if it has a length."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with progress(description, total, unit=unit) as advance:
        for item in items:
            yield item
            advance()


def check_total(total: int | None) -> None:
    """Raise ValueError unless ``total`` is an int >= 0 or None (unknown)."""
    if total is not None and (isinstance(total, bool) or not isinstance(total, int) or total < 0):
        raise ValueError(f"total must be an int >= 0 or None (unknown), got {total!r}")
