"""databricks.yml: every task's entry file exists, and its entry point's argparse accepts exactly
the parameters the bundle gives it (bundle variables replaced by their defaults, else by dummy
values)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from compaction_job import job as compaction_job
from jobs import llog_to_delta

REPO = Path(__file__).resolve().parents[2]
BUNDLE = yaml.safe_load((REPO / "databricks.yml").read_text())
#: The entry file of each Python task, and the parser builder of its module.
PARSERS = {
    "compaction_job/main.py": compaction_job.build_parser,
    "jobs/llog_to_delta.py": llog_to_delta.build_parser,
}
_VARIABLE = re.compile(r"\$\{var\.([A-Za-z0-9_]+)\}")


def _substitute(text: str, values: dict[str, str]) -> str:
    def value(match: re.Match) -> str:
        name = match.group(1)
        assert name in BUNDLE["variables"], f"${{var.{name}}} is not a bundle variable"
        return values.get(name, f"dummy-{name}")

    return _VARIABLE.sub(value, str(text))


DEFAULTS = {name: str(v["default"]) for name, v in BUNDLE["variables"].items() if "default" in v}
TASKS = [(job_key, task) for job_key, job in BUNDLE["resources"]["jobs"].items() for task in job["tasks"]]


def test_bundle_has_the_jobs_and_targets():
    assert BUNDLE["bundle"]["name"]
    assert set(BUNDLE["targets"]) >= {"dev", "prod"}
    assert BUNDLE["targets"]["dev"]["mode"] == "development" and BUNDLE["targets"]["prod"]["mode"] == "production"
    jobs = BUNDLE["resources"]["jobs"]
    compaction, to_delta = jobs["llog_compaction"], jobs["llog_to_delta"]
    assert compaction["schedule"]["quartz_cron_expression"] == "${var.compaction_cron}"
    assert DEFAULTS["compaction_cron"] == "0 0/5 * * * ?"
    assert compaction["max_concurrent_runs"] == 1
    assert to_delta["continuous"]["pause_status"] == "UNPAUSED" and "schedule" not in to_delta
    params = to_delta["tasks"][0]["spark_python_task"]["parameters"]
    assert params[params.index("--trigger") + 1].startswith("processing-time=")


@pytest.mark.parametrize("job_key,task", TASKS, ids=[f"{j}.{t['task_key']}" for j, t in TASKS])
def test_task_entry_file_exists_and_accepts_its_parameters(job_key, task):
    python_task = task["spark_python_task"]
    entry = python_task["python_file"].removeprefix("./")
    assert (REPO / entry).is_file(), f"{job_key}: {entry} does not exist"
    assert entry in PARSERS, f"{job_key}: no parser known for {entry}"
    params = [_substitute(p, DEFAULTS) for p in python_task.get("parameters", [])]
    assert not any("${" in p for p in params), params
    PARSERS[entry]().parse_args(params)  # argparse exits (SystemExit) on anything it does not accept
    if entry == "jobs/llog_to_delta.py":
        llog_to_delta.parse_trigger(params[params.index("--trigger") + 1])


@pytest.mark.parametrize("job_key,task", TASKS, ids=[f"{j}.{t['task_key']}" for j, t in TASKS])
def test_task_cluster_gets_the_connection_settings(job_key, task):
    job = BUNDLE["resources"]["jobs"][job_key]
    [cluster] = [c for c in job["job_clusters"] if c["job_cluster_key"] == task["job_cluster_key"]]
    env = cluster["new_cluster"]["spark_env_vars"]
    for name in ("LLOG_OXIA_SERVICE_ADDRESS", "LLOG_S3_BUCKET", "LLOG_S3_ENDPOINT_URL", "LLOG_ROOT_PREFIX",
                 "LLOG_GC_GRACE_MS"):
        assert _VARIABLE.fullmatch(str(env[name])), f"{job_key}: {name} is not set from a bundle variable"
    assert any(str(lib.get("whl", "")).startswith("./dist/") for lib in task["libraries"])


def test_bundle_variables_are_all_used():
    text = (REPO / "databricks.yml").read_text()
    used = set(_VARIABLE.findall(text))
    assert set(BUNDLE["variables"]) <= used, set(BUNDLE["variables"]) - used


def test_compaction_parameters_are_valid_options():
    [(_, task)] = [(j, t) for j, t in TASKS if j == "llog_compaction"]
    params = [_substitute(p, DEFAULTS) for p in task["spark_python_task"]["parameters"]]
    args = compaction_job.build_parser().parse_args(params)
    assert args.gc and args.max_runtime == float(DEFAULTS["compaction_max_runtime_s"])
    assert args.max_runtime < 300, "the compaction job should stop starting compactions before the next run"
