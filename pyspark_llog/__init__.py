"""``format("llog")`` with no registration: Spark imports every installed ``pyspark_*`` module
and registers its ``DefaultSource`` under the source's ``name()``.

That lookup runs once per Spark driver JVM, at its first Python data source call, in the
driver's Python (``PYSPARK_PYTHON``), and it lists packages with :func:`pkgutil.iter_modules`:
a driver whose lookup ran before llog was installed, whose Python is not the one llog is in, or
that has llog as an editable install (``pip install -e``: an import hook, which that listing
does not show) fails ``format("llog")`` with ``DATA_SOURCE_NOT_FOUND``. Through Spark Connect
the driver is the Connect server, so installing llog beside the client changes nothing there.
:func:`register` then makes ``format("llog")`` work in the session (docs/spark-connect.md).
"""

from __future__ import annotations

# First: on a pyspark without Python data sources (< 4.0) the import fails saying so.
from pyspark_llog.compat import PYSPARK_VERSION  # noqa: F401
from pyspark.sql.datasource import DataSource


def register(spark) -> str:
    """Register llog as ``format("llog")`` in ``spark`` (a classic or a Spark Connect session);
    its name. Needed where Spark's own lookup misses llog (module doc); harmless elsewhere.

    The Spark driver's Python workers (the Connect server's) import ``pyspark_llog`` and
    ``llog`` when a query runs: llog must be installed there too."""
    data_sources = getattr(spark, "dataSource", None)
    if data_sources is None:
        raise TypeError(f"pyspark_llog.register needs a SparkSession of pyspark >= 4.0, not {type(spark).__name__}")
    data_sources.register(DefaultSource)
    return DefaultSource.name()


class DefaultSource(DataSource):
    """llog as a Spark data source: a source (``llog_source``) and a sink (``llog_sink``)."""

    @classmethod
    def name(cls) -> str:
        return "llog"

    # --- reading ------------------------------------------------------------------------------

    def schema(self):
        """The fixed columns of a read. Called by ``load()``, so bad options and unknown topics
        fail there."""
        from llog_source.options import SourceOptions
        from llog_source.schema import source_schema
        from llog_source.spark_readers import check_readable

        options = SourceOptions.parse(self.options)
        check_readable(options)
        return source_schema(options.include_headers)

    def reader(self, schema):
        from llog_source.options import SourceOptions
        from llog_source.spark_readers import LlogBatchReader, check_schema

        options = SourceOptions.parse(self.options, streaming=False)
        check_schema(schema, options)
        return LlogBatchReader(options)

    def streamReader(self, schema):  # noqa: N802 - Spark's name
        from llog_source.options import SourceOptions
        from llog_source.spark_readers import LlogStreamReader, check_schema

        options = SourceOptions.parse(self.options, streaming=True)
        check_schema(schema, options)
        return LlogStreamReader(options)

    # --- writing ------------------------------------------------------------------------------

    def writer(self, schema, overwrite: bool):
        from llog_sink.spark_writers import LlogBatchWriter, InvalidSinkInput

        if overwrite:
            raise InvalidSinkInput("llog is an append-only log: use mode('append')")
        return LlogBatchWriter(schema, self.options)

    def streamWriter(self, schema, overwrite: bool):  # noqa: N802 - Spark's name
        from llog_sink.spark_writers import LlogStreamWriter

        return LlogStreamWriter(schema, self.options)
