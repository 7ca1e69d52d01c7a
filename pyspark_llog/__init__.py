"""``format("llog")`` with no registration: Spark imports every installed ``pyspark_*`` module
and registers its ``DefaultSource`` under the source's ``name()``."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource


class DefaultSource(DataSource):
    """llog as a Spark data source: a sink now (``llog_sink``)."""

    @classmethod
    def name(cls) -> str:
        return "llog"

    def writer(self, schema, overwrite: bool):
        from llog_sink.spark_writers import LlogBatchWriter, InvalidSinkInput

        if overwrite:
            raise InvalidSinkInput("llog is an append-only log: use mode('append')")
        return LlogBatchWriter(schema, self.options)

    def streamWriter(self, schema, overwrite: bool):  # noqa: N802 - Spark's name
        from llog_sink.spark_writers import LlogStreamWriter

        return LlogStreamWriter(schema, self.options)
