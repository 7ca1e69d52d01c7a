"""The quality gate's Spark SQL translation of a great-expectations suite (jobs/quality_gate.py)
gives GX's own verdict: for every expectation type and argument it translates, on good batches,
on batches where each expectation fails alone, on mixed ones and on an empty one, the same rows
fail the same expectations, and each expectation's success and counts are GX's."""

from __future__ import annotations

import json
import re
from datetime import datetime

import pytest

from jobs.local_spark import local_spark
from jobs.quality_gate import FAILED_EXPECTATIONS, RECORD_ID, QualityGate, QualityGateError
from tests.integration.test_quality_gate import BAD, SUITE

ROWS = "topic string, partition int, offset long, key binary, value binary, batch_timestamp timestamp"
NOW = datetime(2026, 6, 1)
GOOD = [json.dumps({"seq": i, "ts": "2026-01-01 00:00:00", "limit": i - 1}).encode() for i in range(12)]
#: Texts where Spark's own JSON parser and Python's json.loads (GX's test) disagree, and JSON
#: null: the gate must follow json.loads.
JSON_EDGES = [b"NaN", b"-Infinity", b'{"a": 1, "a": 2}', b'{"a": 1} x', b'"\\ud800"', b"null", b"",
              b'{"seq": 3, "ts": "2026-01-01 00:00:00"} trailing', b'[1, 2', b"  7  "]
#: A suite using every translated type and argument (the demo's uses only some).
OTHER_SUITE = {
    "name": "every-type",
    "expectations": [
        {"type": "expect_column_values_to_be_null", "kwargs": {"column": "key"}, "meta": {"name": "no_key"}},
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "seq", "mostly": 0.75},
         "meta": {"name": "seq_mostly"}},
        {"type": "expect_column_values_to_be_json_parseable", "kwargs": {"column": "value_text", "mostly": 0.9},
         "meta": {"name": "json_mostly"}},
        {"type": "expect_column_pair_values_a_to_be_greater_than_b",
         "kwargs": {"column_A": "seq", "column_B": "limit", "ignore_row_if": "either_value_is_missing"},
         "meta": {"name": "seq_above_limit_either"}},
        {"type": "expect_column_pair_values_a_to_be_greater_than_b",
         "kwargs": {"column_A": "seq", "column_B": "limit", "ignore_row_if": "neither", "or_equal": True}},
        {"type": "expect_column_pair_values_a_to_be_greater_than_b",
         "kwargs": {"column_A": "seq", "column_B": "limit", "mostly": 0.5}, "meta": {"name": "seq_above_both"}},
    ],
    "meta": {"llog": {"columns": {
        "value_text": "CAST(value AS STRING)",
        "seq": "try_cast(get_json_object(CAST(value AS STRING), '$.seq') AS BIGINT)",
        "limit": "try_cast(get_json_object(CAST(value AS STRING), '$.limit') AS BIGINT)",
    }}},
}
OTHER_BAD = [b'{"seq": 1, "limit": 5}', b'{"seq": 5, "limit": 5}', b'{"limit": 5}', b'{"seq": 5}', b"{}",
             b'{"seq": "x", "limit": "y"}']


@pytest.fixture(scope="module")
def spark():
    session = local_spark("gate-translation-tests")
    yield session
    session.stop()


def _batch(spark, values: list[bytes | None], keys: list[bytes | None] | None = None):
    keys = keys or [None] * len(values)
    return spark.createDataFrame([("t", i % 3, i, k, v, NOW) for i, (k, v) in enumerate(zip(keys, values))], ROWS)


def _assert_agrees(gate: QualityGate, batch) -> dict[str, set]:
    """The translation's verdict on ``batch`` is GX's; returns the failing rows per expectation."""
    ours = gate.counts(gate.marked(batch))[0]
    theirs = gate.validate_with_gx(batch)
    assert [(r.expectation, r.success, r.element_count, r.unexpected_count) for r in ours] == \
        [(r.expectation, r.success, r.element_count, r.unexpected_count) for r in theirs]
    failing = {r.expectation: set() for r in ours}
    for row in gate.marked(batch).where(f"size({FAILED_EXPECTATIONS}) > 0").collect():
        for name in row[FAILED_EXPECTATIONS]:
            failing[name].add(tuple(row[c] for c in RECORD_ID))
    assert failing == {r.expectation: set(r.failed_rows or ()) for r in theirs}
    return failing


def test_the_demo_suite_agrees_with_gx_on_good_bad_mixed_and_empty_batches(spark):
    gate = QualityGate(SUITE)
    assert not any(_assert_agrees(gate, _batch(spark, GOOD)).values())
    for bad, names in BAD.items():  # each bad kind alone fails exactly its expectations
        failing = _assert_agrees(gate, _batch(spark, GOOD + [bad]))
        assert {name for name, rows in failing.items() if rows} == set(names), bad
    _assert_agrees(gate, _batch(spark, GOOD + list(BAD) + JSON_EDGES + [None]))
    assert not any(_assert_agrees(gate, _batch(spark, [])).values())


def test_every_translated_type_and_argument_agrees_with_gx(spark, tmp_path):
    path = tmp_path / "suite.json"
    path.write_text(json.dumps(OTHER_SUITE))
    gate = QualityGate(path)
    assert {c.type for c in gate.checks} == {
        "expect_column_values_to_be_null", "expect_column_values_to_not_be_null",
        "expect_column_values_to_be_json_parseable", "expect_column_pair_values_a_to_be_greater_than_b"}
    _assert_agrees(gate, _batch(spark, GOOD))
    for bad in OTHER_BAD + JSON_EDGES:  # alone: under some expectations' mostly, over others'
        _assert_agrees(gate, _batch(spark, GOOD[:3] + [bad]))
    _assert_agrees(gate, _batch(spark, GOOD + OTHER_BAD + JSON_EDGES + [None], [b"k"] + [None] * 40))
    _assert_agrees(gate, _batch(spark, OTHER_BAD))


@pytest.mark.parametrize("expectation, problem", [
    ({"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "seq", "value_set": [1]}},
     "expect_column_values_to_be_in_set, which the gate does not evaluate"),
    ({"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "seq", "row_condition": "seq>1",
                                                                "condition_parser": "spark"}},
     "argument(s) condition_parser, row_condition, which the gate does not evaluate"),
])
def test_an_expectation_not_translated_is_named_when_the_suite_loads(tmp_path, expectation, problem):
    path = tmp_path / "suite.json"
    path.write_text(json.dumps({**OTHER_SUITE, "expectations": [expectation]}))
    with pytest.raises(QualityGateError, match=re.escape(problem)):
        QualityGate(path)


def test_a_value_that_is_not_utf8_is_not_json_where_gx_fails(spark):
    """GX's JSON UDF raises on a value that is not UTF-8 (Spark hands it over through Arrow); the
    gate decodes it as Spark's Python UDFs did (invalid bytes replaced): not JSON."""
    gate = QualityGate(SUITE)
    batch = _batch(spark, GOOD + [b"\xff\xfe{", b'{"seq": 1, "ts": "2026-01-01 00:00:00", "x": "\xff"}'])
    failed = {r["offset"]: r[FAILED_EXPECTATIONS] for r in gate.marked(batch).collect()}
    assert failed[len(GOOD)] == ["seq_is_an_integer", "ts_is_a_timestamp", "value_is_json"]
    assert all(not names for offset, names in failed.items() if offset != len(GOOD))
