"""A local SparkSession for the demo, benchmarks and tests: this Python on the driver and the
workers, loopback only, the checkout importable by the workers.

Its Spark settings are in ``conf/spark-defaults.conf`` (:data:`SPARK_DEFAULTS`, read at every
start by :func:`spark_defaults`): logging through ``conf/log4j2.properties``, the Delta jar and
how Ivy fetches it (``conf/ivysettings.xml``). This module keeps only what cannot be in that
file: the environment the JVM must start with, and the master (``local[cores,task_retries]``).

Jobs take theirs from :func:`job_spark`: the cluster's session when Spark started the process
(``spark-submit``, a Databricks task), else this local one.

With ``delta=True`` the session can read and write Delta tables. The first time, Spark's Ivy
resolves the Delta jar (``spark.jars.packages``) and its dependencies from Maven Central into
``.cache/ivy`` of the checkout (``spark.jars.ivy``, git-ignored); which jars it retrieved is
written next to them (:data:`RESOLVED_JARS_FILE`). Later sessions load those jars directly as
``spark.jars``: no network, no Ivy run, and none of the ~20 lines Ivy prints on every resolution
(its console logger is fixed at INFO; nothing in Spark or Ivy's settings turns it off). A session
that asks for more ``packages`` (say Spark's Kafka connector, for ``bench.kafka``) has them
resolved, cached and recorded the same way. Sessions that start together in several processes
(pytest's workers on a fresh clone) take turns: one resolves, under a lock in ``.cache/ivy``, and
the others load what it recorded.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on the path of every Python process it
starts (the planner of each streaming query and of each Python data source read, the workers'
daemon, a sink's commit worker), and a pip-installed pyspark is its own ``SPARK_HOME``: each such
process then imports pyspark from that zip, compiling its modules anew (Python caches no bytecode
for a zip), about a second of CPU before it does anything. Unless ``SPARK_HOME`` is already set,
the session's JVM gets a ``SPARK_HOME`` of its own (:func:`spark_home_without_zip`): the installed
pyspark's ``bin`` and ``jars``, without ``python/lib``, so those processes import the installed
pyspark, whose bytecode is cached. A streaming query over a Python source starts about 1.8 s
sooner (the first trigger 1.0 s after ``start()`` instead of 2.8 s).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import unquote, urlparse

from llog.config import llog_home
from llog.errors import ConfigError
from llog_tools.stack.processes import locked

CHECKOUT = Path(__file__).resolve().parents[1]
#: The local session's Spark settings, in Spark's ``key  value`` format (conf/README.md).
SPARK_DEFAULTS = CHECKOUT / "conf" / "spark-defaults.conf"
#: The settings of :data:`SPARK_DEFAULTS` that only a Delta session takes (a key equal to one of
#: these or below it): the jar and how Ivy fetches it, Delta's SQL extension and catalog, and
#: Delta's own settings. A session without Delta gets none of them (the extension and catalog
#: would fail without the jar).
DELTA_KEYS = ("spark.jars.", "spark.sql.extensions", "spark.sql.catalog.spark_catalog", "spark.databricks.delta.",
              "spark.delta.")
#: In the ``spark.jars.ivy`` directory: the jars Ivy retrieved for the ``spark.jars.*`` settings
#: it resolved, relative to that directory (JSON), so the next session need not run Ivy. A session
#: with more ``packages`` keeps its record in a file of its own (:func:`resolved_jars_file`), so
#: that sessions with and without them each find theirs, whichever ran last.
RESOLVED_JARS_FILE = "llog-resolved-jars.json"
#: In the ``spark.jars.ivy`` directory: the lock a process holds while its Ivy resolves and it
#: records the jars (:func:`local_spark`), and how long another waits for it (a first resolution
#: downloads the Delta jar and its dependencies from Maven Central).
RESOLVE_LOCK_FILE = ".llog-resolve.lock"
RESOLVE_TIMEOUT_S = 600.0
#: A class of the Delta jar: whether a running JVM has it.
_DELTA_PROBE_CLASS = "io.delta.sql.DeltaSparkSessionExtension"
_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def local_spark(app: str, cores: int = 2, task_retries: int = 1, delta: bool = False,
                packages: Mapping[str, str] | None = None):
    """``local[cores,task_retries]`` with the settings of :data:`SPARK_DEFAULTS`; the env is set
    before the JVM starts.

    ``delta=True`` adds the Delta settings (:data:`DELTA_KEYS`): the jar, its SQL extension and
    its catalog. ``packages`` adds more jars, resolved as Delta's are (:func:`spark_defaults`):
    Maven coordinates, each with a class of its jar that shows whether a JVM has it. Jars are
    only loaded when the JVM starts: if this process already runs a Spark JVM without one of
    them (a session made earlier with ``delta=False``, or without the packages), that JVM is
    stopped and a new one started.
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(CHECKOUT), os.environ.get("PYTHONPATH")) if p)
    if not os.environ.get("SPARK_HOME"):
        home = spark_home_without_zip()
        if home is not None:
            os.environ["SPARK_HOME"] = str(home)
    from pyspark.sql import SparkSession

    packages = dict(packages or {})
    settings = spark_defaults(cores=cores, delta=delta, packages=list(packages))
    probe_classes = [*([_DELTA_PROBE_CLASS] if delta else []), *packages.values()]
    record = resolved_jars_file(settings) if packages else RESOLVED_JARS_FILE
    jars = None
    resolving = contextlib.nullcontext()
    if probe_classes:
        _stop_jvm_without(probe_classes)
        if "spark.jars.ivy" in settings:
            Path(settings["spark.jars.ivy"]).mkdir(parents=True, exist_ok=True)
        jars = resolved_jars(settings, record)
        if jars is None and "spark.jars.packages" in settings and "spark.jars.ivy" in settings:
            # Ivy's cache is not safe for two resolutions at once: on a fresh checkout, sessions
            # started together (pytest's workers) made JVMs that exited before Spark started. One
            # process resolves; the others wait for it and then load what it recorded.
            resolving = locked(Path(settings["spark.jars.ivy"]) / RESOLVE_LOCK_FILE, RESOLVE_TIMEOUT_S,
                               "Ivy to resolve the Spark session's jars")
    with resolving:
        if jars is None and probe_classes:
            jars = resolved_jars(settings, record)  # another process may have resolved them meanwhile
        builder = SparkSession.builder.master(f"local[{cores},{task_retries}]").appName(app)
        for key, value in (with_resolved_jars(settings, jars) if jars else settings).items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        if probe_classes and jars is None and "spark.jars.packages" in settings and "spark.jars.ivy" in settings:
            record_resolved_jars(settings, spark.sparkContext.getConf().get("spark.jars", ""), record)
    return spark


