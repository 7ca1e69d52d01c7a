"""Progress where a person waits: a rich bar on stderr while stderr is a terminal, nothing at all
otherwise.

Commands print their tables and JSON on stdout, and scripts pipe or parse that, so progress
never writes to stdout; and a log file or a pipe on stderr gets no escape sequences, since
without a terminal no progress is shown at all (no display is created). Usage::

    from llog_tools import progress

    with progress.task("streaming 3 micro-batches", total=3, unit="batches") as advance:
        for batch in batches:
            run(batch)
            advance()                          # one more done; advance(n) for n more
            advance.update(description=f"streaming: batch {batch} done")

    for partition in progress.track(partitions, "scanning", unit="partitions"):
        scan(partition)                        # a task over an iterable (total = len() if it has one)

A task with a ``total`` shows a bar and ``done/total unit``; with ``total=None`` (unknown) a
spinner and ``done unit``; both with the time elapsed. ``advance.completed`` is the count so
far, kept whether or not anything is shown; ``advance.update(description=..., total=...,
completed=...)`` changes the line. Tasks may nest and may run in several threads at once: they
share one display, a line each; a task's line is removed when it ends while others still run,
and the last one to end stays on screen, marked with a check mark (or a cross if its block
raised).

While a task shows, lines printed to ``sys.stderr`` are drawn above the bars; so are lines
printed to ``sys.stdout`` when stdout is the very same terminal as stderr (left alone, they
would be torn by the redraws). A stdout that is a pipe or a file is never touched: it gets
exactly what the program prints.

``LLOG_PROGRESS`` says when progress shows. Unset, empty or ``auto``: only while stderr is a
terminal (and ``TERM`` is not ``dumb``); ``0``, ``false``, ``no``, ``off``: never; ``1``,
``true``, ``yes``, ``on``: always, even into a pipe (tests, or a log kept with its escape
sequences). Any other value raises :class:`~llog.errors.ConfigError` naming the variable.

Library code (:mod:`llog.gc`, :mod:`llog.compactor`) takes a :data:`~llog.progress.TaskFactory`
argument that defaults to :func:`~llog.progress.silent` (same signature as :func:`task`, shows
nothing; both from :mod:`llog.progress`, the core's half of this module, and importable from here
too), and the command line passes :func:`task`: the library then neither imports rich nor
decides what a person sees. rich is imported only when a display is created.
"""

from __future__ import annotations

import io
import os
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from llog.errors import ConfigError
from llog.progress import Advance, TaskFactory, check_total, silent
from llog.progress import track as _track

__all__ = ["ENV", "Advance", "TaskFactory", "enabled", "silent", "task", "track"]

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

ENV = "LLOG_PROGRESS"
_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")
_AUTO = ("", "auto")

T = TypeVar("T")


def enabled(console: "Console | None" = None) -> bool:
    """Whether :func:`task` would show progress now (module doc: ``LLOG_PROGRESS``). With
    ``console``, "a terminal" means that console is one; else it means ``sys.stderr`` is."""
    value = os.environ.get(ENV, "").strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    if value not in _AUTO:
        raise ConfigError(f"{ENV}={os.environ[ENV]!r} must be one of auto, {', '.join(_ON)} (always) or "
                          f"{', '.join(_OFF)} (never)")
    if console is not None:
        return console.is_terminal
    return _isatty(sys.stderr) and os.environ.get("TERM", "") != "dumb"


@contextmanager
def task(description: str, total: int | None = None, *, unit: str = "",
         console: "Console | None" = None) -> Iterator[Advance]:
    """Show one line of progress while the block runs (module doc); yields an :class:`Advance`.

    ``total``: how many units of work there are, or None if unknown (a spinner instead of a
    bar). ``unit``: what is counted ("partitions", "blobs"), shown after the count.
    ``console``: where to draw (tests render into a string buffer); default stderr. A task
    started while another shows joins that display, whatever its ``console`` (nested tasks
    need not pass one)."""
    check_total(total)
    opened = _open_line(description, total, unit, console)
    if opened is None:
        yield Advance(description, total)
        return
    display, task_id = opened
    advance = _Shown(description, total, display, task_id)
    ended = "failed"
    try:
        yield advance
        ended = "ok"
    finally:
        advance._detach()
        _close_line(task_id, ended)


def track(items: Iterable[T], description: str, total: int | None = None, *, unit: str = "",
          console: "Console | None" = None, progress: TaskFactory | None = None) -> Iterator[T]:
    """Yield the items of ``items`` inside a :func:`task` (or ``progress``, a :data:`TaskFactory`),
    advancing it by one after each. ``total`` defaults to ``len(items)`` if it has a length."""
    return _track(items, description, total, unit=unit, progress=partial(progress or task, console=console))


# --- the shared display -------------------------------------------------------------------------


class _Shown(Advance):
    """An :class:`Advance` whose changes redraw its line on the display; once the task has ended
    (:meth:`_detach`), calls only count."""

    def __init__(self, description: str, total: int | None, display: "Progress", task_id: "TaskID"):
        super().__init__(description, total)
        self._display: "Progress | None" = display
        self._task_id = task_id

    def _changed(self, **fields: Any) -> None:
        if self._display is not None:
            self._display.update(self._task_id, **fields)

    def _detach(self) -> None:
        with self._lock:
            self._display = None


