"""What the installed pyspark offers the sink, found once, at import (by import, not by version
number, so a vendor build that backports a feature gets it; ``pyspark_llog.compat`` has the
table of every connector's features and the oldest pyspark they run on).

pyspark 4.1 adds ``DataSourceStreamArrowWriter``; on 4.0 ``writeStream.format("llog")`` receives
Rows and puts them back into Arrow batches (``llog_sink.rows.row_batches``): the same records,
slower. Batch writes and ``foreachBatch`` stay Arrow (``DataSourceArrowWriter`` is in 4.0).
"""

from __future__ import annotations

try:
    from pyspark.sql.datasource import DataSourceStreamArrowWriter
except ImportError:  # pyspark 4.0
    DataSourceStreamArrowWriter = None

#: ``writeStream`` hands the writer Arrow batches (else Rows).
ARROW_STREAM_WRITER: bool = DataSourceStreamArrowWriter is not None
