"""Write tests/durations.json from the JUnit reports of a whole run of the suite (``make test``
writes ``.cache/test-results.xml`` and, for the soak modules, ``.cache/test-results-soak.xml``;
``make test-durations`` runs this on them):

    python -m tests.durations [REPORT ...]

Per test module, the seconds its tests took (setup, call and teardown: a module's fixtures count
in its first test). tests/conftest.py orders the xdist units by it and marks the modules over
``SLOW_MODULE_S`` ``slow``."""

from __future__ import annotations

import argparse
import json
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


def durations(reports: list[Path]) -> dict[str, dict[str, float]]:
    modules: dict[str, float] = defaultdict(float)
    for case in (case for report in reports for case in ET.parse(report).iter("testcase")):
        modules[_module_of(case.get("classname", ""))] += float(case.get("time", 0))
    return {"modules": {m: round(s, 1) for m, s in sorted(modules.items())}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="*", type=Path, default=DEFAULT_REPORTS)
    args = parser.parse_args(argv)
    missing = [str(r) for r in args.reports if not r.is_file()]
    if missing:
        parser.error(f"no JUnit report at {', '.join(missing)}: run `make test` first")
    out = CHECKOUT / "tests" / "durations.json"
    recorded = durations(args.reports)
    if len(recorded["modules"]) < 50:
        parser.error(f"the reports hold {len(recorded['modules'])} modules: not a whole run of the suite")
    out.write_text(json.dumps(recorded, indent=1) + "\n")
    total = sum(recorded["modules"].values())
    print(f"wrote {out}: {len(recorded['modules'])} modules, {total:,.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
