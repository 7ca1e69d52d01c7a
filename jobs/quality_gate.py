"""The data-quality gate of the llog -> Delta job: a great-expectations suite, translated to Spark
SQL and evaluated in one pass over each micro-batch, splits the batch into the rows that pass (for
the table) and the rows that fail (for the quarantine table, with the names of the expectations
they failed).

The suite is a GX expectation suite file (``ExpectationSuite.to_json_dict()``, as
``conf/expectations/events.json``), loaded and checked with GX's own API: it stays the definition
of the checks. Its expectations see the micro-batch's columns (those of
``readStream.format("llog")``: ``key``, ``value``, ``topic``, ``partition``, ``offset``,
``timestamp``, ``timestampType``, ``headers``) plus:

- ``batch_timestamp``: the micro-batch's time (Spark's ``current_timestamp()`` in the streaming
  plan, kept in the checkpoint's offset log, so a replayed batch sees the same value and splits
  the same way; "not in the future" is ``ts <= batch_timestamp``);
- the suite's own derived columns, Spark SQL expressions in its ``meta``::

      "meta": {"llog": {"columns": {"ts": "try_to_timestamp(get_json_object(CAST(value AS STRING), '$.ts'))"}}}

  Derived columns exist only for validation; the table and the quarantine get the batch's rows.

How each expectation is evaluated: GX's Spark engine computes each metric of each expectation
with Spark jobs of its own, and cost six times the rest of the batch (``python -m bench gate``:
10.7 s against 1.6 s a batch of 50,000). So each expectation is translated (:data:`TRANSLATED`)
into per-row Spark SQL after GX's own Spark metric for its type: which rows it checks (a
column-map expectation skips rows whose column is null, but ``..._to_not_be_null``; a pair
expectation skips rows as its ``ignore_row_if`` says) and which of those are unexpected (JSON:
GX's own ``json.loads`` test, in an Arrow UDF). :meth:`QualityGate.marked` evaluates every
expectation once a row (the job persists the result), and :meth:`QualityGate.counts` takes every
expectation's counts in one aggregate over it. GX itself runs only in the tests, which check that
the translation gives GX's verdicts, row by row and count by count, on good, bad, mixed and empty
batches (``tests/integration/test_gate_translation.py``). An expectation type or argument not
translated is a :class:`QualityGateError` naming it when the suite is loaded.

Which rows fail: a column-map or column-pair-map expectation's unexpected rows fail it, whatever
its ``mostly``; its ``success`` is GX's (the share of checked rows that are expected is at least
``mostly``; true when no row is checked). ``--on-failure fail`` stops the query instead, before
anything of the batch is written, when an expectation's result is a failure, naming it.

Every batch's result is one row per expectation (its name, success, rows checked, unexpected
rows) in :data:`RESULT_SCHEMA`, logged and appended to the results table.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("llog.quality_gate")

#: Columns a suite's expectations may use besides the batch's and its derived ones.
BATCH_TIMESTAMP = "batch_timestamp"
#: The quarantine table's columns besides the batch's: the names of the expectations a row
#: failed (sorted) and the micro-batch it came in.
FAILED_EXPECTATIONS, BATCH_ID = "failed_expectations", "batch_id"
#: Columns that identify a record of the batch (GX's ``unexpected_index_column_names``).
RECORD_ID = ("topic", "partition", "offset")
ON_FAILURE = ("quarantine", "fail")
RESULT_SCHEMA = ("batch_id long, batch_timestamp timestamp, suite string, expectation string, type string, "
                 "success boolean, element_count long, unexpected_count long")


class QualityGateError(ValueError):
    """The suite file cannot be used: unreadable, not a GX suite, or a derived column is bad."""


class ExpectationsFailed(RuntimeError):
    """``--on-failure fail``: a batch failed expectations; nothing of it was written."""

    def __init__(self, batch_id: int, failed: list["ExpectationResult"]):
        self.batch_id, self.failed = batch_id, failed
        super().__init__(f"batch {batch_id} failed the data-quality gate: " + "; ".join(
            f"{r.expectation} ({r.unexpected_count} of {r.element_count} row(s) unexpected)"
            if r.unexpected_count is not None else f"{r.expectation} (failed)" for r in failed)
            + " (--on-failure fail: nothing of the batch was written)")


@dataclass(frozen=True)
class ExpectationResult:
    expectation: str
    type: str
    success: bool
    element_count: int | None
    unexpected_count: int | None
    #: The failing rows as ``(topic, partition, offset)``; None for an expectation about the
    #: whole batch (it names no rows).
    failed_rows: list[tuple] | None = field(default=None, repr=False)


def expectation_name(config) -> str:
    """An expectation's name in the quarantine and the results: its ``meta["name"]``, else its
    type and columns, like ``expect_column_values_to_not_be_null(ts)``."""
    name = (config.meta or {}).get("name")
    if name:
        return str(name)
    kwargs = config.kwargs
    columns = [kwargs[k] for k in ("column", "column_A", "column_B") if kwargs.get(k)] + list(
        kwargs.get("column_list") or [])
    return f"{config.type}({', '.join(map(str, columns))})"


def load_suite(path: str | os.PathLike):
    """The GX suite in ``path`` (GX's JSON), checked by GX: a :class:`QualityGateError` names the
    file and the problem."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")  # no usage statistics: never phone home
    import great_expectations as gx

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise QualityGateError(f"expectation suite {path}: cannot read it as JSON: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("expectations"), list) or not data.get("name"):
        raise QualityGateError(f"expectation suite {path}: not a great-expectations suite (a JSON object with "
                               "'name' and a list of 'expectations')")
    try:
        suite = gx.ExpectationSuite(**data)
    except Exception as e:  # GX raises its own errors for unknown types and bad kwargs
        raise QualityGateError(f"expectation suite {path}: {type(e).__name__}: {e}") from None
    if not suite.expectations:
        raise QualityGateError(f"expectation suite {path} has no expectations")
    derived_columns(suite, path)
    return suite


def derived_columns(suite, path: str | os.PathLike = "") -> dict[str, str]:
    """The suite's derived columns (``meta.llog.columns``): name -> Spark SQL expression."""
    columns = ((suite.meta or {}).get("llog") or {}).get("columns") or {}
    if not isinstance(columns, dict) or not all(isinstance(k, str) and isinstance(v, str) and v.strip()
                                                for k, v in columns.items()):
        raise QualityGateError(f"expectation suite {path}: meta.llog.columns must map column names to Spark SQL "
                               "expressions")
    return columns


#: Every ``ignore_row_if`` of a pair expectation: the rows it checks, as Spark SQL over ``A`` and
#: ``B`` (GX's ``column_pair`` map condition: a row whose values are both, or either, missing is skipped).
_PAIR_ROWS = {"both_values_are_missing": "NOT ({A} IS NULL AND {B} IS NULL)",
              "either_value_is_missing": "({A} IS NOT NULL AND {B} IS NOT NULL)",
              "neither": "TRUE"}


@dataclass(frozen=True)
class Check:
    """One expectation as Spark SQL over a batch's row: ``checked`` selects the rows it applies
    to, ``unexpected`` is true for a checked row that fails it (null counts as expected, as
    GX's Spark filter drops a null condition)."""

    name: str
    type: str
    checked: str
    unexpected: str
    mostly: float = 1.0


#: The SQL function :func:`register_functions` adds: whether a string is JSON to ``json.loads``.
JSON_LOADS = "llog_gate_json_loads_ok"


def _json_loads_ok(texts):
    """GX's ``is_json`` over an Arrow array of strings (bytes not UTF-8 replaced, as Spark's
    Python UDFs see them)."""
    import pyarrow as pa

    def ok(raw):
        if raw is None:
            return None
        try:
            json.loads(raw.decode("utf-8", "replace"))
            return True
        except Exception:  # GX's is_json: anything json.loads raises is "not JSON"
            return False
    return pa.array([ok(raw) for raw in texts.cast(pa.binary()).to_pylist()], pa.bool_())


def register_functions(spark) -> None:
    """The SQL functions the translated expectations call, on ``spark``'s session."""
    from pyspark.sql.functions import arrow_udf

    spark.udf.register(JSON_LOADS, arrow_udf(_json_loads_ok, "boolean"))


def _quoted(column: str) -> str:
    return "`" + column.replace("`", "``") + "`"


def _column_map(kwargs: dict, check_nulls: bool, expected: str) -> tuple[str, str]:
    column = _quoted(kwargs["column"])
    return ("TRUE" if check_nulls else f"{column} IS NOT NULL"), f"NOT coalesce({expected.format(c=column)}, TRUE)"


def _pair(kwargs: dict) -> tuple[str, str]:
    a, b = _quoted(kwargs["column_A"]), _quoted(kwargs["column_B"])
    ignore = kwargs.get("ignore_row_if", "both_values_are_missing")
    if ignore not in _PAIR_ROWS:
        raise ValueError(f"ignore_row_if {ignore!r} (translated: {', '.join(_PAIR_ROWS)})")
    # GX's Spark metric: A > B, or with or_equal (A >= B) | A.eqNullSafe(B).
    expected = f"({a} >= {b} OR {a} <=> {b})" if kwargs.get("or_equal") else f"({a} > {b})"
    return _PAIR_ROWS[ignore].format(A=a, B=b), f"NOT coalesce({expected}, TRUE)"


#: The expectation types the gate evaluates in Spark SQL: type -> (the kwargs it understands,
#: kwargs -> (checked rows, unexpected row)), each after GX's Spark metric of the type
#: (``great_expectations/expectations/metrics``). ``expect_column_values_to_be_json_parseable``
#: is GX's test too, Python's ``json.loads``, in a vectorized (Arrow) UDF: Spark's own
#: ``try_parse_json`` disagrees with it both ways (it accepts ``{"a": 1} x``, refuses ``NaN``,
#: duplicate keys and lone surrogates).
TRANSLATED = {
    "expect_column_values_to_not_be_null": (
        {"column", "mostly"}, lambda kw: ("TRUE", f"{_quoted(kw['column'])} IS NULL")),
    "expect_column_values_to_be_null": (
        {"column", "mostly"}, lambda kw: ("TRUE", f"{_quoted(kw['column'])} IS NOT NULL")),
    "expect_column_values_to_be_json_parseable": (
        {"column", "mostly"}, lambda kw: _column_map(kw, False, JSON_LOADS + "({c})")),
    "expect_column_pair_values_a_to_be_greater_than_b": (
        {"column_A", "column_B", "or_equal", "ignore_row_if", "mostly"}, _pair),
}


def translate(suite, path: str | os.PathLike = "") -> list[Check]:
    """The suite's expectations as :class:`Check`\\ s, in its order; a :class:`QualityGateError`
    names an expectation whose type or argument is not translated."""
    checks = []
    for expectation in suite.expectations:
        config = expectation.configuration
        name = expectation_name(config)
        if config.type not in TRANSLATED:
            raise QualityGateError(f"expectation suite {path}: expectation {name} is of type {config.type}, which the "
                                   f"gate does not evaluate (translated types: {', '.join(sorted(TRANSLATED))})")
        understood, sql = TRANSLATED[config.type]
        kwargs = {k: v for k, v in config.kwargs.items() if v is not None}
        unknown = sorted(set(kwargs) - understood)
        if unknown:
            raise QualityGateError(f"expectation suite {path}: expectation {name} ({config.type}) has argument(s) "
                                   f"{', '.join(unknown)}, which the gate does not evaluate (it understands "
                                   f"{', '.join(sorted(understood))})")
        try:
            checked, unexpected = sql(kwargs)
        except ValueError as e:
            raise QualityGateError(f"expectation suite {path}: expectation {name} ({config.type}): {e}") from None
        mostly = float(kwargs.get("mostly", 1.0))
        checks.append(Check(name, config.type, checked, unexpected, mostly))
    return checks


def _success(checked: int, unexpected: int, mostly: float) -> bool:
    """GX's ``mostly`` rule: true when no row is checked, else the share expected >= ``mostly``."""
    return checked == 0 or (checked - unexpected) / checked >= mostly


class QualityGate:
    """Validates micro-batches against one suite, in Spark SQL (module doc)."""

    def __init__(self, suite_path: str | os.PathLike, on_failure: str = "quarantine"):
        if on_failure not in ON_FAILURE:
            raise QualityGateError(f"on_failure {on_failure!r}: expected one of {', '.join(ON_FAILURE)}")
        self.suite_path = str(suite_path)
        self.suite = load_suite(suite_path)
        self.on_failure = on_failure
        self.columns = derived_columns(self.suite, suite_path)
        self.checks = translate(self.suite, suite_path)
        self._functions_in = None  # the session register_functions last ran in
        self._batch_definition = None

    @property
    def name(self) -> str:
        return self.suite.name

    def _with_columns(self, batch):
        from pyspark.sql import functions as F

        return batch.select("*", *(F.expr(sql).alias(name) for name, sql in self.columns.items()))

    def marked(self, batch):
        """``batch`` with :data:`FAILED_EXPECTATIONS` (the names of the expectations a row
        failed, sorted; empty for a row that passes) and, for each check, whether it checked the
        row and whether the row is unexpected (``_gate_checked_<i>``, ``_gate_unexpected_<i>``:
        :meth:`counts` adds them up). Persist it: every expectation is evaluated once a row."""
        from pyspark.sql import functions as F

        if self._functions_in is not batch.sparkSession:
            register_functions(batch.sparkSession)
            self._functions_in = batch.sparkSession
        flags = [F.expr(c.checked).alias(f"_gate_checked_{i}") for i, c in enumerate(self.checks)]
        flags += [F.expr(f"({c.checked}) AND coalesce({c.unexpected}, FALSE)").alias(f"_gate_unexpected_{i}")
                  for i, c in enumerate(self.checks)]
        frame = self._with_columns(batch).select(*batch.columns, *flags)
        names = F.array(*(F.when(F.col(f"_gate_unexpected_{i}"), F.lit(c.name)) for i, c in enumerate(self.checks)))
        # sort_array and array_compact, not array_sort and filter: no lambda evaluated per row.
        return frame.withColumn(FAILED_EXPECTATIONS, F.sort_array(F.array_compact(names)))

    def _flags(self) -> list[str]:
        return [f"_gate_{kind}_{i}" for kind in ("checked", "unexpected") for i in range(len(self.checks))]

    def split(self, marked, batch_id: int):
        """``(passed, quarantined)`` of a :meth:`marked` batch: the rows that pass every
        expectation (the batch's columns), and the rows that fail one, with
        :data:`FAILED_EXPECTATIONS` and :data:`BATCH_ID`."""
        from pyspark.sql import functions as F

        marked = marked.drop(*self._flags())
        passed = marked.where(F.size(FAILED_EXPECTATIONS) == 0).drop(FAILED_EXPECTATIONS)
        quarantined = marked.where(F.size(FAILED_EXPECTATIONS) > 0).withColumn(BATCH_ID, F.lit(batch_id).cast("long"))
        return passed, quarantined

    def counts(self, marked, *also) -> tuple[list[ExpectationResult], list]:
        """Every expectation's result on a :meth:`marked` batch, and the values of the aggregate
        columns ``also``, from one aggregate over it."""
        from pyspark.sql import functions as F

        n = len(self.checks)
        row = marked.agg(F.count(F.lit(1)), *(F.count_if(F.col(flag)) for flag in self._flags()), *also).first()
        total, checked, unexpected = row[0], row[1:1 + n], row[1 + n:1 + 2 * n]
        # On an empty batch GX reports no unexpected count for a column-map expectation (0 for a pair).
        results = [ExpectationResult(c.name, c.type, _success(checked[i], unexpected[i], c.mostly), total,
                                     None if not total and c.type.startswith("expect_column_values_")
                                     else unexpected[i]) for i, c in enumerate(self.checks)]
        return results, list(row[1 + 2 * n:])

    def validate(self, batch) -> list[ExpectationResult]:
        """Every expectation's result on ``batch``."""
        return self.counts(self.marked(batch))[0]

    def report(self, batch_id: int, results: list[ExpectationResult]) -> None:
        """Log the batch's results; under ``on_failure="fail"`` raise :class:`ExpectationsFailed`
        when an expectation failed."""
        for r in results:
            log.info("batch %d, suite %s: %s %s (%s of %s row(s) unexpected)", batch_id, self.suite.name,
                     r.expectation, "passed" if r.success else "FAILED", r.unexpected_count, r.element_count)
        failed = [r for r in results if not r.success]
        if failed and self.on_failure == "fail":
            raise ExpectationsFailed(batch_id, failed)

    def result_rows(self, batch_id: int, batch_timestamp, results: list[ExpectationResult]) -> list[tuple[Any, ...]]:
        return [(batch_id, batch_timestamp, self.suite.name, r.expectation, r.type, r.success, r.element_count,
                 r.unexpected_count) for r in results]

    # --- GX's own verdict (the tests compare the translation with it) -----------------------

    def _batches(self):
        """GX's Spark data source for in-memory DataFrames (an ephemeral context; no files)."""
        if self._batch_definition is None:
            import great_expectations as gx
            from great_expectations.data_context.types.base import ProgressBarsConfig

            context = gx.get_context(mode="ephemeral")
            context.variables.progress_bars = ProgressBarsConfig(globally=False)
            self.suite = context.suites.add(self.suite)
            asset = context.data_sources.add_spark(name="llog").add_dataframe_asset(name="micro_batch")
            self._batch_definition = asset.add_batch_definition_whole_dataframe("whole micro-batch")
        return self._batch_definition

    def validate_with_gx(self, batch) -> list[ExpectationResult]:
        """Run the suite on ``batch`` (with its derived columns) through GX's Spark engine, its
        unexpected rows named by :data:`RECORD_ID`."""
        gx_batch = self._batches().get_batch(batch_parameters={"dataframe": self._with_columns(batch)})
        outcome = gx_batch.validate(self.suite, result_format={
            "result_format": "COMPLETE", "unexpected_index_column_names": list(RECORD_ID),
            "exclude_unexpected_values": True, "return_unexpected_index_query": False})
        return [self._gx_result(r) for r in outcome.results]

    def _gx_result(self, r) -> ExpectationResult:
        config, result = r.expectation_config, r.result or {}
        if r.exception_info and r.exception_info.get("raised_exception"):
            raise QualityGateError(f"expectation {expectation_name(config)} of suite {self.suite.name!r} could not "
                                   f"run: {r.exception_info.get('exception_message')}")
        index = result.get("unexpected_index_list")
        return ExpectationResult(expectation_name(config), config.type, bool(r.success), result.get("element_count"),
                                 result.get("unexpected_count"), None if index is None else _row_ids(index))


def _row_ids(index: list[dict]) -> list[tuple]:
    """GX's ``unexpected_index_list`` as ``(topic, partition, offset)`` tuples: one dict of
    columns (``exclude_unexpected_values``) or one dict per row."""
    rows = []
    for item in index:
        if isinstance(item.get(RECORD_ID[0]), list):
            rows += zip(*(item[c] for c in RECORD_ID))
        else:
            rows.append(tuple(item[c] for c in RECORD_ID))
    return rows
