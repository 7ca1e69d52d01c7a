"""llog's wheel as a cluster gets it: pyspark, delta-spark and great-expectations only in extras
(a cluster keeps its own Spark), every package and the price table inside, and what it installs
importable without Spark.

The wheel is built once for the module (``tests/compat/wheel.py``: ``python -m build --wheel
--no-isolation`` from a copy of the checkout's source files; no isolation because an isolated
build installs setuptools from PyPI on every run, seconds and network for nothing setup.py
needs). The install check puts it ``--no-deps`` into a fresh venv (no system site packages),
then imports every module it installed with its third-party dependencies borrowed from the dev
venv and Spark's packages blocked: installing every dependency into the fresh venv would take
minutes, and what is checked here is the wheel's own code and files. Which pyspark versions the
connectors run on is checked by tests/compat/check_pyspark.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.compat.wheel import build_wheel

#: The top-level packages setup.py ships; compaction_job too, as its Spark tasks import it.
PACKAGES = ("llog", "llog_tools", "llog_sink", "llog_source", "pyspark_llog", "compaction_job", "broker_lite")
#: Distributions a cluster brings (or ``llog[spark]`` / ``llog[quality]`` do), and their extra.
EXTRAS_ONLY = {"pyspark": "spark", "delta-spark": "spark", "great-expectations": "quality", "grpcio-status": "connect"}
#: Python packages the borrowed dependencies must not provide in the install check.
SPARK_MODULES = ("pyspark", "delta", "great_expectations", "py4j")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("dist"))


def _metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(archive.read(name).decode())


def test_spark_and_quality_packages_are_only_extras(wheel):
    metadata = _metadata(wheel)
    assert {"spark", "quality", "dev"} <= set(metadata.get_all("Provides-Extra"))
    requirements = [Requirement(r) for r in metadata.get_all("Requires-Dist")]
    by_name: dict[str, list[Requirement]] = {}
    for requirement in requirements:
        by_name.setdefault(requirement.name.lower().replace("_", "-"), []).append(requirement)
    for name, extra in EXTRAS_ONLY.items():
        assert by_name.get(name), f"{name} is not required by any extra"
        for requirement in by_name[name]:
            assert requirement.marker is not None, f"{requirement} is required without an extra"
            assert requirement.marker.evaluate({"extra": extra}), f"{requirement} is not in the {extra!r} extra"
            assert not requirement.marker.evaluate({"extra": ""}), f"{requirement} is required without an extra"
    # And no core dependency drags Spark in: every requirement without a marker is a plain library.
    core = sorted(r.name for r in requirements if r.marker is None)
    assert core and not {n.lower() for n in core} & {"pyspark", "delta-spark", "great-expectations", "py4j"}


def test_wheel_holds_every_package_and_the_price_table(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        data = [n for n in names if n.endswith(".data/data/share/llog/s3_prices.json")]
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "llog = llog_tools.cli:main" in archive.read(entry_points).decode()
        assert len(data) == 1 and json.loads(archive.read(data[0]))  # the table, as JSON
    for package in PACKAGES:
        assert f"{package}/__init__.py" in names, f"{package} is not in the wheel"
    assert "pyspark_llog/compat.py" in names and "llog_source/spark_readers.py" in names
    assert not [n for n in names if n.startswith(("tests/", "jobs/", "bench/"))]


#: Run by the fresh venv's Python: block Spark, borrow the dev venv's other packages, import
#: every module the wheel installed. Prints JSON: module -> "ok" or the error.
_IMPORT_ALL = """
import importlib, importlib.abc, json, pathlib, sys, sysconfig

BLOCKED = {blocked!r}

class NoSpark(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

sys.meta_path.insert(0, NoSpark())
installed = pathlib.Path(sysconfig.get_paths()["purelib"])
sys.path.append({borrowed!r})  # after this venv's site-packages: the wheel's modules come first
out = {{}}
for package in {packages!r}:
    for path in sorted((installed / package).rglob("*.py")):
        parts = path.relative_to(installed).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if parts[-1] == "__main__":
            continue
        try:
            module = importlib.import_module(name)
            assert module.__file__.startswith(str(installed)), module.__file__
            out[name] = "ok"
        except ModuleNotFoundError as e:
            out[name] = "missing " + (e.name or "?").split(".")[0]
        except Exception as e:
            out[name] = f"{{type(e).__name__}}: {{e}}"
from llog_tools.pricing import load_prices, prices_file
load_prices()
out["prices_file"] = str(prices_file())
print(json.dumps(out))
"""


def test_installed_wheel_imports_without_spark(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    # Without PYTHONPATH: a Spark session of this test process (jobs.local_spark) puts the checkout
    # on it, where pip would find llog installed already (llog.egg-info) and install nothing.
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                              "--no-index", str(wheel)], capture_output=True, text=True, timeout=120,
                             env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert install.returncode == 0, install.stderr
    assert (venv / "bin" / "llog").exists()  # the console script
    code = _IMPORT_ALL.format(blocked=SPARK_MODULES, borrowed=sysconfig.get_paths()["purelib"], packages=PACKAGES)
    run = subprocess.run([str(python), "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert Path(result.pop("prices_file")) == venv / "share" / "llog" / "s3_prices.json"  # data_files, installed
    failed = {m: why for m, why in result.items() if why != "ok" and why != "missing pyspark"}
    assert not failed, f"modules that fail to import without Spark: {failed}"
    needs_spark = sorted(m for m, why in result.items() if why == "missing pyspark")
    # The core, its tools, the broker and the compaction job never import Spark at import time; the
    # connectors' Spark modules need it.
    assert not [m for m in needs_spark
                if m.split(".")[0] in ("llog", "llog_tools", "broker_lite", "compaction_job")], needs_spark
    assert {"llog_sink.spark_writers", "llog_source.spark_readers", "pyspark_llog"} <= set(needs_spark)
    assert result["llog_tools.cli"] == "ok" and result["llog_source.options"] == "ok"
