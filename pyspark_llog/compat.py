"""What the installed pyspark offers the llog connectors, found once, at import: the oldest
pyspark they run on (checked here, first thing ``pyspark_llog`` imports) and, from each
connector's own ``compat`` module, the features later versions add.

llog's wheel does not depend on pyspark: a cluster keeps its own (Databricks 17.3 LTS is Spark
4.0), and ``llog[spark]`` brings the version the project is tested with (4.2). The connectors
need pyspark >= 4.0 (Python data sources with streaming readers and writers) and use what later
versions add when it is there. Features are found by import, not by version number, so a vendor
build that backports one (Databricks' runtimes do) gets it.

==================================  =======  =================================================
feature                             pyspark  without it
==================================  =======  =================================================
``DataSourceStreamArrowWriter``     4.1      ``writeStream.format("llog")`` receives Rows and
                                             puts them back into Arrow batches
                                             (``llog_sink.rows.row_batches``): same records,
                                             slower. Batch writes and ``foreachBatch`` stay Arrow
                                             (``DataSourceArrowWriter`` is in 4.0).
admission control: ``ReadLimit``,   4.2      ``maxOffsetsPerTrigger`` is refused with an error
``latestOffset(start, limit)``,              naming the pyspark version; each micro-batch reads
``SupportsTriggerAvailableNow``,             everything found (``llog_source.spark_readers``);
``reportLatestOffset``                       ``availableNow`` is Spark's own wrapper: one batch
                                             up to the ends found when the run starts; the
                                             progress has no ``latestOffset``.
==================================  =======  =================================================
"""

from __future__ import annotations

import re

import pyspark

#: The oldest pyspark the connectors run on: Python data sources (and their streaming API) are 4.0's.
MIN_PYSPARK = (4, 0)
PYSPARK_VERSION: str = pyspark.__version__


def _release(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a version string such as ``4.0.5``, ``4.1.0.dev1`` or ``4.2.0+db``."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None:
        raise ImportError(f"cannot read the pyspark version {version!r}")
    return int(found[1]), int(found[2])


if _release(PYSPARK_VERSION) < MIN_PYSPARK:
    raise ImportError(f"llog's Spark connectors need pyspark >= {'.'.join(map(str, MIN_PYSPARK))} (Python data "
                      f"sources); this is pyspark {PYSPARK_VERSION}")

# The connectors find their features themselves (llog_sink.compat, llog_source.compat): they
# import nothing of this package, which imports them.
from llog_sink.compat import ARROW_STREAM_WRITER  # noqa: E402 - after the version check
from llog_source.compat import ADMISSION_CONTROL  # noqa: E402


def features() -> dict[str, object]:
    """What this pyspark gives the connectors (for logs, reports and the compatibility check)."""
    return {"pyspark": PYSPARK_VERSION, "arrow_stream_writer": ARROW_STREAM_WRITER,
            "admission_control": ADMISSION_CONTROL}
