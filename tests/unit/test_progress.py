"""llog_tools.progress: nothing at all unless stderr is a terminal (or LLOG_PROGRESS forces it), a bar
or a spinner with counts when it shows, and never a byte on stdout. No servers."""

from __future__ import annotations

import io
import os
import pty
import re
import select
import sys
import threading

import pytest
from rich.console import Console

from llog.errors import ConfigError
from llog_tools import progress

ESC = "\x1b["


@pytest.fixture(autouse=True)
def auto_env(monkeypatch):
    """Each test starts in auto mode on an ordinary terminal type."""
    monkeypatch.delenv(progress.ENV, raising=False)
    monkeypatch.setenv("TERM", "xterm")


def terminal() -> tuple[Console, io.StringIO]:
    """A console that takes itself for a terminal, drawing into a string."""
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=True, width=120), buffer


def last_frame(drawn: str) -> str:
    """The display's last frame (what follows the last erase-line sequence), as plain text."""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", drawn.rsplit(f"{ESC}2K", 1)[-1])


def read_until(fd: int, end: str) -> str:
    """What the pseudo-terminal shows up to ``end``, written last (a read returns one chunk of
    what is there, and the kernel passes it on asynchronously)."""
    drawn = b""
    while end.encode() not in drawn:
        if not select.select([fd], [], [], 30)[0]:
            raise AssertionError(f"{end!r} did not reach the terminal; it showed {drawn!r}")
        drawn += os.read(fd, 65536)
    return drawn.decode()


def test_off_when_stderr_is_not_a_terminal(capsys):
    assert not progress.enabled()  # pytest captures stderr: not a terminal
    with progress.task("copying files", total=3, unit="files") as advance:
        advance()
        advance(2)
    assert advance.completed == 3
    assert list(progress.track(["a", "b"], "tracking")) == ["a", "b"]
    assert capsys.readouterr() == ("", "")


def test_off_when_the_env_says_so_even_on_a_terminal(monkeypatch, capsys):
    monkeypatch.setenv(progress.ENV, "0")
    console, drawn = terminal()
    with progress.task("copying files", total=3, console=console) as advance:
        advance(3)
    assert drawn.getvalue() == ""
    assert capsys.readouterr() == ("", "")


def test_a_terminal_shows_a_bar_with_description_and_counts(capsys):
    console, drawn = terminal()
    with progress.task("uploading blobs", total=4, unit="blobs", console=console) as advance:
        advance(3)
    frame = last_frame(drawn.getvalue())
    assert "uploading blobs" in frame and "3/4 blobs" in frame and "━" in frame
    assert "✓" in frame  # ended normally
    assert ESC in drawn.getvalue()
    assert capsys.readouterr() == ("", "")


def test_an_unknown_total_shows_a_count_and_no_bar():
    console, drawn = terminal()
    with progress.task("examining blobs", unit="blobs", console=console) as advance:
        advance(1234)
    frame = last_frame(drawn.getvalue())
    assert "examining blobs" in frame and "1,234 blobs" in frame
    assert "/" not in frame and "━" not in frame


def test_a_plain_spinner_shows_no_count():
    console, drawn = terminal()
    with progress.task("starting the stack", console=console):
        pass
    frame = last_frame(drawn.getvalue())
    assert frame.split() == ["✓", "starting", "the", "stack", "0:00:00"]  # no count


def test_update_changes_the_line():
    console, drawn = terminal()
    with progress.task("starting", console=console) as advance:
        advance.update(description="streaming batch 2", total=5, completed=2)
    assert advance.completed == 2 and advance.total == 5
    frame = last_frame(drawn.getvalue())
    assert "streaming batch 2" in frame and "2/5" in frame and "starting" not in frame


def test_forced_on_draws_on_stderr_and_never_on_stdout(monkeypatch, capsys):
    monkeypatch.setenv(progress.ENV, "1")
    assert progress.enabled()
    long_line = "x" * 300  # longer than any terminal line: must stay one line
    streams = sys.stdout, sys.stderr
    with progress.task("compacting t[0]", total=2, unit="records") as advance:
        print('{"result": 1}')
        print(long_line, file=sys.stderr)
        advance(2)
    out, err = capsys.readouterr()
    assert out == '{"result": 1}\n'
    assert "compacting t[0]" in err and "2/2 records" in err and ESC in err
    assert long_line in err
    assert (sys.stdout, sys.stderr) == streams  # stderr put back after the display ended


def test_nested_tasks_share_one_display_and_only_the_last_stays():
    console, drawn = terminal()
    with progress.task("bench", total=2, unit="cases", console=console) as cases:
        for name in ("core", "sink"):
            with progress.task(f"timing {name}", total=3, unit="rounds") as rounds:
                rounds(3)
            cases()
    assert "timing core" in drawn.getvalue() and "timing sink" in drawn.getvalue()
    frame = last_frame(drawn.getvalue())
    assert "bench" in frame and "2/2 cases" in frame and "timing" not in frame


def test_a_block_that_raises_ends_marked_failed_and_the_error_propagates():
    console, drawn = terminal()
    with pytest.raises(RuntimeError, match="boom"):
        with progress.task("deleting blobs", total=10, console=console) as advance:
            advance(4)
            raise RuntimeError("boom")
    frame = last_frame(drawn.getvalue())
    assert "4/10" in frame and "✗" in frame
    with progress.task("again", console=console):  # the display was released
        pass


def test_advancing_from_threads_counts_every_step():
    console, drawn = terminal()
    with progress.task("listing", total=4000, console=console) as advance:
        threads = [threading.Thread(target=lambda: [advance() for _ in range(1000)]) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert advance.completed == 4000
    assert "4,000/4,000" in last_frame(drawn.getvalue())


def test_silent_shows_nothing_even_when_forced(monkeypatch, capsys):
    monkeypatch.setenv(progress.ENV, "1")
    with progress.silent("quiet", total=2) as advance:
        advance(2)
    assert [x for x in progress.track(range(3), "quiet", progress=progress.silent)] == [0, 1, 2]
    assert advance.completed == 2
    assert capsys.readouterr() == ("", "")


def test_a_real_terminal_on_stderr_turns_it_on(monkeypatch, capsys):
    leader, follower = pty.openpty()
    try:
        with os.fdopen(follower, "w", encoding="utf-8", closefd=False) as tty:
            monkeypatch.setattr(sys, "stderr", tty)
            assert progress.enabled()
            with progress.task("on a terminal", total=1, unit="steps") as advance:
                advance()
            monkeypatch.setenv("TERM", "dumb")
            assert not progress.enabled()
            tty.write("END\n")
            tty.flush()
        drawn = read_until(leader, "END")
    finally:
        os.close(leader)
        os.close(follower)
    assert "on a terminal" in drawn and "1/1 steps" in drawn
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("value", ["maybe", "2"])
def test_a_bad_env_value_is_a_clear_error(monkeypatch, value):
    monkeypatch.setenv(progress.ENV, value)
    with pytest.raises(ConfigError, match=f"LLOG_PROGRESS='{value}' must be one of auto"):
        progress.enabled()


def test_bad_totals_and_backward_steps_are_rejected():
    with pytest.raises(ValueError, match="total must be an int >= 0"):
        with progress.task("x", total=-1):
            pass
    with pytest.raises(ValueError, match="total must be an int >= 0"):
        with progress.silent("x", total=1.5):
            pass
    with progress.task("x") as advance:
        with pytest.raises(ValueError, match="only moves forward"):
            advance(-1)
