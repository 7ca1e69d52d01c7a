"""Write tests/durations.json from the JUnit reports of a whole run of the suite (``make test``
writes ``.cache/test-results.xml`` and ``.cache/test-results-soak.xml``; ``make test-durations``
runs this on them):

    python -m tests.durations [REPORT ...]

Per test module, the seconds its tests took (setup, call and teardown: a module's fixtures count
in its first test), its ``soak`` tests apart, by test. tests/conftest.py orders the xdist groups
by it and marks the modules over ``SLOW_MODULE_S`` ``slow``."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
DEFAULT_REPORTS = [CHECKOUT / ".cache" / "test-results.xml", CHECKOUT / ".cache" / "test-results-soak.xml"]


def _module_of(classname: str) -> str:
    """``tests/unit/test_x.py`` of a JUnit classname (``tests.unit.test_x`` or, for a test in a
    class, ``tests.unit.test_x.TestY``)."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        path = "/".join(parts[:end]) + ".py"
        if (CHECKOUT / path).is_file():
            return path
    raise ValueError(f"no test module for JUnit classname {classname!r}")


def _soak_tests() -> set[str]:
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "soak"],
                            cwd=CHECKOUT, capture_output=True, text=True, check=True)
    return {line.strip() for line in listed.stdout.splitlines() if "::" in line}


def durations(reports: list[Path], soak: set[str]) -> dict[str, dict[str, float]]:
    modules: dict[str, float] = defaultdict(float)
    soaks: dict[str, float] = {}
    for case in (case for report in reports for case in ET.parse(report).iter("testcase")):
        module = _module_of(case.get("classname", ""))
        nodeid = f"{module}::{case.get('name')}"
        seconds = float(case.get("time", 0))
        if nodeid in soak:
            soaks[nodeid] = round(seconds, 1)
        else:
            modules[module] += seconds
    return {"modules": {m: round(s, 1) for m, s in sorted(modules.items())}, "soak": dict(sorted(soaks.items()))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="*", type=Path, default=DEFAULT_REPORTS)
    args = parser.parse_args(argv)
    missing = [str(r) for r in args.reports if not r.is_file()]
    if missing:
        parser.error(f"no JUnit report at {', '.join(missing)}: run `make test` first")
    out = CHECKOUT / "tests" / "durations.json"
    recorded = durations(args.reports, _soak_tests())
    if len(recorded["modules"]) < 50:
        parser.error(f"the reports hold {len(recorded['modules'])} modules: not a whole run of the suite")
    out.write_text(json.dumps(recorded, indent=1) + "\n")
    total = sum(recorded["modules"].values()) + sum(recorded["soak"].values())
    print(f"wrote {out}: {len(recorded['modules'])} modules, {len(recorded['soak'])} soak tests, {total:,.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
