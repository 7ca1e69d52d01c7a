"""A compactor in its own process, for crash and race tests.

``python -m tests.helpers.compactor_process --topic T --partitions 0,1 --max-offsets N`` compacts
the partitions one after another and prints one JSON line per partition. Settings come from
LLOG_* environment variables; LLOG_FAILPOINT kills it at a named point. Its clock runs an hour
ahead by default, so what was just written is past the compaction lag.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

from llog.clock import ShiftedClock
from llog.compactor import Compactor
from llog.config import Config
from tests.helpers.clocks import LAG_OFFSET_S

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partitions", required=True)
    parser.add_argument("--max-offsets", type=int, default=1_000_000)
    parser.add_argument("--clock-offset-s", type=float, default=LAG_OFFSET_S,
                        help="run the compactor's clock this far ahead (default: past the compaction lag)")
    args = parser.parse_args()
    with Compactor(Config.load(), max_offsets=args.max_offsets, clock=ShiftedClock(args.clock_offset_s)) as compactor:
        for p in (int(p) for p in args.partitions.split(",")):
            print(json.dumps(dataclasses.asdict(compactor.compact_partition(args.topic, p))), flush=True)


def run(config: Config, topic: str, partitions: list[int], max_offsets: int, failpoint: str | None = None,
        session_timeout_ms: int = 2000) -> subprocess.CompletedProcess:
    """Run a compactor process using exactly ``config`` (with a short Oxia session, so the claim
    of a killed one expires soon)."""
    env = {"PATH": "/usr/bin:/bin", "LLOG_SETTINGS_FILE": "/nonexistent",
           **config.replace(oxia_session_timeout_ms=session_timeout_ms).to_options()}
    if failpoint:
        env["LLOG_FAILPOINT"] = failpoint
    return subprocess.run(
        [sys.executable, "-m", "tests.helpers.compactor_process", "--topic", topic,
         "--partitions", ",".join(map(str, partitions)), "--max-offsets", str(max_offsets)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )


if __name__ == "__main__":
    main()