_lock = threading.Lock()
_display: "Progress | None" = None
_lines = 0
#: While a display draws on stderr: (name in sys, the proxy put there, the stream it replaced).
_redirected: list[tuple[str, "_LinesAbove", Any]] = []


def _open_line(description: str, total: int | None, unit: str, console: "Console | None"
               ) -> "tuple[Progress, TaskID] | None":
    """A line on the display showing now, else on a new one if progress is wanted (else None)."""
    global _display, _lines
    with _lock:
        if _display is None:
            if not enabled(console):
                return None
            display = _new_display(console)
            display.start()
            _display = display
            if console is None:  # drawing on this process's stderr: other lines go above the bars
                names = ["stderr"] + (["stdout"] if _same_terminal() else [])
                for name in names:
                    proxy = _LinesAbove(display.console, getattr(sys, name))
                    _redirected.append((name, proxy, getattr(sys, name)))
                    setattr(sys, name, proxy)
        _lines += 1
        task_id = _display.add_task(description, total=total, unit=unit)
        _display.refresh()  # drawn at once: a short task shows too, not only those the timer catches
        return _display, task_id


def _close_line(task_id: "TaskID", ended: str) -> None:
    """End one task's line (``ended``: "ok" or "failed"): removed while others run; the last
    one stays, marked, and the display stops."""
    global _display, _lines
    with _lock:
        display = _display
        if display is None:
            return
        _lines -= 1
        if _lines:
            display.refresh()  # its last count, once, before its line goes
            display.remove_task(task_id)
            return
        _display = None
        for name, proxy, original in reversed(_redirected):
            proxy.flush()
            if getattr(sys, name) is proxy:  # unless someone replaced it meanwhile
                setattr(sys, name, original)
        _redirected.clear()
        display.update(task_id, ended=ended)
        display.stop_task(task_id)
        display.stop()


def _new_display(console: "Console | None") -> "Progress":
    from rich.console import Console
    from rich.progress import BarColumn, Progress, ProgressColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
    from rich.text import Text

    class Spinner(SpinnerColumn):
        """A spinner while the task runs; a check mark once it ended, a cross if it failed."""

        def render(self, task):
            ended = task.fields.get("ended")
            if ended is not None:
                return Text("✓", style="green") if ended == "ok" else Text("✗", style="red")
            return super().render(task)

    class KnownBar(BarColumn):
        """A bar when the total is known; nothing when it is not (the spinner says it)."""

        def render(self, task):
            return super().render(task) if task.total is not None else Text("")

    class Count(ProgressColumn):
        """``done/total unit``, or ``done unit`` when the total is unknown (nothing for a plain
        spinner: no total, no unit, not advanced)."""

        def render(self, task):
            unit = task.fields.get("unit", "")
            if task.total is None and not unit and not task.completed:
                return Text("")
            done = f"{int(task.completed):,}" + (f"/{int(task.total):,}" if task.total is not None else "")
            return Text(f"{done} {unit}" if unit else done, style="progress.download")

    if console is None:  # the decision to show is made (enabled()): rich must not make it again
        console = Console(stderr=True, force_terminal=True)
    # Not rich's own redirection: it wraps long lines with newlines of its own (_LinesAbove).
    return Progress(
        Spinner(), TextColumn("{task.description}"), KnownBar(finished_style="green"), Count(), TimeElapsedColumn(),
        console=console, redirect_stdout=False, redirect_stderr=False, refresh_per_second=8,
    )


class _LinesAbove(io.TextIOBase):
    """Stands in for ``sys.stderr`` (and ``sys.stdout`` if it is the same terminal) while a
    display draws there: each whole line written is printed above the bars, as it was written
    (colours kept, no line breaks added: a long JSON line stays one line to copy)."""

    def __init__(self, console: "Console", file: Any):
        self._console = console
        self._file = file
        self._partial = ""
        self._lock = threading.Lock()

    @property
    def rich_proxied_file(self) -> Any:
        """What rich writes to when a console's file is this proxy (so it does not loop)."""
        return self._file

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)

    def write(self, text: str) -> int:
        with self._lock:
            *lines, self._partial = (self._partial + text).split("\n")
        if lines:
            self._print(lines)
        return len(text)

    def flush(self) -> None:
        with self._lock:
            rest, self._partial = self._partial, ""
        if rest:
            self._print([rest])

    def _print(self, lines: list[str]) -> None:
        from rich.text import Text

        self._console.print(Text("\n").join(Text.from_ansi(line) for line in lines), soft_wrap=True)

    def fileno(self) -> int:
        return self._file.fileno()

    def isatty(self) -> bool:
        return self._file.isatty()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:
        return self._file.encoding

    @property
    def errors(self) -> str | None:
        return getattr(self._file, "errors", None)


def _isatty(stream) -> bool:
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


def _same_terminal() -> bool:
    """Whether stdout and stderr are one terminal (then stdout's lines may go above the bars)."""
    try:
        return (_isatty(sys.stdout) and _isatty(sys.stderr)
                and os.path.samestat(os.fstat(sys.stdout.fileno()), os.fstat(sys.stderr.fileno())))
    except (AttributeError, ValueError, OSError):
        return False
