"""``python -m bench [core] [sink] [source] [compaction] [broker] [records] [gate] [latency] [kafka] [kafka-front-door]``: run benchmark cases against a private local stack.

Results are JSON lines on stdout; what the run is doing goes to stderr, as lines, and as
progress bars over the cases and their steps while stderr is a terminal (:mod:`llog_tools.progress`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from llog.config import Config
from llog_tools import local_stack
from llog_tools.stack import build, network
from llog_tools import progress as llog_progress

CASES = {"core": "bench.core", "sink": "bench.sink", "source": "bench.source",
         "compaction": "bench.compaction", "broker": "bench.broker", "records": "bench.records",
         "gate": "bench.gate", "latency": "bench.latency", "kafka": "bench.kafka",
         "kafka-front-door": "bench.kafka_front_door"}
#: What runs when no case is named: all but those against a Kafka broker they start (``kafka``,
#: the longest by far, and ``kafka-front-door``), which run only when named.
DEFAULT_CASES = [case for case in CASES if case not in ("kafka", "kafka-front-door")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("cases", nargs="*", metavar="CASE", help=f"any of {', '.join(CASES)} (default: all but kafka and kafka-front-door)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.cases) - set(CASES))
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
    cases = args.cases or DEFAULT_CASES
    with llog_progress.task(f"bench: {', '.join(cases)}", total=len(cases), unit="cases") as done, \
            tempfile.TemporaryDirectory(prefix="llog-bench-") as tmp:
        with llog_progress.task("bench: installing the local stack (unless installed)"):
            build.install()
        stack_dir = Path(tmp) / "stack"
        print(f"bench: starting a private stack in {stack_dir}", file=sys.stderr)
        with llog_progress.task("bench: starting the local stack"):
            local_stack.up(stack_dir=stack_dir, ports=network.free_ports())
        try:
            config = Config.load(env={}, settings_path=stack_dir / "settings.json")
            for case in cases:
                done.update(description=f"bench: {case}")
                module = __import__(CASES[case], fromlist=["run"])
                module.run(config)
                done()
            done.update(description=f"bench: {', '.join(cases)}")
        finally:
            with llog_progress.task("bench: stopping the local stack"):
                local_stack.down(stack_dir, purge=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
