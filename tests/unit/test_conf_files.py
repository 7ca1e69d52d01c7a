"""The files of conf/ a deployment edits, and the code that reads them: the local Spark session's
settings (jobs/local_spark.py), its Ivy and log4j files, and the generated llog.example.toml.
No Spark here (tests/integration/test_local_spark_conf.py starts one)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from jobs.local_spark import (CHECKOUT, RESOLVED_JARS_FILE, SPARK_DEFAULTS, is_delta_key, read_spark_conf,
                              record_resolved_jars, resolved_jars, spark_defaults, with_resolved_jars)
from llog.config import example_toml
from llog.errors import ConfigError

CONF = CHECKOUT / "conf"


# --- the Spark settings file's format ------------------------------------------------------------


def write_conf(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "spark-defaults.conf"
    path.write_text(text)
    return path


def test_spark_conf_format(tmp_path):
    path = write_conf(tmp_path, "# a comment\n! another\n\n"
                                "spark.a    1\n"
                                "spark.b=2\n"
                                "spark.c : 3\n"
                                "\tspark.d\tx  y  \n"
                                "spark.e   -Dk=v -Dj=w\n"
                                "spark.f   {cores}/{where}\n")
    assert read_spark_conf(path, {"cores": "4", "where": "here"}) == {
        "spark.a": "1", "spark.b": "2", "spark.c": "3", "spark.d": "x  y", "spark.e": "-Dk=v -Dj=w",
        "spark.f": "4/here"}


@pytest.mark.parametrize("line,problem", [
    ("spark.a", "line 2: expected 'key  value', got 'spark.a'"),
    ("spark.a =", "line 2: expected 'key  value', got 'spark.a ='"),
    ("spark.x 1", "line 2: spark.x is set twice"),
    ("spark.a one \\", "line 2: continued lines"),
    ("spark.a {cors}", "line 2: unknown placeholder(s) {cors} in spark.a; known: {cores}"),
])
def test_bad_spark_conf_line_names_file_and_line(tmp_path, line, problem):
    path = write_conf(tmp_path, f"spark.x 0\n{line}\n")
    with pytest.raises(ConfigError, match=re.escape(problem)) as info:
        read_spark_conf(path, {"cores": "2"})
    assert str(info.value).startswith(f"{path}, line 2: ")


def test_missing_spark_conf(tmp_path):
    with pytest.raises(ConfigError, match=re.escape(f"cannot read Spark settings file {tmp_path / 'nope.conf'}")):
        read_spark_conf(tmp_path / "nope.conf", {})


@pytest.mark.parametrize("key,delta", [
    ("spark.jars.packages", True), ("spark.jars.ivySettings", True), ("spark.sql.extensions", True),
    ("spark.sql.catalog.spark_catalog", True), ("spark.sql.catalog.spark_catalog.x", True),
    ("spark.databricks.delta.snapshotPartitions", True), ("spark.delta.logStore.class", True),
    ("spark.jars", False), ("spark.sql.extensionsX", False), ("spark.sql.catalog.other", False),
    ("spark.sql.shuffle.partitions", False), ("spark.driver.extraJavaOptions", False),
])
def test_delta_keys(key, delta):
    assert is_delta_key(key) is delta


# --- conf/spark-defaults.conf --------------------------------------------------------------------


def test_local_session_settings():
    plain, delta = spark_defaults(cores=3), spark_defaults(cores=3, delta=True)
    assert plain == {k: v for k, v in delta.items() if not is_delta_key(k)}
    assert not any(is_delta_key(k) for k in plain)
    # What parallel local sessions need: no UI ports, no progress bar, one shuffle partition per core.
    assert (plain["spark.ui.enabled"], plain["spark.ui.showConsoleProgress"]) == ("false", "false")
    assert plain["spark.sql.shuffle.partitions"] == "3" and delta["spark.databricks.delta.snapshotPartitions"] == "3"
    assert re.fullmatch(r"io\.delta:delta-spark_\d+\.\d+_2\.13:\d+\.\d+\.\d+", delta["spark.jars.packages"])
    assert delta["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert delta["spark.sql.catalog.spark_catalog"] == "org.apache.spark.sql.delta.catalog.DeltaCatalog"


def test_local_session_files_exist():
    """The paths the conf file names, with the checkout filled in, are this checkout's files."""
    settings = spark_defaults(delta=True)
    log4j = re.fullmatch(r"-Dlog4j2\.configurationFile=(\S+)", settings["spark.driver.extraJavaOptions"])
    assert log4j and Path(log4j.group(1)) == CONF / "log4j2.properties"
    assert Path(settings["spark.jars.ivySettings"]) == CONF / "ivysettings.xml"
    assert Path(settings["spark.jars.ivy"]) == CHECKOUT / ".cache" / "ivy"  # git-ignored
    assert SPARK_DEFAULTS == CONF / "spark-defaults.conf"


# --- conf/ivysettings.xml ------------------------------------------------------------------------


