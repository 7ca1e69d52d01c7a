"""databricks.yml: every Python task's entry file exists, and its entry point's argparse accepts
exactly the parameters the bundle gives it (bundle variables replaced by their defaults, else by
dummy values); every notebook task's notebook exists; the wheel is built with ``build``."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
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
ALL_TASKS = [(job_key, task) for job_key, job in BUNDLE["resources"]["jobs"].items() for task in job["tasks"]]
TASKS = [(job_key, task) for job_key, task in ALL_TASKS if "spark_python_task" in task]
NOTEBOOK_TASKS = [(job_key, task) for job_key, task in ALL_TASKS if "notebook_task" in task]
#: The notebooks the bundle deploys (notebooks/, executed by tests/integration/test_notebooks.py).
NOTEBOOKS = {"notebooks/quickstart.ipynb", "notebooks/operations.ipynb"}


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
    notebooks = jobs["llog_notebooks"]
    assert not {"schedule", "continuous", "trigger"} & set(notebooks), "the notebooks job runs on demand only"


def test_every_task_is_a_python_or_a_notebook_task():
    """Each is checked by the tests of its kind; a task of another kind (or of both) would go unchecked."""
    assert len(TASKS) + len(NOTEBOOK_TASKS) == len(ALL_TASKS)


def test_notebook_tasks_run_the_committed_notebooks():
    paths = [task["notebook_task"]["notebook_path"].removeprefix("./") for _, task in NOTEBOOK_TASKS]
    assert sorted(paths) == sorted(NOTEBOOKS)
    assert {job_key for job_key, _ in NOTEBOOK_TASKS} == {"llog_notebooks"}
    for path in paths:
        assert (REPO / path).is_file(), f"{path} does not exist"
        nbformat.validate(nbformat.read(REPO / path, as_version=4))
    [cluster] = BUNDLE["resources"]["jobs"]["llog_notebooks"]["job_clusters"]
    env = cluster["new_cluster"]["spark_env_vars"]
    assert env["LLOG_NOTEBOOK_DIR"] == "${var.notebook_dir}"  # the quickstart's Delta table and checkpoints


def test_wheel_is_built_with_build():
    [artifact] = BUNDLE["artifacts"].values()
    assert artifact["type"] == "whl" and artifact["path"] == "."
    assert artifact["build"] == "python3 -m build --wheel --outdir dist ."


def test_llog_to_delta_gets_great_expectations_as_pinned_in_setup_py():
    [pin] = re.findall(r'"(great-expectations==[^"]+)"', (REPO / "setup.py").read_text())
    [task] = BUNDLE["resources"]["jobs"]["llog_to_delta"]["tasks"]
    assert {"pypi": {"package": pin}} in task["libraries"]


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


@pytest.mark.parametrize("job_key,task", ALL_TASKS, ids=[f"{j}.{t['task_key']}" for j, t in ALL_TASKS])
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
