"""The suites in conf/expectations/ are great-expectations suites, in GX's own JSON (loaded and
written back by GX's API unchanged), and the gate's errors name the file and the problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.llog_to_delta import Job, main
from jobs.quality_gate import QualityGateError, derived_columns, expectation_name, load_suite

SUITES = sorted((Path(__file__).resolve().parents[2] / "conf" / "expectations").glob("*.json"))


def test_there_is_a_suite():
    assert [p.name for p in SUITES] == ["events.json"]


@pytest.mark.parametrize("path", SUITES, ids=lambda p: p.name)
def test_each_suite_is_gx_json_that_gx_writes_back_unchanged(path):
    suite = load_suite(path)
    assert suite.to_json_dict() == json.loads(path.read_text())
    assert derived_columns(suite)
    names = [expectation_name(e.configuration) for e in suite.expectations]
    assert len(set(names)) == len(names)  # the quarantine tells them apart


def test_bad_suites_are_named(tmp_path):
    cases = {
        "not-json.json": ("{", "cannot read it as JSON"),
        "no-expectations.json": ('{"name": "x", "expectations": []}', "has no expectations"),
        "not-a-suite.json": ('[1, 2]', "not a great-expectations suite"),
        "unknown.json": ('{"name": "x", "expectations": [{"type": "expect_magic", "kwargs": {}}]}', "unknown.json"),
        "columns.json": (json.dumps({"name": "x", "meta": {"llog": {"columns": {"a": ""}}}, "expectations": [
            {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "a"}}]}), "meta.llog.columns"),
    }
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(QualityGateError, match=message):
            load_suite(tmp_path / name)
    with pytest.raises(QualityGateError, match="cannot read"):
        load_suite(tmp_path / "absent.json")


def test_gate_options_are_checked():
    with pytest.raises(ValueError, match="needs a quarantine"):
        Job(table="t", checkpoint="c", topics="a", expectations="s.json")
    with pytest.raises(ValueError, match="need expectations"):
        Job(table="t", checkpoint="c", topics="a", quarantine="q")
    assert Job(table="t", checkpoint="c", topics="a", expectations="s.json", quarantine="q/").results_table == "q_results"
    assert Job(table="t", checkpoint="c", topics="a", expectations="s.json", on_failure="fail").results_table == \
        "t_quality_results"
    for argv in (["--expectations", "/nonexistent.json", "--quarantine", "q"],
                 ["--quarantine", "q"],
                 ["--expectations", str(SUITES[0])],
                 ["--expectations", str(SUITES[0]), "--quarantine", "q", "--on-failure", "maybe"]):
        with pytest.raises(SystemExit) as exit_:
            main(["--topics", "a", "--table", "t", "--checkpoint", "c", *argv])
        assert exit_.value.code == 2
