"""``foreachBatch(write_batch(topic="orders"))``: the sink's engine inside a foreachBatch query.

Each micro-batch DataFrame is written with ``df.write.format("llog")`` naming the running
query as the sink and the micro-batch as the batch, so a replayed micro-batch commits nothing
twice, exactly as with ``writeStream.format("llog")``.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame

from llog_sink.spark_writers import BATCH_ID_OPTION, SINK_ID_OPTION


def write_batch(topic: str | None = None, partitions: int | None = None, **options: str) -> Callable[[DataFrame, int], None]:
    """A ``foreachBatch`` function writing each micro-batch to llog. ``options`` are passed on
    (``llog.*`` settings); ``topic``/``partitions`` as the sink's options of those names."""

    def write(df: DataFrame, batch_id: int) -> None:
        query_id = df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
        if not query_id:
            raise RuntimeError("llog_sink.write_batch must run inside foreachBatch of a streaming query")
        writer = df.write.format("llog").mode("append").options(**options)
        if topic is not None:
            writer = writer.option("topic", topic)
        if partitions is not None:
            writer = writer.option("partitions", str(partitions))
        writer.option(SINK_ID_OPTION, query_id).option(BATCH_ID_OPTION, str(batch_id)).save()

    return write
