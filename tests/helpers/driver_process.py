"""A Spark driver (``python -m MODULE``) in its own process, for crash tests.

It runs as a session leader with ``LLOG_FAILPOINT_SCOPE=session``, so a failpoint reached by any
of its processes (the driver, its JVM or a Python worker) kills them all at once, as when the
driver's machine goes down. Settings come from ``config`` alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from llog.config import Config

REPO = Path(__file__).resolve().parents[2]


def run(config: Config, argv: list[str], failpoint: str | None = None, timeout: float = 300
        ) -> subprocess.CompletedProcess:
    """``python -m argv...`` with ``config``'s settings; killed at ``failpoint`` if given."""
    env = {**os.environ, "LLOG_SETTINGS_FILE": "/nonexistent", **config.to_options()}
    env.pop("LLOG_FAILPOINT", None)
    if failpoint:
        env.update(LLOG_FAILPOINT=failpoint, LLOG_FAILPOINT_SCOPE="session")
    return subprocess.run([sys.executable, "-m", *argv], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout, start_new_session=True)