def spark_home_without_zip(root: Path | None = None) -> Path | None:
    """A ``SPARK_HOME`` for the installed pyspark whose Python processes import it from
    site-packages, not from ``python/lib/pyspark.zip`` (module doc): a directory under
    ``<llog home>/spark-home/`` (or ``root``) with links to the package's ``bin`` and ``jars``.
    None when pyspark is not a pip install with that zip (a Spark distribution, say) or the links
    cannot be made: Spark then runs as it would anyway."""
    import pyspark

    package = Path(pyspark.__file__).resolve().parent
    if not ((package / "python" / "lib" / "pyspark.zip").is_file() and (package / "bin" / "spark-submit").is_file()
            and (package / "jars").is_dir()):
        return None
    root = Path(root) if root else llog_home() / "spark-home"
    home = root / f"pyspark-{pyspark.__version__}-{hashlib.sha1(str(package).encode()).hexdigest()[:12]}"
    links = {"bin": package / "bin", "jars": package / "jars"}

    def whole() -> bool:
        return all((home / name).resolve() == target for name, target in links.items())

    if whole():
        return home
    try:
        root.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=root))
        partial.chmod(0o755)
        for name, target in links.items():
            (partial / name).symlink_to(target, target_is_directory=True)
        try:
            partial.rename(home)
        except OSError:  # made meanwhile by another process, or stale: theirs if it is whole
            shutil.rmtree(partial, ignore_errors=True)
            if not whole():
                shutil.rmtree(home, ignore_errors=True)
                return None
    except OSError:
        return None
    return home


