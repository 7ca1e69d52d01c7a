"""``python -m loadtest [--scenario NAME ...] [--duration S] [--brokers N [--balancer
[--no-route-key]]] [--keep]``: start a private local stack and the brokers (behind HAProxy with
``--balancer``), run the scenarios (default: all, short), write the run directory and print the
summary as the last line of stdout. Exits 1 when the counts did not reconcile
(:mod:`loadtest.run`)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from uuid import uuid4

from llog_tools import local_stack
from llog_tools.stack import build, network
from llog.config import Config
from loadtest import vegeta
from loadtest.run import RESULTS_DIR, make_run_dir, progress, run
from loadtest.scenarios import SCENARIOS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest", description=__doc__)
    parser.add_argument("--scenario", action="append", choices=list(SCENARIOS), metavar="NAME",
                        help=f"run this scenario (repeatable; default all: {', '.join(SCENARIOS)})")
    parser.add_argument("--duration", type=float, metavar="S",
                        help="seconds of each vegeta phase (default: the scenario's, 5 to 10 s)")
    parser.add_argument("--brokers", type=int, default=1, metavar="N",
                        help="brokers to drive (partition p goes to broker p %% N, unless --balancer; default 1)")
    parser.add_argument("--balancer", action="store_true",
                        help="send every request through HAProxy in front of the brokers, as `llog stack up "
                             "--brokers N` runs it: a partition goes where the hash of X-Llog-Partition says")
    parser.add_argument("--no-route-key", action="store_true",
                        help="with --balancer: send no X-Llog-Partition, so the balancer spreads requests round "
                             "robin (to measure what partition affinity is worth)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help=f"default {RESULTS_DIR}")
    parser.add_argument("--keep", action="store_true",
                        help="keep the stack's data (stopped) in the run directory instead of deleting it")
    args = parser.parse_args(argv)
    if args.brokers < 1:
        parser.error("--brokers must be >= 1")
    if args.no_route_key and not args.balancer:
        parser.error("--no-route-key goes with --balancer")
    names = args.scenario or list(SCENARIOS)
    scenarios = [SCENARIOS[n] if args.duration is None else SCENARIOS[n].replace(duration_s=args.duration)
                 for n in dict.fromkeys(names)]
    label = names[0] if len(set(names)) == 1 else ("all" if set(names) == set(SCENARIOS) else "mixed")
    build.install()
    binary = vegeta.install()
    run_dir = make_run_dir(args.results_dir, label)
    with tempfile.TemporaryDirectory(prefix="llog-loadtest-") as tmp:
        stack_dir = run_dir / "stack" if args.keep else Path(tmp) / "stack"
        progress(f"run directory {run_dir}; starting a private stack in {stack_dir}")
        info = local_stack.up(stack_dir=stack_dir, ports=network.free_ports())
        try:
            config = Config.load(env={}, settings_path=stack_dir / "settings.json").replace(
                root_prefix=f"loadtest-{uuid4().hex[:8]}")
            summary = run(config, scenarios, run_dir, brokers=args.brokers, vegeta_binary=binary,
                          balanced=args.balancer, route=not args.no_route_key,
                          processes={"oxia": info["oxia"]["pid"], "s3": info["s3"]["pid"]})
        finally:
            local_stack.down(stack_dir, purge=not args.keep)
    print(json.dumps(summary), flush=True)
    if not summary["reconciled"]:
        progress(f"counts did not reconcile: {summary['unreconciled']}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
