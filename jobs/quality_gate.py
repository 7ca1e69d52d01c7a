"""The data-quality gate of the llog -> Delta job: a great-expectations suite, run by GX's Spark
execution engine on each micro-batch, splits the batch into the rows that pass (for the table)
and the rows that fail (for the quarantine table, with the names of the expectations they failed).

The suite is a GX expectation suite file (``ExpectationSuite.to_json_dict()``, as
``conf/expectations/events.json``), loaded and checked with GX's own API. Its expectations see
the micro-batch's columns (those of ``readStream.format("llog")``: ``key``, ``value``,
``topic``, ``partition``, ``offset``, ``timestamp``, ``timestampType``, ``headers``) plus:

- ``batch_timestamp``: the micro-batch's time (Spark's ``current_timestamp()`` in the streaming
  plan, kept in the checkpoint's offset log, so a replayed batch sees the same value and splits
  the same way; "not in the future" is ``ts <= batch_timestamp``);
- the suite's own derived columns, Spark SQL expressions in its ``meta``::

      "meta": {"llog": {"columns": {"ts": "try_to_timestamp(get_json_object(CAST(value AS STRING), '$.ts'))"}}}

  Derived columns exist only for validation; the table and the quarantine get the batch's rows.

Which rows fail: a column-map expectation (``expect_column_values_to_...``) names its
unexpected rows (GX's ``unexpected_index_list`` over ``topic, partition, offset``, which
identify a record); those rows fail it, whatever its ``mostly``. An expectation about the whole
batch (a row count, a mean) names no rows: when it fails, every row of the batch fails it.
``--on-failure fail`` stops the query instead, before anything of the batch is written, when an
expectation's result is a failure (``mostly`` applies), naming the expectation.

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


class QualityGate:
    """Validates micro-batches against one suite, in this (the driver's) process."""

    def __init__(self, suite_path: str | os.PathLike, on_failure: str = "quarantine"):
        if on_failure not in ON_FAILURE:
            raise QualityGateError(f"on_failure {on_failure!r}: expected one of {', '.join(ON_FAILURE)}")
        self.suite_path = str(suite_path)
        self.suite = load_suite(suite_path)
        self.on_failure = on_failure
        self.columns = derived_columns(self.suite, suite_path)
        self._batch_definition = None

    @property
    def name(self) -> str:
        return self.suite.name

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

    def validate(self, batch) -> list[ExpectationResult]:
        """Run the suite on ``batch`` (with its derived columns) through GX's Spark engine."""
        from pyspark.sql import functions as F

        frame = batch.select("*", *(F.expr(sql).alias(name) for name, sql in self.columns.items()))
        gx_batch = self._batches().get_batch(batch_parameters={"dataframe": frame})
        outcome = gx_batch.validate(self.suite, result_format={
            "result_format": "COMPLETE", "unexpected_index_column_names": list(RECORD_ID),
            "exclude_unexpected_values": True, "return_unexpected_index_query": False})
        return [self._result(r) for r in outcome.results]

    def _result(self, r) -> ExpectationResult:
        config, result = r.expectation_config, r.result or {}
        if r.exception_info and r.exception_info.get("raised_exception"):
            raise QualityGateError(f"expectation {expectation_name(config)} of suite {self.suite.name!r} could not "
                                   f"run: {r.exception_info.get('exception_message')}")
        index = result.get("unexpected_index_list")
        return ExpectationResult(expectation_name(config), config.type, bool(r.success), result.get("element_count"),
                                 result.get("unexpected_count"), None if index is None else _row_ids(index))

    def split(self, batch, batch_id: int):
        """Validate ``batch``; return ``(passed, quarantined, results)``: the rows that pass every
        expectation, the rows that fail one (with :data:`FAILED_EXPECTATIONS` and
        :data:`BATCH_ID`), and one row per expectation (:data:`RESULT_SCHEMA`'s columns but the
        first two, which the caller adds). Raises :class:`ExpectationsFailed` under
        ``on_failure="fail"`` when an expectation failed."""
        from pyspark.sql import functions as F

        results = self.validate(batch)
        failed = [r for r in results if not r.success]
        if failed and self.on_failure == "fail":
            raise ExpectationsFailed(batch_id, failed)
        spark = batch.sparkSession
        per_row = [(*row, r.expectation) for r in results if r.failed_rows for row in r.failed_rows]
        whole_batch = sorted({r.expectation for r in failed if r.failed_rows is None})
        marked = batch
        if per_row:
            ids = (spark.createDataFrame(per_row, "topic string, partition int, offset long, expectation string")
                   .groupBy(*RECORD_ID).agg(F.collect_set("expectation").alias(FAILED_EXPECTATIONS)))
            marked = marked.join(F.broadcast(ids), list(RECORD_ID), "left")
        else:
            marked = marked.withColumn(FAILED_EXPECTATIONS, F.lit(None).cast("array<string>"))
        everything = F.array(*(F.lit(n) for n in whole_batch)) if whole_batch else F.array().cast("array<string>")
        marked = marked.withColumn(FAILED_EXPECTATIONS, F.array_sort(F.array_union(
            F.coalesce(F.col(FAILED_EXPECTATIONS), F.array().cast("array<string>")), everything)))
        passed = marked.where(F.size(FAILED_EXPECTATIONS) == 0).drop(FAILED_EXPECTATIONS).select(*batch.columns)
        quarantined = (marked.where(F.size(FAILED_EXPECTATIONS) > 0).select(*batch.columns, FAILED_EXPECTATIONS)
                       .withColumn(BATCH_ID, F.lit(batch_id).cast("long")))
        for r in results:
            log.info("batch %d, suite %s: %s %s (%s of %s row(s) unexpected)", batch_id, self.suite.name,
                     r.expectation, "passed" if r.success else "FAILED", r.unexpected_count, r.element_count)
        return passed, quarantined, results

    def result_rows(self, batch_id: int, batch_timestamp, results: list[ExpectationResult]) -> list[tuple[Any, ...]]:
        return [(batch_id, batch_timestamp, self.suite.name, r.expectation, r.type, r.success, r.element_count,
                 r.unexpected_count) for r in results]


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
