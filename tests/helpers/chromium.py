"""Screenshots of local HTML files in headless Chromium, and a check that one is not blank.

Debian's ``/usr/bin/chromium`` (``make test`` installs it with apt, the Makefile's ``chromium``
target): the machine has no other browser, and a test tool's download of one is refused here.
Chromium runs with a fresh profile directory each time, with its background networking (updates,
sync, QUIC, ...) off, so it only ever reads the ``file://`` page it is given; it runs in its own
session, and the whole process group is killed when it outlives ``timeout_s`` (Chromium forks a
zygote, a GPU and a renderer process that would otherwise be left behind).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"


class ChromiumError(RuntimeError):
    """Chromium is missing, failed, timed out or wrote no screenshot."""


def chromium_path() -> str:
    """The Chromium binary: ``/usr/bin/chromium`` else ``chromium`` on the PATH."""
    found = CHROMIUM if os.access(CHROMIUM, os.X_OK) else shutil.which("chromium")
    if not found:
        raise ChromiumError(f"no Chromium at {CHROMIUM} or on the PATH: install it with `make debian-packages` "
                            "(apt-get install chromium)")
    return found


def screenshot(html_path: str | Path, png_path: str | Path, width: int = 1200, height: int = 1600,
               timeout_s: float = 60) -> Path:
    """Render ``html_path`` in headless Chromium at ``width`` x ``height`` pixels into ``png_path``
    (the top of the page, that many pixels of it); return ``png_path``.

    Raises ChromiumError if Chromium is missing, exits with an error, takes longer than
    ``timeout_s``, or exits without writing the PNG."""
    html_path, png_path = Path(html_path).resolve(), Path(png_path).resolve()
    if not html_path.is_file():
        raise FileNotFoundError(f"no HTML file to screenshot at {html_path}")
    png_path.parent.mkdir(parents=True, exist_ok=True)
    png_path.unlink(missing_ok=True)  # so a PNG left by an earlier run cannot pass for this one
    binary = chromium_path()
    with tempfile.TemporaryDirectory(prefix="llog-chromium-") as profile:
        argv = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--hide-scrollbars", f"--user-data-dir={profile}", f"--screenshot={png_path}",
                f"--window-size={width},{height}", html_path.as_uri()]
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   errors="replace", start_new_session=True)
        try:
            output, _ = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(process.pid)
            output, _ = process.communicate()
            raise ChromiumError(f"Chromium took longer than {timeout_s}s to screenshot {html_path}:\n"
                                f"{_tail(output)}") from None
        finally:
            _kill_group(process.pid)  # any helper process still running after the browser exited
    if process.returncode != 0:
        raise ChromiumError(f"Chromium exited with {process.returncode} on {html_path}:\n{_tail(output)}")
    if not png_path.is_file() or png_path.stat().st_size == 0:
        raise ChromiumError(f"Chromium exited without writing {png_path}:\n{_tail(output)}")
    return png_path


@dataclass(frozen=True)
class ImageMeasures:
    """How much is on a screenshot: the share of its pixels in its most common colour, and how
    many colours it has (a blank page has one or two; text and charts bring hundreds, from
    anti-aliasing)."""
    width: int
    height: int
    top_color: tuple[int, int, int]
    top_share: float
    colors: int


def measure(png_path: str | Path) -> ImageMeasures:
    """The ImageMeasures of the PNG at ``png_path``."""
    from PIL import Image

    with Image.open(png_path) as image:
        rgb = image.convert("RGB")
    counts = rgb.getcolors(maxcolors=rgb.width * rgb.height)  # every colour: never None at this maximum
    top_count, top_color = max(counts)
    return ImageMeasures(rgb.width, rgb.height, top_color, top_count / (rgb.width * rgb.height), len(counts))


def is_blank(png_path: str | Path, max_top_share: float = 0.995, min_colors: int = 16) -> bool:
    """Whether the image is (nearly) empty: more than ``max_top_share`` of its pixels are one
    colour, or it has fewer than ``min_colors`` colours."""
    m = measure(png_path)
    return m.top_share > max_top_share or m.colors < min_colors


def color_pixels(png_path: str | Path, color: str | tuple[int, int, int], tolerance: int = 24) -> int:
    """How many pixels are ``color`` (``"#rrggbb"`` or RGB), each channel within ``tolerance``:
    how a test finds a chart's line or bars in a screenshot (anti-aliasing and colour management
    shift edges and, slightly, the fill)."""
    from PIL import Image, ImageChops

    rgb = _rgb(color)
    with Image.open(png_path) as image:
        image = image.convert("RGB")
    difference = ImageChops.difference(image, Image.new("RGB", image.size, rgb))
    # A pixel is within tolerance when its largest channel difference is: per channel 255 where
    # within, then the darkest channel of the three.
    within = [band.point(lambda v: 255 if v <= tolerance else 0) for band in difference.split()]
    matches = ImageChops.darker(ImageChops.darker(within[0], within[1]), within[2])
    return matches.histogram()[255]


def _rgb(color: str | tuple[int, int, int]) -> tuple[int, int, int]:
    if isinstance(color, str):
        value = color.lstrip("#")
        if len(value) != 6:
            raise ValueError(f"not a #rrggbb colour: {color!r}")
        return tuple(int(value[i:i + 2], 16) for i in (0, 2, 4))
    return tuple(color)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(output: str | None, lines: int = 20) -> str:
    """The last lines of Chromium's output, without its harmless D-Bus complaints (no system bus
    in a container)."""
    kept = [line for line in (output or "").splitlines() if "dbus" not in line.lower()]
    return "\n".join(kept[-lines:]) or "(no output)"