def test_ivy_resolves_from_maven_central_only():
    root = ET.parse(CONF / "ivysettings.xml").getroot()
    resolvers = list(root.find("resolvers"))
    assert [(r.tag, r.get("name"), r.get("root"), r.get("m2compatible")) for r in resolvers] == [
        ("ibiblio", "central", None, "true")]  # no root: Ivy's default, Maven Central
    assert root.find("settings").get("defaultResolver") == "central"
    timeouts = {t.get("name"): t for t in root.find("timeout-constraints")}
    assert timeouts[resolvers[0].get("timeoutConstraint")].get("connectionTimeout")


def test_ivy_settings_quiet_the_resolution_and_skip_sources():
    root = ET.parse(CONF / "ivysettings.xml").getroot()
    properties = {p.get("name"): p.get("value") for p in root.findall("property")}
    assert properties == {"ivy.maven.lookup.sources": "false", "ivy.maven.lookup.javadoc": "false",
                          "ivy.log.module.when.found": "false", "ivy.log.modules.in.use": "false",
                          "ivy.log.resolved.revision": "false"}


# --- conf/log4j2.properties ----------------------------------------------------------------------


def read_properties(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if line.strip() and not line.startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


def test_log4j_warn_on_stderr():
    props = read_properties(CONF / "log4j2.properties")
    assert props["rootLogger.level"] == "warn"
    appender = props["rootLogger.appenderRef.console.ref"]
    assert [props[f"appender.{appender}.{k}"] for k in ("type", "target")] == ["Console", "SYSTEM_ERR"]
    levels = {props[k]: props[k[:-len("name")] + "level"] for k in props if re.fullmatch(r"logger\.\w+\.name", k)}
    assert levels["org.apache.hadoop.util.NativeCodeLoader"] == "error"
    # Spark sets a Python shell's root level from this logger and says so unless they agree.
    assert levels["org.apache.spark.repl.Main"] == props["rootLogger.level"]
    assert all(level in ("warn", "error") for level in levels.values())


# --- which jars a resolution retrieved -----------------------------------------------------------


@pytest.fixture
def ivy(tmp_path: Path) -> tuple[dict[str, str], list[Path]]:
    """Settings with a private Ivy directory, and two jars 'retrieved' into it."""
    settings = {"spark.jars.packages": "g:a:1", "spark.jars.ivy": str(tmp_path / "ivy"),
                "spark.jars.ivySettings": "/x/ivysettings.xml", "spark.sql.extensions": "E"}
    jars = [tmp_path / "ivy" / "jars" / "g_a-1.jar", tmp_path / "ivy" / "jars" / "g_b-2.jar"]
    jars[0].parent.mkdir(parents=True)
    for jar in jars:
        jar.write_bytes(b"PK")
    return settings, jars


def test_recorded_jars_are_used_next_time(ivy, tmp_path):
    settings, jars = ivy
    assert resolved_jars(settings) is None
    other = tmp_path / "mine.jar"
    other.write_bytes(b"PK")
    spark_jars = ",".join([f"file://{jars[0]}", str(jars[1]), f"file://{other}"])  # as Spark reports them
    assert record_resolved_jars(settings, spark_jars) == ["jars/g_a-1.jar", "jars/g_b-2.jar"]
    assert json.loads((Path(settings["spark.jars.ivy"]) / RESOLVED_JARS_FILE).read_text())["resolved_for"] == {
        "spark.jars.ivySettings": "/x/ivysettings.xml", "spark.jars.packages": "g:a:1"}
    assert resolved_jars(settings) == jars
    assert with_resolved_jars({**settings, "spark.jars": "/own.jar"}, jars) == {
        "spark.sql.extensions": "E", "spark.jars": f"/own.jar,{jars[0]},{jars[1]}"}


@pytest.mark.parametrize("change", ["other packages", "other settings", "jar gone", "garbage", "nothing retrieved"])
def test_recorded_jars_are_not_used_when_stale(ivy, change):
    settings, jars = ivy
    record_resolved_jars(settings, ",".join(map(str, jars)))
    assert resolved_jars(settings) == jars
    if change == "other packages":
        settings = {**settings, "spark.jars.packages": "g:a:2"}
    elif change == "other settings":
        settings = {**settings, "spark.jars.excludes": "g:b"}
    elif change == "jar gone":
        jars[1].unlink()
    elif change == "garbage":
        (Path(settings["spark.jars.ivy"]) / RESOLVED_JARS_FILE).write_text('{"jars": 3')
    else:
        (Path(settings["spark.jars.ivy"]) / RESOLVED_JARS_FILE).unlink()
        assert record_resolved_jars(settings, "/elsewhere/x.jar") == []
    assert resolved_jars(settings) is None


def test_no_recorded_jars_without_packages(ivy):
    settings, jars = ivy
    record_resolved_jars(settings, ",".join(map(str, jars)))
    assert resolved_jars({k: v for k, v in settings.items() if k != "spark.jars.packages"}) is None


# --- conf/llog.example.toml ----------------------------------------------------------------------


def test_llog_example_is_generated_from_config():
    """Fails when llog/config.py changed and the example was not generated again:
    ``python -m llog.config example > conf/llog.example.toml``."""
    assert (CONF / "llog.example.toml").read_text() == example_toml()


def test_llog_example_command():
    out = subprocess.run([sys.executable, "-m", "llog.config", "example"], cwd=CHECKOUT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == (CONF / "llog.example.toml").read_text()
