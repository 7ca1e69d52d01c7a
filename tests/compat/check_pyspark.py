"""Check llog's Spark connectors against given pyspark versions, as a cluster would run them.

    .cache/venv/bin/python tests/compat/check_pyspark.py 4.0.5 4.1.4
    make compat COMPAT_VERSIONS="4.0.5 4.1.4"   # the same (default: the versions docs/getting-started.md names)

For each version: a throwaway venv ``.cache/compat/pyspark-<version>`` (git-ignored; kept and
reused, so a second run installs nothing) gets that pyspark from PyPI, the way a cluster has its
own, then llog's wheel built from this checkout, installed as a cluster would install it: with
its dependencies, none of which may replace that pyspark (checked). Then ``smoke.py`` runs in
that venv, from outside the checkout, against a local stack (Oxia and the S3 server, started from
this Python's environment for the run and purged after): imports, then batch and stream writes,
``foreachBatch``, batch and stream reads with a consumer group, and ``maxOffsetsPerTrigger``.

Prints one summary line per version (``pass``, ``degraded: ...`` or ``FAIL: ...`` per check) and
writes ``.cache/compat/pyspark-<version>.json`` and ``.log``. Exits 1 if any version failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(CHECKOUT))

from tests.compat.wheel import build_wheel  # noqa: E402 - after the checkout is importable

COMPAT_DIR = CHECKOUT / ".cache" / "compat"
SMOKE = Path(__file__).resolve().parent / "smoke.py"
#: A version as PyPI spells pyspark's: 4.0.5, 4.1.0.dev2, ...
_VERSION_CHARS = set("0123456789.abcdevrpost")


def _run(cmd: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    # Without PYTHONPATH: pip would take a checkout on it (llog.egg-info) for llog installed already.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n"
                           f"{done.stderr[-4000:]}")
    return done


def _installed_pyspark(python: Path) -> str | None:
    done = subprocess.run([str(python), "-c", "import pyspark; print(pyspark.__version__)"], capture_output=True,
                          text=True, timeout=120, check=False)
    return done.stdout.strip() if done.returncode == 0 else None


def prepare_venv(version: str, wheel: Path) -> Path:
    """The venv with ``pyspark==version`` and llog's wheel installed; its Python."""
    venv = COMPAT_DIR / f"pyspark-{version}"
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"check_pyspark: creating {venv.relative_to(CHECKOUT)}", flush=True)
        _run([sys.executable, "-m", "venv", "--clear", str(venv)], 300)
        _run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], 600)
    if _installed_pyspark(python) != version:
        print(f"check_pyspark: installing pyspark=={version} from PyPI", flush=True)
        _run([str(python), "-m", "pip", "install", "-q", f"pyspark=={version}"], 1800)
    # As on a cluster: llog with its dependencies (the first time), then this checkout's code.
    _run([str(python), "-m", "pip", "install", "-q", str(wheel)], 1800)
    _run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)], 600)
    found = _installed_pyspark(python)
    if found != version:
        raise RuntimeError(f"installing llog's wheel changed pyspark {version} to {found}")
    return python


def check(version: str, wheel: Path, settings: Path) -> dict:
    """Prepare the venv and run the smoke; its summary (``ok`` false with the error when the
    venv could not be prepared)."""
    log, out = COMPAT_DIR / f"pyspark-{version}.log", COMPAT_DIR / f"pyspark-{version}.json"
    out.unlink(missing_ok=True)
    try:
        python = prepare_venv(version, wheel)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        return {"pyspark": version, "ok": False, "error": str(e)}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_", "PYTHON", "LLOG_"))}
    env.update(LLOG_SETTINGS_FILE=str(settings), SPARK_LOCAL_IP="127.0.0.1")
    print(f"check_pyspark: pyspark {version}: running the smoke (log: {log.relative_to(CHECKOUT)})", flush=True)
    with tempfile.TemporaryDirectory(prefix="llog-compat-cwd-") as cwd, open(log, "w") as log_file:
        try:
            subprocess.run([str(python), str(SMOKE), "--json", str(out)], cwd=cwd, env=env, stdout=log_file,
                           stderr=subprocess.STDOUT, timeout=1500, check=False)
        except subprocess.TimeoutExpired:
            return {"pyspark": version, "ok": False, "error": f"the smoke ran past 1500 s (see {log})"}
    if not out.exists():
        return {"pyspark": version, "ok": False, "error": f"the smoke wrote no summary (see {log})"}
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("versions", nargs="+", metavar="VERSION", help="pyspark versions, e.g. 4.0.5 4.1.4")
    args = parser.parse_args(argv)
    for version in args.versions:
        if not version[:1].isdigit() or not set(version) <= _VERSION_CHARS:
            parser.error(f"{version!r} is not a pyspark version like 4.0.5")
    from llog_tools.local_stack import down, up
    from llog_tools.stack.network import free_ports

    COMPAT_DIR.mkdir(parents=True, exist_ok=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="llog-compat-") as work:
        wheel = build_wheel(Path(work) / "dist")
        stack = Path(work) / "stack"
        try:
            up(stack_dir=stack, ports=free_ports())
            for version in args.versions:
                results.append(check(version, wheel, stack / "settings.json"))
        finally:
            down(stack, purge=True)
    for result in results:
        checks = result.get("checks", {})
        imports = result.get("imports", {})
        failed_imports = {k: v for k, v in imports.items() if v != "pass"}
        print(f"pyspark {result['pyspark']}: {'ok' if result.get('ok') else 'FAILED'}"
              + (f"; error: {result['error']}" if "error" in result else "")
              + (f"; imports failed: {failed_imports}" if failed_imports else "")
              + "".join(f"\n  {name}: {outcome}" for name, outcome in checks.items()), flush=True)
    return 0 if all(r.get("ok") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
