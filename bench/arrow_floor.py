"""The floor of a Python streaming source: ``format("llog_bench_arrow")`` reads nothing and
yields prebuilt Arrow batches of the llog source's schema, so that ``bench source`` and ``bench
kafka`` can show beside llog's read what Spark alone costs any Python source.

Spark starts the stream's planner, a new Python process, for every query, and that process
imports this module: so it imports only pyspark's data source classes, and a query's start-up
is as short as a Python source's can be. The batches' modules (pyarrow, numpy, llog's schema)
load in the tasks, whose Python workers a warm-up run starts.

Options: ``partitions``; ``splitRows``, the records of each task reading one partition,
comma-separated (the llog source's cut of a partition into tasks: ``bench.source.split_rows``);
``batchRows``, the records per Arrow batch (the llog source yields one per index entry slice);
``topic``, the ``topic`` column's value (default ``bench``; the topic llog's read names, whose
length Spark copies into every row).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

#: The llog source's columns (``llog_source.schema.SOURCE_SCHEMA``), written out rather than
#: imported (that module imports pyarrow); :func:`_batch` builds its batches with the Arrow form.
SCHEMA = "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp, timestampType int"
TOPIC = "bench"
VALUE_BYTES = 100

_prebuilt: dict = {}
_prebuilt_lock = threading.Lock()


@dataclass(frozen=True)
class _Part(InputPartition):
    partition: int
    count: int


def _batch(rows: int, topic: str = TOPIC):
    """A batch of the source's schema, built once per Python worker (the warm-up builds it)."""
    with _prebuilt_lock:
        batch = _prebuilt.get((rows, topic))
        if batch is None:
            import time

            import numpy as np
            import pyarrow as pa

            from bench.report import random_values
            from llog_source.schema import ARROW_SCHEMA, LOG_APPEND_TIME

            batch = _prebuilt[(rows, topic)] = pa.RecordBatch.from_arrays([
                pa.nulls(rows, pa.binary()),
                random_values(rows, VALUE_BYTES, rows),
                pa.array([topic] * rows, pa.string()),
                pa.array(np.zeros(rows, dtype=np.int32)),
                pa.array(np.arange(1, rows + 1, dtype=np.int64)),
                pa.array(np.full(rows, int(time.time() * 1e6), dtype=np.int64), pa.timestamp("us", tz="UTC")),
                pa.array(np.full(rows, LOG_APPEND_TIME, dtype=np.int32)),
            ], schema=ARROW_SCHEMA)
        return batch


class _ArrowStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, partitions: int, split_rows: list[int], batch_rows: int, topic: str):
        self.partitions_, self.split_rows, self.batch_rows, self.topic = partitions, split_rows, batch_rows, topic

    def initialOffset(self) -> dict:  # noqa: N802 - Spark's names
        return {"offset": 0}

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        pass  # the data is fixed: everything is available from the start

    def latestOffset(self, start: dict, limit) -> dict:  # noqa: N802
        return {"offset": 1}

    def partitions(self, start: dict, end: dict) -> list[_Part]:
        if start["offset"] >= end["offset"]:
            return []
        return [_Part(p, n) for p in range(self.partitions_) for n in self.split_rows]

    def read(self, partition: _Part):
        full, left = _batch(self.batch_rows, self.topic), partition.count
        while left:
            rows = min(left, self.batch_rows)
            yield full if rows == self.batch_rows else full.slice(0, rows)
            left -= rows

    def commit(self, end: dict) -> None:
        pass


class ArrowSource(DataSource):
    """The floor source; options ``partitions``, ``splitRows``, ``batchRows``, ``topic`` (module doc)."""

    @classmethod
    def name(cls) -> str:
        return "llog_bench_arrow"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema):  # noqa: N802
        return _ArrowStreamReader(int(self.options["partitions"]),
                                  [int(n) for n in self.options["splitrows"].split(",")],
                                  int(self.options["batchrows"]), self.options.get("topic", TOPIC))
