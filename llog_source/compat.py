"""What the installed pyspark offers the source, found once, at import (by import, not by
version number, so a vendor build that backports a feature gets it; ``pyspark_llog.compat`` has
the table of every connector's features and the oldest pyspark they run on).

pyspark 4.2 adds admission control for Python stream readers (``ReadLimit``,
``latestOffset(start, limit)``, ``SupportsTriggerAvailableNow``, ``reportLatestOffset``). Without
it ``maxOffsetsPerTrigger`` is refused with an error naming the pyspark version, each micro-batch
reads everything found (``llog_source.spark_readers``), ``availableNow`` is Spark's own wrapper
(one batch up to the ends found when the run starts), and the progress has no ``latestOffset``.
"""

from __future__ import annotations

import pyspark

PYSPARK_VERSION: str = pyspark.__version__

try:
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow,
    )
except ImportError:  # pyspark 4.0, 4.1
    ReadAllAvailable = ReadLimit = ReadMaxRows = SupportsTriggerAvailableNow = None

#: Stream readers get ``latestOffset(start, limit)``, ``getDefaultReadLimit``,
#: ``prepareForTriggerAvailableNow`` and ``reportLatestOffset`` (else only ``latestOffset()``).
ADMISSION_CONTROL: bool = SupportsTriggerAvailableNow is not None
