"""llog's wheel, built from a copy of the checkout's source files, so the build leaves nothing
(``build/``, ``*.egg-info``) in the checkout that other builds or tests running at the same time
could trip over. Used by ``check_pyspark.py`` and ``tests/integration/test_packaging.py``."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]
#: What a copy of a checkout that is not a git repository leaves out (as .gitignore does).
_IGNORED = (".git", ".cache", "__pycache__", "*.egg-info", "build", "dist", ".pytest_cache", ".hypothesis", "results")


def source_files(checkout: Path = CHECKOUT) -> list[Path]:
    """The checkout's source files, relative: tracked and untracked but not ignored (what a
    fresh clone plus the files not committed yet hold)."""
    listed = subprocess.run(["git", "-C", str(checkout), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=False)
    if listed.returncode != 0:
        return []
    return [Path(p) for p in listed.stdout.decode().split("\0") if p and (checkout / p).is_file()]


def copy_source(destination: Path, checkout: Path = CHECKOUT) -> Path:
    """``destination`` made a copy of the checkout's source files."""
    files = source_files(checkout)
    if not files:  # not a git checkout: copy the tree less what git would ignore
        shutil.copytree(checkout, destination, ignore=shutil.ignore_patterns(*_IGNORED))
        return destination
    for relative in files:
        target = destination / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(checkout / relative, target)
    return destination


def build_wheel(outdir: Path, python: str = sys.executable, checkout: Path = CHECKOUT, timeout_s: float = 300) -> Path:
    """Build llog's wheel into ``outdir`` with ``python -m build --wheel --no-isolation`` (that
    Python needs ``build`` and ``setuptools``: the dev venv has both, ``make install``); returns it.

    ``--no-isolation``: an isolated build installs setuptools into a fresh environment from PyPI
    on every build (network, and seconds each time) for no gain here: setup.py needs nothing but
    setuptools, which the venv pins."""
    outdir.mkdir(parents=True, exist_ok=True)
    source = copy_source(outdir / "source", checkout)
    built = subprocess.run([python, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(outdir), str(source)],
                           capture_output=True, text=True, timeout=timeout_s, check=False)
    wheels = sorted(outdir.glob("llog-*.whl"))
    if built.returncode != 0 or len(wheels) != 1:
        raise RuntimeError(f"building the wheel failed (exit {built.returncode}, wheels {wheels}):\n"
                           f"{built.stdout[-3000:]}\n{built.stderr[-3000:]}")
    shutil.rmtree(source)
    return wheels[0]
