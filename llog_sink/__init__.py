"""The Spark sink: ``df.writeStream.format("llog")``, ``df.write.format("llog")`` and
``foreachBatch(llog_sink.write_batch(topic=...))``. Tasks stage shared WAL blobs in S3; the
driver commits them to Oxia exactly once per streaming query and batch."""

__all__ = ["write_batch"]


def __getattr__(name: str):
    # ``write_batch`` brings the writer and the S3 client: imported when asked for, so that
    # importing a light module of the package (``llog_sink.compat``, on every query's planning
    # path through ``pyspark_llog``) does not.
    if name == "write_batch":
        from llog_sink.foreach_batch import write_batch

        return write_batch
    raise AttributeError(f"module 'llog_sink' has no attribute {name!r}")
