"""Records behind latest, Kafka's ``{min,avg,max}OffsetsBehindLatest``.

Python data sources cannot attach custom metrics to Spark's query progress (Spark 4.2 gives
them no ``ReportsSourceMetrics``). So the source reports what it can: ``reportLatestOffset``
puts the latest positions next to ``endOffset`` in every progress, :func:`offsets_behind_latest`
computes the metrics from a progress, and every planned micro-batch logs them to stderr and
appends them as a JSON line to the file ``LLOG_SOURCE_METRICS_FILE`` names, if set.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping

from llog.keys import TopicPartition

METRICS_FILE_ENV = "LLOG_SOURCE_METRICS_FILE"


def behind_latest(end: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int]) -> dict[str, float]:
    """``{min,avg,max}OffsetsBehindLatest`` over the partitions of ``latest``."""
    behind = [max(0, latest[tp] - end.get(tp, latest[tp])) for tp in latest]
    if not behind:
        return {"minOffsetsBehindLatest": 0, "avgOffsetsBehindLatest": 0.0, "maxOffsetsBehindLatest": 0}
    return {"minOffsetsBehindLatest": min(behind), "avgOffsetsBehindLatest": sum(behind) / len(behind),
            "maxOffsetsBehindLatest": max(behind)}


def offsets_behind_latest(source_progress: Mapping) -> dict[str, float]:
    """The metrics from one entry of ``query.lastProgress["sources"]`` of an llog source."""
    def positions(raw) -> dict[TopicPartition, int]:
        parsed = json.loads(raw) if isinstance(raw, str) else (raw or {})
        # A topic's "topic_id" names its incarnation (llog_source.planning.to_spark), not a partition.
        return {TopicPartition(t, int(p)): n for t, parts in parsed.items() for p, n in parts.items() if p.isdigit()}

    return behind_latest(positions(source_progress.get("endOffset")), positions(source_progress.get("latestOffset")))


def report_batch(query: str, end: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int],
                 records: int) -> dict:
    """Log one planned micro-batch: its records and how far behind latest it leaves the query."""
    line = {"source": "llog", "query": query, "records": records, "partitions": len(latest),
            "at_ms": int(time.time() * 1000), **behind_latest(end, latest)}
    print(f"llog source: {query}: batch of {records} records over {len(latest)} partition(s); behind latest "
          f"min {line['minOffsetsBehindLatest']} avg {line['avgOffsetsBehindLatest']:.1f} "
          f"max {line['maxOffsetsBehindLatest']}", file=sys.stderr, flush=True)
    path = os.environ.get(METRICS_FILE_ENV)
    if path:
        with open(path, "a") as out:
            out.write(json.dumps(line) + "\n")
    return line
