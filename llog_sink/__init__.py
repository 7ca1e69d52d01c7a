"""The Spark sink: ``df.writeStream.format("llog")``, ``df.write.format("llog")`` and
``foreachBatch(llog_sink.write_batch(topic=...))``. Tasks stage shared WAL blobs in S3; the
driver commits them to Oxia exactly once per streaming query and batch."""

from llog_sink.foreach_batch import write_batch

__all__ = ["write_batch"]