def spark_defaults(cores: int = 2, delta: bool = False, path: Path = SPARK_DEFAULTS,
                   packages: Sequence[str] = ()) -> dict[str, str]:
    """The settings of a local session from ``path``: ``{checkout}`` and ``{cores}`` filled in,
    and without :data:`DELTA_KEYS` unless ``delta``. ``packages`` (Maven coordinates) are added
    to ``spark.jars.packages``, with the file's other ``spark.jars.*`` settings (where Ivy caches
    and how it resolves) whether or not the session has Delta."""
    settings = read_spark_conf(path, {"checkout": str(CHECKOUT), "cores": str(cores)})
    chosen = dict(settings) if delta else {k: v for k, v in settings.items() if not is_delta_key(k)}
    if packages:
        chosen.update({k: v for k, v in settings.items() if k.startswith("spark.jars.") and k != "spark.jars.packages"})
        chosen["spark.jars.packages"] = ",".join([*filter(None, [chosen.get("spark.jars.packages")]), *packages])
    return chosen


def is_delta_key(key: str) -> bool:
    """Whether ``key`` is one of :data:`DELTA_KEYS` or below one of them."""
    return any(key == k or key.startswith(k if k.endswith(".") else k + ".") for k in DELTA_KEYS)


def read_spark_conf(path: Path, placeholders: dict[str, str]) -> dict[str, str]:
    """Parse a file in the format of Spark's ``spark-defaults.conf``: ``key  value`` lines (blanks,
    ``=`` or ``:`` between them; the value trimmed, as Spark does), blank lines and ``#`` or ``!``
    comments. ``{name}`` in a value is replaced by ``placeholders[name]``.

    Stricter than Java's properties format where a laxer reading would hide a mistake: a key
    without a value, a key given twice, a continued line (trailing ``\\``) and an unknown
    placeholder are each a :class:`ConfigError` naming the file and the line.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise ConfigError(f"cannot read Spark settings file {path}: {e}") from None
    settings: dict[str, str] = {}
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        where = f"{path}, line {number}"
        if line.endswith("\\"):
            raise ConfigError(f"{where}: continued lines (a trailing '\\') are not supported: {line!r}")
        match = re.fullmatch(r"([^\s=:]+)(?:\s*[=:]\s*|\s+)(.*)", line)
        if match is None or not match.group(2):
            raise ConfigError(f"{where}: expected 'key  value', got {line!r}")
        key, value = match.groups()
        if key in settings:
            raise ConfigError(f"{where}: {key} is set twice")
        unknown = sorted(set(_PLACEHOLDER.findall(value)) - set(placeholders))
        if unknown:
            raise ConfigError(f"{where}: unknown placeholder(s) {', '.join('{' + u + '}' for u in unknown)} "
                              f"in {key}; known: {', '.join('{' + p + '}' for p in sorted(placeholders))}")
        settings[key] = _PLACEHOLDER.sub(lambda m: placeholders[m.group(1)], value)
    return settings


def _resolution_key(settings: dict[str, str]) -> dict[str, str]:
    """What Ivy's result depends on: every ``spark.jars.*`` setting but the cache's place."""
    return {k: v for k, v in sorted(settings.items()) if k.startswith("spark.jars.") and k != "spark.jars.ivy"}


def resolved_jars_file(settings: dict[str, str]) -> str:
    """The name of the record of a session with more packages than the file's: its
    ``spark.jars.packages``, in characters a file name can hold."""
    packages = re.sub(r"[^\w.-]+", "_", settings["spark.jars.packages"])
    return f"{Path(RESOLVED_JARS_FILE).stem}-{packages}.json"


def resolved_jars(settings: dict[str, str], record: str = RESOLVED_JARS_FILE) -> list[Path] | None:
    """The jars an earlier session's Ivy retrieved for the same ``spark.jars.*`` settings, as
    ``record`` in ``spark.jars.ivy`` lists them, if they are all still there; else None (there
    is nothing to resolve, or Ivy must)."""
    if "spark.jars.packages" not in settings or "spark.jars.ivy" not in settings:
        return None
    ivy_dir = Path(settings["spark.jars.ivy"])
    try:
        recorded = json.loads((ivy_dir / record).read_text())
        jars = [ivy_dir / name for name in recorded["jars"]]
        if recorded["resolved_for"] == _resolution_key(settings) and jars and all(j.is_file() for j in jars):
            return jars
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none yet, or unreadable: Ivy resolves and the file is written again
    return None


def with_resolved_jars(settings: dict[str, str], jars: list[Path]) -> dict[str, str]:
    """``settings`` with the ``spark.jars.*`` settings replaced by ``jars`` (added to ``spark.jars``).
    All of ``spark.jars.*`` go, not only the packages: Spark loads ``spark.jars.ivySettings`` (and
    Ivy prints that it did) whether or not there is anything to resolve."""
    loaded = {k: v for k, v in settings.items() if not k.startswith("spark.jars.")}
    loaded["spark.jars"] = ",".join([*filter(None, [settings.get("spark.jars")]), *map(str, jars)])
    return loaded


def record_resolved_jars(settings: dict[str, str], spark_jars: str, record: str = RESOLVED_JARS_FILE) -> list[str]:
    """Write ``record`` (in ``spark.jars.ivy``): of a session's ``spark.jars`` (comma-separated
    URIs or paths), those Ivy retrieved (in ``<spark.jars.ivy>/jars``), for its ``spark.jars.*``
    settings. Returns them, relative to ``spark.jars.ivy``; writes nothing when there are none."""
    ivy_dir = Path(settings["spark.jars.ivy"]).resolve()
    retrieved = []
    for uri in filter(None, spark_jars.split(",")):
        path = Path(unquote(urlparse(uri).path)).resolve()
        if path.parent == ivy_dir / "jars" and path.is_file():
            retrieved.append(path.relative_to(ivy_dir).as_posix())
    if retrieved:
        target = ivy_dir / record
        partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        partial.write_text(json.dumps({"resolved_for": _resolution_key(settings), "jars": retrieved}, indent=1)
                           + "\n")
        os.replace(partial, target)  # atomic: a session starting meanwhile reads the old file or the new one
    return retrieved


def launched_by_spark() -> bool:
    """Whether Spark started this Python process as a driver (``spark-submit``, which hands it the
    JVM's gateway, or a Databricks task)."""
    return bool(os.environ.get("PYSPARK_GATEWAY_PORT") or os.environ.get("DATABRICKS_RUNTIME_VERSION"))


def job_spark(app: str, delta: bool = False):
    """A job's session and whether the job owns it (and should stop it when done): the session
    of the cluster that started this process (:func:`launched_by_spark`; its master, jars and
    settings are the submitter's, so Delta must be there already), else :func:`local_spark`."""
    if launched_by_spark():
        from pyspark.sql import SparkSession

        return SparkSession.builder.appName(app).getOrCreate(), False
    return local_spark(app, delta=delta), True


def _stop_jvm_without(probe_classes: Sequence[str]) -> None:
    """Stop this process's Spark JVM if it was started without the jar of one of
    ``probe_classes`` (the Delta jar, a package's), so the next session starts one with them
    (``spark.jars.packages`` is read only at JVM start)."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    gateway = SparkContext._gateway
    if gateway is None:
        return
    if all(gateway.jvm.org.apache.spark.util.Utils.classIsLoadable(c) for c in probe_classes):
        return
    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
    if SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.stop()
    proc = getattr(gateway, "proc", None)
    gateway.shutdown()
    if proc is not None:  # the JVM exits when its stdin closes
        proc.stdin.close()
        proc.wait(timeout=60)
    SparkContext._gateway = None
    SparkContext._jvm = None


def wait_for_running_tasks(spark, timeout_s: float = 10) -> None:
    """Until the tasks of a stopped query have ended (Spark cancels them, and logs that as
    errors), so what runs next has the cores, and the log, to itself."""
    import time

    deadline = time.monotonic() + timeout_s
    tracker = spark.sparkContext.statusTracker()
    while time.monotonic() < deadline and (tracker.getActiveStageIds()
                                           or any(e.numRunningTasks for e in tracker.getExecutorInfos())):
        time.sleep(0.1)
